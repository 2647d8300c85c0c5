// exp_portable: e^x from IEEE operations only (fused multiply-adds, products, a subtraction, bit
// assembly), in one fixed order, so that every machine that rounds to nearest gets the same float: the
// CPU's scalar and AVX2 paths and a CUDA kernel alike. The libraries' expf are each accurate but differ
// from one another (glibc's is correctly rounded in practice, CUDA's is within 2 ulp and rests on the
// SFU's ex2.approx), so a product computed on the CPU and one computed on the GPU could not give the same
// bits through them. The expert FFNs' activations (swiglu, swiglu_clamp, swiglu_oai) use this one on every
// backend, which is what lets an expert be computed on either side of the link with the same result.
//
// The steps: n = rint(x log2 e) (ties to even, from one fused multiply-add against 1.5 * 2^23),
// r = x - n ln2 in two fused steps (|r| <= ln2 / 2 + 2^-24), e^r by its Taylor polynomial of degree 7 in
// Horner form (truncation below 5.3e-9 relative, 0.09 ulp), then the scaling by 2^n as two exact powers of
// two, so that a result in the subnormal range is rounded once. Within 1 ulp of e^x (the test measures
// it over the whole finite range); NaN stays NaN, e^x above ~88.72 is +inf, below ~-103.97 is +0.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/float_ops.h"
#include "core/host_device.h"

namespace strata {

namespace exp_detail {

// The constants, shared with the eight-lane form (backend/cpu/activation.cpp).
inline constexpr float kLog2e = 1.44269502162933349609375f;  // the float nearest log2(e)
inline constexpr float kShift = 12582912.0f;                 // 1.5 * 2^23: adding it rounds to an integer
inline constexpr float kLn2Hi = 0.693147182464599609375f;    // the float nearest ln 2
inline constexpr float kLn2Lo = -1.904654323148236e-09f;     // ln 2 - kLn2Hi, to float
// 1 / k! for k = 7 down to 2, each rounded to float once.
inline constexpr float kC7 = static_cast<float>(1.0 / 5040);
inline constexpr float kC6 = static_cast<float>(1.0 / 720);
inline constexpr float kC5 = static_cast<float>(1.0 / 120);
inline constexpr float kC4 = static_cast<float>(1.0 / 24);
inline constexpr float kC3 = static_cast<float>(1.0 / 6);
inline constexpr float kC2 = 0.5f;
// Outside [kLow, kHigh] the result is +0 or +inf without computing (inside it the steps give them too).
inline constexpr float kHigh = 89.0f;
inline constexpr float kLow = -104.0f;

// 2^k as a float, k in [-126, 127].
STRATA_HD inline float pow2(int k) { return rn::as_float(static_cast<uint32_t>(k + 127) << 23); }

}  // namespace exp_detail

STRATA_HD inline float exp_portable(float x) {
  using namespace exp_detail;
  if (x != x) return x;
  if (x > kHigh) return INFINITY;
  if (x < kLow) return 0.0f;
  using rn::fma_rn;
  const float n = rn::sub(fma_rn(x, kLog2e, kShift), kShift);
  const float r = fma_rn(n, -kLn2Lo, fma_rn(n, -kLn2Hi, x));
  float p = fma_rn(kC7, r, kC6);
  p = fma_rn(p, r, kC5);
  p = fma_rn(p, r, kC4);
  p = fma_rn(p, r, kC3);
  p = fma_rn(p, r, kC2);
  p = fma_rn(p, r, 1.0f);
  p = fma_rn(p, r, 1.0f);
  // n in [-150, 128]: 2^n as 2^(n >> 1) * 2^(n - (n >> 1)), both normal; the first product is exact.
  const int ni = static_cast<int>(n), n1 = ni >> 1;
  return rn::mul(rn::mul(p, pow2(n1)), pow2(ni - n1));
}

// silu(x) * u, as every backend's expert FFN computes it: (x / (1 + e^-x)) * u.
STRATA_HD inline float swiglu_portable(float x, float u) {
  return rn::mul(rn::div(x, rn::add(1.0f, exp_portable(-x))), u);
}

}  // namespace strata
