// Small pieces of the block formats that dequantization and both matmuls share (ggml's
// get_scale_min_k4 and the IQ2_XS sign tables), and the kernels the traits table points at.
#pragma once
#include <array>
#include <bit>
#include <cstdint>

#include "quant/quant.h"

namespace strata::quant_detail {

// ggml's get_scale_min_k4: sub-block j's 6-bit scale and min.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// ggml's ksigns_iq2xs: 7 sign bits plus an 8th that makes the count of negatives even.
inline constexpr std::array<uint8_t, 128> kSignsIq2xs = [] {
  std::array<uint8_t, 128> t{};
  for (unsigned k = 0; k < 128; ++k) t[k] = static_cast<uint8_t>(k | ((std::popcount(k) & 1u) << 7));
  return t;
}();

// The same signs as eight bytes of +1 (0x01) or -1 (0xFF), for _mm256_sign_epi8.
inline constexpr std::array<uint64_t, 128> kSignBytesIq2xs = [] {
  std::array<uint64_t, 128> t{};
  for (unsigned k = 0; k < 128; ++k)
    for (int j = 0; j < 8; ++j) t[k] |= static_cast<uint64_t>((kSignsIq2xs[k] >> j) & 1 ? 0xFF : 0x01) << (8 * j);
  return t;
}();

// T = 1 kernels of matmul (AVX2; matmul.cpp) and the integer kernels of matmul_q8 (matmul_q8.cpp).
#define STRATA_QUANT_KERNELS(X) X(q8_0) X(q4_k) X(q6_k) X(iq2_xs)
#define STRATA_DECLARE(name)                                                                                \
  void gemv_##name##_avx2(const void*, size_t, int64_t, int64_t, const float*, float*);                    \
  void mmq_##name##_scalar(const void*, size_t, int64_t, int64_t, const uint8_t*, int64_t, int64_t, float*, \
                           int64_t);                                                                         \
  void mmq_##name##_avx2(const void*, size_t, int64_t, int64_t, const uint8_t*, int64_t, int64_t, float*,   \
                         int64_t);
STRATA_QUANT_KERNELS(STRATA_DECLARE)
#undef STRATA_DECLARE
void gemv_f16_avx2(const void*, size_t, int64_t, int64_t, const float*, float*);
void gemv_bf16_avx2(const void*, size_t, int64_t, int64_t, const float*, float*);

}  // namespace strata::quant_detail
