// Logging to stderr with a level from STRATA_LOG (error, warn, info, debug); the only global state.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace strata {

enum class LogLevel { Error = 0, Warn = 1, Info = 2, Debug = 3 };

inline LogLevel log_level() {
  static const LogLevel lvl = [] {
    const char* e = std::getenv("STRATA_LOG");
    if (!e) return LogLevel::Warn;
    if (!std::strcmp(e, "error")) return LogLevel::Error;
    if (!std::strcmp(e, "info")) return LogLevel::Info;
    if (!std::strcmp(e, "debug")) return LogLevel::Debug;
    return LogLevel::Warn;
  }();
  return lvl;
}

template <class... A>
void log(LogLevel lvl, const A&... a) {
  if (lvl > log_level()) return;
  static const char* names[] = {"error", "warn", "info", "debug"};
  std::fprintf(stderr, "strata %s: %s\n", names[(int)lvl], str(a...).c_str());
}

}  // namespace strata
