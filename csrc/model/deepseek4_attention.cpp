// DeepSeek V4's attention sublayer (see deepseek4_forward.h), as transformers' DeepseekV4Attention and
// llama.cpp's deepseek4 graph compute it, over the KV cache layout of deepseek4_spec.cpp: the raw
// window as a ring, the compressed rows and indexer keys by window, the open windows' projections.
#include <cmath>

#include "backend/ds4_ops.h"
#include "core/error.h"
#include "model/deepseek4_forward.h"
#include "model/kv_cache.h"
#include "quant/quant.h"

namespace strata {

namespace {

void mm(Backend& be, const DenseMatrix& m, const float* x, int64_t T, float* y) {
  be.matmul(m.type, m.data, m.rows, m.cols, x, m.cols, T, y, m.rows);
}

// One compressor of layer l (the attention's or the indexer's): the kv and score projections of the
// chunk's tokens into kv / score, the rows of the windows closing in the chunk pooled, normalized and
// rotated into the cache tensor `rows`, then the chunk's projections kept in the state rings for the
// windows still open. With the backend's position source set (a recorded decode step: one token whose
// position only the device knows) the device decides: the window that closes at it, if one does, is
// pooled, normalized and rotated in `row` (hd floats of scratch) by the same ops, then moved to its row.
void compress(const ForwardContext& ctx, Ds4Ops& ops, int64_t l, const std::string& name,
              const DenseMatrix& wkv, const DenseMatrix& wgate, const float* ape, const float* norm,
              int64_t ratio, int64_t lanes, int64_t hd, const Ds4RopeDev& rope, const float* x, int64_t T,
              int64_t pos0, float* kv, float* score, float* row) {
  Backend& be = ctx.be;
  const Ds4Spec& d = ds4_spec(ctx.spec);
  float* rows = ctx.kv.tensor(l, name);
  float* state_kv = ctx.kv.tensor(l, name + ".state.kv");
  float* state_score = ctx.kv.tensor(l, name + ".state.score");
  matmul_same_x(be, x, T, {{wkv, kv}, {wgate, score}});
  const int64_t first = pos0 / ratio, n_new = (pos0 + T) / ratio - first;
  if (be.position_source()) {
    STRATA_CHECK(T == 1, Error, "internal error: a V4 pass at a device position of ", T, " tokens");
    ops.compress_pool(kv, score, state_kv, state_score, ape, pos0, T, ratio, lanes, hd, row);
    ops.rms_norm(row, 1, hd, norm, ctx.spec.rms_eps);
    // The window's first position, w * ratio = p + 1 - ratio when it closes at p.
    ops.rope_tail(row, 1, 1, hd, d.rope_dim / 2, rope.inv_freq, rope.mscale, pos0 + 1 - ratio, ratio, false);
    ops.window_commit(row, rows, hd, ratio, pos0, T);
  } else if (n_new > 0) {
    float* out = rows + first * hd;
    ops.compress_pool(kv, score, state_kv, state_score, ape, pos0, T, ratio, lanes, hd, out);
    ops.rms_norm(out, n_new, hd, norm, ctx.spec.rms_eps);
    ops.rope_tail(out, n_new, 1, hd, d.rope_dim / 2, rope.inv_freq, rope.mscale, first * ratio, ratio, false);
  }
  ops.ring_store(state_kv, lanes * ratio, lanes * hd, pos0, T, kv);
  ops.ring_store(state_score, lanes * ratio, lanes * hd, pos0, T, score);
}

}  // namespace

void ds4_attention(const ForwardContext& ctx, Ds4Ops& ops, const PrefillBuffers& b, const Ds4Scratch& sc,
                   int64_t l, const Ds4LayerWeights& w, const Ds4RopeDev& compress_rope, const float* x,
                   int64_t T, int64_t pos0) {
  Backend& be = ctx.be;
  const ModelSpec& s = ctx.spec;
  const Ds4Spec& d = ds4_spec(s);
  float *qa = b[sc.qa], *q = b[sc.q], *kv = b[sc.kv], *out = b[sc.out];
  const int64_t H = s.n_head, hd = s.head_dim, pairs = d.rope_dim / 2;
  const float eps = s.rms_eps;
  STRATA_CHECK(ctx.kv.ctx() >= pos0 + T, ConfigError, "context full at ", pos0 + T);

  // Q: D -> q_lora, RMSNorm, -> heads x hd, per-head unweighted RMSNorm, RoPE on the last rope_dim.
  mm(be, w.q_a, x, T, qa);
  ops.rms_norm(qa, T, d.q_lora, w.q_a_norm, eps);
  mm(be, w.q_b, qa, T, q);
  ops.rms_norm(q, T * H, hd, nullptr, eps);
  ops.rope_tail(q, T, H, hd, pairs, w.rope.inv_freq, w.rope.mscale, pos0, 1, false);
  // The one KV head: D -> hd, RMSNorm, RoPE; it is both key and value.
  mm(be, w.kv, x, T, kv);
  ops.rms_norm(kv, T, hd, w.kv_norm, eps);
  ops.rope_tail(kv, T, 1, hd, pairs, w.rope.inv_freq, w.rope.mscale, pos0, 1, false);

  const float* comp = nullptr;
  const int32_t* sel = nullptr;
  if (w.ratio > 0) {
    const int64_t lanes = w.ratio == 4 ? 2 : 1;
    compress(ctx, ops, l, "comp", w.comp_kv, w.comp_gate, w.comp_ape, w.comp_norm, w.ratio, lanes, hd,
             compress_rope, x, T, pos0, b[sc.comp_kv], b[sc.comp_score], out);
    comp = ctx.kv.tensor(l, "comp");
  }
  if (w.ratio == 4) {
    // The lightning indexer: its own compressed keys, queries from the low-rank Q, per-head weights.
    const int64_t ih = d.idx_heads, idim = d.idx_dim;
    compress(ctx, ops, l, "index", w.idx_kv, w.idx_gate, w.idx_ape, w.idx_norm, 4, 2, idim, compress_rope, x,
             T, pos0, b[sc.idx_kv], b[sc.idx_score], out);
    mm(be, w.idx_q_b, qa, T, b[sc.idx_q]);
    ops.rope_tail(b[sc.idx_q], T, ih, idim, pairs, compress_rope.inv_freq, compress_rope.mscale, pos0, 1,
                  false);
    mm(be, w.idx_proj, x, T, b[sc.idx_w]);
    const float scale = 1.0f / std::sqrt((float)(idim * ih));
    ops.indexer_topk(b[sc.idx_q], b[sc.idx_w], ctx.kv.tensor(l, "index"), T, pos0, ih, idim, 4, d.idx_topk,
                     scale, b[sc.idx_sel]);
    sel = b[sc.idx_sel];
  }
  float* win = ctx.kv.tensor(l, "window");
  ops.attention_sink(q, kv, win, d.window, comp, w.ratio, sel, d.idx_topk, w.sinks, T, pos0, H, hd,
                     1.0f / std::sqrt((float)hd), out);
  ops.ring_store(win, d.window, hd, pos0, T, kv);
  // K = V carried RoPE into the output: rotate it back at the query's position.
  ops.rope_tail(out, T, H, hd, pairs, w.rope.inv_freq, w.rope.mscale, pos0, 1, true);
  // Grouped output: each group of H / G heads to o_lora, then all groups to D.
  const int64_t G = d.o_groups, in_g = H * hd / G;
  const size_t group_bytes =
      row_bytes(quant_traits(w.o_a.type, "attn_output_a").type, in_g) * (size_t)d.o_lora;
  be.matmul_strided(w.o_a.type, w.o_a.data, group_bytes, d.o_lora, in_g, out, in_g, H * hd, T, b[sc.oa],
                    d.o_lora, G * d.o_lora, G);
  mm(be, w.o_b, b[sc.oa], T, b.proj);
}

}  // namespace strata
