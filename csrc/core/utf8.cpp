// UTF-8 validation and escaping for messages that quote bytes from a file.
#include "core/utf8.h"

#include <cstdint>

namespace strata {

namespace {

// Length of the well-formed UTF-8 sequence at s[i] (1..4), or 0 when the byte there starts none.
size_t sequence_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return uint8_t(s[i + k]); };
  const uint8_t c = b(0);
  if (c < 0x80) return 1;
  const size_t left = s.size() - i;
  const auto cont = [&](size_t k) { return k < left && (b(k) & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    if (c == 0xE0 && b(1) < 0xA0) return 0;  // overlong
    if (c == 0xED && b(1) > 0x9F) return 0;  // UTF-16 surrogates
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (c == 0xF0 && b(1) < 0x90) return 0;  // overlong
    if (c == 0xF4 && b(1) > 0x8F) return 0;  // past U+10FFFF
    return 4;
  }
  return 0;
}

void hex_escape(std::string& out, uint8_t c) {
  static const char kHex[] = "0123456789abcdef";
  out += "\\x";
  out += kHex[c >> 4];
  out += kHex[c & 15];
}

std::string escape(std::string_view s, bool controls) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = sequence_length(s, i);
    const uint8_t c = uint8_t(s[i]);
    if (n == 0 || (controls && n == 1 && (c < 0x20 || c == 0x7F || c == '\\'))) {
      hex_escape(out, c);
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

}  // namespace

bool is_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string valid_utf8(std::string_view s) { return is_utf8(s) ? std::string(s) : escape(s, false); }

std::string printable(std::string_view s) { return escape(s, true); }

}  // namespace strata
