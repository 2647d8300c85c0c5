// quantize_row_q8_0: d = max|x| / 127, q = round(x / d), as ggml's quantize_row_q8_0_ref.
#include "quant/quantize.h"

#include <cmath>
#include <cstring>

#include "core/half.h"
#include "quant/formats.h"

namespace strata {

void quantize_row_q8_0(const float* x, uint8_t* out, int64_t n) {
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    const float* xb = x + b * kQK8_0;
    float amax = 0.f;
    for (int i = 0; i < kQK8_0; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    const float d = amax / 127.f;
    const float id = d != 0.f ? 1.0f / d : 0.f;
    BlockQ8_0 blk;
    blk.d = f32_to_fp16(d);
    for (int i = 0; i < kQK8_0; ++i) blk.qs[i] = static_cast<int8_t>(std::lround(xb[i] * id));
    std::memcpy(out + b * kQ8_0Bytes, &blk, sizeof(blk));  // out may be at any byte offset
  }
}

}  // namespace strata
