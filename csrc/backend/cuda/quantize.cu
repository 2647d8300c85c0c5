// The MMQ gather on the device: rows of x (times grs and w when normed, picked by row index when
// indexed) quantized to q8_0 exactly as the CPU's quantize_row_q8_0 does, one warp per 32-block.
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/quantize.cuh"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;

// Blocks (output row, group of its 32-blocks), one warp per 32-block, one lane per element
// (q8_0_quantize_store).
__global__ void __launch_bounds__(kThreads)
    quantize_q8_0_kernel(const float* x, const float* grs, const float* w, int64_t D, const int32_t* rows,
                         int64_t div, uint8_t* out, size_t out_row_bytes) {
  grid_start();
  const int lane = threadIdx.x % kWarp;
  const int64_t i = blockIdx.x, s = rows ? rows[i] / div : i;
  const float* r = x + s * D;
  uint8_t* o = out + i * out_row_bytes;
  const float g = grs ? grs[s] : 0.0f;
  // Grid y spreads a row's blocks over kThreads / kWarp warps each: one block a warp in most rows.
  for (int64_t b = blockIdx.y * (int64_t)(blockDim.x / kWarp) + threadIdx.x / kWarp; b < D / 32;
       b += (int64_t)gridDim.y * (blockDim.x / kWarp)) {
    const int64_t c = b * 32 + lane;
    q8_0_quantize_store(o + b * kQ8_0Bytes, lane, grs ? __fmul_rn(__fmul_rn(r[c], g), w[c]) : r[c]);
  }
}

}  // namespace

void launch_quantize_q8_0(const float* x, const float* grs, const float* w, int64_t D, const int32_t* rows,
                          int64_t div, int64_t n, uint8_t* out, size_t out_row_bytes, cudaStream_t s) {
  STRATA_CHECK(D % 32 == 0, ConfigError, "quantize_q8_0: a row of ", D, " elements is not whole 32-blocks");
  STRATA_CHECK(out_row_bytes >= (size_t)(D / 32 * kQ8_0Bytes), ConfigError,
               "quantize_q8_0: out_row_bytes=", out_row_bytes, " is smaller than ", D / 32, " blocks");
  if (n <= 0 || D == 0) return;
  const unsigned per_row = (unsigned)std::min<int64_t>(ceil_div(D / 32, kThreads / kWarp), 65535);
  launch_kernel(quantize_q8_0_kernel, dim3(grid_x(n), per_row), kThreads, 0, s, x, grs, w, D, rows, div, out,
                out_row_bytes);
  STRATA_CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
