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

// Slots a chunk of T tokens borrows from a cache of `slot_bytes` slots (with an ExpertSource).
int64_t region_slots(const Prefill& p, int64_t T, size_t slot_bytes);

// A fixed chunk fits when the cache holds its region plus the one expert being computed. Auto
// halves from max_T (through 256) down to 1 token: it takes the largest chunk whose region still
// leaves room for one layer's expert working set at that chunk, min(E, T * K) slots, else the
// largest that fits as a fixed chunk; when none does, the error names the smallest cache that works.
ChunkPlan plan_chunk(const Prefill& p, size_t slot_bytes, int64_t n_slots, size_t cache_bytes, int64_t max_T,
                     bool is_auto);

}  // namespace strata
