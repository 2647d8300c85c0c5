// CPU reference implementations of DeepSeek V4's ops (backend/ds4_ops.h documents each): the
// hyper-connections (hyper_connection.cpp), its attention, compressor and indexer (ds4_attention.cpp),
// norms, RoPE, rings and routing (ds4_misc.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

namespace strata {

class ThreadPool;

void cpu_apply_norm_hc(const float* x, const float* grs, const float* w, int64_t D, int64_t HC,
                       const int32_t* rows, int64_t div, int64_t n, float* out, ThreadPool& pool);
void cpu_quantize_q8_0_hc(const float* x, const float* grs, const float* w, int64_t D, int64_t HC,
                          const int32_t* rows, int64_t div, int64_t n, uint8_t* out, size_t out_row_bytes,
                          ThreadPool& pool);
void cpu_hc_pre(const float* mix, const float* x, int64_t T, int64_t HC, int64_t D, float eps,
                const float* scale, const float* base, float hc_eps, int64_t iters, float* grs, float* post,
                float* comb, ThreadPool& pool);
void cpu_hc_post(float* x, const float* y, const float* post, const float* comb, int64_t T, int64_t HC,
                 int64_t D, ThreadPool& pool);
void cpu_hc_expand(const float* y, int64_t T, int64_t HC, int64_t D, float* x, ThreadPool& pool);

void cpu_compress_pool(const float* kv, const float* score, const float* state_kv, const float* state_score,
                       const float* ape, int64_t pos0, int64_t T, int64_t ratio, int64_t lanes, int64_t hd,
                       float* out, ThreadPool& pool);
void cpu_attention_sink(const float* q, const float* kv, const float* win, int64_t window, const float* comp,
                        int64_t ratio, const int32_t* sel, int64_t topk, const float* sinks, int64_t T,
                        int64_t pos0, int64_t H, int64_t hd, float scale, float* out, ThreadPool& pool);
void cpu_indexer_topk(const float* q, const float* w, const float* keys, int64_t T, int64_t pos0,
                      int64_t n_heads, int64_t dim, int64_t ratio, int64_t topk, float scale, int32_t* sel,
                      ThreadPool& pool);

void cpu_rms_norm(float* x, int64_t rows, int64_t D, const float* w, float eps, ThreadPool& pool);
void cpu_rope_tail(float* x, int64_t rows, int64_t n_heads, int64_t hd, int64_t n_pairs,
                   const float* inv_freq, float mscale, int64_t pos0, int64_t pos_step, bool inverse,
                   ThreadPool& pool);
void cpu_ring_store(float* ring, int64_t slots, int64_t width, int64_t pos0, int64_t T, const float* src);
void cpu_router_v4(const float* logits, int64_t T, int64_t E, int64_t K, const float* bias,
                   const int32_t* table, const int32_t* tokens, bool norm, float scale, int32_t* ids,
                   float* weights, ThreadPool& pool);

}  // namespace strata
