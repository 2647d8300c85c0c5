// The IQ2_XS sign bytes that the AVX2 integer kernels use, and the kernels the traits table
// points at.
#pragma once
#include <array>
#include <cstdint>

#include "quant/quant.h"

namespace strata::quant_detail {

// The same signs as eight bytes of +1 (0x01) or -1 (0xFF), for _mm256_sign_epi8.
inline constexpr std::array<uint64_t, 128> kSignBytesIq2xs = [] {
  std::array<uint64_t, 128> t{};
  for (unsigned k = 0; k < 128; ++k)
    for (int j = 0; j < 8; ++j)
      t[k] |= static_cast<uint64_t>((kIq2xsSigns[k] >> j) & 1 ? 0xFF : 0x01) << (8 * j);
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
