// Launchers of deepseek2's ops on CUDA (backend/deepseek2_ops.h says what each computes).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace strata::cuda {

void launch_rms_norm_rows(float* x, int64_t rows, int64_t D, int64_t stride, const float* w, float eps,
                          cudaStream_t s);
// pos_dev: the position source's device int32, added to pos0 when the kernel runs (null: none).
void launch_rope_pairs(const float* x, int64_t x_row, int64_t x_head, float* y, int64_t y_row, int64_t y_head,
                       int64_t T, int64_t n_heads, int64_t n_pairs, const float* inv_freq, int64_t pos0,
                       const int32_t* pos_dev, cudaStream_t s);
// Experts per token at most kRouterGroupedMaxE (a block's shared memory holds a row of scores).
constexpr int64_t kRouterGroupedMaxE = 1024;
void launch_router_grouped(const float* logits, int64_t T, int64_t E, int64_t K, bool sigmoid,
                           const float* bias, int64_t groups, int64_t groups_used, bool norm, float scale,
                           int32_t* ids, float* weights, cudaStream_t s);

}  // namespace strata::cuda
