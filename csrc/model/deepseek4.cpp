// DeepSeek V4 (GGUF arch "deepseek4"): the forward pass over HC = 4 residual streams. Each layer: the
// attention site's hyper-connection GR read, the attention sublayer (deepseek4_attention.cpp), the
// stream update; the FFN site's GR read, sqrt-softplus routing (biased top-K or the hash table), the
// routed experts through the expert cache with the clamped SwiGLU, the shared expert, the update. The
// head collapses the streams before the final norm.
#include <memory>
#include <vector>

#include "backend/ds4_ops.h"
#include "core/error.h"
#include "model/arch.h"
#include "model/deepseek4_forward.h"
#include "model/kv_cache.h"
#include "model/weights.h"

namespace strata {

ModelSpec read_deepseek4(const gguf::File& f);

namespace {

// The GR read of the HC streams at a sublayer site: the site's weights per token (grs = the collapse
// weights times the RMS scale of the collapsed input; hc.post and hc.comb unless the site is the head),
// then the normalized input R * grs * w summed over the streams, returned where gr_read returns it (xn
// when carved, else staged in `stage`). `first` skips rows (the head reads only the last).
const float* gr_read_hc(Ds4Ops& ops, const PrefillBuffers& b, const Ds4Scratch& sc, int64_t T, int64_t D,
                        float eps, const HcSite& site, bool head, const float* w, float* stage,
                        int64_t first = 0) {
  const int64_t HC = b.HC, n = T - first;
  const float* R = b.R + first * HC * D;
  float* grs = b.grs + first * HC;
  float* mix = b[sc.hc_mix];
  STRATA_CHECK(site.fn.cols == HC * D, ConfigError, "hc_mix: fn of ", site.fn.cols, " columns, streams of ",
               HC * D);
  ops.hc_mix(site.fn.type, site.fn.data, site.fn.rows, site.fn.cols, R, n, mix);
  ops.hc_pre(mix, R, n, HC, D, eps, site.scale, site.base, site.hc_eps, site.iters, grs,
             head ? nullptr : b[sc.hc_post], head ? nullptr : b[sc.hc_comb]);
  float* out = b.xn ? b.xn : stage;
  ops.apply_norm_hc(R, grs, w, D, HC, nullptr, 1, n, out);
  return out;
}

// After a sublayer whose output y (T x D) is in b.proj: each stream becomes post * y plus the
// combination of the old streams (hc.post, hc.comb from this site's gr_read_hc).
void hc_update(Ds4Ops& ops, const PrefillBuffers& b, const Ds4Scratch& sc, int64_t T, int64_t D) {
  ops.hc_post(b.R, b.proj, b[sc.hc_post], b[sc.hc_comb], T, b.HC, D);
}

// V4's routed experts: their input is the GR read collapsing the HC streams, their SwiGLU clamped
// (limit > 0).
class Ds4Moe final : public MoeVariant {
 public:
  Ds4Moe(Ds4Ops& ops, float limit) : ops_(ops), limit_(limit) {}
  void input(Backend& be, const PrefillBuffers& b, const float* ffn_norm, int64_t D, int64_t K,
             const int32_t* rows, int64_t n, float* out) const override {
    if (b.HC > 1)
      ops_.apply_norm_hc(b.R, b.grs, ffn_norm, D, b.HC, rows, K, n, out);
    else
      be.apply_norm(b.R, b.grs, ffn_norm, D, rows, K, n, out);
  }
  void input_q8(Backend& be, const PrefillBuffers& b, const float* ffn_norm, int64_t D, int64_t K,
                const int32_t* rows, int64_t n, uint8_t* out, size_t rb) const override {
    if (b.HC > 1)
      ops_.quantize_q8_0_hc(b.R, b.grs, ffn_norm, D, b.HC, rows, K, n, out, rb);
    else
      be.quantize_q8_0(b.R, b.grs, ffn_norm, D, rows, K, n, out, rb);
  }
  void activate(Backend& be, float* g, const float* u, int64_t n) const override {
    if (limit_ > 0)
      ops_.swiglu_clamp(g, u, n, limit_);
    else
      be.swiglu(g, u, n);
  }

 private:
  Ds4Ops& ops_;
  float limit_;
};

class Ds4Forward final : public ForwardPass {
 public:
  // A decode step records as one graph: its ops that take a position (RoPE, the rings, attention, the
  // indexer) add the device's while the position source is set, and the compressor's one choice (does a
  // window close at this position?) is made on the device then (compress in deepseek4_attention.cpp).
  bool graphable() const override { return true; }
  explicit Ds4Forward(const ForwardContext& ctx, Ds4Ops& ops)
      : ctx_(ctx), ops_(ops), d_(ds4_spec(ctx.spec)), w_(ctx.be) {
    const ModelSpec& s = ctx.spec;
    ScratchList scratch;
    sc_ = ds4_scratch(s, d_, scratch);
    STRATA_CHECK(scratch.specs() == s.scratch, Error,
                 "internal error: the deepseek4 scratch is not the spec's");
    const Ds4Rope main = ds4_rope(d_, s.rope_base, false), comp = ds4_rope(d_, s.rope_base, true);
    main_rope_ = Ds4RopeDev{w_.floats(main.inv_freq, "rope"), main.mscale};
    comp_rope_ = Ds4RopeDev{w_.floats(comp.inv_freq, "compressed rope"), comp.mscale};
    using Y = Ds4Layer;
    using W = Ds4LayerWeights;
    for (const Ds4Layer& y : d_.layers) {
      Ds4LayerWeights w;
      w.ratio = y.ratio;
      w.hash = y.hash;
      w.clamp_exp = y.clamp_exp;
      w.clamp_shexp = y.clamp_shexp;
      w.hc_attn = site(y.hc_attn_fn, y.hc_attn_scale, y.hc_attn_base);
      w.hc_ffn = site(y.hc_ffn_fn, y.hc_ffn_scale, y.hc_ffn_base);
      // The tensors a layer lacks (its ratio's compressor and indexer, the hash table or the bias) are
      // null in its spec and skipped.
      w_.layer<Y, W>(y, w,
                     {
                         {&Y::attn_norm, &W::attn_norm, "attn_norm"},
                         {&Y::ffn_norm, &W::ffn_norm, "ffn_norm"},
                         {&Y::q_a, &W::q_a, "attn_q_a"},
                         {&Y::q_b, &W::q_b, "attn_q_b"},
                         {&Y::kv, &W::kv, "attn_kv"},
                         {&Y::o_a, &W::o_a, "attn_output_a"},
                         {&Y::o_b, &W::o_b, "attn_output_b"},
                         {&Y::q_a_norm, &W::q_a_norm, "attn_q_a_norm"},
                         {&Y::kv_norm, &W::kv_norm, "attn_kv_a_norm"},
                         {&Y::sinks, &W::sinks, "attn_sinks"},
                         {&Y::comp_kv, &W::comp_kv, "attn_compressor_kv"},
                         {&Y::comp_gate, &W::comp_gate, "attn_compressor_gate"},
                         {&Y::comp_ape, &W::comp_ape, "attn_compressor_ape"},
                         {&Y::comp_norm, &W::comp_norm, "attn_compressor_norm"},
                         {&Y::idx_proj, &W::idx_proj, "indexer.proj"},
                         {&Y::idx_q_b, &W::idx_q_b, "indexer.attn_q_b"},
                         {&Y::idx_kv, &W::idx_kv, "indexer_compressor_kv"},
                         {&Y::idx_gate, &W::idx_gate, "indexer_compressor_gate"},
                         {&Y::idx_ape, &W::idx_ape, "indexer_compressor_ape"},
                         {&Y::idx_norm, &W::idx_norm, "indexer_compressor_norm"},
                         {&Y::router, &W::router, "ffn_gate_inp"},
                         {&Y::probs_b, &W::probs_b, "exp_probs_b"},
                         {&Y::gate_shexp, &W::gate_shexp, "ffn_gate_shexp"},
                         {&Y::up_shexp, &W::up_shexp, "ffn_up_shexp"},
                         {&Y::down_shexp, &W::down_shexp, "ffn_down_shexp"},
                     });
      if (y.hash) {
        // The hash table and the shared expert stay resident: only routed experts stream. Its ids
        // index the router's scores and the expert cache: every one must name an expert.
        check_hash_table(y.tid2eid, s.E);
        w.tid2eid = static_cast<const int32_t*>(w_.raw(y.tid2eid, "ffn_gate_tid2eid"));
      }
      w.rope = y.ratio ? comp_rope_ : main_rope_;
      layers_.push_back(w);
    }
    hc_head_ = site(d_.hc_head_fn, d_.hc_head_scale, d_.hc_head_base);
    head_ = w_.head(s);
  }

  void run_chunk(const PrefillBuffers& b, const int32_t* ids, int64_t T, int64_t pos0, float* logits,
                 bool all_logits) override {
    const ModelSpec& s = ctx_.spec;
    Backend& be = ctx_.be;
    Ds4Ops& ops = ops_;
    const int64_t D = s.D, HC = d_.HC;
    STRATA_CHECK(b.HC == HC && b.scratch.size() == s.scratch.size(), Error,
                 "internal error: the prefill plan is not DeepSeek V4's");
    int32_t* tokens = b[sc_.tokens];
    be.upload(tokens, ids, (size_t)T * sizeof(int32_t));
    // The embedding is copied into every stream.
    be.embed(s.token_embd.type(), head_.token_embd.get(), D, tokens, T, b.proj);
    ops.hc_expand(b.proj, T, HC, D, b.R);
    // The GR reads stage their rows in proj when the plan has no xn: proj is free at both read points
    // and is written last by each sublayer.
    for (int64_t l = 0; l < s.L; ++l) {
      between_layers(ctx_, l, T, pos0);
      const Ds4LayerWeights& w = layers_[l];
      const float* x = gr_read_hc(ops, b, sc_, T, D, s.rms_eps, w.hc_attn, false, w.attn_norm, b.proj);
      ds4_attention(ctx_, ops, b, sc_, l, w, comp_rope_, x, T, pos0);
      hc_update(ops, b, sc_, T, D);

      x = gr_read_hc(ops, b, sc_, T, D, s.rms_eps, w.hc_ffn, false, w.ffn_norm, b.proj);
      be.matmul(w.router.type, w.router.data, w.router.rows, w.router.cols, x, D, T, b.router, s.E);
      ops.router_v4(b.router, T, s.E, s.K, w.probs_b, w.tid2eid, tokens, d_.norm_weights, d_.routed_scale,
                    b.topk_ids, b.topk_w);
      be.group_by_expert(b.topk_ids, T, s.K, s.E, b.expert_off, b.expert_rows);
      // The shared expert first: the routed experts overwrite proj, where x may be staged.
      const int64_t Fs = d_.shared_ffn;
      float *sh_gate = b[sc_.sh_gate], *sh_up = b[sc_.sh_up], *sh_out = b[sc_.sh_out];
      matmul_same_x(be, x, T, {{w.gate_shexp, sh_gate}, {w.up_shexp, sh_up}});
      ops.swiglu_clamp(sh_gate, sh_up, T * Fs, w.clamp_shexp);
      be.matmul(w.down_shexp.type, w.down_shexp.data, D, Fs, sh_gate, Fs, T, sh_out, D);
      const Ds4Moe moe(ops, w.clamp_exp);
      // The guess of the next layer's experts (a prompt's look ahead, --prefetch): its router on these
      // streams collapsed by this site's weights under its FFN norm, its own selection (hash layers: exact).
      NextRouter next;
      if (l + 1 < s.L) {
        const Ds4LayerWeights& nw = layers_[l + 1];
        next.router = &nw.router;
        next.ffn_norm = nw.ffn_norm;
        next.input = [&ops, &b, &nw, D, HC](float* out, int64_t n) {
          ops.apply_norm_hc(b.R, b.grs, nw.ffn_norm, D, HC, nullptr, 1, n, out);
        };
        next.select = [this, &ops, &nw, tokens](float* logits, int64_t n, int32_t* ids, float* wts) {
          ops.router_v4(logits, n, ctx_.spec.E, ctx_.spec.K, nw.probs_b, nw.tid2eid, tokens, d_.norm_weights,
                        d_.routed_scale, ids, wts);
        };
      }
      moe_block(ctx_, b, l, T, w.ffn_norm, &moe, next.router ? &next : nullptr);
      be.add(b.proj, sh_out, T * D);
      hc_update(ops, b, sc_, T, D);
    }
    between_layers(ctx_, s.L, T, pos0);
    if (!logits) return;
    const int64_t first = all_logits ? 0 : T - 1;
    const float* x =
        gr_read_hc(ops, b, sc_, T, D, s.rms_eps, hc_head_, true, head_.output_norm, b.proj, first);
    head_block(be, head_.output, x, T - first, head_.logits_dev.as<float>(), logits);
  }

 private:
  HcSite site(const WeightRef& fn, const WeightRef& scale, const WeightRef& base) {
    return HcSite{w_.dense(fn, "hc fn"), w_.vec(scale, "hc scale"), w_.vec(base, "hc base"), d_.hc_eps,
                  d_.sinkhorn_iters};
  }

  static void check_hash_table(const WeightRef& w, int64_t E) {
    const auto* ids = reinterpret_cast<const int32_t*>(w.data());
    const int64_t n = w.t->nelements(), K = w.t->ne[0];
    for (int64_t i = 0; i < n; ++i)
      STRATA_CHECK(ids[i] >= 0 && ids[i] < E, FormatError, "tensor '", w.t->name, "' routes token ", i / K,
                   " to expert ", ids[i], ", outside [0, ", E, "); the file is corrupt");
  }

  ForwardContext ctx_;
  Ds4Ops& ops_;
  const Ds4Spec& d_;
  ResidentWeights w_;
  Ds4Scratch sc_;
  std::vector<Ds4LayerWeights> layers_;
  Ds4RopeDev main_rope_, comp_rope_;
  HcSite hc_head_;
  HeadWeights head_;
};

std::string no_v4_ops(const Backend& be) {
  return str("DeepSeek V4 runs on the CPU and CUDA backends; the ", be.name(),
             " backend has no V4 ops (hyper-connections, compressed attention, V4 routing). Run it with "
             "--device cpu");
}

void check_deepseek4_backend(Backend& be, const std::string& path) {
  STRATA_CHECK(ds4_ops(be), UnsupportedError, path, ": ", no_v4_ops(be));
}

std::unique_ptr<ForwardPass> make_deepseek4(const ForwardContext& ctx) {
  Ds4Ops* ops = ds4_ops(ctx.be);
  STRATA_CHECK(ops, UnsupportedError, no_v4_ops(ctx.be));
  return std::make_unique<Ds4Forward>(ctx, *ops);
}

}  // namespace

extern const Architecture kDeepseek4{"deepseek4", read_deepseek4, make_deepseek4, check_deepseek4_backend};

}  // namespace strata
