// Launchers of qwen35moe's ops on CUDA (backend/qwen35_ops.h says what each computes).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace strata::cuda {

void launch_conv1d_silu(const float* x, int64_t T, int64_t C, int64_t Kc, const float* w,
                        const float* state_in, float* state_out, float* y, cudaStream_t s);
// counters (n_counters of them, zero, left zero): the split form's per-head count of blocks past their
// first reads (the split form, the default; heads past n_counters run unsplit).
void launch_gated_delta_chunked(const float* qkv, const float* a, const float* b, int64_t T, int64_t pos0,
                                int64_t C, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, const float* A,
                                const float* dt_bias, bool fresh, float* s_cur, float* s_other, float* rows_k,
                                float* rows_d, float* rows_g, float* out, unsigned* counters,
                                int64_t n_counters, cudaStream_t s);
// The one-token forms with the state copies chosen by the position pos0 + *pos_dev (pos_dev null: pos0), as
// Qwen35Ops::conv1d_silu_at and gated_delta_at say.
void launch_conv1d_silu_at(const float* x, int64_t C, int64_t Kc, const float* w, float* conv0, float* conv1,
                           int64_t pos0, const int32_t* pos_dev, float* y, cudaStream_t s);
void launch_gated_delta_at(const float* qkv, const float* a, const float* b, int64_t pos0,
                           const int32_t* pos_dev, int64_t C, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv,
                           const float* A, const float* dt_bias, float* state0, float* state1, float* rows_k,
                           float* rows_d, float* rows_g, float* out, unsigned* counters, int64_t n_counters,
                           cudaStream_t s);
void launch_gated_rms_norm(float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps,
                           cudaStream_t s);
void launch_split_q_gate(const float* qg, int64_t T, int64_t H, int64_t hd, float* q, float* gate,
                         cudaStream_t s);
void launch_sigmoid_mul(float* x, const float* g, int64_t n, cudaStream_t s);
void launch_add_sigmoid_scaled(float* y, const float* x, const float* sc, int64_t T, int64_t D,
                               cudaStream_t s);

}  // namespace strata::cuda
