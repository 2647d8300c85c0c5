// Launchers of the elementwise ops (add, SwiGLU) and of the MoE combine (scatter_add).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace strata::cuda {

void launch_add(float* x, const float* y, int64_t n, cudaStream_t s);
void launch_swiglu(float* g, const float* u, int64_t n, cudaStream_t s);
// launch_swiglu over n rows of F, then launch_quantize_q8_0 of them, in one launch: the same bits.
void launch_swiglu_q8_0(float* g, const float* u, int64_t n, int64_t F, uint8_t* out, size_t out_row_bytes,
                        cudaStream_t s);

// Device scratch that launch_scatter_add needs for n rows.
size_t scatter_add_scratch_bytes(int64_t n);
// out[rows[i] / K, :] += w[rows[i]] * y[i, :] for i < n, in order of i. `scratch` holds
// scatter_add_scratch_bytes(n) bytes, unused by any other queued work.
void launch_scatter_add(const float* y, const int32_t* rows, const float* w, int64_t K, int64_t n, int64_t D,
                        float* out, void* scratch, cudaStream_t s);

}  // namespace strata::cuda
