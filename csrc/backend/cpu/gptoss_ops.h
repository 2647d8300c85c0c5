// CPU reference implementations of gpt-oss's ops (backend/gptoss_ops.h documents each), in
// gptoss_ops.cpp; attention with sinks is cpu_attention's (attention.h).
#pragma once
#include <cstdint>

namespace strata {

class ThreadPool;

void cpu_add_bias(float* y, const float* bias, int64_t T, int64_t n, ThreadPool& pool);
void cpu_rope_neox(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* inv_freq, float mscale,
                   int64_t pos0, ThreadPool& pool);
void cpu_expert_bias(float* y, const int32_t* ids, const float* w, const float* bias, int64_t T, int64_t K,
                     int64_t D, ThreadPool& pool);

}  // namespace strata
