// Chunk planner: region slots from the one Prefill plan, and the auto step-down.
#include "prefill/chunk_plan.h"

#include <algorithm>

#include "core/error.h"
#include "core/memory.h"

namespace strata {

int64_t region_slots(const Prefill& p, int64_t T, size_t slot_bytes) {
  return (int64_t)((p.bytes_needed(T, true) + slot_bytes - 1) / slot_bytes);
}

ChunkPlan plan_chunk(const Prefill& p, size_t slot_bytes, int64_t n_slots, size_t cache_bytes, int64_t max_T,
                     bool is_auto) {
  STRATA_CHECK(max_T >= 1, ConfigError, "--prefill must be at least 1 token, got ", max_T);
  const auto& s = p.shape();
  auto make = [&](int64_t T) {
    ChunkPlan c;
    c.chunk = T;
    c.slots = region_slots(p, T, slot_bytes);
    c.needs = c.slots + (is_auto ? std::min<int64_t>(s.E, T * s.K) : 1);
    c.fits = c.needs <= n_slots;
    return c;
  };
  ChunkPlan c = make(max_T);
  if (is_auto)
    while (!c.fits && c.chunk > 256) c = make(std::max<int64_t>(256, c.chunk / 2));
  if (!c.fits) {
    c.error = str("--expert-cache ", mib_str(cache_bytes), " (", n_slots, " slots of ", slot_bytes,
                  " bytes) is too small for a prompt chunk of ", c.chunk, " tokens, which borrows ", c.slots,
                  " slots and needs ", c.needs, "; use --expert-cache ",
                  ((uint64_t)c.needs * slot_bytes + (1 << 20) - 1) >> 20, " or more, or a smaller --prefill");
  }
  return c;
}

}  // namespace strata
