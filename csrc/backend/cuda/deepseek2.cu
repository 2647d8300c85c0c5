// deepseek2's ops on CUDA (deepseek2.cuh). Each output element is computed the same way whatever T is (a
// row's norm by its own block, a token's rotation by its own threads, a token's routing by its own block),
// so the logits do not depend on the prompt's chunking; against the CPU's ops they agree within the op
// harness's bounds, and the router picks the same experts wherever its scores are not within rounding of
// a tie.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/deepseek2.cuh"
#include "core/error.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256, kNormThreads = 128, kRouterThreads = 256;

// Block r: the first D floats of row r (rows `stride` apart), in place.
__global__ void __launch_bounds__(kNormThreads)
    rms_norm_rows_kernel(float* x, int64_t D, int64_t stride, const float* w, float eps) {
  grid_start();
  __shared__ float red[kNormThreads / kWarp];
  float* v = x + blockIdx.x * stride;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) ss = __fadd_rn(ss, __fmul_rn(v[i], v[i]));
  ss = warp_sum(ss);
  if (threadIdx.x % kWarp == 0) red[threadIdx.x / kWarp] = ss;
  __syncthreads();
  float tot = 0.0f;
  for (int k = 0; k < kNormThreads / kWarp; ++k) tot = __fadd_rn(tot, red[k]);
  const float g = 1.0f / sqrtf(__fadd_rn(tot / static_cast<float>(D), eps));
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) v[i] = __fmul_rn(__fmul_rn(v[i], g), w[i]);
}

// Thread (t, h, i): pair (2i, 2i + 1) of head h of token t (each thread forms its own angle: the same
// float). x and y may be the same memory: each pair is read and written by one thread.
__global__ void __launch_bounds__(kThreads)
    rope_pairs_kernel(const float* x, int64_t x_row, int64_t x_head, float* y, int64_t y_row, int64_t y_head,
                      int64_t T, int64_t n_heads, int64_t n_pairs, const float* inv_freq, int64_t pos0,
                      const int32_t* pos_dev) {
  grid_start();
  if (pos_dev) pos0 += *pos_dev;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < T * n_heads * n_pairs;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t th = e / n_pairs, i = e % n_pairs, t = th / n_heads, h = th % n_heads;
    const float a = __fmul_rn(static_cast<float>(pos0 + t), inv_freq[i]);
    float sn, cs;
    sincosf(a, &sn, &cs);
    const float* xv = x + t * x_row + h * x_head + 2 * i;
    float* yv = y + t * y_row + h * y_head + 2 * i;
    const float x0 = xv[0], x1 = xv[1];
    yv[0] = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
    yv[1] = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, cs));
  }
}

// Block t: token t's routing (deepseek2_ops.h). Shared: p and s per expert, the eligible flags, the
// group scores.
__global__ void __launch_bounds__(kRouterThreads)
    router_grouped_kernel(const float* logits, int64_t E, int64_t K, bool sigmoid, const float* bias,
                          int64_t groups, int64_t groups_used, bool norm, float scale, int32_t* ids,
                          float* weights) {
  grid_start();
  __shared__ float p[kRouterGroupedMaxE], s[kRouterGroupedMaxE], gscore[kRouterGroupedMaxE / 2];
  __shared__ unsigned char ok[kRouterGroupedMaxE];
  __shared__ float rv[kRouterThreads / kWarp];
  __shared__ int ri[kRouterThreads / kWarp];
  const int64_t t = blockIdx.x;
  const float* lg = logits + t * E;
  const int tid = threadIdx.x;
  if (sigmoid) {
    for (int64_t i = tid; i < E; i += kRouterThreads) p[i] = 1.0f / __fadd_rn(1.0f, expf(-lg[i]));
  } else {
    // Softmax in the CPU's order: the max, then the sum of exp(l - max) by one thread in expert order.
    float mx = -INFINITY;
    for (int64_t i = tid; i < E; i += kRouterThreads) mx = fmaxf(mx, lg[i]);
    int unused = 0;
    block_best<kRouterThreads>(mx, unused, rv, ri);
    for (int64_t i = tid; i < E; i += kRouterThreads) p[i] = expf(__fsub_rn(lg[i], mx));
    __syncthreads();
    if (tid == 0) {
      float sum = 0.0f;
      for (int64_t i = 0; i < E; ++i) sum = __fadd_rn(sum, p[i]);
      rv[0] = sum;
    }
    __syncthreads();
    const float sum = rv[0];
    __syncthreads();
    for (int64_t i = tid; i < E; i += kRouterThreads) p[i] = __fdiv_rn(p[i], sum);
  }
  __syncthreads();
  for (int64_t i = tid; i < E; i += kRouterThreads) {
    s[i] = bias ? __fadd_rn(p[i], bias[i]) : p[i];
    ok[i] = groups > 1 ? 0 : 1;
  }
  __syncthreads();
  if (groups > 1) {
    const int64_t per = E / groups;
    for (int64_t g = tid; g < groups;
         g += kRouterThreads) {  // the sum of the group's two highest, highest first
      float a = -INFINITY, c = -INFINITY;
      for (int64_t i = g * per; i < (g + 1) * per; ++i) {
        if (s[i] > a) {
          c = a;
          a = s[i];
        } else if (s[i] > c) {
          c = s[i];
        }
      }
      gscore[g] = __fadd_rn(a, c);
    }
    __syncthreads();
    for (int64_t k = 0; k < groups_used; ++k) {  // the best group left, its experts eligible
      float v = -INFINITY;
      int idx = 0x7fffffff;
      for (int64_t g = tid; g < groups; g += kRouterThreads)
        if (ranks_before(gscore[g], (int)g, v, idx)) v = gscore[g], idx = (int)g;
      block_best<kRouterThreads>(v, idx, rv, ri);
      __syncthreads();
      if (tid == 0) gscore[idx] = -INFINITY;  // taken (a score of -inf itself ranks after every index)
      for (int64_t i = idx * per + tid; i < (idx + 1) * per; i += kRouterThreads) ok[i] = 1;
      __syncthreads();
    }
  }
  float sum = 0.0f;  // thread 0's
  for (int64_t k = 0; k < K; ++k) {
    float v = -INFINITY;
    int idx = 0x7fffffff;
    for (int64_t i = tid; i < E; i += kRouterThreads)
      if (ok[i] && ranks_before(s[i], (int)i, v, idx)) v = s[i], idx = (int)i;
    block_best<kRouterThreads>(v, idx, rv, ri);
    __syncthreads();
    if (tid == 0) {
      ids[t * K + k] = idx;
      ok[idx] = 0;
      sum = __fadd_rn(sum, p[idx]);
    }
    __syncthreads();
  }
  if (tid == 0) {
    const float div = fmaxf(sum, 6.103515625e-5f);
    for (int64_t k = 0; k < K; ++k) {
      const float pk = p[ids[t * K + k]];
      weights[t * K + k] = __fmul_rn(norm ? __fdiv_rn(pk, div) : pk, scale);
    }
  }
}

}  // namespace

void launch_rms_norm_rows(float* x, int64_t rows, int64_t D, int64_t stride, const float* w, float eps,
                          cudaStream_t s) {
  if (rows <= 0) return;
  launch_kernel(rms_norm_rows_kernel, grid_x(rows), kNormThreads, 0, s, x, D, stride, w, eps);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_rope_pairs(const float* x, int64_t x_row, int64_t x_head, float* y, int64_t y_row, int64_t y_head,
                       int64_t T, int64_t n_heads, int64_t n_pairs, const float* inv_freq, int64_t pos0,
                       const int32_t* pos_dev, cudaStream_t s) {
  if (T <= 0 || n_pairs <= 0 || n_heads <= 0) return;
  launch_kernel(rope_pairs_kernel, stride_blocks(T * n_heads * n_pairs, kThreads), kThreads, 0, s, x, x_row,
                x_head, y, y_row, y_head, T, n_heads, n_pairs, inv_freq, pos0, pos_dev);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_router_grouped(const float* logits, int64_t T, int64_t E, int64_t K, bool sigmoid,
                           const float* bias, int64_t groups, int64_t groups_used, bool norm, float scale,
                           int32_t* ids, float* weights, cudaStream_t s) {
  STRATA_CHECK(E >= 1 && E <= kRouterGroupedMaxE && K >= 1 && K <= E, UnsupportedError,
               "router_grouped on CUDA: ", E, " experts (top ", K, "); the kernel takes up to ",
               kRouterGroupedMaxE);
  if (T <= 0) return;
  launch_kernel(router_grouped_kernel, grid_x(T), kRouterThreads, 0, s, logits, E, K, sigmoid, bias, groups,
                groups_used, norm, scale, ids, weights);
  STRATA_CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
