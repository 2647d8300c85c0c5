// The CPU kernels that the traits table (formats.cpp) points at, by format: matmul's AVX2 T = 1
// kernels (matmul.cpp) and matmul_q8's integer kernels (mmq_legacy.cpp, mmq_k.cpp, mmq_iq.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "quant/quant.h"

namespace strata::quant_detail {

// clang-format off
#define STRATA_QUANT_KERNELS(X) \
  X(q8_0) \
  X(q4_0) \
  X(q4_1) \
  X(q5_0) \
  X(q5_1) \
  X(iq4_nl) \
  X(mxfp4) \
  X(q3_k) \
  X(q4_k) \
  X(q5_k) \
  X(q6_k) \
  X(iq2_xs) \
  X(iq4_xs) \
  X(iq3_xxs) \
  X(iq3_s) \
  X(iq2_s) \
  X(iq1_s) \
  X(iq1_m)
// clang-format on
#define STRATA_DECLARE(name)                                                                                \
  void gemv_##name##_avx2(const void*, size_t, int64_t, int64_t, const float*, float*);                     \
  void mmq_##name##_scalar(const void*, size_t, int64_t, int64_t, const uint8_t*, int64_t, int64_t, float*, \
                           int64_t);                                                                        \
  void mmq_##name##_avx2(const void*, size_t, int64_t, int64_t, const uint8_t*, int64_t, int64_t, float*,   \
                         int64_t);
STRATA_QUANT_KERNELS(STRATA_DECLARE)
#undef STRATA_DECLARE
// Q2_K and IQ2_XXS: AVX2 decoders (matmul.cpp) and AVX2 integer kernels (mmq_k.cpp, mmq_iq.cpp).
void gemv_q2_k_avx2(const void*, size_t, int64_t, int64_t, const float*, float*);
void mmq_q2_k_avx2(const void*, size_t, int64_t, int64_t, const uint8_t*, int64_t, int64_t, float*, int64_t);
void gemv_iq2_xxs_avx2(const void*, size_t, int64_t, int64_t, const float*, float*);
void mmq_q2_k_scalar(const void*, size_t, int64_t, int64_t, const uint8_t*, int64_t, int64_t, float*,
                     int64_t);
void mmq_iq2_xxs_scalar(const void*, size_t, int64_t, int64_t, const uint8_t*, int64_t, int64_t, float*,
                        int64_t);
void mmq_iq2_xxs_avx2(const void*, size_t, int64_t, int64_t, const uint8_t*, int64_t, int64_t, float*,
                      int64_t);
// The AVX-512 VNNI integer kernels (QuantTraits::matmul_q8_vnni), where they measured faster than AVX2's.
// clang-format off
#define STRATA_QUANT_VNNI_KERNELS(X) \
  X(q8_0) \
  X(q4_0) \
  X(q4_1) \
  X(q5_0) \
  X(q5_1) \
  X(iq4_nl) \
  X(mxfp4) \
  X(q2_k) \
  X(q3_k) \
  X(q4_k) \
  X(q5_k) \
  X(q6_k) \
  X(iq2_xxs) \
  X(iq2_xs) \
  X(iq4_xs) \
  X(iq3_xxs) \
  X(iq3_s) \
  X(iq2_s) \
  X(iq1_s) \
  X(iq1_m)
// clang-format on
#define STRATA_DECLARE(name)                                                                              \
  void mmq_##name##_vnni(const void*, size_t, int64_t, int64_t, const uint8_t*, int64_t, int64_t, float*, \
                         int64_t);
STRATA_QUANT_VNNI_KERNELS(STRATA_DECLARE)
#undef STRATA_DECLARE
void gemv_f16_avx2(const void*, size_t, int64_t, int64_t, const float*, float*);
void gemv_bf16_avx2(const void*, size_t, int64_t, int64_t, const float*, float*);

}  // namespace strata::quant_detail
