// Elementwise kernels (add, SwiGLU, SwiGLU with its q8_0 rows) and the MoE combine, scatter_add: each token's
// rows are found by a stable sort by token (or, for a few rows, walked in order by every column's thread),
// then added in order of i as the CPU adds them (bit-identical, no atomics).
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/counting_sort.cuh"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/quantize.cuh"
#include "core/exp_portable.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;

unsigned elementwise_blocks(int64_t n) { return (unsigned)std::min<int64_t>(ceil_div(n, kThreads), 8192); }

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  grid_start();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    x[i] = __fadd_rn(x[i], y[i]);
}

// silu(g) * u, the CPU's bits: swiglu_portable (core/exp_portable.h).
__device__ __forceinline__ float swiglu_one(float x, float u) { return swiglu_portable(x, u); }
__global__ void swiglu_kernel(float* g, const float* u, int64_t n) {
  grid_start();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    g[i] = swiglu_one(g[i], u[i]);
}

// swiglu_kernel's values, then quantize_q8_0_kernel's steps on them (one warp per 32-block, a lane
// per element; none of those steps is an a * b + c that could be fused): block (row, group of the
// row's 32-blocks).
__global__ void __launch_bounds__(kThreads)
    swiglu_q8_0_kernel(float* g, const float* u, int64_t F, uint8_t* out, size_t out_row_bytes) {
  grid_start();
  const int lane = threadIdx.x % kWarp;
  const int64_t i = blockIdx.x;
  uint8_t* o = out + i * out_row_bytes;
  for (int64_t b = blockIdx.y * (int64_t)(blockDim.x / kWarp) + threadIdx.x / kWarp; b < F / 32;
       b += (int64_t)gridDim.y * (blockDim.x / kWarp)) {
    const int64_t c = i * F + b * 32 + lane;
    const float v = swiglu_one(g[c], u[c]);
    g[c] = v;
    q8_0_quantize_store(o + b * kQ8_0Bytes, lane, v);
  }
}

// Radix digit `shift` of the token of the row at position p of the previous pass (of row p itself
// in the first pass). Tokens are taken unsigned, so every row lands in a bin.
struct TokenDigit {
  const int32_t* rows;
  const int32_t* prev;  // nullptr: the identity
  int64_t K;
  int shift;
  __device__ int operator()(int64_t p) const {
    const int32_t i = prev ? prev[p] : (int32_t)p;
    return (int)(((uint32_t)(rows[i] / K) >> shift) & 0xFF);
  }
};
struct PrevItem {
  const int32_t* prev;
  __device__ int operator()(int64_t p) const { return prev ? prev[p] : (int)p; }
};

// perm = 0..n-1 stably sorted by token (rows[i] / K): least-significant-digit radix passes of 8
// bits, as many as the largest token needs, the last one landing in perm.
__global__ void __launch_bounds__(kSortThreads)
    sort_by_token_kernel(const int32_t* rows, int64_t K, int64_t n, int32_t* perm, int32_t* tmp,
                         bool parallel) {
  grid_start();
  extern __shared__ int smem[];
  __shared__ unsigned top;
  if (threadIdx.x == 0) top = 0;
  __syncthreads();
  unsigned mx = 0;
  for (int64_t p = threadIdx.x; p < n; p += blockDim.x) mx = max(mx, (uint32_t)(rows[p] / K));
  atomicMax(&top, mx);
  __syncthreads();
  int passes = 1;
  while (passes < 4 && (top >> (8 * passes)) != 0) ++passes;
  const int32_t* prev = nullptr;
  for (int k = 0; k < passes; ++k) {
    int32_t* dst = (passes - 1 - k) % 2 == 0 ? perm : tmp;
    block_counting_sort(n, 256, TokenDigit{rows, prev, K, 8 * k}, PrevItem{prev}, dst, nullptr, smem,
                        parallel);
    prev = dst;  // block_counting_sort ends with a barrier: dst is visible to the whole block
  }
}

// One block per sorted position; the first position of each token adds all of that token's rows,
// in order of i, into its output row, one thread per column.
__global__ void __launch_bounds__(kThreads)
    scatter_add_kernel(const float* y, const int32_t* rows, const float* w, int64_t K, int64_t n, int64_t D,
                       const int32_t* perm, float* out) {
  grid_start();
  const int64_t p = blockIdx.x;
  const int64_t tok = rows[perm[p]] / K;
  if (p > 0 && rows[perm[p - 1]] / K == tok) return;
  int64_t end = p + 1;
  while (end < n && rows[perm[end]] / K == tok) ++end;
  float* o = out + tok * D;
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
    float acc = o[c];
    for (int64_t q = p; q < end; ++q) {
      const int32_t i = perm[q];
      acc = __fadd_rn(acc, __fmul_rn(y[(int64_t)i * D + c], w[rows[i]]));  // o += y * w, as the CPU
    }
    o[c] = acc;
  }
}

// Few rows (a decode step's K): no sort; each thread owns a column of every output row and walks
// the rows in order of i, so each token's sum takes the same steps as scatter_add_kernel's.
constexpr int64_t kSmallScatter = 64;
__global__ void __launch_bounds__(kThreads)
    scatter_add_small_kernel(const float* y, const int32_t* rows, const float* w, int64_t K, int64_t n,
                             int64_t D, float* out) {
  grid_start();
  const int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (c >= D) return;
  // A batch of rows' products loaded before any output is written: their loads are in flight together.
  constexpr int kBatch = 8;
  for (int64_t i0 = 0; i0 < n; i0 += kBatch) {
    float p[kBatch];
    int32_t r[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      if (i0 + k < n) {
        r[k] = __ldg(rows + i0 + k);
        p[k] = __fmul_rn(__ldg(y + (i0 + k) * D + c), __ldg(w + r[k]));
      }
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      if (i0 + k < n) {
        float* o = out + (r[k] / K) * D + c;
        *o = __fadd_rn(*o, p[k]);
      }
  }
}

}  // namespace

void launch_add(float* x, const float* y, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  launch_kernel(add_kernel, elementwise_blocks(n), kThreads, 0, s, x, y, n);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_swiglu(float* g, const float* u, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  launch_kernel(swiglu_kernel, elementwise_blocks(n), kThreads, 0, s, g, u, n);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_swiglu_q8_0(float* g, const float* u, int64_t n, int64_t F, uint8_t* out, size_t out_row_bytes,
                        cudaStream_t s) {
  STRATA_CHECK(F % 32 == 0, ConfigError, "swiglu_q8_0: a row of ", F, " elements is not whole 32-blocks");
  STRATA_CHECK(out_row_bytes >= (size_t)(F / 32 * kQ8_0Bytes), ConfigError,
               "swiglu_q8_0: out_row_bytes=", out_row_bytes, " is smaller than ", F / 32, " blocks");
  if (n <= 0 || F == 0) return;
  const unsigned per_row = (unsigned)std::min<int64_t>(ceil_div(F / 32, kThreads / kWarp), 65535);
  launch_kernel(swiglu_q8_0_kernel, dim3(grid_x(n), per_row), kThreads, 0, s, g, u, F, out, out_row_bytes);
  STRATA_CUDA_LAUNCH_CHECK();
}

size_t scatter_add_scratch_bytes(int64_t n) { return (size_t)std::max<int64_t>(n, 0) * 2 * sizeof(int32_t); }

void launch_scatter_add(const float* y, const int32_t* rows, const float* w, int64_t K, int64_t n, int64_t D,
                        float* out, void* scratch, cudaStream_t s) {
  STRATA_CHECK(K >= 1, ConfigError, "scatter_add: K=", K, " must be at least 1");
  STRATA_CHECK(n < 0x7fffffff, ConfigError, "scatter_add: ", n, " rows exceed int32");
  if (n <= 0 || D <= 0) return;
  if (n <= kSmallScatter) {
    launch_kernel(scatter_add_small_kernel, grid_x(ceil_div(D, kThreads)), kThreads, 0, s, y, rows, w, K, n,
                  D, out);
    STRATA_CUDA_LAUNCH_CHECK();
    return;
  }
  int32_t* perm = static_cast<int32_t*>(scratch);
  const bool parallel = sort_parallel_for(256);
  launch_kernel(sort_by_token_kernel, 1, kSortThreads, counting_sort_smem(256, parallel), s, rows, K, n, perm,
                perm + n, parallel);
  STRATA_CUDA_LAUNCH_CHECK();
  launch_kernel(scatter_add_kernel, grid_x(n), kThreads, 0, s, y, rows, w, K, n, D, perm, out);
  STRATA_CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
