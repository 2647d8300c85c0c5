// The shared blocks of the forward passes (see blocks.h).
#include "model/blocks.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/error.h"
#include "model/host_experts.h"
#include "model/kv_cache.h"
#include "model/weights.h"
#include "quant/formats.h"
#include "quant/quant.h"

namespace strata {

const float* gr_read(Backend& be, const PrefillBuffers& b, int64_t T, int64_t D, float eps, const float* w,
                     float* stage) {
  float* out = b.xn ? b.xn : stage;
  be.rms_norm_read(b.R, T, D, eps, w, b.grs, out);
  return out;
}

const float* add_gr_read(Backend& be, const PrefillBuffers& b, int64_t T, int64_t D, float eps,
                         const float* w, float* stage) {
  float* out = b.xn ? b.xn : stage;
  be.add_rms_norm_read(b.R, b.proj, T, D, eps, w, b.grs, out);
  return out;
}

namespace {
void matmul(Backend& be, const DenseMatrix& m, const float* x, int64_t T, float* y) {
  be.matmul(m.type, m.data, m.rows, m.cols, x, m.cols, T, y, m.rows);
}
}  // namespace

AttentionScratch declare_attention(ScratchList& list, const AttentionShape& a) {
  AttentionScratch sc;
  sc.q = list.f32("attn.q", {a.n_head, a.head_dim});
  sc.k = list.f32("attn.k", {a.n_kv_head, a.head_dim});
  sc.v = list.f32("attn.v", {a.n_kv_head, a.head_dim});
  sc.out = list.f32("attn.out", {a.n_head * a.head_dim});
  return sc;
}

void matmul_same_x(Backend& be, const float* x, int64_t T, std::initializer_list<MatmulTo> outs) {
  constexpr int kMax = 4;
  STRATA_CHECK(outs.size() >= 1 && outs.size() <= kMax, Error, "internal error: matmul_same_x of ",
               outs.size(), " matrices");
  const DenseMatrix& first = outs.begin()->m;
  bool shared = true;
  for (const MatmulTo& o : outs) shared = shared && o.m.type == first.type && o.m.cols == first.cols;
  if (!shared) {
    for (const MatmulTo& o : outs) matmul(be, o.m, x, T, o.y);
    return;
  }
  Backend::MatmulOut mo[kMax];
  int n = 0;
  for (const MatmulTo& o : outs) mo[n++] = {o.m.data, o.m.rows, o.y, o.m.rows};
  be.matmul_n(first.type, first.cols, x, first.cols, T, mo, n);
}

void attention_block(const ForwardContext& ctx, const PrefillBuffers& b, int64_t l, const AttentionWeights& w,
                     const AttentionShape& a, const AttentionScratch& sc, const float* x, int64_t T,
                     int64_t pos0, const SeqRows* rows) {
  Backend& be = ctx.be;
  float *q = b[sc.q], *k = b[sc.k], *v = b[sc.v], *out = b[sc.out];
  matmul_same_x(be, x, T, {{w.q, q}, {w.k, k}, {w.v, v}});
  const KvType kt = ctx.kv.type();
  const float scale = 1.0f / std::sqrt((float)a.head_dim);
  if (rows) {
    // Each span of one sequence as a chunk of it, in its region.
    const int64_t qw = a.n_head * a.head_dim, kw = a.n_kv_head * a.head_dim;
    for_row_runs(be, *rows, T, [&](const RowRun& r) {
      void* kc = ctx.kv.k(l, r.seq);
      void* vc = ctx.kv.v(l, r.seq);
      be.qk_rope_store(q + r.first * qw, k + r.first * kw, v + r.first * kw, r.n, a.n_head, a.n_kv_head,
                       a.head_dim, w.q_norm, w.k_norm, a.eps, r.pos0, a.rope, kc, vc, kt);
      be.attention(q + r.first * qw, kc, vc, kt, r.n, r.pos0, a.n_head, a.n_kv_head, a.head_dim, scale,
                   out + r.first * qw);
    });
  } else {
    be.qk_rope_store(q, k, v, T, a.n_head, a.n_kv_head, a.head_dim, w.q_norm, w.k_norm, a.eps, pos0, a.rope,
                     ctx.kv.k(l), ctx.kv.v(l), kt);
    be.attention(q, ctx.kv.k(l), ctx.kv.v(l), kt, T, pos0, a.n_head, a.n_kv_head, a.head_dim, scale, out);
  }
  matmul(be, w.o, out, T, b.proj);
}

void softmax_router(Backend& be, const PrefillBuffers& b, const DenseMatrix& router, const float* x,
                    int64_t T, int64_t K, bool norm) {
  be.route(router.type, router.data, router.rows, router.cols, x, T, K, norm, b.router, b.topk_ids, b.topk_w,
           b.expert_off, b.expert_rows);
}

namespace {

// The experts a chunk routes to, ascending, with their row ranges in b.expert_rows.
struct Routed {
  std::vector<int32_t> ids, off;  // off[e] .. off[e + 1] for e < E
};

// `expert_off`: E + 1 prefix offsets in device memory.
Routed routed_experts(Backend& be, const int32_t* expert_off, int64_t E) {
  Routed r;
  r.off.resize(E + 1);
  // The host sees the layer's routing once: it walks experts by these offsets.
  be.download(r.off.data(), expert_off, r.off.size() * sizeof(int32_t));
  for (int64_t e = 0; e < E; ++e)
    if (r.off[e + 1] > r.off[e]) r.ids.push_back((int32_t)e);
  return r;
}

Routed routed_experts(Backend& be, const PrefillBuffers& b, int64_t E) {
  return routed_experts(be, b.expert_off, E);
}

// Layer l + 1's router on this layer's post-attention residual R under layer l + 1's FFN norm (R * grs * w',
// into yd): the guess of its experts that both prefetches make, into the given routing outputs.
void route_next(Backend& be, const PrefillBuffers& b, const NextRouter& next, int64_t D, int64_t T, int64_t K,
                float* logits, int32_t* ids, float* w, int32_t* off, int32_t* rows) {
  if (next.input)
    next.input(b.yd, T);
  else
    be.apply_norm(b.R, b.grs, next.ffn_norm, D, nullptr, 1, T, b.yd);
  const DenseMatrix& r = *next.router;
  if (!next.select) {
    be.route(r.type, r.data, r.rows, r.cols, b.yd, T, K, next.norm_topk, logits, ids, w, off, rows);
    return;
  }
  be.matmul(r.type, r.data, r.rows, r.cols, b.yd, r.cols, T, logits, r.rows);
  next.select(logits, T, ids, w);
  be.group_by_expert(ids, T, K, r.rows, off, rows);
}

// A prompt pass's guess of the experts layer l + 1 will route this chunk's tokens to: its router on this
// layer's post-attention residual under its own FFN norm (R * grs * w', the decode prefetch's guess), into
// scratch that is free until this layer's experts run: the input in yd (at least T x D floats in either
// layout), the logits in hu, the top-K ids, weights and grouping in hg (each at least T x F floats).
// Returns the guess's E + 1 expert offsets (device memory), or null when hu or hg is too small (a router
// wider than the experts' F, which no supported model has).
const int32_t* guess_next_experts(Backend& be, const PrefillBuffers& b, int64_t T, int64_t D, int64_t F,
                                  int64_t K, int64_t E, const NextRouter& next) {
  if (E > F || 3 * T * K + E + 1 > T * F) return nullptr;
  auto* ids = reinterpret_cast<int32_t*>(b.hg);
  int32_t* off = ids + 2 * T * K;
  route_next(be, b, next, D, T, K, b.hu, ids, b.hg + T * K, off, off + E + 1);
  return off;
}

// A batch of experts with copies still crossing to the device runs in pieces (8, of at least
// kMinPiece experts; STRATA_PREFILL_PIECES=N for N, 1 for whole batches: the A/B switch): each piece's
// compute waits only for its own copies, so it overlaps the copies of the pieces after it. More pieces
// overlap more but launch more (a piece is ~4 launches on CUDA).
constexpr int64_t kMinPiece = 8;
int64_t pieces() {
  static const int64_t n = env_int("STRATA_PREFILL_PIECES", 8, 1, 1024, "a number of pieces");
  return n;
}

// Whether a prompt pass queues the next layer's experts behind this layer's copies
// (ExpertCache::prefetch_layer): on by default, STRATA_PROMPT_PREFETCH=0 off (the A/B switch; read at each
// layer, so one process can time both, as bench/gpu.py --look-ahead both does).
bool prompt_prefetch() { return env_switch("STRATA_PROMPT_PREFETCH", true); }

// Runs fn(e, first_row, n_rows, view) for every routed expert in ascending order, preparing as many
// as the cache has room for at a time; done(first_row, end_row) after each piece of a batch (the whole
// batch when none of its experts is in flight), then release. A row's result does not depend on the
// pieces: every row is one expert's, and the callers' sums run in row order either way. When the whole
// layer is prepared at once, the experts `ahead` names of layer l + 1 are prefetched right after this
// layer's copies are queued, so the link stays busy while this layer computes.
template <class Fn, class Done>
void for_routed(ExpertCache& cache, int64_t l, const Routed& r, Fn fn, Done done,
                const std::vector<int32_t>& ahead = {}) {
  const int64_t n = (int64_t)r.ids.size();
  for (int64_t i = 0; i < n;) {
    const int64_t got = cache.prepare(l, r.ids.data() + i, n - i);
    if (i == 0 && got == n && !ahead.empty())
      cache.prefetch_layer(l + 1, ahead.data(), (int64_t)ahead.size());
    bool in_flight = false;
    for (int64_t j = i; j < i + got && !in_flight; ++j) in_flight = cache.in_flight(l, r.ids[j]);
    const int64_t piece = in_flight ? std::max(kMinPiece, (got + pieces() - 1) / pieces()) : got;
    for (int64_t p = i; p < i + got; p += piece) {
      const int64_t q = std::min(i + got, p + piece);
      for (int64_t j = p; j < q; ++j) {
        const int32_t e = r.ids[j];
        fn(e, (int64_t)r.off[e], (int64_t)(r.off[e + 1] - r.off[e]), cache.wait(l, e));
      }
      done((int64_t)r.off[r.ids[p]], (int64_t)r.off[r.ids[q - 1] + 1]);
    }
    cache.release(l);
    i += got;
  }
}

// The routed experts' input rows (`rows`: K per token, as expert_rows) as floats: the rows of xn in
// an unfused plan, else the fused GR read R * grs * w (the architecture's, when it has its own).
void expert_input(Backend& be, const PrefillBuffers& b, const float* ffn_norm, int64_t D, int64_t K,
                  const int32_t* rows, int64_t n, float* out, const MoeVariant* var) {
  if (b.xn)
    be.gather(b.xn, D, rows, K, n, out);
  else if (var)
    var->input(be, b, ffn_norm, D, K, rows, n, out);
  else
    be.apply_norm(b.R, b.grs, ffn_norm, D, rows, K, n, out);
}

// The same rows as q8_0 rows `rb` bytes apart, for the integer kernels.
void expert_input_q8(Backend& be, const PrefillBuffers& b, const float* ffn_norm, int64_t D, int64_t K,
                     const int32_t* rows, int64_t n, uint8_t* out, size_t rb, const MoeVariant* var) {
  if (!b.xn && var)
    var->input_q8(be, b, ffn_norm, D, K, rows, n, out, rb);
  else
    be.quantize_q8_0(b.xn ? b.xn : b.R, b.xn ? nullptr : b.grs, ffn_norm, D, rows, K, n, out, rb);
}

// The activation of the experts' gate (in place) and up over n rows of F (their (token, k) ids
// `rows`): SwiGLU, or the architecture's.
void expert_swiglu(Backend& be, const PrefillBuffers& b, const int32_t* rows, int64_t n, int64_t F, float* g,
                   const float* u, const MoeVariant* var) {
  if (var)
    var->activate_rows(be, b, rows, n, F, g, u);
  else
    be.swiglu(g, u, n * F);
}

// The activation of n rows (expert_swiglu) and, for a down projection with an integer kernel, its q8_0
// rows into xq (`xrb` bytes apart): one swiglu_q8_0 where the activation is plain SwiGLU.
void expert_swiglu_q8(Backend& be, const PrefillBuffers& b, const int32_t* rows, int64_t n, int64_t F,
                      float* g, const float* u, const MoeVariant* var, bool q8_down, uint8_t* xq,
                      size_t xrb) {
  if (q8_down && !var) {
    be.swiglu_q8_0(g, u, n, F, xq, xrb);
    return;
  }
  expert_swiglu(be, b, rows, n, F, g, u, var);
  if (q8_down) be.quantize_q8_0(g, nullptr, nullptr, F, nullptr, 1, n, xq, xrb);
}

// The CPU share of a one-token decode step (cpu_experts): the host computes experts `ids` (missed, without
// slots; the products left their rows of yd as they were, ExpertTable::leave_absent) from the source,
// HostExperts' bits being the products' (see host_experts.h), and puts each one's row at its place in yd, so
// scatter_add adds them in ascending expert order as always. xq: the token's q8_0 row, downloaded before
// the products were queued, so the host works while they run; the uploads wait for them.
void cpu_share(const ForwardContext& ctx, const PrefillBuffers& b, int64_t l, const Routed& r,
               const std::vector<int32_t>& ids, const std::vector<uint8_t>& xq) {
  Backend& be = ctx.be;
  const int64_t D = ctx.spec.D;
  const ExpertLayerLayout& lay = ctx.experts.layers[l];
  const ExpertSource* src = ctx.cache.source();
  STRATA_CHECK(src, Error, "internal error: the CPU share needs a source");
  // Each expert's row in its own place of the host buffer: the uploads are queued on the compute stream
  // behind the products (no wait here) and read the buffer until they run; the next layer's routing download
  // waits for them before any cpu_share writes it again.
  float* out = ctx.host_experts->rows(static_cast<int64_t>(ids.size()), D);
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t e = ids[i];
    float* y = out + i * D;
    ctx.host_experts->run(lay, *src, l, e, xq.data(), y);
    for (int32_t row = r.off[e]; row < r.off[e + 1]; ++row)
      be.upload_async(b.yd + (int64_t)row * D, y, static_cast<size_t>(D) * sizeof(float), Stream::Compute);
  }
  ctx.cache.count_cpu(ids.size(), ids.size() * (lay.gate.bytes + lay.up.bytes + lay.down.bytes));
}

// A decode step's experts all at once: each matrix is one matmul_experts over the token's K rows,
// the device finding every expert's weights by id (ExpertCache::table). The float operations per row
// are the per-expert path's, in the same order (the rows are sorted by expert, so scatter_add adds
// them in ascending expert order): the logits do not change, the launches drop from ~6 per expert
// to ~6 per layer. With an all-resident cache nothing reaches the host, so a decode step can be
// recorded as one graph. A bounded cache resolves the experts either on the device (design (b):
// resolve_experts, again nothing on the host) or on the host first (design (a): one download,
// prepare, copies on the copy engine).
void moe_gathered(const ForwardContext& ctx, const PrefillBuffers& b, int64_t l, int64_t T,
                  const float* ffn_norm, const MoeVariant* var, ExpertPath path, const NextRouter* next) {
  Backend& be = ctx.be;
  ExpertCache& cache = ctx.cache;
  const ModelSpec& s = ctx.spec;
  const auto& xl = ctx.experts.layers[l];
  const int64_t D = s.D, F = s.F, K = s.K, n = T * K;
  // Write-through: a token's K experts are distinct, so each miss is read from the source once (the float
  // products and the q8_0 ones alike).
  const bool wt = path == ExpertPath::Device && T == 1 && write_through_on();
  Routed r;                      // Host path: the experts routed to, ascending
  std::vector<int32_t> cpu_ids;  // Host path: those computed on the host (ascending)
  if (path == ExpertPath::Resident) {
    // Nothing is looked up: the rows' experts count as hits (one token's K distinct ones; a batch's
    // rows are not reduced to their union, which would cost a download, a host sync, a layer).
    cache.count_hits((uint64_t)n);
  } else if (path == ExpertPath::Device) {
    // Design (b): the device resolves hits and misses and fills the misses' slots itself, or (one token)
    // leaves them to the products, which write them through.
    be.resolve_experts(cache.resolve_args(l, b.topk_ids, b.expert_rows, n, wt));
  } else {
    r = routed_experts(be, b, s.E);
    // The CPU share (cpu_experts): up to that many of the token's misses are computed on the host from the
    // source, below, while the link brings the others; they take no slot.
    std::vector<int32_t> dev_ids;
    const int64_t cpu_max = T == 1 && ctx.host_experts ? ctx.step->cpu_experts : 0;
    for (int32_t e : r.ids)
      ((int64_t)cpu_ids.size() < cpu_max && !cache.resident(l, e) ? cpu_ids : dev_ids).push_back(e);
    const int64_t got = cache.prepare(l, dev_ids.data(), (int64_t)dev_ids.size());
    STRATA_CHECK(got == (int64_t)dev_ids.size(), Error, "internal error: the decode step's ", dev_ids.size(),
                 " experts of layer ", l, " did not all get slots");
    for (int32_t e : dev_ids) cache.wait(l, e);
  }
  STRATA_CHECK(cpu_ids.empty() || b.moe == MoeLayout::MMQ, Error,
               "internal error: the CPU share runs in the MMQ layout only");
  ExpertTable tab = cache.table(l, wt);
  tab.leave_absent = !cpu_ids.empty();
  const int32_t* ids = b.topk_ids;
  const int32_t* order = b.expert_rows;
  if (b.moe == MoeLayout::Fused) {
    expert_input(be, b, ffn_norm, D, K, order, n, b.xg, var);
    be.matmul_experts(xl.gate.type, tab, 0, F, D, ids, order, n, b.xg, D, b.hg, F);
    be.matmul_experts(xl.up.type, tab, 1, F, D, ids, order, n, b.xg, D, b.hu, F);
    expert_swiglu(be, b, order, n, F, b.hg, b.hu, var);
    be.matmul_experts(xl.down.type, tab, 2, D, F, ids, order, n, b.hg, F, b.yd, D);
  } else {
    const size_t xrb = b.xq_row_bytes;
    const bool q8_in = uses_matmul_q8(xl.gate.type) || uses_matmul_q8(xl.up.type);
    const bool float_in = !uses_matmul_q8(xl.gate.type) || !uses_matmul_q8(xl.up.type);
    if (q8_in) expert_input_q8(be, b, ffn_norm, D, K, order, n, b.xq, xrb, var);
    std::vector<uint8_t> cpu_xq;  // the CPU share's input: the token's q8_0 row (every row of xq holds it)
    if (!cpu_ids.empty()) {
      STRATA_CHECK(q8_in, Error, "internal error: the CPU share needs the q8_0 expert products");
      cpu_xq.resize(static_cast<size_t>(D / kQK8_0) * kQ8_0Bytes);
      be.download(cpu_xq.data(), b.xq, cpu_xq.size());
    }
    if (float_in) expert_input(be, b, ffn_norm, D, K, order, n, b.xg, var);
    auto mm = [&](uint32_t type, int m, int64_t rows, int64_t cols, const float* x, float* y) {
      if (uses_matmul_q8(type))
        be.matmul_q8_experts(type, tab, m, rows, cols, ids, order, n, b.xq, xrb, y, rows);
      else
        be.matmul_experts(type, tab, m, rows, cols, ids, order, n, x, cols, y, rows);
    };
    if (xl.gate.type == xl.up.type && uses_matmul_q8(xl.gate.type)) {
      be.matmul_q8_experts_pair(xl.gate.type, tab, 0, 1, F, D, ids, order, n, b.xq, xrb, b.hg, b.hu, F);
    } else {
      mm(xl.gate.type, 0, F, D, b.xg, b.hg);
      mm(xl.up.type, 1, F, D, b.xg, b.hu);
    }
    expert_swiglu_q8(be, b, order, n, F, b.hg, b.hu, var, uses_matmul_q8(xl.down.type), b.xq, xrb);
    mm(xl.down.type, 2, D, F, b.hg, b.yd);
    if (!cpu_ids.empty()) cpu_share(ctx, b, l, r, cpu_ids, cpu_xq);
  }
  be.zero(b.proj, (size_t)T * D * sizeof(float));
  be.scatter_add(b.yd, order, b.topk_w, K, n, D, b.proj);
  if (path == ExpertPath::Host) cache.release(l);
  if (path == ExpertPath::Device && next && ctx.step->prefetch && (b.HC == 1 || next->input)) {
    // The prefetch of layer l + 1's experts: its router on R * grs * (its norm), R being this layer's
    // post-attention residual (what this layer's router read, under this layer's norm). The router's
    // buffers and yd are free now, until the next layer's router.
    route_next(be, b, *next, D, T, K, b.router, b.topk_ids, b.topk_w, b.expert_off, b.expert_rows);
    ExpertResolve pr = cache.prefetch_args(l + 1, b.topk_ids, b.expert_rows, n);
    if (ctx.step->prefetch_max > 0) {  // a budget: each token's surest guesses first (router order)
      pr.max_fills = std::min(n, ctx.step->prefetch_max * T);
      pr.ranked = true;
    }
    be.resolve_experts(pr);
  }
}

}  // namespace

// Whether a one-token decode step resolved on the device leaves its misses to the expert products, which
// read them from the source and write them into their slots as they multiply (ExpertTable::pending): on
// by default, STRATA_WRITE_THROUGH=0 fills each layer's misses first (the A/B switch; read at each layer:
// a recorded step keeps what it was recorded with).
bool write_through_on() { return env_switch("STRATA_WRITE_THROUGH", true); }

void moe_block(const ForwardContext& ctx, const PrefillBuffers& b, int64_t l, int64_t T,
               const float* ffn_norm, const MoeVariant* var, const NextRouter* next) {
  Backend& be = ctx.be;
  const ModelSpec& s = ctx.spec;
  const auto& xl = ctx.experts.layers[l];
  const int64_t D = s.D, F = s.F, K = s.K;
  STRATA_CHECK(b.HC == 1 || var, Error, "internal error: the MoE block reads ", b.HC,
               " streams only through the architecture's MoeVariant");
  // The step's plan (Model::decode) says whether this token's experts go gathered, and how they are found.
  const ExpertPath path = ctx.step ? ctx.step->experts : ExpertPath::PerExpert;
  if (path != ExpertPath::PerExpert) {
    STRATA_CHECK(ctx.step && ctx.step->decode, Error, "internal error: a gathered MoE step of ", T,
                 " tokens outside a decode step");
    moe_gathered(ctx, b, l, T, ffn_norm, var, path, next);
    return;
  }
  // A chunk that routes many rows: the experts layer l + 1 will likely want, whose copies go right
  // behind this layer's (queued before this layer's routing is downloaded: one wait for both).
  const bool look_ahead = prompt_prefetch() && next && (b.HC == 1 || next->input) && T * K >= 8 * s.E &&
                          !ctx.cache.all_resident();
  const int32_t* guess_off = look_ahead ? guess_next_experts(be, b, T, D, F, K, s.E, *next) : nullptr;
  const Routed r = routed_experts(be, b, s.E);
  std::vector<int32_t> ahead;
  if (guess_off) ahead = routed_experts(be, guess_off, s.E).ids;
  be.zero(b.proj, (size_t)T * D * sizeof(float));
  if (b.moe == MoeLayout::Fused) {
    // Experts in ascending id, as many at a time as the buffers' rows (max(T, K): one expert's rows fit)
    // take: their rows gathered, each matrix as one matmul_runs, scatter_add in row order. Per output the
    // operations of one expert at a time, and the sums into proj in ascending expert order.
    const int64_t cap = std::max(b.T, K);
    std::vector<Backend::ExpertRun> gu, dn;
    int64_t first = -1, end = -1;  // the group's rows [first, end) of expert_rows
    const auto run_group = [&] {
      if (gu.empty()) return;
      const int64_t n = end - first;
      const int32_t* rows = b.expert_rows + first;
      expert_input(be, b, ffn_norm, D, K, rows, n, b.xg, var);
      if (xl.gate.type == xl.up.type) {
        be.matmul_runs(xl.gate.type, gu.data(), (int64_t)gu.size(), F, D, b.xg, D, b.hg, b.hu, F);
      } else {
        std::vector<Backend::ExpertRun> up = gu;
        for (size_t j = 0; j < gu.size(); ++j) up[j].W = gu[j].W2, gu[j].W2 = up[j].W2 = nullptr;
        be.matmul_runs(xl.gate.type, gu.data(), (int64_t)gu.size(), F, D, b.xg, D, b.hg, nullptr, F);
        be.matmul_runs(xl.up.type, up.data(), (int64_t)up.size(), F, D, b.xg, D, b.hu, nullptr, F);
      }
      expert_swiglu(be, b, rows, n, F, b.hg, b.hu, var);
      be.matmul_runs(xl.down.type, dn.data(), (int64_t)dn.size(), D, F, b.hg, F, b.yd, nullptr, D);
      be.scatter_add(b.yd, rows, b.topk_w, K, n, D, b.proj);
      gu.clear();
      dn.clear();
      first = end = -1;
    };
    for_routed(
        ctx.cache, l, r,
        [&](int32_t, int64_t o, int64_t n, const ExpertView& v) {
          if (!gu.empty() && o + n - first > cap) run_group();
          if (gu.empty()) first = o;
          end = o + n;
          gu.push_back({v.gate, v.up, o - first, n});
          dn.push_back({v.down, nullptr, o - first, n});
        },
        [&](int64_t, int64_t) { run_group(); },  // before the batch's experts are released
        ahead);
    return;
  }
  // MMQ: every (token, k) row gathered in expert order, quantized to q8_0 for weights with an
  // integer kernel, as floats for float weights; then, per batch of experts the cache holds at once,
  // each matrix as one matmul_q8_runs over the batch's experts (one launch a matrix, not one an
  // expert) into per-row outputs, which are added into proj in row order at the end.
  const int64_t n_rows = T * K;
  const bool q8_in = uses_matmul_q8(xl.gate.type) || uses_matmul_q8(xl.up.type);
  const bool float_in = !uses_matmul_q8(xl.gate.type) || !uses_matmul_q8(xl.up.type);
  const bool q8_down = uses_matmul_q8(xl.down.type);
  const size_t xrb = b.xq_row_bytes;
  if (q8_in) expert_input_q8(be, b, ffn_norm, D, K, b.expert_rows, n_rows, b.xq, xrb, var);
  if (float_in) expert_input(be, b, ffn_norm, D, K, b.expert_rows, n_rows, b.xg, var);
  // The batch's experts: their row runs and matrices.
  struct Run {
    int64_t row0, n;
    ExpertView v;
  };
  std::vector<Run> batch;
  std::vector<Backend::ExpertRun> runs;
  // Matrix `m` of every expert in the batch (and m2 into Y2 when m2 >= 0) over its rows: one
  // matmul_q8_runs for a type with an integer kernel, else a float matmul an expert.
  const auto mm = [&](uint32_t type, int m, int m2, int64_t rows, int64_t cols, const float* x, float* Y,
                      float* Y2) {
    const auto mat = [](const ExpertView& v, int k) { return k == 0 ? v.gate : k == 1 ? v.up : v.down; };
    if (uses_matmul_q8(type)) {
      runs.clear();
      for (const Run& r : batch) runs.push_back({mat(r.v, m), m2 >= 0 ? mat(r.v, m2) : nullptr, r.row0, r.n});
      be.matmul_q8_runs(type, runs.data(), (int64_t)runs.size(), rows, cols, b.xq, xrb, Y, Y2, rows);
      return;
    }
    for (const Run& r : batch) {
      be.matmul(type, mat(r.v, m), rows, cols, x + r.row0 * cols, cols, r.n, Y + r.row0 * rows, rows);
      if (m2 >= 0)
        be.matmul(type, mat(r.v, m2), rows, cols, x + r.row0 * cols, cols, r.n, Y2 + r.row0 * rows, rows);
    }
  };
  for_routed(
      ctx.cache, l, r,
      [&](int32_t, int64_t o, int64_t n, const ExpertView& v) { batch.push_back({o, n, v}); },
      [&](int64_t r0, int64_t r1) {
        if (xl.gate.type == xl.up.type) {
          mm(xl.gate.type, 0, 1, F, D, b.xg, b.hg, b.hu);
        } else {
          mm(xl.gate.type, 0, -1, F, D, b.xg, b.hg, nullptr);
          mm(xl.up.type, 1, -1, F, D, b.xg, b.hu, nullptr);
        }
        // The batch's rows: SwiGLU, the down projection's input requantized into their xq rows
        // (gate/up have read them), then down.
        expert_swiglu_q8(be, b, b.expert_rows + r0, r1 - r0, F, b.hg + r0 * F, b.hu + r0 * F, var, q8_down,
                         b.xq + r0 * xrb, xrb);
        mm(xl.down.type, 2, -1, D, F, b.hg, b.yd, nullptr);
        batch.clear();
      },
      ahead);
  be.scatter_add(b.yd, b.expert_rows, b.topk_w, K, n_rows, D, b.proj);
}

void head_block(Backend& be, const DenseMatrix& output, const float* x, int64_t rows, float* logits_dev,
                float* logits_host, const std::function<void(float*, int64_t)>* on_logits) {
  const int64_t V = output.rows, D = output.cols;
  for (int64_t r = 0; r < rows; r += kHeadRows) {
    const int64_t n = std::min(kHeadRows, rows - r);
    be.matmul(output.type, output.data, V, D, x + r * D, D, n, logits_dev, V);
    if (on_logits && *on_logits) (*on_logits)(logits_dev, n* V);
    be.download(logits_host + r * V, logits_dev, (size_t)n * V * sizeof(float));
  }
}

int64_t final_logits(Backend& be, const PrefillBuffers& b, const HeadWeights& head, int64_t T, int64_t D,
                     float eps, bool all_logits, float* logits, const SeqRows* rows) {
  be.add(b.R, b.proj, T * D);  // the last layer's MoE output
  be.rms_scale(b.R, T, D, eps, b.grs);
  float* x = b.xn ? b.xn : b.proj;
  if (rows && rows->pick) {
    // The picked rows, gathered by index (the router ids are free after the last layer).
    const int64_t n = rows->n_pick;
    STRATA_CHECK(n >= 1 && n <= T, Error, "internal error: ", n, " logit rows picked of a pass of ", T);
    be.upload(b.topk_ids, rows->pick, (size_t)n * sizeof(int32_t));
    be.apply_norm(b.R, b.grs, head.output_norm, D, b.topk_ids, 1, n, x);
    head_block(be, head.output, x, n, head.logits_dev.as<float>(), logits, &head.on_logits);
    return n;
  }
  const int64_t first = all_logits ? 0 : T - 1;
  be.apply_norm(b.R + first * D, b.grs + first, head.output_norm, D, nullptr, 1, T - first, x);
  head_block(be, head.output, x, T - first, head.logits_dev.as<float>(), logits, &head.on_logits);
  return T - first;
}

std::vector<RowRun> row_runs(const SeqRows& rows, int64_t T) {
  std::vector<RowRun> runs;
  for (int64_t t = 0; t < T; ++t) {
    if (rows.pos_dev) {
      runs.push_back(RowRun{t, 1, 0, rows.seq[t]});
      continue;
    }
    RowRun* r = runs.empty() ? nullptr : &runs.back();
    if (r && r->seq == rows.seq[t] && r->pos0 + r->n == rows.pos[t])
      ++r->n;
    else
      runs.push_back(RowRun{t, 1, rows.pos[t], rows.seq[t]});
  }
  return runs;
}

}  // namespace strata
