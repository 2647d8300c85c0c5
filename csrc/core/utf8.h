// Text from a file is untrusted: helpers that make any bytes safe to put in a message.
#pragma once
#include <string>
#include <string_view>

namespace strata {

// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool is_utf8(std::string_view s);

// `s` with every byte that is not part of a well-formed UTF-8 sequence written as \xNN: valid
// UTF-8 whatever the input, unchanged when the input already was.
std::string valid_utf8(std::string_view s);

// For quoting a name or value read from a file inside a message: valid_utf8, and control
// characters (C0, DEL) and backslashes escaped too, so the text cannot break a line or a terminal.
std::string printable(std::string_view s);

}  // namespace strata
