// quantize_row_q8_0: d = max|x| / 127, q = round(x / d), as ggml's quantize_row_q8_0_ref.
#include "quant/quantize.h"

#include <cmath>
#include <cstring>

#include "core/half.h"

namespace strata {

void quantize_row_q8_0(const float* x, uint8_t* out, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + b * 32;
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    const float d = amax / 127.f;
    const float id = d != 0.f ? 1.0f / d : 0.f;
    const uint16_t dh = f32_to_fp16(d);
    uint8_t* ob = out + b * 34;
    std::memcpy(ob, &dh, 2);
    for (int i = 0; i < 32; ++i) ob[2 + i] = (uint8_t)(int8_t)std::lround(xb[i] * id);
  }
}

}  // namespace strata
