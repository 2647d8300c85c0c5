// gpt-oss's ops on CUDA (gptoss.cuh). Each output element is computed the same way whatever T is (a
// query's attention by its own block, a token's rotation by its own threads), so the logits do not
// depend on the prompt's chunking; against the CPU's ops they agree within the op harness's bounds
// (transcendentals and the attention's fold order differ).
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gptoss.cuh"
#include "core/exp_portable.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    add_bias_kernel(float* y, const float* bias, int64_t n, int64_t total) {
  grid_start();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * blockDim.x)
    y[i] = __fadd_rn(y[i], bias[i % n]);
}

// Thread (t, h, i): pair (i, i + hd / 2) of head h at token t (each thread forms its own angle: the
// same float).
__global__ void __launch_bounds__(kThreads)
    rope_neox_kernel(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* inv_freq, float mscale,
                     int64_t pos0, const int32_t* pos_dev) {
  grid_start();
  const int64_t half = hd / 2, base = pos0 + (pos_dev ? *pos_dev : 0);
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < T * n_heads * half;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t th = e / half, i = e % half, t = th / n_heads;
    const float a = __fmul_rn((float)(base + t), inv_freq[i]);
    float sn, cs;
    sincosf(a, &sn, &cs);
    const float c = __fmul_rn(cs, mscale), s = __fmul_rn(sn, mscale);
    float* v = x + th * hd;
    const float x0 = v[i], x1 = v[i + half];
    v[i] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    v[i + half] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
  }
}

__device__ __forceinline__ float kv_at(const float* p) { return *p; }
__device__ __forceinline__ float kv_at(const uint16_t* p) { return __half2float(__ushort_as_half(*p)); }

constexpr int kAttThreads = 128, kAttDimsPer = kSinksMaxDims / kAttThreads;

// Block (t, h): query t of head h against keys j0 .. p of its kv head, 128 keys at a time: a key's
// score by one thread (its dot product in dim order), the running max and sum (the sink's logit
// starting both) folded per chunk, the values' sums by dim (thread d, keys in order).
template <class KvT>
__global__ void __launch_bounds__(kAttThreads)
    attention_sinks_kernel(const float* q, const KvT* kc, const KvT* vc, int64_t H, int64_t KV, int64_t hd,
                           float scale, const float* sinks, int64_t window, int64_t pos0,
                           const int32_t* pos_dev, float* out) {
  grid_start();
  __shared__ float qs[kSinksMaxDims];
  __shared__ float ps[kAttThreads];
  __shared__ float red[kWarp];
  const int64_t t = blockIdx.x / H, h = blockIdx.x % H, kvh = h / (H / KV);
  const int64_t p = pos0 + (pos_dev ? *pos_dev : 0) + t;
  const int64_t j0 = window > 0 ? max((int64_t)0, p - window + 1) : 0;
  const int tid = threadIdx.x;
  const float* qr = q + (t * H + h) * hd;
  for (int64_t d = tid; d < hd; d += kAttThreads) qs[d] = qr[d];
  __syncthreads();
  const int64_t stride = KV * hd;
  // The sink: exp(sink - m) in the sum, no value; without one the sums start empty (the first chunk's
  // factor exp(-inf - m') is 0).
  float m = sinks ? sinks[h] : -INFINITY, l = sinks ? 1.0f : 0.0f;
  float acc[kAttDimsPer] = {};
  for (int64_t c0 = j0; c0 <= p; c0 += kAttThreads) {
    const int nk = (int)min((int64_t)kAttThreads, p + 1 - c0);
    float sc = -INFINITY;
    if (tid < nk) {
      const KvT* kr = kc + (c0 + tid) * stride + kvh * hd;
      float dot = 0.0f;
#pragma unroll 8
      for (int64_t d = 0; d < hd; ++d) dot = fmaf(qs[d], kv_at(kr + d), dot);
      sc = dot * scale;
    }
    // The chunk's max, then the fold: m' = max(m, chunk max), the old sums scaled by exp(m - m').
    float cm = warp_max(sc);
    if (tid % kWarp == 0) red[tid / kWarp] = cm;
    __syncthreads();
    cm = red[0];
    for (int w = 1; w < kAttThreads / kWarp; ++w) cm = fmaxf(cm, red[w]);
    const float mn = fmaxf(m, cm), a = expf(m - mn);
    const float pj = tid < nk ? expf(sc - mn) : 0.0f;
    __syncthreads();  // red is read by every thread before block_sum reuses it
    ps[tid] = pj;
    const float sum = block_sum(pj, red);  // its barriers also publish ps
    l = l * a + sum;
    m = mn;
#pragma unroll
    for (int i = 0; i < kAttDimsPer; ++i) {
      const int64_t d = tid + (int64_t)i * kAttThreads;
      if (d >= hd) break;
      float s = acc[i] * a;
      const KvT* vcol = vc + c0 * stride + kvh * hd + d;
#pragma unroll 8
      for (int j = 0; j < nk; ++j) s = fmaf(ps[j], kv_at(vcol + j * stride), s);
      acc[i] = s;
    }
    __syncthreads();  // ps is rewritten by the next chunk
  }
  float* o = out + (t * H + h) * hd;
#pragma unroll
  for (int i = 0; i < kAttDimsPer; ++i) {
    const int64_t d = tid + (int64_t)i * kAttThreads;
    if (d < hd) o[d] = acc[i] / l;
  }
}

__global__ void __launch_bounds__(kThreads)
    swiglu_oai_kernel(float* g, const float* u, const int32_t* ids, const int32_t* rows, int64_t n, int64_t F,
                      const float* gate_b, const float* up_b, float alpha, float limit) {
  grid_start();
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n * F;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = e / F, c = e % F, ex = ids[rows[i]];
    const float x = fminf(__fadd_rn(g[e], gate_b[ex * F + c]), limit);
    const float y = fminf(fmaxf(__fadd_rn(u[e], up_b[ex * F + c]), -limit), limit);
    const float sig = __fdiv_rn(x, __fadd_rn(1.0f, exp_portable(-__fmul_rn(alpha, x))));
    g[e] = __fmul_rn(__fadd_rn(y, 1.0f), sig);
  }
}

__global__ void __launch_bounds__(kThreads)
    expert_bias_kernel(float* y, const int32_t* ids, const float* w, const float* bias, int64_t T, int64_t K,
                       int64_t D) {
  grid_start();
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < T * D;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t t = e / D, c = e % D;
    float acc = y[e];
    for (int64_t k = 0; k < K; ++k)
      acc = __fadd_rn(acc, __fmul_rn(w[t * K + k], bias[(int64_t)ids[t * K + k] * D + c]));
    y[e] = acc;
  }
}

}  // namespace

void launch_add_bias(float* y, const float* bias, int64_t T, int64_t n, cudaStream_t s) {
  if (T <= 0 || n <= 0) return;
  launch_kernel(add_bias_kernel, stride_blocks(T * n, kThreads), kThreads, 0, s, y, bias, n, T * n);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_rope_neox(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* inv_freq, float mscale,
                      int64_t pos0, const int32_t* pos_dev, cudaStream_t s) {
  STRATA_CHECK(hd % 2 == 0, ConfigError, "rope_neox: head_dim ", hd, " is odd");
  if (T <= 0 || hd <= 0 || n_heads <= 0) return;
  launch_kernel(rope_neox_kernel, stride_blocks(T * n_heads * hd / 2, kThreads), kThreads, 0, s, x, T,
                n_heads, hd, inv_freq, mscale, pos0, pos_dev);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_attention_sinks(const float* q, const void* kc, const void* vc, KvType t, int64_t T, int64_t pos0,
                            const int32_t* pos_dev, int64_t H, int64_t KV, int64_t hd, float scale,
                            const float* sinks, int64_t window, float* out, cudaStream_t s) {
  STRATA_CHECK(H > 0 && KV > 0 && H % KV == 0, ConfigError, "attention_sinks: ", H,
               " query heads are not a multiple of ", KV, " kv heads");
  STRATA_CHECK(hd > 0 && hd <= kSinksMaxDims, UnsupportedError, "attention_sinks: head_dim ", hd,
               " exceeds the CUDA kernel's ", kSinksMaxDims);
  STRATA_CHECK(window >= 0, ConfigError, "attention_sinks: window ", window, " is negative");
  if (T <= 0) return;
  const unsigned grid = grid_x(T * H);
  if (t == KvType::F32)
    launch_kernel(attention_sinks_kernel<float>, grid, kAttThreads, 0, s, q, static_cast<const float*>(kc),
                  static_cast<const float*>(vc), H, KV, hd, scale, sinks, window, pos0, pos_dev, out);
  else if (t == KvType::F16)
    launch_kernel(attention_sinks_kernel<uint16_t>, grid, kAttThreads, 0, s, q,
                  static_cast<const uint16_t*>(kc), static_cast<const uint16_t*>(vc), H, KV, hd, scale, sinks,
                  window, pos0, pos_dev, out);
  else
    throw UnsupportedError("attention_sinks: the CUDA backend keeps f32 and f16 KV caches only");
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_swiglu_oai(float* g, const float* u, const int32_t* ids, const int32_t* rows, int64_t n,
                       int64_t F, const float* gate_b, const float* up_b, float alpha, float limit,
                       cudaStream_t s) {
  if (n <= 0 || F <= 0) return;
  launch_kernel(swiglu_oai_kernel, stride_blocks(n * F, kThreads), kThreads, 0, s, g, u, ids, rows, n, F,
                gate_b, up_b, alpha, limit);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_expert_bias(float* y, const int32_t* ids, const float* w, const float* bias, int64_t T, int64_t K,
                        int64_t D, cudaStream_t s) {
  if (T <= 0 || D <= 0) return;
  launch_kernel(expert_bias_kernel, stride_blocks(T * D, kThreads), kThreads, 0, s, y, ids, w, bias, T, K, D);
  STRATA_CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
