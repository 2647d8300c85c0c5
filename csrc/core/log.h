// Logging to stderr at a process-wide level (error, warn, info, debug): the only global state.
// The level is set at the edge (strata reads STRATA_LOG in Python); nothing here reads the environment.
#pragma once
#include <atomic>
#include <cstdio>
#include <string>

#include "core/error.h"

namespace strata {

enum class LogLevel { Error = 0, Warn = 1, Info = 2, Debug = 3 };

inline std::atomic<int>& log_level_slot() {
  static std::atomic<int> level{static_cast<int>(LogLevel::Warn)};
  return level;
}
inline LogLevel log_level() {
  return static_cast<LogLevel>(log_level_slot().load(std::memory_order_relaxed));
}
inline void set_log_level(LogLevel l) { log_level_slot().store(static_cast<int>(l)); }
// "error" | "warn" | "info" | "debug"; ConfigError naming the accepted values otherwise.
inline LogLevel parse_log_level(const std::string& name) {
  static const char* names[] = {"error", "warn", "info", "debug"};
  for (int i = 0; i < 4; ++i)
    if (name == names[i]) return static_cast<LogLevel>(i);
  throw ConfigError(str("log level '", name, "' is not one of error, warn, info, debug (STRATA_LOG)"));
}

template <class... A>
void log(LogLevel lvl, const A&... a) {
  if (lvl > log_level()) return;
  static const char* names[] = {"error", "warn", "info", "debug"};
  std::fprintf(stderr, "strata %s: %s\n", names[(int)lvl], str(a...).c_str());
}

}  // namespace strata
