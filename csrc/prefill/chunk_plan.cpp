// Chunk planner: region slots from the one Prefill plan, and the auto step-down.
#include "prefill/chunk_plan.h"

#include <algorithm>

#include "core/error.h"
#include "core/memory.h"

namespace strata {

const char* prefill_mode_name(PrefillMode m) {
  switch (m) {
    case PrefillMode::Fixed:
      return "fixed";
    case PrefillMode::Auto:
      return "auto";
    default:
      return "default";
  }
}

PrefillMode parse_prefill_mode(const std::string& name) {
  for (PrefillMode m : {PrefillMode::Default, PrefillMode::Fixed, PrefillMode::Auto})
    if (name == prefill_mode_name(m)) return m;
  throw ConfigError(str("prefill mode must be default, fixed or auto, got '", name, "'"));
}

int64_t region_slots(const Prefill& p, int64_t T, size_t slot_bytes) {
  return (int64_t)((p.bytes_needed(T, true) + slot_bytes - 1) / slot_bytes);
}

ChunkPlan plan_chunk(const Prefill& p, size_t slot_bytes, int64_t n_slots, size_t cache_bytes, int64_t max_T,
                     PrefillMode mode) {
  STRATA_CHECK(max_T >= 1, ConfigError, "--prefill must be at least 1 token, got ", max_T);
  const auto& s = p.shape();
  // room: slots the chunk needs besides its region, a layer's expert working set or one expert.
  auto make = [&](int64_t T, bool layer_room) {
    ChunkPlan c;
    c.chunk = T;
    c.slots = region_slots(p, T, slot_bytes);
    c.needs = c.slots + (layer_room ? std::min<int64_t>(s.E, T * s.K) : 1);
    c.fits = c.needs <= n_slots;
    return c;
  };
  auto mib = [&](int64_t slots) { return ((uint64_t)slots * slot_bytes + (1 << 20) - 1) >> 20; };
  const std::string cache =
      str("--expert-cache ", mib_str(cache_bytes), " (", n_slots, " slots of ", slot_bytes, " bytes)");
  // The MMQ layout's chunk buffers are the larger: where the fused layout could run, say so.
  const std::string fused_hint =
      !s.streamed_fused && p.fused_supported() ? ", or --moe-layout fused (smaller chunk buffers)" : "";
  if (mode != PrefillMode::Auto) {
    ChunkPlan c = make(max_T, false);
    if (c.fits) return c;
    if (mode == PrefillMode::Fixed) {
      // The largest chunk that fits as a fixed one: the region grows with T (bisection; checked).
      int64_t lo = 0, hi = max_T;
      while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        (make(mid, false).fits ? lo : hi) = mid;
      }
      c.error =
          str(cache, " is too small for a prompt chunk of ", c.chunk, " tokens, which borrows ", c.slots,
              " slots and needs ", c.needs, "; use --expert-cache ", mib(c.needs), "MiB or more");
      if (lo >= 1)  // lo only ever takes a chunk that fits
        c.error += str(", or --prefill ", lo, " or fewer tokens, or --prefill auto");
      c.error += fused_hint;
      return c;
    }
    // Default: no --prefill was given, so a cache too small for the default chunk steps down.
  }
  // Halving from max_T (through 256, down to 1): first the largest chunk whose region leaves room
  // for a layer's experts; failing that, the largest that leaves room for one (experts then evict
  // each other within a layer, as with a fixed chunk that small).
  for (bool layer_room : {true, false}) {
    for (int64_t T = max_T;; T = T > 256 ? std::max<int64_t>(256, T / 2) : T / 2) {
      const ChunkPlan c = make(T, layer_room);
      if (c.fits) return c;
      if (T == 1) break;
    }
  }
  ChunkPlan c = make(1, false);
  const int64_t useful = std::min<int64_t>(256, max_T);
  c.error = str(cache, " is too small for any prompt chunk: one of 1 token borrows ", c.slots,
                " slots and needs ", c.needs, "; use --expert-cache ", mib(c.needs), "MiB or more");
  if (useful > 1 && mib(make(useful, true).needs) > mib(c.needs))
    c.error += str(" (", mib(make(useful, true).needs), "MiB or more for chunks of ", useful, " tokens)");
  c.error += fused_hint;
  return c;
}

}  // namespace strata
