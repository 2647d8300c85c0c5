// Launchers of gpt-oss's ops on CUDA (backend/gptoss_ops.h says what each computes). Positions are pos0
// + t, plus the int32 at pos_dev when it is set (read when the kernel runs, so a recorded decode step
// serves every position).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/backend.h"

namespace strata::cuda {

void launch_add_bias(float* y, const float* bias, int64_t T, int64_t n, cudaStream_t s);
void launch_rope_neox(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* inv_freq, float mscale,
                      int64_t pos0, const int32_t* pos_dev, cudaStream_t s);
// Head dims up to kSinksMaxDims (UnsupportedError beyond); sinks may be null (no sink: gemma4's
// attention_window).
constexpr int64_t kSinksMaxDims = 512;
void launch_attention_sinks(const float* q, const void* kc, const void* vc, KvType t, int64_t T, int64_t pos0,
                            const int32_t* pos_dev, int64_t H, int64_t KV, int64_t hd, float scale,
                            const float* sinks, int64_t window, float* out, cudaStream_t s);
void launch_swiglu_oai(float* g, const float* u, const int32_t* ids, const int32_t* rows, int64_t n,
                       int64_t F, const float* gate_b, const float* up_b, float alpha, float limit,
                       cudaStream_t s);
void launch_expert_bias(float* y, const int32_t* ids, const float* w, const float* bias, int64_t T, int64_t K,
                        int64_t D, cudaStream_t s);

}  // namespace strata::cuda
