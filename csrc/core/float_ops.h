// Float operations with one rounding each that no compiler may fuse or reorder, the same on the host and in
// CUDA device code (STRATA_HD): the steps of code whose bits must agree across backends (the quant decoders,
// exp_portable). On the host, -ffp-contract=off keeps a * b and a - b separate; on a device the _rn
// intrinsics do.
#pragma once
#include <cmath>
#include <cstdint>

#include "core/half.h"
#include "core/host_device.h"

namespace strata::rn {

STRATA_HD inline float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
STRATA_HD inline float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
STRATA_HD inline float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
STRATA_HD inline float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
// a * b + c with one rounding.
STRATA_HD inline float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
STRATA_HD inline float as_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return f32_from_bits(u);
#endif
}

}  // namespace strata::rn
