// CPU reference implementations of deepseek2's ops (backend/deepseek2_ops.h documents each), in
// deepseek2_ops.cpp.
#pragma once
#include <cstdint>

namespace strata {

class ThreadPool;

void cpu_rms_norm_rows(float* x, int64_t rows, int64_t D, int64_t stride, const float* w, float eps,
                       ThreadPool& pool);
void cpu_rope_pairs(const float* x, int64_t x_row, int64_t x_head, float* y, int64_t y_row, int64_t y_head,
                    int64_t T, int64_t n_heads, int64_t n_pairs, const float* inv_freq, int64_t pos0,
                    ThreadPool& pool);
void cpu_router_grouped(const float* logits, int64_t T, int64_t E, int64_t K, bool sigmoid, const float* bias,
                        int64_t groups, int64_t groups_used, bool norm, float scale, int32_t* ids,
                        float* weights, ThreadPool& pool);

}  // namespace strata
