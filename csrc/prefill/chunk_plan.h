// The chunk planner: how many slots a prompt chunk borrows, and which chunk --prefill picks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "prefill/prefill.h"

namespace strata {

struct ChunkPlan {
  int64_t chunk = 0;  // tokens per chunk
  int64_t slots = 0;  // slots the chunk's region borrows: ceil(bytes_needed / slot_bytes)
  int64_t needs = 0;  // slots the cache must have for it: region + expert room
  bool fits = false;
  std::string error;  // when !fits: the cause and the smallest --expert-cache that works
};

// How --prefill picks the chunk. Fixed: exactly --prefill N (an error when the cache is too small).
// Auto: --prefill auto[:MAX], the largest chunk <= MAX that leaves the cache room for a layer's
// experts. Default: no --prefill given: the default chunk when it fits as a fixed one, else as Auto.
enum class PrefillMode { Default, Fixed, Auto };
const char* prefill_mode_name(PrefillMode m);             // "default", "fixed", "auto"
PrefillMode parse_prefill_mode(const std::string& name);  // ConfigError for any other name
constexpr int64_t kPrefillDefault = 8192;                 // tokens per chunk when no --prefill is given
constexpr int64_t kPrefillAutoMax = 32768;                // --prefill auto without :MAX

// Slots a chunk of T tokens borrows from a cache of `slot_bytes` slots (with an ExpertSource).
int64_t region_slots(const Prefill& p, int64_t T, size_t slot_bytes);

// A fixed chunk fits when the cache holds its region plus the one expert being computed; when it
// does not, the error names the smallest --expert-cache for it and the largest --prefill that fits.
// Auto halves from max_T (through 256) down to 1 token: it takes the largest chunk whose region
// still leaves room for one layer's expert working set at that chunk, min(E, T * K) slots, else the
// largest that fits as a fixed chunk; when none does, the error names the smallest cache that works.
// Every size in an error carries its unit (--expert-cache 37MiB).
ChunkPlan plan_chunk(const Prefill& p, size_t slot_bytes, int64_t n_slots, size_t cache_bytes, int64_t max_T,
                     PrefillMode mode);

}  // namespace strata
