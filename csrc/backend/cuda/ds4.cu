// DeepSeek V4's ops on CUDA (ds4.cuh; backend/ds4_ops.h says what each computes). Each output is computed
// by its own thread or block the same way whatever T is and wherever its inputs live (a chunk or a ring),
// so the logits do not depend on the prompt's chunking. The products and sums the CPU forms one after
// another are formed here in the same order with unfused roundings (__fmul_rn, __fadd_rn), so the GR
// read and its q8_0 rows are the CPU's bits, and the indexer ranks the CPU's scores; sums the CPU forms
// over thousands of values (the norms' squares, softmax denominators of attention) are block sums in a
// fixed tree, within the op harness's bounds.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/ds4.cuh"
#include "backend/cuda/quantize.cuh"
#include "core/error.h"
#include "core/exp_portable.h"
#include "quant/formats.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256, kRowThreads = 128;

__device__ __forceinline__ float sigmoid(float v) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-v))); }

// The GR read's column c over HC streams at xs: (sum over j in order of xs[j D + c] g[j]) * w[c].
__device__ __forceinline__ float collapse(const float* xs, const float* g, const float* w, int64_t D,
                                          int64_t HC, int64_t c) {
  float acc = __fmul_rn(xs[c], g[0]);
  for (int64_t j = 1; j < HC; ++j) acc = __fadd_rn(acc, __fmul_rn(xs[j * D + c], g[j]));
  return __fmul_rn(acc, w[c]);
}

// The CPU's dot8 of a and b (eight lanes over the first n / 8 * 8 elements, a fixed reduction, the
// tail) by the eight lanes of a group (j = lane % 8, the whole warp converged): lane j forms the
// CPU's acc[j] over elements j, j + 8, .., the xor shuffles by 4, 2 and 1 add them in dot8's tree
// ((0+4)+(2+6)) + ((1+5)+(3+7)), each lane adds the tail. Bit for bit dot8, in every lane of the group.
__device__ __forceinline__ float dot8_group(const float* __restrict__ a, const float* __restrict__ b,
                                            int64_t n, int j) {
  const int64_t n8 = n / 8 * 8;
  float acc = 0.0f;
#pragma unroll 8
  for (int64_t i = j; i < n8; i += 8) acc = __fadd_rn(acc, __fmul_rn(a[i], b[i]));
  acc = __fadd_rn(acc, __shfl_xor_sync(kFullMask, acc, 4));
  acc = __fadd_rn(acc, __shfl_xor_sync(kFullMask, acc, 2));
  acc = __fadd_rn(acc, __shfl_xor_sync(kFullMask, acc, 1));
  for (int64_t i = n8; i < n; ++i) acc = __fadd_rn(acc, __fmul_rn(a[i], b[i]));
  return acc;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = blockDim.x / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < nwarps ? scratch[lane] : -INFINITY;
    v = warp_max(v);
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  return scratch[0];
}

// Exclusive prefix sum of v over the block (whole warps); *total gets the sum. scratch: 32 ints.
__device__ __forceinline__ int block_scan(int v, int* scratch, int* total) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = blockDim.x / kWarp;
  int inc = v;
  for (int o = 1; o < kWarp; o <<= 1) {
    const int n = __shfl_up_sync(kFullMask, inc, o);
    if (lane >= o) inc += n;
  }
  __syncthreads();
  if (lane == kWarp - 1) scratch[warp] = inc;
  __syncthreads();
  int before = 0, all = 0;
  for (int w = 0; w < nwarps; ++w) {
    if (w < warp) before += scratch[w];
    all += scratch[w];
  }
  *total = all;
  return before + inc - v;
}

// Block (i, y): columns y * blockDim .. of row i (one token's row spans D / blockDim blocks).
__global__ void __launch_bounds__(kRowThreads)
    apply_norm_hc_kernel(const float* x, const float* grs, const float* w, int64_t D, int64_t HC,
                         const int32_t* rows, int64_t div, float* out) {
  grid_start();
  const int64_t i = blockIdx.x, s = rows ? rows[i] / div : i,
                c = blockIdx.y * (int64_t)blockDim.x + threadIdx.x;
  if (c < D) out[i * D + c] = collapse(x + s * HC * D, grs + s * HC, w, D, HC, c);
}

// Block (i, y), warp w: q8_0 block y * warps + w of row i.
__global__ void __launch_bounds__(kRowThreads)
    quantize_q8_0_hc_kernel(const float* x, const float* grs, const float* w, int64_t D, int64_t HC,
                            const int32_t* rows, int64_t div, uint8_t* out, size_t rb) {
  grid_start();
  const int64_t i = blockIdx.x, s = rows ? rows[i] / div : i;
  const int64_t b = blockIdx.y * (int64_t)(blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (b >= D / kQK8_0) return;  // whole warps
  const int lane = threadIdx.x % kWarp;
  q8_0_quantize_store(out + i * rb + b * kQ8_0Bytes, lane,
                      collapse(x + s * HC * D, grs + s * HC, w, D, HC, b * kQK8_0 + lane));
}

// Token t's mixing weights from its mix row mt scaled by r, into g (HC), post (HC) and comb (HC x HC):
// one thread, in the CPU's order. kHC > 0: HC is kHC and the arrays live in registers (the Sinkhorn
// iterations are V4's decode-critical serial part); kHC == 0: any HC <= kHcMax, in local memory.
template <int kHC>
__device__ __forceinline__ void hc_weights(const float* mt, float r, int64_t HC_, const float* scale,
                                           const float* base, float hc_eps, int64_t iters, float* g,
                                           float* post, float* comb) {
  constexpr int kN = kHC > 0 ? kHC : static_cast<int>(kHcMax);
  const int HC = kHC > 0 ? kHC : static_cast<int>(HC_);
  float c[kN * kN];
#pragma unroll
  for (int j = 0; j < HC; ++j)
    g[j] = __fadd_rn(sigmoid(__fadd_rn(__fmul_rn(__fmul_rn(mt[j], r), scale[0]), base[j])), hc_eps);
  if (post) {
#pragma unroll
    for (int j = 0; j < HC; ++j)
      post[j] =
          __fmul_rn(2.0f, sigmoid(__fadd_rn(__fmul_rn(__fmul_rn(mt[HC + j], r), scale[1]), base[HC + j])));
  }
  if (!comb) return;
#pragma unroll
  for (int j = 0; j < HC; ++j) {
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < HC; ++k) {
      c[j * kN + k] =
          __fadd_rn(__fmul_rn(__fmul_rn(mt[2 * HC + j * HC + k], r), scale[2]), base[2 * HC + j * HC + k]);
      mx = fmaxf(mx, c[j * kN + k]);
    }
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < HC; ++k) {
      c[j * kN + k] = expf(__fsub_rn(c[j * kN + k], mx));
      sum = __fadd_rn(sum, c[j * kN + k]);
    }
#pragma unroll
    for (int k = 0; k < HC; ++k) c[j * kN + k] = __fadd_rn(__fdiv_rn(c[j * kN + k], sum), hc_eps);
  }
  // Each line of c divided by its sum (+ hc_eps), the sum in the line's order: the columns (line 1, element
  // kN: a column's elements kN apart) or the rows (the transpose).
  auto normalize = [&](int line, int elem) {
#pragma unroll
    for (int a = 0; a < HC; ++a) {
      float sum = 0.0f;
#pragma unroll
      for (int b = 0; b < HC; ++b) sum = __fadd_rn(sum, c[a * line + b * elem]);
      const float den = __fadd_rn(sum, hc_eps);
#pragma unroll
      for (int b = 0; b < HC; ++b) c[a * line + b * elem] = __fdiv_rn(c[a * line + b * elem], den);
    }
  };
  normalize(1, kN);
  for (int64_t it = 1; it < iters; ++it) {
    normalize(kN, 1);
    normalize(1, kN);
  }
#pragma unroll
  for (int j = 0; j < HC; ++j)
#pragma unroll
    for (int k = 0; k < HC; ++k) comb[j * HC + k] = c[j * kN + k];
}

// Block t: token t's mixing weights (thread 0: hc_weights), the RMS sums by the whole block.
template <int kHC>
__global__ void __launch_bounds__(kThreads)
    hc_pre_kernel(const float* mix, const float* x, int64_t HC, int64_t D, float eps, const float* scale,
                  const float* base, float hc_eps, int64_t iters, float* grs, float* post, float* comb) {
  grid_start();
  __shared__ float red[kWarp], g[kHcMax];
  const int64_t t = blockIdx.x, M = comb ? (2 + HC) * HC : HC;
  const float* xt = x + t * HC * D;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < HC * D; i += blockDim.x) ss = __fadd_rn(ss, __fmul_rn(xt[i], xt[i]));
  ss = block_sum(ss, red);
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, static_cast<float>(HC * D)), eps)));
  if (threadIdx.x == 0)
    hc_weights<kHC>(mix + t * M, r, HC, scale, base, hc_eps, iters, g, post ? post + t * HC : nullptr,
                    comb ? comb + t * HC * HC : nullptr);
  __syncthreads();
  // The RMS scale of the collapsed input, folded into the collapse weights.
  float cs = 0.0f;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float v = __fmul_rn(xt[d], g[0]);
    for (int64_t j = 1; j < HC; ++j) v = __fadd_rn(v, __fmul_rn(xt[j * D + d], g[j]));
    cs = __fadd_rn(cs, __fmul_rn(v, v));
  }
  cs = block_sum(cs, red);
  const float rr = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(cs, static_cast<float>(D)), eps)));
  if (threadIdx.x < HC) grs[t * HC + threadIdx.x] = __fmul_rn(g[threadIdx.x], rr);
}

// hc_weights for HC = 4 on the 32 lanes of a warp: lane L (and L + 16, its twin) holds c[j][k], j = L / 4,
// k = L % 4 of the 4 x 4 Sinkhorn matrix, so each normalization is one division a lane after the line's
// sum, which every lane of the line forms from the line's four values in the CPU's order. The float
// operations are hc_weights<4>'s, in its order: the same bits.
__device__ __forceinline__ void hc_weights_warp4(const float* mt, float r, const float* scale,
                                                 const float* base, float hc_eps, int64_t iters, float* g,
                                                 float* post, float* comb) {
  constexpr int HC = 4;
  const int e = threadIdx.x & 15, j = e >> 2, k = e & 3, lane = threadIdx.x & 31;
  if (lane < HC) {
    g[lane] = __fadd_rn(sigmoid(__fadd_rn(__fmul_rn(__fmul_rn(mt[lane], r), scale[0]), base[lane])), hc_eps);
    if (post)
      post[lane] = __fmul_rn(
          2.0f, sigmoid(__fadd_rn(__fmul_rn(__fmul_rn(mt[HC + lane], r), scale[1]), base[HC + lane])));
  }
  if (!comb) return;
  float c = __fadd_rn(__fmul_rn(__fmul_rn(mt[2 * HC + e], r), scale[2]), base[2 * HC + e]);
  float mx = fmaxf(c, __shfl_xor_sync(kFullMask, c, 1));  // the row's max (fmaxf: any order)
  mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 2));
  c = expf(__fsub_rn(c, mx));
  // The sum of row j's (stride 1) or column k's (stride 4) four values from 0.0f, in order.
  auto line_sum = [&](int first, int stride) {
    float sum = 0.0f;
#pragma unroll
    for (int b = 0; b < HC; ++b)
      sum = __fadd_rn(sum, __shfl_sync(kFullMask, c, (threadIdx.x & 16) + first + b * stride));
    return sum;
  };
  c = __fadd_rn(__fdiv_rn(c, line_sum(4 * j, 1)), hc_eps);
  auto by_columns = [&] { c = __fdiv_rn(c, __fadd_rn(line_sum(k, 4), hc_eps)); };
  auto by_rows = [&] { c = __fdiv_rn(c, __fadd_rn(line_sum(4 * j, 1), hc_eps)); };
  by_columns();
  for (int64_t it = 1; it < iters; ++it) {
    by_rows();
    by_columns();
  }
  if (lane < 16) comb[e] = c;
}

// hc_pre for HC = 4 and D a multiple of 4 (x 16-byte aligned), block t: the RMS sums read the token's
// streams as float4, eight loads a thread in flight; warp 0 forms the mixing weights (hc_weights_warp4).
// The block sums' order differs from hc_pre_kernel's (both fixed, each token alone: any T gives a token
// the same bits); the mixing weights' operations are the same.
__global__ void __launch_bounds__(kThreads)
    hc_pre4_kernel(const float* mix, const float* x, int64_t D, float eps, const float* scale,
                   const float* base, float hc_eps, int64_t iters, float* grs, float* post, float* comb) {
  grid_start();
  constexpr int HC = 4, kLoads = 8;
  __shared__ float red[kWarp], g[HC];
  const int64_t t = blockIdx.x, M = comb ? (2 + HC) * HC : HC, nq = D / 4;
  const float4* x4 = reinterpret_cast<const float4*>(x + t * HC * D);
  auto sq = [](float acc, float4 v) {
    acc = __fadd_rn(acc, __fmul_rn(v.x, v.x));
    acc = __fadd_rn(acc, __fmul_rn(v.y, v.y));
    acc = __fadd_rn(acc, __fmul_rn(v.z, v.z));
    return __fadd_rn(acc, __fmul_rn(v.w, v.w));
  };
  float ss = 0.0f;
  for (int64_t i0 = threadIdx.x; i0 < HC * nq; i0 += kLoads * kThreads) {
    float4 v[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u)
      if (i0 + u * kThreads < HC * nq) v[u] = x4[i0 + u * kThreads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u)
      if (i0 + u * kThreads < HC * nq) ss = sq(ss, v[u]);
  }
  ss = block_sum(ss, red);
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, static_cast<float>(HC * D)), eps)));
  if (threadIdx.x < kWarp)
    hc_weights_warp4(mix + t * M, r, scale, base, hc_eps, iters, g, post ? post + t * HC : nullptr,
                     comb ? comb + t * HC * HC : nullptr);
  __syncthreads();
  const float g0 = g[0], g1 = g[1], g2 = g[2], g3 = g[3];
  // A column's collapse as collapse() forms it: x0 g0 + x1 g1 + x2 g2 + x3 g3, left to right.
  auto col = [&](float a, float b, float c, float d) {
    float v = __fmul_rn(a, g0);
    v = __fadd_rn(v, __fmul_rn(b, g1));
    v = __fadd_rn(v, __fmul_rn(c, g2));
    return __fadd_rn(v, __fmul_rn(d, g3));
  };
  float cs = 0.0f;
  constexpr int kQuads = kLoads / HC;  // column quads a round: HC loads each
  for (int64_t q0 = threadIdx.x; q0 < nq; q0 += kQuads * kThreads) {
    float4 v[kQuads][HC];
#pragma unroll
    for (int u = 0; u < kQuads; ++u)
      if (q0 + u * kThreads < nq) {
#pragma unroll
        for (int s = 0; s < HC; ++s) v[u][s] = x4[s * nq + q0 + u * kThreads];
      }
#pragma unroll
    for (int u = 0; u < kQuads; ++u)
      if (q0 + u * kThreads < nq) {
        const float a = col(v[u][0].x, v[u][1].x, v[u][2].x, v[u][3].x);
        const float b = col(v[u][0].y, v[u][1].y, v[u][2].y, v[u][3].y);
        const float c = col(v[u][0].z, v[u][1].z, v[u][2].z, v[u][3].z);
        const float d = col(v[u][0].w, v[u][1].w, v[u][2].w, v[u][3].w);
        cs = __fadd_rn(cs, __fmul_rn(a, a));
        cs = __fadd_rn(cs, __fmul_rn(b, b));
        cs = __fadd_rn(cs, __fmul_rn(c, c));
        cs = __fadd_rn(cs, __fmul_rn(d, d));
      }
  }
  cs = block_sum(cs, red);
  const float rr = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(cs, static_cast<float>(D)), eps)));
  if (threadIdx.x < HC) grs[t * HC + threadIdx.x] = __fmul_rn(g[threadIdx.x], rr);
}

// Block (t, m): mix[t, m] = fn[m, :] . x[t, :]; thread i sums k = i, i + blockDim, .. (float4 where both
// rows are 16-byte aligned), then the block's fixed tree: the same float operations whatever T.
__global__ void __launch_bounds__(kThreads)
    hc_mix_kernel(const float* fn, int64_t M, int64_t K, const float* x, float* mix, bool vec) {
  grid_start();
  __shared__ float red[kWarp];
  const int64_t t = blockIdx.y, m = blockIdx.x;
  const float* w = fn + m * K;
  const float* xt = x + t * K;
  float acc = 0.0f;
  if (vec) {
    const float4* w4 = reinterpret_cast<const float4*>(w);
    const float4* x4 = reinterpret_cast<const float4*>(xt);
    for (int64_t i = threadIdx.x; i < K / 4; i += blockDim.x) {
      const float4 a = __ldg(w4 + i), b = x4[i];
      acc = fmaf(a.x, b.x, acc);
      acc = fmaf(a.y, b.y, acc);
      acc = fmaf(a.z, b.z, acc);
      acc = fmaf(a.w, b.w, acc);
    }
  } else {
    for (int64_t i = threadIdx.x; i < K; i += blockDim.x) acc = fmaf(w[i], xt[i], acc);
  }
  acc = block_sum(acc, red);
  if (threadIdx.x == 0) mix[t * M + m] = acc;
}

// Thread (t, d): column d of token t's streams, in place.
__global__ void __launch_bounds__(kThreads)
    hc_post_kernel(float* x, const float* y, const float* post, const float* comb, int64_t T, int64_t HC,
                   int64_t D) {
  grid_start();
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < T * D;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t = e / D, d = e % D;
    float* xt = x + t * HC * D;
    const float* p = post + t * HC;
    const float* cm = comb + t * HC * HC;
    float old[kHcMax];
    for (int64_t j = 0; j < HC; ++j) old[j] = xt[j * D + d];
    const float yv = y[t * D + d];
    for (int64_t k = 0; k < HC; ++k) {
      float v = __fmul_rn(yv, p[k]);
      for (int64_t j = 0; j < HC; ++j) v = __fadd_rn(v, __fmul_rn(old[j], cm[j * HC + k]));
      xt[k * D + d] = v;
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    hc_expand_kernel(const float* y, int64_t T, int64_t HC, int64_t D, float* x) {
  grid_start();
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < T * HC * D;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t = e / (HC * D), d = e % D;
    x[e] = y[t * D + d];
  }
}

__global__ void __launch_bounds__(kRowThreads)
    rms_norm_kernel(float* x, int64_t D, const float* w, float eps) {
  grid_start();
  __shared__ float red[kWarp];
  float* v = x + blockIdx.x * D;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) ss = __fadd_rn(ss, __fmul_rn(v[i], v[i]));
  ss = block_sum(ss, red);
  const float g = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, static_cast<float>(D)), eps)));
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x)
    v[i] = w ? __fmul_rn(__fmul_rn(v[i], g), w[i]) : __fmul_rn(v[i], g);
}

// Thread (r, h, i): pair i of head h of row r (each thread forms its own angle: the same float).
__global__ void __launch_bounds__(kThreads)
    rope_tail_kernel(float* x, int64_t rows, int64_t n_heads, int64_t hd, int64_t n_pairs,
                     const float* inv_freq, float mscale, int64_t pos0, const int32_t* pos_dev,
                     int64_t pos_step, bool inverse) {
  grid_start();
  if (pos_dev) pos0 += *pos_dev;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < rows * n_heads * n_pairs;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t rh = e / n_pairs, i = e % n_pairs, r = rh / n_heads;
    const float theta = __fmul_rn(static_cast<float>(pos0 + r * pos_step), inv_freq[i]);
    float sn, cs;
    sincosf(theta, &sn, &cs);
    cs = __fmul_rn(cs, mscale);
    sn = __fmul_rn(__fmul_rn(sn, mscale), inverse ? -1.0f : 1.0f);
    float* v = x + rh * hd + hd - 2 * n_pairs + 2 * i;
    const float x0 = v[0], x1 = v[1];
    v[0] = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
    v[1] = __fadd_rn(__fmul_rn(x1, cs), __fmul_rn(x0, sn));
  }
}

__global__ void __launch_bounds__(kThreads)
    ring_store_kernel(float* ring, int64_t slots, int64_t width, int64_t p0, int64_t n, int64_t pos0,
                      const int32_t* pos_dev, const float* src) {
  grid_start();
  if (pos_dev) p0 += *pos_dev, pos0 += *pos_dev;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n * width;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t p = p0 + e / width, c = e % width;
    ring[(p % slots) * width + c] = src[(p - pos0) * width + c];
  }
}

// Thread (window w - first, d).
__global__ void __launch_bounds__(kThreads)
    compress_pool_kernel(const float* kv, const float* score, const float* state_kv, const float* state_score,
                         const float* ape, int64_t pos0, const int32_t* pos_dev, int64_t first, int64_t n_win,
                         int64_t ratio, int64_t lanes, int64_t hd, float* out) {
  grid_start();
  // With a device position (one token): the window that closes at it, if one does (else nothing).
  if (pos_dev) {
    pos0 += *pos_dev;
    if ((pos0 + 1) % ratio != 0) return;
    first = (pos0 + 1) / ratio - 1;
  }
  const int64_t width = lanes * hd, slots = lanes * ratio;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n_win * hd;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t w = first + e / hd, d = e % hd;
    // The window's slots in order: the previous window's (lanes 2, w > 0; column 0), then its own.
    const int64_t n_prev = lanes == 2 && w > 0 ? ratio : 0, own_col = lanes == 2 ? hd : 0;
    auto slot = [&](int64_t k, int64_t& q, int64_t& col, int64_t& i) {
      if (k < n_prev) {
        q = (w - 1) * ratio + k, col = 0, i = k;
      } else {
        q = w * ratio + (k - n_prev), col = own_col, i = k - n_prev;
      }
    };
    auto sc_at = [&](int64_t q, int64_t col, int64_t i) {
      const float* sr = q >= pos0 ? score + (q - pos0) * width : state_score + (q % slots) * width;
      return __fadd_rn(sr[col + d], ape[i * width + col + d]);
    };
    float mx = -INFINITY;
    for (int64_t k = 0; k < n_prev + ratio; ++k) {
      int64_t q, col, i;
      slot(k, q, col, i);
      mx = fmaxf(mx, sc_at(q, col, i));
    }
    float sum = 0.0f, acc = 0.0f;
    for (int64_t k = 0; k < n_prev + ratio; ++k) {
      int64_t q, col, i;
      slot(k, q, col, i);
      const float p = expf(__fsub_rn(sc_at(q, col, i), mx));
      const float* vr = q >= pos0 ? kv + (q - pos0) * width : state_kv + (q % slots) * width;
      sum = __fadd_rn(sum, p);
      acc = __fadd_rn(acc, __fmul_rn(p, vr[col + d]));
    }
    out[(w - first) * hd + d] = __fdiv_rn(acc, sum);
  }
}

// rows[w] = row for the window w that closes at the position (one token; pos0, plus the device's), if one
// does.
__global__ void __launch_bounds__(kThreads)
    window_commit_kernel(const float* row, float* rows, int64_t hd, int64_t ratio, int64_t pos0,
                         const int32_t* pos_dev) {
  grid_start();
  const int64_t p = pos0 + (pos_dev ? *pos_dev : 0);
  if ((p + 1) % ratio != 0) return;
  float* dst = rows + ((p + 1) / ratio - 1) * hd;
  for (int64_t d = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; d < hd;
       d += (int64_t)gridDim.x * blockDim.x)
    dst[d] = row[d];
}

constexpr int kAttnThreads = 256;

// The keys token t (at pos0 + t) attends to, their rows' pointers into keys (the block's shared memory, each
// thread a stride; the caller's barrier follows): its window (this chunk's rows from kv, earlier ones from
// the ring win), then the compressed rows, the selected ones (sel's row up to its first -1) or all visible.
// Returns how many.
__device__ __forceinline__ int64_t sink_keys(const float** keys, int64_t t, int64_t pos0, const float* kv,
                                             const float* win, int64_t window, const float* comp,
                                             int64_t ratio, const int32_t* sel, int64_t topk, int64_t hd) {
  const int64_t p = pos0 + t, j0 = p - window + 1 > 0 ? p - window + 1 : 0, n_win = p - j0 + 1;
  int64_t n_comp = 0;
  if (ratio > 0) {
    if (sel) {
      while (n_comp < topk && sel[t * topk + n_comp] >= 0) ++n_comp;
    } else {
      n_comp = (p + 1) / ratio;
    }
  }
  const int64_t nk = n_win + n_comp;
  for (int64_t k = threadIdx.x; k < nk; k += blockDim.x) {
    if (k < n_win) {
      const int64_t j = j0 + k;
      keys[k] = j >= pos0 ? kv + (j - pos0) * hd : win + (j % window) * hd;
    } else {
      keys[k] = comp + (sel ? sel[t * topk + (k - n_win)] : k - n_win) * hd;
    }
  }
  return nk;
}

// Block (t, head group): HB heads of token t. The keys a token sees are the same for all its heads,
// so a block reads them once for its heads (from L2, where a block a head read them 64 times over). Each
// head's operations do not depend on HB (which heads share a block), so neither do the bits: a decode
// step's few tokens may take fewer heads a block, more blocks (sink_heads). Its
// keys' pointers, the heads' queries and their logits sit in dynamic shared memory (launch_attention_sink
// sizes it). A group of eight lanes forms a key's logits for the block's heads, each the CPU's dot8 (lane j
// adds elements j, j + 8, .. in order, xor shuffles 4, 2, 1, the tail), the key's elements loaded into
// registers kSinkMaxPer at a time (one memory round trip a key up to 512 dims); each head's denominator adds
// in key order, as the CPU does; each key's weight is divided once, then a thread's two columns sum the keys
// in order, sixteen keys' rows at a time.
constexpr int kSinkHeads = 4, kSinkMaxPer = 64;  // the most heads a block; elements a lane holds of a key

// Heads a block of attention_sink takes: STRATA_CUDA_SINK_HEADS (1, 2 or 4; default 1), for the A/B of
// a decode step (T = 1: 64 heads are 64 blocks at 1, 16 at 4). The same bits either way. Measured on an
// H100 (V4 Flash shape, all resident, tg32): 1 head a block 7.64 ms a token, 4 heads 8.24.
int sink_heads() {
  static const int n = [] {
    const char* e = std::getenv("STRATA_CUDA_SINK_HEADS");
    if (!e || !*e) return 1;
    STRATA_CHECK(std::strcmp(e, "1") == 0 || std::strcmp(e, "2") == 0 || std::strcmp(e, "4") == 0,
                 ConfigError, "STRATA_CUDA_SINK_HEADS=", e, " is not 1, 2 or 4");
    return e[0] - '0';
  }();
  return n;
}

template <int HB>
__global__ void __launch_bounds__(kAttnThreads)
    attention_sink_kernel(const float* q, const float* kv, const float* win, int64_t window,
                          const float* comp, int64_t ratio, const int32_t* sel, int64_t topk,
                          const float* sinks, int64_t pos0, const int32_t* pos_dev, int64_t H, int64_t hd,
                          float scale, float* out) {
  grid_start();
  extern __shared__ __align__(16) unsigned char ds4_smem[];
  __shared__ float red[kWarp], ms[HB], dens[HB];
  if (pos_dev) pos0 += *pos_dev;
  const int64_t hgroups = (H + HB - 1) / HB, t = blockIdx.x / hgroups, h0 = blockIdx.x % hgroups * HB,
                nh = H - h0 < HB ? H - h0 : HB;
  const float** keys = reinterpret_cast<const float**>(ds4_smem);
  const int64_t nk = sink_keys(keys, t, pos0, kv, win, window, comp, ratio, sel, topk, hd);
  float* qs = reinterpret_cast<float*>(ds4_smem + nk * sizeof(const float*));  // HB x hd
  float* lg = qs + HB * hd;                                                    // HB x nk
  for (int64_t e = threadIdx.x; e < HB * hd; e += blockDim.x) {  // a missing head repeats the last one
    const int64_t hh = e / hd < nh ? e / hd : nh - 1;
    qs[e] = q[(t * H + h0 + hh) * hd + e % hd];
  }
  __syncthreads();
  {  // the logits: warp w's groups take keys w * 4 .., every lane of a warp in the loop together
    const int lane = threadIdx.x % kWarp, groups = blockDim.x / 8, j = lane % 8;
    const int64_t n8 = hd / 8 * 8, per = n8 / 8;
    for (int64_t base = threadIdx.x / kWarp * (kWarp / 8); base < nk; base += groups) {
      const int64_t k = base + lane / 8;
      const float* b = keys[k < nk ? k : 0];
      float accs[HB] = {};
      for (int64_t c0 = 0; c0 < per; c0 += kSinkMaxPer) {  // one pass up to 512 dims
        float kr[kSinkMaxPer];
#pragma unroll
        for (int i = 0; i < kSinkMaxPer; ++i)
          if (c0 + i < per) kr[i] = b[j + 8 * (c0 + i)];
#pragma unroll
        for (int hh = 0; hh < HB; ++hh) {
          const float* a = qs + hh * hd + j + 8 * c0;
#pragma unroll
          for (int i = 0; i < kSinkMaxPer; ++i)
            if (c0 + i < per) accs[hh] = __fadd_rn(accs[hh], __fmul_rn(a[8 * i], kr[i]));
        }
      }
#pragma unroll
      for (int hh = 0; hh < HB; ++hh) {
        const float* a = qs + hh * hd;
        float acc = accs[hh];
        acc = __fadd_rn(acc, __shfl_xor_sync(kFullMask, acc, 4));
        acc = __fadd_rn(acc, __shfl_xor_sync(kFullMask, acc, 2));
        acc = __fadd_rn(acc, __shfl_xor_sync(kFullMask, acc, 1));
        for (int64_t i = n8; i < hd; ++i) acc = __fadd_rn(acc, __fmul_rn(a[i], b[i]));
        if (k < nk && j == 0) lg[hh * nk + k] = __fmul_rn(acc, scale);
      }
    }
  }
  __syncthreads();
  for (int hh = 0; hh < HB; ++hh) {
    float m = sinks[h0 + (hh < nh ? hh : nh - 1)];
    for (int64_t k = threadIdx.x; k < nk; k += blockDim.x) m = fmaxf(m, lg[hh * nk + k]);
    m = block_max(m, red);  // exact in any order
    if (threadIdx.x == 0) ms[hh] = m;
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < HB * nk; e += blockDim.x) lg[e] = expf(__fsub_rn(lg[e], ms[e / nk]));
  __syncthreads();
  if (threadIdx.x < HB) {  // each head's denominator in key order, as the CPU adds it
    const int hh = threadIdx.x;
    float den = expf(__fsub_rn(sinks[h0 + (hh < nh ? hh : nh - 1)], ms[hh]));
    for (int64_t k = 0; k < nk; ++k) den = __fadd_rn(den, lg[hh * nk + k]);
    dens[hh] = den;
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < HB * nk; e += blockDim.x) lg[e] = __fdiv_rn(lg[e], dens[e / nk]);
  __syncthreads();
  constexpr int kKeys = 16;
  for (int64_t d0 = threadIdx.x; d0 < hd; d0 += 2 * blockDim.x) {  // columns d0 and d1 = d0 + blockDim
    const int64_t d1 = d0 + blockDim.x < hd ? d0 + blockDim.x : d0;
    float acc0[HB], acc1[HB];
#pragma unroll
    for (int hh = 0; hh < HB; ++hh) acc0[hh] = acc1[hh] = 0.0f;
    int64_t k = 0;
    for (; k + kKeys <= nk; k += kKeys) {
      float v0[kKeys], v1[kKeys];
#pragma unroll
      for (int i = 0; i < kKeys; ++i) {
        v0[i] = keys[k + i][d0];
        v1[i] = keys[k + i][d1];
      }
#pragma unroll
      for (int i = 0; i < kKeys; ++i)
#pragma unroll
        for (int hh = 0; hh < HB; ++hh) {
          const float w = lg[hh * nk + k + i];
          acc0[hh] = __fadd_rn(acc0[hh], __fmul_rn(w, v0[i]));
          acc1[hh] = __fadd_rn(acc1[hh], __fmul_rn(w, v1[i]));
        }
    }
    for (; k < nk; ++k) {
      const float x0 = keys[k][d0], x1 = keys[k][d1];
#pragma unroll
      for (int hh = 0; hh < HB; ++hh) {
        const float w = lg[hh * nk + k];
        acc0[hh] = __fadd_rn(acc0[hh], __fmul_rn(w, x0));
        acc1[hh] = __fadd_rn(acc1[hh], __fmul_rn(w, x1));
      }
    }
#pragma unroll
    for (int hh = 0; hh < HB; ++hh) {
      if (hh >= nh) break;
      float* o = out + (t * H + h0 + hh) * hd;
      o[d0] = acc0[hh];
      if (d1 != d0) o[d1] = acc1[hh];
    }
  }
}

// The score's order as an unsigned key: a larger float, a larger key (scores are never -0 or NaN).
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

constexpr int kIdxThreads = 1024, kIdxTile = 4096;

// Block t: the scores of the visible compressed rows (dynamic shared memory, one key each), the
// topk-th largest by a radix select over the keys, then the picked rows in ascending order: every
// key above it, and of those equal to it the lowest rows first (the CPU's ties to the lower row).
// The scores go a tile of rows at a time: a group of eight lanes per (row, head) forms the CPU's dot8
// (dot8_group), then a thread per row adds its heads in order, as the CPU does.
__global__ void __launch_bounds__(kIdxThreads)
    indexer_topk_kernel(const float* q, const float* w, const float* keys, int64_t pos0,
                        const int32_t* pos_dev, int64_t n_heads, int64_t dim, int64_t ratio, int64_t topk,
                        float scale, int32_t* sel) {
  grid_start();
  if (pos_dev) pos0 += *pos_dev;
  extern __shared__ __align__(16) unsigned char ds4_smem[];
  __shared__ int hist[256], scan[kWarp];
  __shared__ uint32_t s_prefix;
  __shared__ int s_want;
  __shared__ float dots[kIdxTile];
  uint32_t* key = reinterpret_cast<uint32_t*>(ds4_smem);
  const int64_t t = blockIdx.x, n_vis = (pos0 + t + 1) / ratio, k = topk < n_vis ? topk : n_vis;
  int32_t* st = sel + t * topk;
  // Every visible row picked (topk covers them: a context below topk x ratio): the picks are the rows in
  // order whatever their scores, which are then not formed.
  if (k == n_vis) {
    for (int64_t i = threadIdx.x; i < topk; i += blockDim.x) st[i] = i < n_vis ? static_cast<int32_t>(i) : -1;
    return;
  }
  for (int64_t i = threadIdx.x; i < topk; i += blockDim.x) st[i] = -1;
  const int lane = threadIdx.x % kWarp, groups = blockDim.x / 8;
  const float* qt = q + t * n_heads * dim;
  const float* wt = w + t * n_heads;
  const int64_t tile_rows = kIdxTile / n_heads;
  for (int64_t s0 = 0; s0 < n_vis; s0 += tile_rows) {
    const int64_t rows = n_vis - s0 < tile_rows ? n_vis - s0 : tile_rows, pairs = rows * n_heads;
    for (int64_t base = threadIdx.x / kWarp * (kWarp / 8); base < pairs; base += groups) {
      const int64_t e = base + lane / 8, ee = e < pairs ? e : 0, r = ee / n_heads, h = ee % n_heads;
      const float d = dot8_group(qt + h * dim, keys + (s0 + r) * dim, dim, lane % 8);
      if (e < pairs && lane % 8 == 0) dots[e] = d;
    }
    __syncthreads();
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
      float acc = 0.0f;
      for (int64_t h = 0; h < n_heads; ++h)
        acc = __fadd_rn(acc, __fmul_rn(fmaxf(dots[r * n_heads + h], 0.0f), __fmul_rn(wt[h], scale)));
      key[s0 + r] = order_key(acc);
    }
    __syncthreads();
  }
  if (k == 0) return;
  if (threadIdx.x == 0) {
    s_prefix = 0;
    s_want = static_cast<int>(k);
  }
  // Radix select, 8 bits a pass from the top: the k-th largest key, and how many equal to it to take.
  uint32_t mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    const uint32_t prefix = s_prefix;
    for (int64_t s = threadIdx.x; s < n_vis; s += blockDim.x)
      if ((key[s] & mask) == prefix) atomicAdd(&hist[(key[s] >> shift) & 0xFF], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
      int want = s_want, b = 255;
      for (; b > 0 && hist[b] < want; --b) want -= hist[b];
      s_want = want;
      s_prefix = prefix | (static_cast<uint32_t>(b) << shift);
    }
    mask |= 0xFFu << shift;
    __syncthreads();
  }
  const uint32_t thr = s_prefix;
  const int want_eq = s_want;
  // The picks in ascending row order: a block scan over the rows, a chunk of blockDim at a time.
  int eq_seen = 0, picked = 0;
  for (int64_t base = 0; base < n_vis; base += blockDim.x) {
    const int64_t s = base + threadIdx.x;
    const uint32_t ks = s < n_vis ? key[s] : 0;
    const int eq = s < n_vis && ks == thr;
    int eq_total, sel_total;
    const int eq_before = block_scan(eq, scan, &eq_total);
    const int take = s < n_vis && (ks > thr || (eq && eq_seen + eq_before < want_eq));
    const int at = block_scan(take, scan, &sel_total);
    if (take) st[picked + at] = static_cast<int32_t>(s);
    eq_seen += eq_total;
    picked += sel_total;
  }
}

constexpr int kRouterThreads = 256;

// Block t: token t's routing.
__global__ void __launch_bounds__(kRouterThreads)
    router_v4_kernel(const float* logits, int64_t E, int64_t K, const float* bias, const int32_t* table,
                     const int32_t* tokens, bool norm, float scale, int32_t* ids, float* weights) {
  grid_start();
  __shared__ float s[kRouterV4MaxE], sc[kRouterV4MaxE];
  __shared__ float rv[kRouterThreads / kWarp];
  __shared__ int ri[kRouterThreads / kWarp];
  const int64_t t = blockIdx.x;
  const float* lg = logits + t * E;
  const int tid = threadIdx.x;
  for (int64_t i = tid; i < E; i += kRouterThreads) {
    // softplus as torch computes it: the identity above 20
    const float sp = lg[i] > 20.0f ? lg[i] : log1pf(expf(lg[i]));
    s[i] = __fsqrt_rn(sp);
    sc[i] = bias ? __fadd_rn(s[i], bias[i]) : s[i];
  }
  __syncthreads();
  int32_t* id = ids + t * K;
  if (table) {
    for (int64_t k = tid; k < K; k += kRouterThreads) id[k] = table[static_cast<int64_t>(tokens[t]) * K + k];
  } else {
    for (int64_t k = 0; k < K; ++k) {
      float v = -INFINITY;
      int idx = 0x7fffffff;
      for (int64_t i = tid; i < E; i += kRouterThreads)
        if (ranks_before(sc[i], static_cast<int>(i), v, idx)) v = sc[i], idx = static_cast<int>(i);
      block_best<kRouterThreads>(v, idx, rv, ri);
      __syncthreads();
      if (tid == 0) {
        id[k] = idx;
        sc[idx] = -INFINITY;
      }
      __syncthreads();
    }
  }
  __syncthreads();
  if (tid == 0) {
    float sum = 0.0f;
    for (int64_t k = 0; k < K; ++k) sum = __fadd_rn(sum, s[id[k]]);
    for (int64_t k = 0; k < K; ++k)
      weights[t * K + k] = __fmul_rn(norm ? __fdiv_rn(s[id[k]], __fadd_rn(sum, 1e-20f)) : s[id[k]], scale);
  }
}

__global__ void __launch_bounds__(kThreads)
    swiglu_clamp_kernel(float* g, const float* u, int64_t n, float limit) {
  grid_start();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float x = g[i], y = u[i];
    if (limit > 0) {
      x = fminf(x, limit);
      y = fminf(fmaxf(y, -limit), limit);
    }
    g[i] = swiglu_portable(x, y);
  }
}

// Shared memory of a kernel (its static part, asked of the runtime once, and `bytes` of dynamic) past
// 48 KB: asked for, refused past the device's limit.
template <auto Kernel>
void allow_smem(size_t bytes, const char* what) {
  constexpr size_t kDefault = 48 * 1024;
  static const size_t static_bytes = [] {
    cudaFuncAttributes fa{};
    STRATA_CUDA_CHECK(cudaFuncGetAttributes(&fa, Kernel));
    return fa.sharedSizeBytes;
  }();
  const size_t total = bytes + static_bytes;
  if (total <= kDefault) return;
  int dev = 0, max_optin = 0;
  STRATA_CUDA_CHECK(cudaGetDevice(&dev));
  STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  STRATA_CHECK(total <= static_cast<size_t>(max_optin), UnsupportedError, what, " on CUDA needs ", total,
               " bytes of shared memory a block; this GPU gives ", max_optin, " (a shorter context)");
  STRATA_CUDA_CHECK(
      cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

}  // namespace

void launch_apply_norm_hc(const float* x, const float* grs, const float* w, int64_t D, int64_t HC,
                          const int32_t* rows, int64_t div, int64_t n, float* out, cudaStream_t s) {
  if (n <= 0 || D <= 0) return;
  const int64_t cols = ceil_div(D, kRowThreads);
  STRATA_CHECK(cols <= 65535, UnsupportedError, "apply_norm_hc on CUDA: rows of ", D, " columns");
  launch_kernel(apply_norm_hc_kernel, dim3(grid_x(n), static_cast<unsigned>(cols)), kRowThreads, 0, s, x, grs,
                w, D, HC, rows, div, out);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_quantize_q8_0_hc(const float* x, const float* grs, const float* w, int64_t D, int64_t HC,
                             const int32_t* rows, int64_t div, int64_t n, uint8_t* out, size_t out_row_bytes,
                             cudaStream_t s) {
  STRATA_CHECK(D % kQK8_0 == 0, ConfigError, "quantize_q8_0_hc: D=", D, " is not a multiple of ", kQK8_0);
  if (n <= 0 || D <= 0) return;
  const int64_t groups = ceil_div(D / kQK8_0, kRowThreads / kWarp);
  STRATA_CHECK(groups <= 65535, UnsupportedError, "quantize_q8_0_hc on CUDA: rows of ", D, " columns");
  launch_kernel(quantize_q8_0_hc_kernel, dim3(grid_x(n), static_cast<unsigned>(groups)), kRowThreads, 0, s, x,
                grs, w, D, HC, rows, div, out, out_row_bytes);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_hc_mix(const float* fn, int64_t M, int64_t K, const float* x, int64_t T, float* mix,
                   cudaStream_t s) {
  STRATA_CHECK(M >= 0 && M <= 0x7fffffff && T <= 65535, UnsupportedError, "hc_mix on CUDA: ", M, " rows, ", T,
               " tokens (at most 65535 a launch)");
  if (M <= 0 || T <= 0) return;
  const bool vec =
      K % 4 == 0 && reinterpret_cast<uintptr_t>(fn) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  launch_kernel(hc_mix_kernel, dim3(grid_x(M), static_cast<unsigned>(T)), kThreads, 0, s, fn, M, K, x, mix,
                vec);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_hc_pre(const float* mix, const float* x, int64_t T, int64_t HC, int64_t D, float eps,
                   const float* scale, const float* base, float hc_eps, int64_t iters, float* grs,
                   float* post, float* comb, cudaStream_t s) {
  STRATA_CHECK(HC >= 1 && HC <= kHcMax, UnsupportedError, "hc_pre on CUDA: ", HC, " streams; at most ",
               kHcMax);
  if (T <= 0) return;
  if (HC == 4 && D % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0)
    launch_kernel(hc_pre4_kernel, grid_x(T), kThreads, 0, s, mix, x, D, eps, scale, base, hc_eps, iters, grs,
                  post, comb);
  else
    launch_kernel(HC == 4 ? hc_pre_kernel<4> : hc_pre_kernel<0>, grid_x(T), kThreads, 0, s, mix, x, HC, D,
                  eps, scale, base, hc_eps, iters, grs, post, comb);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_hc_post(float* x, const float* y, const float* post, const float* comb, int64_t T, int64_t HC,
                    int64_t D, cudaStream_t s) {
  STRATA_CHECK(HC >= 1 && HC <= kHcMax, UnsupportedError, "hc_post: at most ", kHcMax, " streams, got ", HC);
  if (T <= 0 || D <= 0) return;
  launch_kernel(hc_post_kernel, stride_blocks(T * D, kThreads), kThreads, 0, s, x, y, post, comb, T, HC, D);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_hc_expand(const float* y, int64_t T, int64_t HC, int64_t D, float* x, cudaStream_t s) {
  if (T <= 0 || HC <= 0 || D <= 0) return;
  launch_kernel(hc_expand_kernel, stride_blocks(T * HC * D, kThreads), kThreads, 0, s, y, T, HC, D, x);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_ds4_rms_norm(float* x, int64_t rows, int64_t D, const float* w, float eps, cudaStream_t s) {
  if (rows <= 0) return;
  launch_kernel(rms_norm_kernel, grid_x(rows), kRowThreads, 0, s, x, D, w, eps);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_rope_tail(float* x, int64_t rows, int64_t n_heads, int64_t hd, int64_t n_pairs,
                      const float* inv_freq, float mscale, int64_t pos0, const PosSource& ps,
                      int64_t pos_step, bool inverse, cudaStream_t s) {
  if (rows <= 0 || n_pairs <= 0) return;
  if (n_heads <= 0) return;
  launch_kernel(rope_tail_kernel, stride_blocks(rows * n_heads * n_pairs, kThreads), kThreads, 0, s, x, rows,
                n_heads, hd, n_pairs, inv_freq, mscale, pos0, ps.dev, pos_step, inverse);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_ring_store(float* ring, int64_t slots, int64_t width, int64_t pos0, const PosSource& ps,
                       int64_t T, const float* src, cudaStream_t s) {
  const int64_t p0 = std::max(pos0, pos0 + T - slots), n = pos0 + T - p0;
  if (n <= 0 || width <= 0) return;
  launch_kernel(ring_store_kernel, stride_blocks(n * width, kThreads), kThreads, 0, s, ring, slots, width, p0,
                n, pos0, ps.dev, src);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_compress_pool(const float* kv, const float* score, const float* state_kv,
                          const float* state_score, const float* ape, int64_t pos0, const PosSource& ps,
                          int64_t T, int64_t ratio, int64_t lanes, int64_t hd, float* out, cudaStream_t s) {
  STRATA_CHECK(ratio >= 1 && (lanes == 1 || lanes == 2), ConfigError, "compress_pool: ratio ", ratio,
               ", lanes ", lanes);
  STRATA_CHECK(!ps.dev || T == 1, ConfigError, "compress_pool: a device position takes one token, got ", T);
  // A device position: the one window that may close at it (the kernel decides), into out.
  const int64_t first = pos0 / ratio, n_win = ps.dev ? 1 : (pos0 + T) / ratio - first;
  if (n_win <= 0) return;
  launch_kernel(compress_pool_kernel, stride_blocks(n_win * hd, kThreads), kThreads, 0, s, kv, score,
                state_kv, state_score, ape, pos0, ps.dev, first, n_win, ratio, lanes, hd, out);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_window_commit(const float* row, float* rows, int64_t hd, int64_t ratio, int64_t pos0,
                          const PosSource& ps, int64_t T, cudaStream_t s) {
  STRATA_CHECK(T == 1 && ratio >= 1, ConfigError, "window_commit: one token, got T ", T, ", ratio ", ratio);
  launch_kernel(window_commit_kernel, stride_blocks(hd, kThreads), kThreads, 0, s, row, rows, hd, ratio, pos0,
                ps.dev);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_attention_sink(const float* q, const float* kv, const float* win, int64_t window,
                           const float* comp, int64_t ratio, const int32_t* sel, int64_t topk,
                           const float* sinks, int64_t T, int64_t pos0, const PosSource& ps, int64_t H,
                           int64_t hd, float scale, float* out, cudaStream_t s) {
  if (T <= 0 || H <= 0) return;
  // The most keys a query sees: its window, and the compressed rows (the selected ones, or all visible);
  // with a device position, those of the last position below max_pos.
  const int64_t end = ps.dev ? std::max<int64_t>(pos0 + T, ps.max_pos) : pos0 + T;
  const int64_t n_comp = ratio > 0 ? (sel ? topk : end / ratio) : 0;
  const int64_t nk = std::min(window, end) + n_comp;
  const int hb = sink_heads();
  const size_t smem = static_cast<size_t>(nk) * (sizeof(const float*) + hb * sizeof(float)) + hb * hd * 4;
  auto go = [&](auto heads) {
    constexpr int HB = decltype(heads)::value;
    allow_smem<attention_sink_kernel<HB>>(smem, "attention_sink");
    launch_kernel(attention_sink_kernel<HB>, grid_x(T * ceil_div(H, HB)), kAttnThreads, smem, s, q, kv, win,
                  window, comp, ratio, sel, topk, sinks, pos0, ps.dev, H, hd, scale, out);
  };
  if (hb == 1)
    go(std::integral_constant<int, 1>{});
  else if (hb == 2)
    go(std::integral_constant<int, 2>{});
  else
    go(std::integral_constant<int, kSinkHeads>{});
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_indexer_topk(const float* q, const float* w, const float* keys, int64_t T, int64_t pos0,
                         const PosSource& ps, int64_t n_heads, int64_t dim, int64_t ratio, int64_t topk,
                         float scale, int32_t* sel, cudaStream_t s) {
  STRATA_CHECK(ratio >= 1 && topk >= 1, ConfigError, "indexer_topk: ratio ", ratio, ", topk ", topk);
  if (T <= 0) return;
  const int64_t end = ps.dev ? std::max<int64_t>(pos0 + T, ps.max_pos) : pos0 + T;
  const size_t smem = static_cast<size_t>(std::max<int64_t>(1, end / ratio)) * sizeof(uint32_t);
  allow_smem<indexer_topk_kernel>(smem, "indexer_topk");
  STRATA_CHECK(n_heads >= 1 && n_heads <= kIdxTile, UnsupportedError, "indexer_topk on CUDA: ", n_heads,
               " heads; the kernel takes up to ", kIdxTile);
  launch_kernel(indexer_topk_kernel, grid_x(T), kIdxThreads, smem, s, q, w, keys, pos0, ps.dev, n_heads, dim,
                ratio, topk, scale, sel);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_router_v4(const float* logits, int64_t T, int64_t E, int64_t K, const float* bias,
                      const int32_t* table, const int32_t* tokens, bool norm, float scale, int32_t* ids,
                      float* weights, cudaStream_t s) {
  STRATA_CHECK(E >= 1 && E <= kRouterV4MaxE && K >= 1 && K <= E, UnsupportedError, "router_v4 on CUDA: ", E,
               " experts (top ", K, "); the kernel takes up to ", kRouterV4MaxE);
  if (T <= 0) return;
  launch_kernel(router_v4_kernel, grid_x(T), kRouterThreads, 0, s, logits, E, K, bias, table, tokens, norm,
                scale, ids, weights);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_swiglu_clamp(float* g, const float* u, int64_t n, float limit, cudaStream_t s) {
  if (n <= 0) return;
  launch_kernel(swiglu_clamp_kernel, stride_blocks(n, kThreads), kThreads, 0, s, g, u, n, limit);
  STRATA_CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
