// Launchers of gemma4's ops on CUDA (backend/gemma4_ops.h says what each computes; its windowed
// attention is gptoss.cuh's launch_attention_sinks without sinks).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace strata::cuda {

void launch_head_norm(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* w, float eps,
                      cudaStream_t s);
// Rows t < T at positions pos0 + t.
// pos_dev: the position source's device int32, added to pos0 when the kernel runs (null: none).
void launch_rope_freqs(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* inv_freq, int64_t pos0,
                       const int32_t* pos_dev, cudaStream_t s);
void launch_geglu(float* g, const float* u, int64_t n, cudaStream_t s);
void launch_scale(float* x, int64_t n, const float* sc, cudaStream_t s);
void launch_softcap(float* x, int64_t n, float cap, cudaStream_t s);
void launch_expert_scale(float* w, const int32_t* ids, const float* sc, int64_t n, cudaStream_t s);

}  // namespace strata::cuda
