// The A/B knobs read from the environment (STRATA_*): unset or empty gives the default; anything else
// must be a valid value, or a ConfigError names the variable, the value and what it takes.
#pragma once
#include <cstdint>

namespace strata {

// An integer from lo to hi; `what` names it in the error ("a number of blocks": "... is not a number of
// blocks from 1 to 1024").
int64_t env_int(const char* name, int64_t dflt, int64_t lo, int64_t hi, const char* what);
// A switch: 0 or 1.
bool env_switch(const char* name, bool dflt);

}  // namespace strata
