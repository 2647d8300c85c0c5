// Normalization kernels: per-token RMS scales, the GR read (x * grs * w, optionally by row index),
// gather, and the per-head RMSNorm + NEOX rotary embedding of queries and keys.
#include <cmath>

#include "backend/cuda/common.cuh"
#include "backend/cuda/norm.cuh"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRopeThreads = 128;
constexpr int64_t kMaxRopeHalf = 256;  // rotated pairs per head: head dims up to 512

// One block per token: a block sum of squares in a fixed tree.
__global__ void __launch_bounds__(kThreads)
    rms_scale_kernel(const float* x, int64_t D, float eps, float* grs) {
  __shared__ float red[kWarp];
  const float* r = x + (int64_t)blockIdx.x * D;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) ss = fmaf(r[i], r[i], ss);
  ss = block_sum(ss, red);
  if (threadIdx.x == 0) grs[blockIdx.x] = 1.0f / sqrtf(ss / (float)D + eps);
}

// One block per output row: out[i, :] = (x[s, :] * grs[s]) * w, s = rows ? rows[i] / div : i, the
// CPU's two roundings per element.
__global__ void __launch_bounds__(kThreads)
    apply_norm_kernel(const float* x, const float* grs, const float* w, int64_t D, const int32_t* rows,
                      int64_t div, float* out) {
  const int64_t i = blockIdx.x, s = rows ? rows[i] / div : i;
  const float* r = x + s * D;
  const float g = grs[s];
  float* o = out + i * D;
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) o[c] = __fmul_rn(__fmul_rn(r[c], g), w[c]);
}

// rms_scale_kernel then apply_norm_kernel (no row index) in one block per token: the same sums and
// roundings, x read once more from cache instead of a second launch.
__global__ void __launch_bounds__(kThreads)
    rms_norm_read_kernel(const float* x, int64_t D, float eps, const float* w, float* grs, float* out) {
  __shared__ float red[kWarp];
  const float* r = x + (int64_t)blockIdx.x * D;
  float* o = out + (int64_t)blockIdx.x * D;
  // This thread's columns a batch at a time, loaded before use: their loads are in flight together.
  constexpr int kBatch = 8;
  float ss = 0.0f;
  for (int64_t c0 = threadIdx.x; c0 < D; c0 += (int64_t)kBatch * blockDim.x) {
    float v[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int64_t c = c0 + (int64_t)k * blockDim.x;
      v[k] = c < D ? r[c] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      if (c0 + (int64_t)k * blockDim.x < D) ss = fmaf(v[k], v[k], ss);
  }
  ss = block_sum(ss, red);
  const float g = 1.0f / sqrtf(ss / (float)D + eps);
  if (threadIdx.x == 0) grs[blockIdx.x] = g;
  for (int64_t c0 = threadIdx.x; c0 < D; c0 += (int64_t)kBatch * blockDim.x) {
    float v[kBatch], wv[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int64_t c = c0 + (int64_t)k * blockDim.x;
      v[k] = c < D ? r[c] : 0.0f;
      wv[k] = c < D ? w[c] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int64_t c = c0 + (int64_t)k * blockDim.x;
      if (c < D) o[c] = __fmul_rn(__fmul_rn(v[k], g), wv[k]);
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    gather_kernel(const float* x, int64_t D, const int32_t* rows, int64_t div, float* out) {
  const int64_t i = blockIdx.x;
  const float* r = x + (int64_t)(rows[i] / div) * D;
  float* o = out + i * D;
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) o[c] = r[c];
}

// The rotation's inverse frequencies, computed on the host exactly as the CPU backend does (a
// device powf may differ by an ulp, which the angle then multiplies by the position).
struct InvFreq {
  float v[kMaxRopeHalf];
};

// One block per (token, head), the head staged in shared memory: RMSNorm (block sum in a fixed
// tree), then NEOX rotation of pairs (i, i + n_dims / 2) with the precise cosf/sinf, each product
// and sum rounded on its own as on the CPU.
__global__ void __launch_bounds__(kRopeThreads)
    head_norm_rope_kernel(float* x, int64_t n_heads, int64_t hd, const float* w, float eps, int64_t pos0,
                          const int32_t* pos_dev, int64_t half, InvFreq inv_freq) {
  extern __shared__ float sh[];  // hd floats
  __shared__ float red[kWarp];
  const int64_t th = blockIdx.x;
  float* h = x + th * hd;
  for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) sh[i] = h[i];
  if (w) {
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) ss = fmaf(sh[i], sh[i], ss);
    ss = block_sum(ss, red);  // its barriers also publish sh
    const float g = 1.0f / sqrtf(ss / (float)hd + eps);
    for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) sh[i] = __fmul_rn(__fmul_rn(sh[i], g), w[i]);
  }
  __syncthreads();
  const float pos = (float)(pos0 + (pos_dev ? *pos_dev : 0) + th / n_heads);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    float s, c;
    sincosf(__fmul_rn(pos, inv_freq.v[i]), &s, &c);
    const float x0 = sh[i], x1 = sh[i + half];
    h[i] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    h[i + half] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
  }
  if (w)  // the unrotated tail keeps its normalized values
    for (int64_t i = 2 * half + threadIdx.x; i < hd; i += blockDim.x) h[i] = sh[i];
}

}  // namespace

void launch_rms_scale(const float* x, int64_t T, int64_t D, float eps, float* grs, cudaStream_t s) {
  if (T <= 0) return;
  rms_scale_kernel<<<grid_x(T), kThreads, 0, s>>>(x, D, eps, grs);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_apply_norm(const float* x, const float* grs, const float* w, int64_t D, const int32_t* rows,
                       int64_t div, int64_t n, float* out, cudaStream_t s) {
  if (n <= 0) return;
  apply_norm_kernel<<<grid_x(n), kThreads, 0, s>>>(x, grs, w, D, rows, div, out);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_rms_norm_read(const float* x, int64_t T, int64_t D, float eps, const float* w, float* grs, float* out,
                          cudaStream_t s) {
  if (T <= 0) return;
  rms_norm_read_kernel<<<grid_x(T), kThreads, 0, s>>>(x, D, eps, w, grs, out);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_gather(const float* x, int64_t D, const int32_t* rows, int64_t div, int64_t n, float* out,
                   cudaStream_t s) {
  if (n <= 0) return;
  gather_kernel<<<grid_x(n), kThreads, 0, s>>>(x, D, rows, div, out);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_head_norm_rope(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* w, float eps,
                           int64_t pos0, const int32_t* pos_dev, const RopeParams& rope, cudaStream_t s) {
  STRATA_CHECK(rope.neox && rope.n_dims % 2 == 0 && rope.n_dims <= hd, UnsupportedError,
               "head_norm_rope: only NEOX rotation of an even number of dims <= head_dim is implemented");
  const int64_t half = rope.n_dims / 2;
  STRATA_CHECK(half <= kMaxRopeHalf, UnsupportedError, "head_norm_rope: the CUDA backend rotates at most ",
               2 * kMaxRopeHalf, " dims per head, not ", rope.n_dims);
  if (T <= 0 || n_heads <= 0) return;
  InvFreq inv{};
  for (int64_t i = 0; i < half; ++i)
    inv.v[i] = 1.0f / std::pow(rope.freq_base, (float)(2 * i) / (float)rope.n_dims);
  const size_t smem = (size_t)hd * sizeof(float);
  STRATA_CHECK(smem <= 48 * 1024, UnsupportedError, "head_norm_rope: head_dim ", hd, " is too large");
  head_norm_rope_kernel<<<grid_x(T * n_heads), kRopeThreads, smem, s>>>(x, n_heads, hd, w, eps, pos0, pos_dev,
                                                                        half, inv);
  STRATA_CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
