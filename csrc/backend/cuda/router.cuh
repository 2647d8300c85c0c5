// Launchers of the MoE routing ops: softmax top-K per token, and grouping (token, k) pairs by expert.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace strata::cuda {

void launch_router_topk(const float* logits, int64_t T, int64_t E, int64_t K, bool norm, int32_t* ids,
                        float* weights, cudaStream_t s);
void launch_group_by_expert(const int32_t* ids, int64_t T, int64_t K, int64_t E, int32_t* off, int32_t* rows,
                            cudaStream_t s);

}  // namespace strata::cuda
