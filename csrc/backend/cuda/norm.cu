// Normalization kernels: per-token RMS scales, the GR read (x * grs * w, optionally by row index),
// gather, and the per-head RMSNorm + NEOX rotary embedding of queries and keys.
#include <cuda_fp16.h>

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
  grid_start();
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
  grid_start();
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
  grid_start();
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

// x += y, then rms_norm_read_kernel's steps, one block per token; each thread reads and writes only its
// own columns, so out may be y.
__global__ void __launch_bounds__(kThreads)
    add_rms_norm_read_kernel(float* x, const float* y, int64_t D, float eps, const float* w, float* grs,
                             float* out) {
  grid_start();
  __shared__ float red[kWarp];
  float* r = x + (int64_t)blockIdx.x * D;
  const float* yr = y + (int64_t)blockIdx.x * D;
  float* o = out + (int64_t)blockIdx.x * D;
  constexpr int kBatch = 8;
  float ss = 0.0f;
  for (int64_t c0 = threadIdx.x; c0 < D; c0 += (int64_t)kBatch * blockDim.x) {
    float a[kBatch], b[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int64_t c = c0 + (int64_t)k * blockDim.x;
      a[k] = c < D ? r[c] : 0.0f;
      b[k] = c < D ? yr[c] : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int64_t c = c0 + (int64_t)k * blockDim.x;
      if (c < D) {
        const float v = __fadd_rn(a[k], b[k]);
        r[c] = v;
        ss = fmaf(v, v, ss);
      }
    }
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
  grid_start();
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
// One head in place (sh: hd floats of shared memory); also into the KV row kv (f32 or f16) when set.
__device__ __forceinline__ void kv_put(void* kv, bool f16, int64_t i, float v) {
  if (f16)
    static_cast<uint16_t*>(kv)[i] = __half_as_ushort(__float2half_rn(v));
  else
    static_cast<float*>(kv)[i] = v;
}
__device__ __forceinline__ void norm_rope_head(float* h, float* sh, float* red, int64_t hd, const float* w,
                                               float eps, float pos, int64_t half, const InvFreq& inv_freq,
                                               void* kv, bool f16) {
  for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) sh[i] = h[i];
  if (w) {
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) ss = fmaf(sh[i], sh[i], ss);
    ss = block_sum(ss, red);  // its barriers also publish sh
    const float g = 1.0f / sqrtf(ss / (float)hd + eps);
    for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) sh[i] = __fmul_rn(__fmul_rn(sh[i], g), w[i]);
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    float s, c;
    sincosf(__fmul_rn(pos, inv_freq.v[i]), &s, &c);
    const float x0 = sh[i], x1 = sh[i + half];
    const float y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)),
                y1 = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
    h[i] = y0;
    h[i + half] = y1;
    if (kv) {
      kv_put(kv, f16, i, y0);
      kv_put(kv, f16, i + half, y1);
    }
  }
  for (int64_t i = 2 * half + threadIdx.x; i < hd; i += blockDim.x) {  // the unrotated tail
    if (w) h[i] = sh[i];
    if (kv) kv_put(kv, f16, i, sh[i]);
  }
}

// qk_rope_store: blocks (token, head) over the n_head query heads, then the n_kv heads of k (also
// written to kc), then those of v (copied to vc); the cache rows at pos0 + pos_dev + token.
__global__ void __launch_bounds__(kRopeThreads)
    qk_rope_store_kernel(float* q, float* k, const float* v, int64_t n_head, int64_t n_kv, int64_t hd,
                         const float* q_norm, const float* k_norm, float eps, int64_t pos0,
                         const int32_t* pos_dev, int64_t half, InvFreq inv_freq, void* kc, void* vc,
                         bool f16) {
  grid_start();
  extern __shared__ float sh[];  // hd floats
  __shared__ float red[kWarp];
  const int64_t per_token = n_head + 2 * n_kv, t = blockIdx.x / per_token, j = blockIdx.x % per_token;
  const int64_t row = pos0 + (pos_dev ? *pos_dev : 0) + t;
  const int64_t width = n_kv * hd, eb = f16 ? 2 : 4;
  if (j < n_head) {
    norm_rope_head(q + (t * n_head + j) * hd, sh, red, hd, q_norm, eps, (float)row, half, inv_freq, nullptr,
                   f16);
  } else if (j < n_head + n_kv) {
    const int64_t kh = j - n_head;
    void* dst = static_cast<uint8_t*>(kc) + (row * width + kh * hd) * eb;
    norm_rope_head(k + (t * n_kv + kh) * hd, sh, red, hd, k_norm, eps, (float)row, half, inv_freq, dst, f16);
  } else {
    const int64_t vh = j - n_head - n_kv;
    void* dst = static_cast<uint8_t*>(vc) + (row * width + vh * hd) * eb;
    const float* src = v + (t * n_kv + vh) * hd;
    for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) kv_put(dst, f16, i, src[i]);
  }
}

__global__ void __launch_bounds__(kRopeThreads)
    head_norm_rope_kernel(float* x, int64_t n_heads, int64_t hd, const float* w, float eps, int64_t pos0,
                          const int32_t* pos_dev, int64_t half, InvFreq inv_freq) {
  grid_start();
  extern __shared__ float sh[];  // hd floats
  __shared__ float red[kWarp];
  const int64_t th = blockIdx.x;
  const float pos = (float)(pos0 + (pos_dev ? *pos_dev : 0) + th / n_heads);
  norm_rope_head(x + th * hd, sh, red, hd, w, eps, pos, half, inv_freq, nullptr, false);
}

// The rotation's inverse frequencies and the launch checks of the per-head ops.
InvFreq rope_inv_freq(const RopeParams& rope, int64_t hd, const char* op) {
  STRATA_CHECK(rope.neox && rope.n_dims % 2 == 0 && rope.n_dims <= hd, UnsupportedError, op,
               ": only NEOX rotation of an even number of dims <= head_dim is implemented");
  const int64_t half = rope.n_dims / 2;
  STRATA_CHECK(half <= kMaxRopeHalf, UnsupportedError, op, ": the CUDA backend rotates at most ",
               2 * kMaxRopeHalf, " dims per head, not ", rope.n_dims);
  STRATA_CHECK((size_t)hd * sizeof(float) <= 48 * 1024, UnsupportedError, op, ": head_dim ", hd,
               " is too large");
  InvFreq inv{};
  for (int64_t i = 0; i < half; ++i)
    inv.v[i] = 1.0f / std::pow(rope.freq_base, (float)(2 * i) / (float)rope.n_dims);
  return inv;
}

}  // namespace

void launch_rms_scale(const float* x, int64_t T, int64_t D, float eps, float* grs, cudaStream_t s) {
  if (T <= 0) return;
  launch_kernel(rms_scale_kernel, grid_x(T), kThreads, 0, s, x, D, eps, grs);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_apply_norm(const float* x, const float* grs, const float* w, int64_t D, const int32_t* rows,
                       int64_t div, int64_t n, float* out, cudaStream_t s) {
  if (n <= 0) return;
  launch_kernel(apply_norm_kernel, grid_x(n), kThreads, 0, s, x, grs, w, D, rows, div, out);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_rms_norm_read(const float* x, int64_t T, int64_t D, float eps, const float* w, float* grs,
                          float* out, cudaStream_t s) {
  if (T <= 0) return;
  launch_kernel(rms_norm_read_kernel, grid_x(T), kThreads, 0, s, x, D, eps, w, grs, out);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_add_rms_norm_read(float* x, const float* y, int64_t T, int64_t D, float eps, const float* w,
                              float* grs, float* out, cudaStream_t s) {
  if (T <= 0) return;
  launch_kernel(add_rms_norm_read_kernel, grid_x(T), kThreads, 0, s, x, y, D, eps, w, grs, out);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_gather(const float* x, int64_t D, const int32_t* rows, int64_t div, int64_t n, float* out,
                   cudaStream_t s) {
  if (n <= 0) return;
  launch_kernel(gather_kernel, grid_x(n), kThreads, 0, s, x, D, rows, div, out);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_head_norm_rope(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* w, float eps,
                           int64_t pos0, const int32_t* pos_dev, const RopeParams& rope, cudaStream_t s) {
  const InvFreq inv = rope_inv_freq(rope, hd, "head_norm_rope");
  if (T <= 0 || n_heads <= 0) return;
  launch_kernel(head_norm_rope_kernel, grid_x(T * n_heads), kRopeThreads, (size_t)hd * sizeof(float), s, x,
                n_heads, hd, w, eps, pos0, pos_dev, rope.n_dims / 2, inv);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_qk_rope_store(float* q, float* k, const float* v, int64_t T, int64_t n_head, int64_t n_kv,
                          int64_t hd, const float* q_norm, const float* k_norm, float eps, int64_t pos0,
                          const int32_t* pos_dev, const RopeParams& rope, void* kc, void* vc, KvType t,
                          cudaStream_t s) {
  const InvFreq inv = rope_inv_freq(rope, hd, "qk_rope_store");
  STRATA_CHECK(n_head >= 0 && n_kv >= 0, ConfigError, "qk_rope_store: negative head counts");
  if (T <= 0 || n_head + n_kv == 0) return;
  launch_kernel(qk_rope_store_kernel, grid_x(T * (n_head + 2 * n_kv)), kRopeThreads,
                (size_t)hd * sizeof(float), s, q, k, v, n_head, n_kv, hd, q_norm, k_norm, eps, pos0, pos_dev,
                rope.n_dims / 2, inv, kc, vc, t == KvType::F16);
  STRATA_CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
