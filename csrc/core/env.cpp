#include "core/env.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace strata {

int64_t env_int(const char* name, int64_t dflt, int64_t lo, int64_t hi, const char* what) {
  const char* e = std::getenv(name);
  if (!e || !*e) return dflt;
  char* end = nullptr;
  const long long v = std::strtoll(e, &end, 10);
  STRATA_CHECK(end && *end == 0 && v >= lo && v <= hi, ConfigError, name, "=", e, " is not ", what, " from ",
               lo, " to ", hi);
  return static_cast<int64_t>(v);
}

bool env_switch(const char* name, bool dflt) {
  const char* e = std::getenv(name);
  if (!e || !*e) return dflt;
  STRATA_CHECK(std::strcmp(e, "0") == 0 || std::strcmp(e, "1") == 0, ConfigError, name, "=", e,
               " is not 0 or 1");
  return e[0] == '1';
}

}  // namespace strata
