// The one exception hierarchy of strata; the bindings map each class to a Python exception.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

#include "core/utf8.h"

namespace strata {

// Messages quote names and values from files, which may hold any bytes: the text is made valid
// UTF-8 here, once, so no binding ever fails to decode it.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(valid_utf8(what)) {}
  explicit Error(const char* what) : Error(std::string(what)) {}
};
// A file that is not a valid GGUF, or holds a value out of range.
class FormatError : public Error {
 public:
  using Error::Error;
};
// Valid input that strata cannot run: unknown architecture, quant type, op.
class UnsupportedError : public Error {
 public:
  using Error::Error;
};
// Not enough memory for what was asked (cache too small, chunk too large).
class MemoryError : public Error {
 public:
  using Error::Error;
};
// A bad argument or flag value from the caller.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A caller stopped a pass (Ctrl-C). Not an Error, as Python's KeyboardInterrupt is no Exception:
// code that handles errors does not catch it; the bindings raise KeyboardInterrupt.
class Interrupted : public std::runtime_error {
 public:
  Interrupted() : std::runtime_error("interrupted") {}
};

namespace detail {
inline void cat(std::ostringstream&) {}
template <class T, class... R>
void cat(std::ostringstream& os, const T& v, const R&... r) {
  os << v;
  cat(os, r...);
}
}  // namespace detail

// str("a", 1, "b") -> "a1b": message building for errors and logs.
template <class... A>
std::string str(const A&... a) {
  std::ostringstream os;
  detail::cat(os, a...);
  return os.str();
}

}  // namespace strata

#define STRATA_CHECK(cond, Exc, ...)                              \
  do {                                                            \
    if (!(cond)) throw ::strata::Exc(::strata::str(__VA_ARGS__)); \
  } while (0)
