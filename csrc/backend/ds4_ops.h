// Ds4Ops: DeepSeek V4's ops beyond the shared Backend surface (hyper-connections, its RoPE, the
// compressor rings and pooling, attention with a sink, the lightning indexer, biased and hash routing,
// the clamped SwiGLU). A backend that runs V4 implements this beside Backend (the CPU's does, in
// backend/cpu/ds4_*.cpp and hyper_connection.cpp); V4's forward pass finds it with ds4_ops(), and a V4
// load on a backend without it is refused before anything is allocated (kDeepseek4's check_backend).
// As Backend's ops: every pointer is device memory of that backend, every op runs on its compute stream.
// While the backend's position source is set (Backend::set_position_source: a recorded decode step), the ops
// that take pos0 add the device's int32 to it, and T is 1; compress_pool then pools the one window that
// closes at that position, if one does, into out's first row, and window_commit moves it into its row.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/backend.h"

namespace strata {

class Ds4Ops {
 public:
  virtual ~Ds4Ops() = default;

  // The GR read over HC streams (x is [*, HC, D]): out[i, :] = (sum over j in order of x[s, j, :] *
  // grs[s, j]) * w with s = rows ? rows[i] / div : i. With HC = 1 it is apply_norm.
  virtual void apply_norm_hc(const float* x, const float* grs, const float* w, int64_t D, int64_t HC,
                             const int32_t* rows, int64_t div, int64_t n, float* out) = 0;
  // quantize_q8_0 of apply_norm_hc's rows (grs and w required).
  virtual void quantize_q8_0_hc(const float* x, const float* grs, const float* w, int64_t D, int64_t HC,
                                const int32_t* rows, int64_t div, int64_t n, uint8_t* out,
                                size_t out_row_bytes) = 0;
  // The hyper-connection mix of T tokens: mix[t, m] = fn[m, :] . x[t, :] over K = HC * D values, fn M rows
  // of ggml type `type` (a site's few rows against a long input). Backend::matmul's result where the
  // backend sums in matmul's order (the CPU); a backend may sum each (t, m) in its own fixed order, the
  // same whatever T (CUDA: F32 fn on the decode's GEMV path a block per (t, m), the block's fixed tree; a
  // prompt's the weight matmul).
  virtual void hc_mix(uint32_t type, const void* fn, int64_t M, int64_t K, const float* x, int64_t T,
                      float* mix) = 0;
  // Hyper-connection weights of T tokens from mix = fn . x[t] (T x M, M = (2 + HC) HC) and the streams
  // x (T x HC x D): with r = 1 / sqrt(mean(x[t]^2) + eps) over all HC * D values and m = mix[t] * r,
  //   pre_j  = sigmoid(m_j * scale[0] + base_j) + hc_eps,
  //   post_j = 2 sigmoid(m_{HC + j} * scale[1] + base_{HC + j}),
  //   comb   = softmax over k of (m_{2 HC + j HC + k} * scale[2] + base_{2 HC + j HC + k}) + hc_eps, its
  //            columns (sums over j) normalized (+ hc_eps), then iters - 1 times rows and columns,
  //   grs[t, j] = pre_j / sqrt(mean(c^2) + eps) with c = sum_j pre_j x[t, j]: the collapse folded into
  //            the RMS scale of the sublayer input, which apply_norm_hc reads.
  // post and comb null: the head's collapse (M = HC, scale[0] only).
  virtual void hc_pre(const float* mix, const float* x, int64_t T, int64_t HC, int64_t D, float eps,
                      const float* scale, const float* base, float hc_eps, int64_t iters, float* grs,
                      float* post, float* comb) = 0;
  // In place: x[t, k, :] = post[t, k] * y[t, :] + sum over j in order of comb[t, j, k] * x[t, j, :].
  virtual void hc_post(float* x, const float* y, const float* post, const float* comb, int64_t T, int64_t HC,
                       int64_t D) = 0;
  // x[t, j, :] = y[t, :] for every stream j.
  virtual void hc_expand(const float* y, int64_t T, int64_t HC, int64_t D, float* x) = 0;
  // In place per row of D: x = x / sqrt(mean(x^2) + eps) * w (w null: unweighted).
  virtual void rms_norm(float* x, int64_t rows, int64_t D, const float* w, float eps) = 0;
  // DeepSeek V4's RoPE: in each head of hd (rows x n_heads x hd), the pairs (2i, 2i + 1) of its last
  // 2 * n_pairs dims rotate by angle pos * inv_freq[i] (by -angle when inverse), cos and sin times mscale;
  // row r is at position pos0 + r * pos_step.
  virtual void rope_tail(float* x, int64_t rows, int64_t n_heads, int64_t hd, int64_t n_pairs,
                         const float* inv_freq, float mscale, int64_t pos0, int64_t pos_step,
                         bool inverse) = 0;
  // ring[p % slots, :] = src[p - pos0, :] (rows of width floats) for the last min(T, slots) positions p
  // of [pos0, pos0 + T).
  virtual void ring_store(float* ring, int64_t slots, int64_t width, int64_t pos0, int64_t T,
                          const float* src) = 0;
  // The compressor's pooling: out[w - pos0 / ratio] for every window w of `ratio` positions that closes
  // in [pos0, pos0 + T), per dim d < hd the sum of kv over the window's slots weighted by the softmax
  // over slots of score + ape[slot]. lanes 1: the slots are the window's positions q = w ratio + i, with
  // kv[q, d], score[q, d] + ape[i, d]. lanes 2: first the previous window's positions with kv[q, d],
  // score[q, d] + ape[i, d] (none for w = 0), then the window's own with kv[q, hd + d],
  // score[q, hd + d] + ape[i, hd + d]. Position q's row is the chunk's (kv, score: T rows of lanes * hd)
  // when q >= pos0, else row q % (lanes * ratio) of the state rings.
  virtual void compress_pool(const float* kv, const float* score, const float* state_kv,
                             const float* state_score, const float* ape, int64_t pos0, int64_t T,
                             int64_t ratio, int64_t lanes, int64_t hd, float* out) = 0;
  // One token at position pos0: rows[w] = row (hd floats) when window w of `ratio` positions closes there
  // ((pos0 + 1) % ratio == 0, w = (pos0 + 1) / ratio - 1); else nothing. T must be 1.
  virtual void window_commit(const float* row, float* rows, int64_t hd, int64_t ratio, int64_t pos0,
                             int64_t T) = 0;
  // DeepSeek V4 attention of T queries q (T x H x hd) at positions p = pos0 + t over one head used as
  // key and value: the window's positions max(0, p - window + 1) .. p (row p - pos0 of kv when
  // >= pos0, else row p % window of the ring win), then the compressed rows s < (p + 1) / ratio of comp
  // (all of them, or those sel[t] lists when sel is set: topk ids, ascending, -1 unused; ratio 0: none).
  // Softmax of the scaled dot products with a sink logit sinks[h] in the denominator.
  virtual void attention_sink(const float* q, const float* kv, const float* win, int64_t window,
                              const float* comp, int64_t ratio, const int32_t* sel, int64_t topk,
                              const float* sinks, int64_t T, int64_t pos0, int64_t H, int64_t hd, float scale,
                              float* out) = 0;
  // The lightning indexer: for query t at p = pos0 + t, score[s] = sum_h w[t, h] * scale *
  // max(0, q[t, h] . keys[s]) over the compressed rows s < (p + 1) / ratio; sel[t] = the topk of highest
  // score (ties to the lower s) in ascending order, then -1.
  virtual void indexer_topk(const float* q, const float* w, const float* keys, int64_t T, int64_t pos0,
                            int64_t n_heads, int64_t dim, int64_t ratio, int64_t topk, float scale,
                            int32_t* sel) = 0;
  // DeepSeek V4 routing: s = sqrt(softplus(logits)); ids = the K experts of highest s + bias (ties to the
  // lower id), or table[tokens[t] * K + k] when table is set; weights = s[ids] (/ (their sum + 1e-20)
  // when norm) * scale.
  virtual void router_v4(const float* logits, int64_t T, int64_t E, int64_t K, const float* bias,
                         const int32_t* table, const int32_t* tokens, bool norm, float scale, int32_t* ids,
                         float* weights) = 0;
  // g[i] = silu(min(g[i], limit)) * clamp(u[i], -limit, limit); limit <= 0: swiglu.
  virtual void swiglu_clamp(float* g, const float* u, int64_t n, float limit) = 0;
};

// The V4 ops of `be`, or null when the backend has none.
inline Ds4Ops* ds4_ops(Backend& be) { return dynamic_cast<Ds4Ops*>(&be); }

}  // namespace strata
