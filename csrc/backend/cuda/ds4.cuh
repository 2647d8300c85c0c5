// Launchers of DeepSeek V4's ops on CUDA (backend/ds4_ops.h says what each computes).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/attention.cuh"

namespace strata::cuda {

void launch_apply_norm_hc(const float* x, const float* grs, const float* w, int64_t D, int64_t HC,
                          const int32_t* rows, int64_t div, int64_t n, float* out, cudaStream_t s);
void launch_quantize_q8_0_hc(const float* x, const float* grs, const float* w, int64_t D, int64_t HC,
                             const int32_t* rows, int64_t div, int64_t n, uint8_t* out, size_t out_row_bytes,
                             cudaStream_t s);
// Streams per token at most kHcMax (a block keeps a token's mixing weights in shared memory).
constexpr int64_t kHcMax = 16;
// Ds4Ops::hc_mix of F32 fn: a block per (t, m), its threads' strided partials summed in the block's tree.
void launch_hc_mix(const float* fn, int64_t M, int64_t K, const float* x, int64_t T, float* mix,
                   cudaStream_t s);
void launch_hc_pre(const float* mix, const float* x, int64_t T, int64_t HC, int64_t D, float eps,
                   const float* scale, const float* base, float hc_eps, int64_t iters, float* grs,
                   float* post, float* comb, cudaStream_t s);
void launch_hc_post(float* x, const float* y, const float* post, const float* comb, int64_t T, int64_t HC,
                    int64_t D, cudaStream_t s);
void launch_hc_expand(const float* y, int64_t T, int64_t HC, int64_t D, float* x, cudaStream_t s);
void launch_ds4_rms_norm(float* x, int64_t rows, int64_t D, const float* w, float eps, cudaStream_t s);
// The ops that take a position add the int32 at ps.dev (device memory) to pos0 when it is set, and size
// their shared memory for positions below ps.max_pos (a recorded decode step serves every position).
void launch_rope_tail(float* x, int64_t rows, int64_t n_heads, int64_t hd, int64_t n_pairs,
                      const float* inv_freq, float mscale, int64_t pos0, const PosSource& ps,
                      int64_t pos_step, bool inverse, cudaStream_t s);
void launch_ring_store(float* ring, int64_t slots, int64_t width, int64_t pos0, const PosSource& ps,
                       int64_t T, const float* src, cudaStream_t s);
// With a device position (T = 1): the window that closes at it, if one does, into out's first row.
void launch_compress_pool(const float* kv, const float* score, const float* state_kv,
                          const float* state_score, const float* ape, int64_t pos0, const PosSource& ps,
                          int64_t T, int64_t ratio, int64_t lanes, int64_t hd, float* out, cudaStream_t s);
// rows[w] = row when window w (of `ratio` positions) closes at position pos0 (+ *ps.dev; T = 1).
void launch_window_commit(const float* row, float* rows, int64_t hd, int64_t ratio, int64_t pos0,
                          const PosSource& ps, int64_t T, cudaStream_t s);
void launch_attention_sink(const float* q, const float* kv, const float* win, int64_t window,
                           const float* comp, int64_t ratio, const int32_t* sel, int64_t topk,
                           const float* sinks, int64_t T, int64_t pos0, const PosSource& ps, int64_t H,
                           int64_t hd, float scale, float* out, cudaStream_t s);
void launch_indexer_topk(const float* q, const float* w, const float* keys, int64_t T, int64_t pos0,
                         const PosSource& ps, int64_t n_heads, int64_t dim, int64_t ratio, int64_t topk,
                         float scale, int32_t* sel, cudaStream_t s);
// Experts per token at most kRouterV4MaxE (a block keeps a row of scores in shared memory).
constexpr int64_t kRouterV4MaxE = 1024;
void launch_router_v4(const float* logits, int64_t T, int64_t E, int64_t K, const float* bias,
                      const int32_t* table, const int32_t* tokens, bool norm, float scale, int32_t* ids,
                      float* weights, cudaStream_t s);
void launch_swiglu_clamp(float* g, const float* u, int64_t n, float limit, cudaStream_t s);

}  // namespace strata::cuda
