// AVX2 building blocks of the x86-64 kernels (dequantization rows, matmul's decode kernels,
// matmul_q8): the target attribute, widening loads, F16C conversion and horizontal sums.
#pragma once
#if defined(__x86_64__)
#include <immintrin.h>

#include <array>
#include <cstdint>
#include <cstring>

#include "quant/formats.h"

// Code that uses AVX2, FMA or F16C; it runs only where best_isa() is Isa::Avx2 or above.
#define STRATA_SIMD __attribute__((target("avx2,fma,f16c")))
// Code that also uses AVX-512 (F, BW, VL) and its VNNI dot products (vpdpbusd); it runs only where
// best_isa() is Isa::Avx512Vnni, so the library still runs on AVX2-only CPUs.
#define STRATA_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

namespace strata::quant_detail {

STRATA_SIMD inline __m256i load256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// Eight bytes at p widened to eight int32 lanes.
STRATA_SIMD inline __m256i u8x8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
STRATA_SIMD inline __m256i i8x8(const int8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// F16C's conversion: the same float as fp16_to_f32 for every non-NaN half, without its branches.
STRATA_SIMD inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
// The same for a half at any byte offset (q8_0 activation rows may be unaligned).
STRATA_SIMD inline float h2f_at(const void* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)): matmul's order for its eight lanes.
STRATA_SIMD inline float hsum_ps(__m256 a) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// The sum of four int32 lanes (exact).
STRATA_SIMD inline int32_t hsum_epi32(__m128i s4) {
  const __m128i s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
  return _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)));
}

// iq2_xs_signs as eight bytes of +1 (0x01) or -1 (0xFF), for _mm256_sign_epi8.
inline constexpr std::array<uint64_t, 128> kIq2xsSignBytes = [] {
  std::array<uint64_t, 128> t{};
  for (int k = 0; k < 128; ++k)
    for (int e = 0; e < 8; ++e)
      t[k] |= static_cast<uint64_t>(iq2_xs_negative(iq2_xs_signs(k), e) ? 0xFF : 0x01) << (8 * e);
  return t;
}();

}  // namespace strata::quant_detail
#endif
