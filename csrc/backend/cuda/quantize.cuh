// Launcher of the MMQ gather: activation rows (optionally normed and picked by row index) quantized
// to q8_0 with the CPU's rule, bit for bit.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace strata::cuda {

void launch_quantize_q8_0(const float* x, const float* grs, const float* w, int64_t D, const int32_t* rows,
                          int64_t div, int64_t n, uint8_t* out, size_t out_row_bytes, cudaStream_t s);

}  // namespace strata::cuda
