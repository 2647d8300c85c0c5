// The shared blocks of the forward passes (see blocks.h).
#include "model/blocks.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "model/kv_cache.h"
#include "quant/quant.h"

namespace strata {

const float* gr_read(Backend& be, const PrefillBuffers& b, int64_t T, int64_t D, float eps, const float* w,
                     float* stage) {
  be.rms_scale(b.R, T, D, eps, b.grs);
  float* out = b.xn ? b.xn : stage;
  be.apply_norm(b.R, b.grs, w, D, nullptr, 1, T, out);
  return out;
}

namespace {
void matmul(Backend& be, const DenseMatrix& m, const float* x, int64_t T, float* y) {
  be.matmul(m.type, m.data, m.rows, m.cols, x, m.cols, T, y, m.rows);
}
}  // namespace

void attention_block(const ForwardContext& ctx, const PrefillBuffers& b, int64_t l, const AttentionWeights& w,
                     const AttentionShape& a, const float* x, int64_t T, int64_t pos0) {
  Backend& be = ctx.be;
  const int64_t KVd = a.n_kv_head * a.head_dim;
  matmul(be, w.q, x, T, b.q);
  matmul(be, w.k, x, T, b.k);
  matmul(be, w.v, x, T, b.v);
  be.head_norm_rope(b.q, T, a.n_head, a.head_dim, w.q_norm, a.eps, pos0, a.rope);
  be.head_norm_rope(b.k, T, a.n_kv_head, a.head_dim, w.k_norm, a.eps, pos0, a.rope);
  const KvType kt = ctx.kv.type();
  be.kv_store(ctx.kv.k(l), kt, pos0, T, KVd, b.k);
  be.kv_store(ctx.kv.v(l), kt, pos0, T, KVd, b.v);
  const float scale = 1.0f / std::sqrt((float)a.head_dim);
  be.attention(b.q, ctx.kv.k(l), ctx.kv.v(l), kt, T, pos0, a.n_head, a.n_kv_head, a.head_dim, scale, b.attn);
  matmul(be, w.o, b.attn, T, b.proj);
}

void softmax_router(Backend& be, const PrefillBuffers& b, const DenseMatrix& router, const float* x,
                    int64_t T, int64_t K, bool norm) {
  const int64_t E = router.rows;
  matmul(be, router, x, T, b.router);
  be.router_topk(b.router, T, E, K, norm, b.topk_ids, b.topk_w);
  be.group_by_expert(b.topk_ids, T, K, E, b.expert_off, b.expert_rows);
}

namespace {

// The experts a chunk routes to, ascending, with their row ranges in b.expert_rows.
struct Routed {
  std::vector<int32_t> ids, off;  // off[e] .. off[e + 1] for e < E
};

Routed routed_experts(Backend& be, const PrefillBuffers& b, int64_t E) {
  Routed r;
  r.off.resize(E + 1);
  // The host sees the layer's routing once: it walks experts by these offsets.
  be.download(r.off.data(), b.expert_off, r.off.size() * sizeof(int32_t));
  for (int64_t e = 0; e < E; ++e)
    if (r.off[e + 1] > r.off[e]) r.ids.push_back((int32_t)e);
  return r;
}

// Runs fn(e, first_row, n_rows, view) for every routed expert in ascending order, preparing as many
// as the cache has room for at a time; after each batch, done(first_row, end_row) then release.
template <class Fn, class Done>
void for_routed(ExpertCache& cache, int64_t l, const Routed& r, Fn fn, Done done) {
  const int64_t n = (int64_t)r.ids.size();
  for (int64_t i = 0; i < n;) {
    const int64_t got = cache.prepare(l, r.ids.data() + i, n - i);
    for (int64_t j = i; j < i + got; ++j) {
      const int32_t e = r.ids[j];
      fn(e, (int64_t)r.off[e], (int64_t)(r.off[e + 1] - r.off[e]), cache.wait(l, e));
    }
    done((int64_t)r.off[r.ids[i]], (int64_t)r.off[r.ids[i + got - 1] + 1]);
    cache.release(l);
    i += got;
  }
}

}  // namespace

void moe_block(const ForwardContext& ctx, const PrefillBuffers& b, int64_t l, int64_t T,
               const float* ffn_norm) {
  Backend& be = ctx.be;
  const ModelSpec& s = ctx.spec;
  const auto& xl = ctx.experts.layers[l];
  const int64_t D = s.D, F = s.F, K = s.K;
  const Routed r = routed_experts(be, b, s.E);
  const bool fused_read = b.xn == nullptr;  // default GR mode: read R * grs * w by row index
  be.zero(b.proj, (size_t)T * D * sizeof(float));
  if (b.moe == MoeLayout::Fused) {
    // One expert at a time in ascending id: the order of the sums into proj is fixed.
    for_routed(
        ctx.cache, l, r,
        [&](int32_t, int64_t o, int64_t n, const ExpertView& v) {
          const int32_t* rows = b.expert_rows + o;
          if (fused_read)
            be.apply_norm(b.R, b.grs, ffn_norm, D, rows, K, n, b.xg);
          else
            be.gather(b.xn, D, rows, K, n, b.xg);
          be.matmul(xl.gate.type, v.gate, F, D, b.xg, D, n, b.hg, F);
          be.matmul(xl.up.type, v.up, F, D, b.xg, D, n, b.hu, F);
          be.swiglu(b.hg, b.hu, n * F);
          be.matmul(xl.down.type, v.down, D, F, b.hg, F, n, b.yd, D);
          be.scatter_add(b.yd, rows, b.topk_w, K, n, D, b.proj);
        },
        [](int64_t, int64_t) {});
    return;
  }
  // MMQ: every (token, k) row gathered in expert order, quantized to q8_0 for weights with an
  // integer kernel, as floats for float weights; then expert by expert into per-row outputs, which
  // are added into proj in row order at the end.
  const int64_t n_rows = T * K;
  const bool q8_in = uses_matmul_q8(xl.gate.type) || uses_matmul_q8(xl.up.type);
  const bool float_in = !uses_matmul_q8(xl.gate.type) || !uses_matmul_q8(xl.up.type);
  const bool q8_down = uses_matmul_q8(xl.down.type);
  const size_t xrb = b.xq_row_bytes;
  const float* src = fused_read ? b.R : b.xn;
  if (q8_in)
    be.quantize_q8_0(src, fused_read ? b.grs : nullptr, ffn_norm, D, b.expert_rows, K, n_rows, b.xq, xrb);
  if (float_in) {
    if (fused_read)
      be.apply_norm(b.R, b.grs, ffn_norm, D, b.expert_rows, K, n_rows, b.xg);
    else
      be.gather(b.xn, D, b.expert_rows, K, n_rows, b.xg);
  }
  auto mm = [&](uint32_t type, const uint8_t* W, int64_t rows, int64_t cols, const uint8_t* xq,
                const float* x, int64_t n, float* y) {
    if (uses_matmul_q8(type))
      be.matmul_q8(type, W, rows, cols, xq, xrb, n, y, rows);
    else
      be.matmul(type, W, rows, cols, x, cols, n, y, rows);
  };
  // xq or xg is absent (null) when no expert type needs it: no offset may be applied to it.
  const auto at = [](auto* p, int64_t off) { return p ? p + off : nullptr; };
  std::vector<ExpertView> views(s.E);
  for_routed(
      ctx.cache, l, r,
      [&](int32_t e, int64_t o, int64_t n, const ExpertView& v) {
        views[e] = v;
        mm(xl.gate.type, v.gate, F, D, at(b.xq, o * xrb), at(b.xg, o * D), n, b.hg + o * F);
        mm(xl.up.type, v.up, F, D, at(b.xq, o * xrb), at(b.xg, o * D), n, b.hu + o * F);
      },
      [&](int64_t r0, int64_t r1) {
        // The batch's rows: SwiGLU, the down projection's input requantized into their xq rows
        // (gate/up have read them), then down, expert by expert.
        be.swiglu(b.hg + r0 * F, b.hu + r0 * F, (r1 - r0) * F);
        if (q8_down)
          be.quantize_q8_0(b.hg + r0 * F, nullptr, nullptr, F, nullptr, 1, r1 - r0, at(b.xq, r0 * xrb), xrb);
        for (int32_t e : r.ids) {
          const int64_t o = r.off[e], n = r.off[e + 1] - o;
          if (o < r0 || o >= r1) continue;
          mm(xl.down.type, views[e].down, D, F, at(b.xq, o * xrb), b.hg + o * F, n, b.yd + o * D);
        }
      });
  be.scatter_add(b.yd, b.expert_rows, b.topk_w, K, n_rows, D, b.proj);
}

void head_block(Backend& be, const DenseMatrix& output, const float* x, int64_t rows, float* logits_dev,
                float* logits_host) {
  const int64_t V = output.rows, D = output.cols;
  for (int64_t r = 0; r < rows; r += kHeadRows) {
    const int64_t n = std::min(kHeadRows, rows - r);
    be.matmul(output.type, output.data, V, D, x + r * D, D, n, logits_dev, V);
    be.download(logits_host + r * V, logits_dev, (size_t)n * V * sizeof(float));
  }
}

}  // namespace strata
