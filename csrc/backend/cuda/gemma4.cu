// gemma4's ops on CUDA (gemma4.cuh). Each output element is computed the same way whatever T is (a head's
// norm by its own block, a token's rotation by its own threads), so the logits do not depend on the
// prompt's chunking; against the CPU's ops they agree within the op harness's bounds.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemma4.cuh"
#include "core/error.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256, kNormThreads = 128;

// Block r: the head row r of hd.
__global__ void __launch_bounds__(kNormThreads)
    head_norm_kernel(float* x, int64_t hd, const float* w, float eps) {
  grid_start();
  __shared__ float red[kNormThreads / kWarp];
  float* v = x + blockIdx.x * hd;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) ss = __fadd_rn(ss, __fmul_rn(v[i], v[i]));
  ss = warp_sum(ss);
  if (threadIdx.x % kWarp == 0) red[threadIdx.x / kWarp] = ss;
  __syncthreads();
  float tot = 0.0f;
  for (int k = 0; k < kNormThreads / kWarp; ++k) tot = __fadd_rn(tot, red[k]);
  const float g = 1.0f / sqrtf(__fadd_rn(tot / static_cast<float>(hd), eps));
  for (int64_t i = threadIdx.x; i < hd; i += blockDim.x)
    v[i] = w ? __fmul_rn(__fmul_rn(v[i], g), w[i]) : __fmul_rn(v[i], g);
}

// Thread (t, i): pair (i, i + hd / 2) of every head of token t.
__global__ void __launch_bounds__(kThreads)
    rope_freqs_kernel(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* inv_freq, int64_t pos0,
                      const int32_t* pos_dev) {
  grid_start();
  if (pos_dev) pos0 += *pos_dev;
  const int64_t half = hd / 2;
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < T * n_heads * half;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t th = e / half, i = e % half, t = th / n_heads;
    const float a = __fmul_rn(static_cast<float>(pos0 + t), inv_freq[i]);
    float sn, cs;
    sincosf(a, &sn, &cs);
    float* v = x + th * hd;
    const float x0 = v[i], x1 = v[i + half];
    v[i] = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
    v[i + half] = __fadd_rn(__fmul_rn(x1, cs), __fmul_rn(x0, sn));
  }
}

// PyTorch's gelu(approximate="tanh") constants and order of operations, as the CPU's.
__global__ void __launch_bounds__(kThreads) geglu_kernel(float* g, const float* u, int64_t n) {
  grid_start();
  const float beta = 0.7978845608028654f, kappa = 0.044715f;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    const float x = g[i];
    const float inner = __fmul_rn(beta, __fadd_rn(x, __fmul_rn(kappa, __fmul_rn(__fmul_rn(x, x), x))));
    g[i] = __fmul_rn(__fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(inner))), u[i]);
  }
}

__global__ void __launch_bounds__(kThreads) scale_kernel(float* x, int64_t n, const float* sc) {
  grid_start();
  const float v = sc[0];
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    x[i] = __fmul_rn(x[i], v);
}

__global__ void __launch_bounds__(kThreads) softcap_kernel(float* x, int64_t n, float cap) {
  grid_start();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    x[i] = __fmul_rn(tanhf(__fdiv_rn(x[i], cap)), cap);
}

__global__ void __launch_bounds__(kThreads)
    expert_scale_kernel(float* w, const int32_t* ids, const float* sc, int64_t n) {
  grid_start();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    w[i] = __fmul_rn(w[i], sc[ids[i]]);
}

}  // namespace

void launch_head_norm(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* w, float eps,
                      cudaStream_t s) {
  STRATA_CHECK(T >= 0 && n_heads >= 0 && hd >= 1, ConfigError, "head_norm: bad shape T=", T,
               " heads=", n_heads, " hd=", hd);
  if (T * n_heads == 0) return;
  launch_kernel(head_norm_kernel, grid_x(T * n_heads), kNormThreads, 0, s, x, hd, w, eps);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_rope_freqs(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* inv_freq, int64_t pos0,
                       const int32_t* pos_dev, cudaStream_t s) {
  STRATA_CHECK(hd % 2 == 0, ConfigError, "rope_freqs: head_dim ", hd, " is odd");
  if (T * n_heads * (hd / 2) == 0) return;
  launch_kernel(rope_freqs_kernel, stride_blocks(T * n_heads * (hd / 2), kThreads), kThreads, 0, s, x, T,
                n_heads, hd, inv_freq, pos0, pos_dev);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_geglu(float* g, const float* u, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  launch_kernel(geglu_kernel, stride_blocks(n, kThreads), kThreads, 0, s, g, u, n);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_scale(float* x, int64_t n, const float* sc, cudaStream_t s) {
  if (n <= 0) return;
  launch_kernel(scale_kernel, stride_blocks(n, kThreads), kThreads, 0, s, x, n, sc);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_softcap(float* x, int64_t n, float cap, cudaStream_t s) {
  if (n <= 0) return;
  launch_kernel(softcap_kernel, stride_blocks(n, kThreads), kThreads, 0, s, x, n, cap);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_expert_scale(float* w, const int32_t* ids, const float* sc, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  launch_kernel(expert_scale_kernel, stride_blocks(n, kThreads), kThreads, 0, s, w, ids, sc, n);
  STRATA_CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
