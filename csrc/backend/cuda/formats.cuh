// The CUDA backend's one list of weight formats and its type switch: every kernel family that reads
// weights (embed, dequant_rows, the GEMV and tensor-core matmuls) decodes them through quant/unit_decode.h's
// descriptions, the ones the CPU tests hold bit for bit against dequant_row. A new format is a line here,
// its decoder in quant/unit_decode_*.h and its file in matmul_instances/.
#pragma once
#include <cstdint>

#include "core/error.h"
#include "quant/quant.h"
#include "quant/unit_decode.h"

// Every format the CUDA backend reads: the float formats and the quantized ones, which all have
// integer kernels against q8_0 activations (STRATA_CUDA_MATMUL_Q8_FORMATS in matmul_kernels.cuh).
// clang-format off
#define STRATA_CUDA_QUANT_FORMATS(X) \
  X(Q8_0) \
  X(Q4_K) \
  X(Q6_K) \
  X(IQ2_XS) \
  X(Q2_K) \
  X(IQ2_XXS) \
  X(Q5_K) \
  X(Q3_K) \
  X(IQ4_XS) \
  X(MXFP4) \
  X(Q5_0) \
  X(Q4_0) \
  X(Q4_1) \
  X(Q5_1) \
  X(IQ4_NL) \
  X(IQ3_XXS) \
  X(IQ3_S) \
  X(IQ2_S) \
  X(IQ1_S) \
  X(IQ1_M)
#define STRATA_CUDA_FORMATS(X) \
  X(F32) \
  X(F16) \
  X(BF16) \
  STRATA_CUDA_QUANT_FORMATS(X)
// clang-format on

namespace strata::cuda {

// Calls fn(F{}) with the decoder (unit::F) of ggml type `type`; UnsupportedError naming `what` and the
// type otherwise (quant_traits' error for a type strata does not know at all).
template <class Fn>
void dispatch_format(uint32_t type, const char* what, Fn&& fn) {
  switch (static_cast<QType>(type)) {
#define STRATA_CASE(N) \
  case QType::N:       \
    return fn(unit::N{});
    STRATA_CUDA_FORMATS(STRATA_CASE)
#undef STRATA_CASE
    default:
      break;
  }
  const QuantTraits& q = quant_traits(type, what);  // throws for a type strata does not know
  throw UnsupportedError(str(what, ": the CUDA backend has no kernel for ggml type ", q.name));
}

}  // namespace strata::cuda
