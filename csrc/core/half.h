// IEEE half and bfloat16 conversions, bit-exact with numpy's float16 and ggml's bf16; host and
// device code share them (STRATA_HD).
#pragma once
#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace strata {

STRATA_HD inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
STRATA_HD inline uint32_t bits_from_f32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Exact fp16 -> fp32 (every half is representable in float).
STRATA_HD inline float fp16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        mant <<= 1;
        ++e;
      } while ((mant & 0x400) == 0);
      mant &= 0x3ff;
      u = sign | ((uint32_t)(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return f32_from_bits(u);
}

// fp32 -> fp16, round to nearest even (as numpy's astype(float16)).
STRATA_HD inline uint16_t f32_to_fp16(float f) {
  uint32_t x = bits_from_f32(f);
  const uint16_t sign = (x >> 16) & 0x8000;
  x &= 0x7fffffff;
  if (x >= 0x7f800000u) return sign | 0x7c00 | (x > 0x7f800000u ? 0x200 : 0);
  if (x >= 0x477ff000u) return sign | 0x7c00;  // overflow to inf
  if (x < 0x38800000u) {                       // subnormal or zero in half
    if (x < 0x33000000u) return sign;
    const uint32_t e = x >> 23;
    uint32_t m = (x & 0x7fffff) | 0x800000;
    const int shift = 126 - (int)e;  // 14..24
    const uint32_t half_m = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    uint32_t r = half_m + ((rem > halfway || (rem == halfway && (half_m & 1))) ? 1 : 0);
    return sign | (uint16_t)r;
  }
  uint32_t r = x - 0x38000000u;  // rebias exponent
  const uint32_t rem = r & 0x1fff;
  r >>= 13;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) ++r;
  return sign | (uint16_t)r;
}

STRATA_HD inline float bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

}  // namespace strata
