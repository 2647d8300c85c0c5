// Launchers of the normalization ops: RMS scales, the GR read (apply_norm), gather, and the
// per-head RMSNorm + rotary embedding of queries and keys.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/backend.h"

namespace strata::cuda {

void launch_rms_scale(const float* x, int64_t T, int64_t D, float eps, float* grs, cudaStream_t s);
void launch_rms_norm_read(const float* x, int64_t T, int64_t D, float eps, const float* w, float* grs,
                          float* out, cudaStream_t s);
void launch_add_rms_norm_read(float* x, const float* y, int64_t T, int64_t D, float eps, const float* w,
                              float* grs, float* out, cudaStream_t s);
void launch_apply_norm(const float* x, const float* grs, const float* w, int64_t D, const int32_t* rows,
                       int64_t div, int64_t n, float* out, cudaStream_t s);
void launch_gather(const float* x, int64_t D, const int32_t* rows, int64_t div, int64_t n, float* out,
                   cudaStream_t s);
// NEOX rotation only (UnsupportedError otherwise), as the CPU backend. Positions pos0 + t, plus the
// int32 at pos_dev when it is set (read when the kernel runs: a recorded graph serves every position).
// head_norm_rope of q and k, then k and v into the KV cache rows pos0 (+ *pos_dev) + t, in one launch.
void launch_qk_rope_store(float* q, float* k, const float* v, int64_t T, int64_t n_head, int64_t n_kv,
                          int64_t hd, const float* q_norm, const float* k_norm, float eps, int64_t pos0,
                          const int32_t* pos_dev, const RopeParams& rope, void* kc, void* vc, KvType t,
                          cudaStream_t s);
void launch_head_norm_rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const float* w, float eps,
                           int64_t pos0, const int32_t* pos_dev, const RopeParams& rope, cudaStream_t s);

}  // namespace strata::cuda
