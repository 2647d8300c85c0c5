// CPU reference implementations of gemma4's ops (backend/gemma4_ops.h documents each), in
// gemma4_ops.cpp; attention over a window is cpu_attention's (attention.h).
#pragma once
#include <cstdint>

namespace strata {

class ThreadPool;

void cpu_head_norm(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* w, float eps,
                   ThreadPool& pool);
void cpu_rope_freqs(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* inv_freq, int64_t pos0,
                    const int64_t* pos, ThreadPool& pool);
void cpu_geglu(float* g, const float* u, int64_t n, ThreadPool& pool);
void cpu_scale(float* x, int64_t n, const float* s, ThreadPool& pool);
void cpu_softcap(float* x, int64_t n, float cap, ThreadPool& pool);
void cpu_expert_scale(float* w, const int32_t* ids, const float* scale, int64_t n);

}  // namespace strata
