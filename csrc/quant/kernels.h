// The CPU kernels that the traits table (formats.cpp) points at, by format: matmul's AVX2 T = 1
// kernels (matmul.cpp) and matmul_q8's integer kernels (matmul_q8.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "quant/quant.h"

namespace strata::quant_detail {

#define STRATA_QUANT_KERNELS(X) X(q8_0) X(q4_k) X(q6_k) X(iq2_xs)
#define STRATA_DECLARE(name)                                                                                \
  void gemv_##name##_avx2(const void*, size_t, int64_t, int64_t, const float*, float*);                     \
  void mmq_##name##_scalar(const void*, size_t, int64_t, int64_t, const uint8_t*, int64_t, int64_t, float*, \
                           int64_t);                                                                        \
  void mmq_##name##_avx2(const void*, size_t, int64_t, int64_t, const uint8_t*, int64_t, int64_t, float*,   \
                         int64_t);
STRATA_QUANT_KERNELS(STRATA_DECLARE)
#undef STRATA_DECLARE
void gemv_f16_avx2(const void*, size_t, int64_t, int64_t, const float*, float*);
void gemv_bf16_avx2(const void*, size_t, int64_t, int64_t, const float*, float*);

}  // namespace strata::quant_detail
