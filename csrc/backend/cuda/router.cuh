// Launchers of the MoE routing ops: softmax top-K per token, grouping (token, k) pairs by expert, and
// a decode step's router (matmul, top-K, grouping) in one launch.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace strata::cuda {

void launch_router_topk(const float* logits, int64_t T, int64_t E, int64_t K, bool norm, int32_t* ids,
                        float* weights, cudaStream_t s);
// route for one token as one launch, the logits' matmul bit for bit gemv_row_kernel's; `ticket` is a
// zeroed device word the launch leaves zeroed. Returns false (nothing launched) for a router type or
// shape it does not take: the caller runs the three ops.
bool launch_route(uint32_t type, const void* W, int64_t E, int64_t D, const float* x, int64_t K, bool norm,
                  float* logits, int32_t* ids, float* weights, int32_t* off, int32_t* rows, unsigned* ticket,
                  cudaStream_t s);
void launch_group_by_expert(const int32_t* ids, int64_t T, int64_t K, int64_t E, int32_t* off, int32_t* rows,
                            cudaStream_t s);

}  // namespace strata::cuda
