// The scan policy's victim order (policy.h ScanPolicy), shared by the host's policy, the sequential
// resolve_experts reference and the GPU's resolve kernel, so the three choose the same slot.
#pragma once
#include <cstdint>

#include "core/host_device.h"

namespace strata {

// A slot's place in the victim order: smaller goes first, compared as (a, b), then the lower slot.
struct ScanKey {
  uint64_t a = 0, b = 0;
};
STRATA_HD inline bool scan_less(ScanKey x, ScanKey y) { return x.a != y.a ? x.a < y.a : x.b < y.b; }

// The key of a slot last used at tick `last` (0: empty), in pass `pass` at layer `layer`, when the pass
// `pass_now` resolves layer `layer_now`. Classes in the top two bits of a: 0 stale (used before the
// previous pass, or in it at a layer this pass has passed without using it; the least recent first),
// 1 used in this pass (the most recent first: its next use is the farthest), 2 used in the previous pass
// at a layer still ahead (the farthest layer first, then the most recent). Ticks and layers stay below
// 2^62 (a tick counts lookups).
STRATA_HD inline ScanKey scan_key(uint64_t last, uint64_t pass, int64_t layer, uint64_t pass_now,
                                  int64_t layer_now) {
  constexpr uint64_t kTop = uint64_t{1} << 62, kMask = kTop - 1;
  if (pass == pass_now) return {kTop | (kMask - (last & kMask)), 0};
  if (pass + 1 < pass_now || layer < layer_now) return {last & kMask, 0};
  return {2 * kTop | (kMask - ((uint64_t)layer & kMask)), ~last};
}

}  // namespace strata
