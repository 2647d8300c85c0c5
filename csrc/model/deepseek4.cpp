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
#include "quant/quant.h"

namespace strata {

ModelSpec read_deepseek4(const gguf::File& f);

namespace {

// The GR read of the HC streams at a sublayer site: the site's weights per token (grs = the collapse
// weights times the RMS scale of the collapsed input; hc.post and hc.comb unless the site is the head),
// then the normalized input R * grs * w summed over the streams, returned where gr_read returns it (xn
// when carved, else staged in `stage`). `first` skips rows (the head reads only the last).
const float* gr_read_hc(Backend& be, Ds4Ops& ops, const PrefillBuffers& b, const Ds4Scratch& sc, int64_t T,
                        int64_t D, float eps, const HcSite& site, bool head, const float* w, float* stage,
                        int64_t first = 0) {
  const int64_t HC = b.HC, n = T - first;
  const float* R = b.R + first * HC * D;
  float* grs = b.grs + first * HC;
  float* mix = b[sc.hc_mix];
  be.matmul(site.fn.type, site.fn.data, site.fn.rows, site.fn.cols, R, HC * D, n, mix, site.fn.rows);
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
  explicit Ds4Forward(const ForwardContext& ctx, Ds4Ops& ops) : ctx_(ctx), ops_(ops), d_(ds4_spec(ctx.spec)) {
    const ModelSpec& s = ctx.spec;
    Backend& be = ctx.be;
    ScratchList scratch;
    sc_ = ds4_scratch(s, d_, scratch);
    STRATA_CHECK(scratch.specs() == s.scratch, Error,
                 "internal error: the deepseek4 scratch is not the spec's");
    const Ds4Rope main = ds4_rope(d_, s.rope_base, false), comp = ds4_rope(d_, s.rope_base, true);
    main_rope_ = Ds4RopeDev{floats(main.inv_freq, "rope"), main.mscale};
    comp_rope_ = Ds4RopeDev{floats(comp.inv_freq, "compressed rope"), comp.mscale};
    for (const Ds4Layer& y : d_.layers) {
      Ds4LayerWeights w;
      w.ratio = y.ratio;
      w.hash = y.hash;
      w.clamp_exp = y.clamp_exp;
      w.clamp_shexp = y.clamp_shexp;
      w.hc_attn = site(y.hc_attn_fn, y.hc_attn_scale, y.hc_attn_base);
      w.hc_ffn = site(y.hc_ffn_fn, y.hc_ffn_scale, y.hc_ffn_base);
      w.attn_norm = vec(y.attn_norm, "attn_norm");
      w.ffn_norm = vec(y.ffn_norm, "ffn_norm");
      w.q_a = dense(y.q_a, "attn_q_a");
      w.q_b = dense(y.q_b, "attn_q_b");
      w.kv = dense(y.kv, "attn_kv");
      w.o_a = dense(y.o_a, "attn_output_a");
      w.o_b = dense(y.o_b, "attn_output_b");
      w.q_a_norm = vec(y.q_a_norm, "attn_q_a_norm");
      w.kv_norm = vec(y.kv_norm, "attn_kv_a_norm");
      w.sinks = vec(y.sinks, "attn_sinks");
      if (y.ratio) {
        w.comp_kv = dense(y.comp_kv, "attn_compressor_kv");
        w.comp_gate = dense(y.comp_gate, "attn_compressor_gate");
        w.comp_ape = vec(y.comp_ape, "attn_compressor_ape");
        w.comp_norm = vec(y.comp_norm, "attn_compressor_norm");
      }
      if (y.ratio == 4) {
        w.idx_proj = dense(y.idx_proj, "indexer.proj");
        w.idx_q_b = dense(y.idx_q_b, "indexer.attn_q_b");
        w.idx_kv = dense(y.idx_kv, "indexer_compressor_kv");
        w.idx_gate = dense(y.idx_gate, "indexer_compressor_gate");
        w.idx_ape = vec(y.idx_ape, "indexer_compressor_ape");
        w.idx_norm = vec(y.idx_norm, "indexer_compressor_norm");
      }
      w.router = dense(y.router, "ffn_gate_inp");
      if (y.hash) {
        // The hash table and the shared expert stay resident: only routed experts stream. Its ids
        // index the router's scores and the expert cache: every one must name an expert.
        check_hash_table(y.tid2eid, s.E);
        owned_.push_back(be.resident(y.tid2eid.data(), y.tid2eid.t->nbytes, "ffn_gate_tid2eid"));
        w.tid2eid = owned_.back().as<int32_t>();
      } else {
        w.probs_b = vec(y.probs_b, "exp_probs_b");
      }
      w.gate_shexp = dense(y.gate_shexp, "ffn_gate_shexp");
      w.up_shexp = dense(y.up_shexp, "ffn_up_shexp");
      w.down_shexp = dense(y.down_shexp, "ffn_down_shexp");
      w.rope = y.ratio ? comp_rope_ : main_rope_;
      layers_.push_back(w);
    }
    head_ = site(d_.hc_head_fn, d_.hc_head_scale, d_.hc_head_base);
    token_embd_ = be.resident(s.token_embd.data(), s.token_embd.t->nbytes, "token_embd");
    output_norm_ = vec(s.output_norm, "output_norm");
    output_ = dense(s.output, "output");
    logits_dev_ = DeviceBuffer(be, (size_t)kHeadRows * s.V * sizeof(float), "the logits");
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
    be.embed(s.token_embd.type(), token_embd_.get(), D, tokens, T, b.proj);
    ops.hc_expand(b.proj, T, HC, D, b.R);
    // The GR reads stage their rows in proj when the plan has no xn: proj is free at both read points
    // and is written last by each sublayer.
    for (int64_t l = 0; l < s.L; ++l) {
      between_layers(ctx_, l, T, pos0);
      const Ds4LayerWeights& w = layers_[l];
      const float* x = gr_read_hc(be, ops, b, sc_, T, D, s.rms_eps, w.hc_attn, false, w.attn_norm, b.proj);
      ds4_attention(ctx_, ops, b, sc_, l, w, comp_rope_, x, T, pos0);
      hc_update(ops, b, sc_, T, D);

      x = gr_read_hc(be, ops, b, sc_, T, D, s.rms_eps, w.hc_ffn, false, w.ffn_norm, b.proj);
      be.matmul(w.router.type, w.router.data, w.router.rows, w.router.cols, x, D, T, b.router, s.E);
      ops.router_v4(b.router, T, s.E, s.K, w.probs_b, w.tid2eid, tokens, d_.norm_weights, d_.routed_scale,
                    b.topk_ids, b.topk_w);
      be.group_by_expert(b.topk_ids, T, s.K, s.E, b.expert_off, b.expert_rows);
      // The shared expert first: the routed experts overwrite proj, where x may be staged.
      const int64_t Fs = d_.shared_ffn;
      float *sh_gate = b[sc_.sh_gate], *sh_up = b[sc_.sh_up], *sh_out = b[sc_.sh_out];
      be.matmul(w.gate_shexp.type, w.gate_shexp.data, Fs, D, x, D, T, sh_gate, Fs);
      be.matmul(w.up_shexp.type, w.up_shexp.data, Fs, D, x, D, T, sh_up, Fs);
      ops.swiglu_clamp(sh_gate, sh_up, T * Fs, w.clamp_shexp);
      be.matmul(w.down_shexp.type, w.down_shexp.data, D, Fs, sh_gate, Fs, T, sh_out, D);
      const Ds4Moe moe(ops, w.clamp_exp);
      moe_block(ctx_, b, l, T, w.ffn_norm, &moe);
      be.add(b.proj, sh_out, T * D);
      hc_update(ops, b, sc_, T, D);
    }
    between_layers(ctx_, s.L, T, pos0);
    if (!logits) return;
    const int64_t first = all_logits ? 0 : T - 1;
    const float* x = gr_read_hc(be, ops, b, sc_, T, D, s.rms_eps, head_, true, output_norm_, b.proj, first);
    head_block(be, output_, x, T - first, logits_dev_.as<float>(), logits);
  }

 private:
  DenseMatrix dense(const WeightRef& w, const char* what) {
    owned_.push_back(ctx_.be.resident(w.data(), w.t->nbytes, what));
    return DenseMatrix{w.type(), owned_.back().get(), w.t->ne.size() > 1 ? w.t->ne[1] : 1, w.t->ne[0]};
  }
  // Vectors (norms, sinks, biases, position biases) are read as float32: other types converted once.
  const float* vec(const WeightRef& w, const char* what) {
    const int64_t n = w.t->nelements();
    if (w.type() == (uint32_t)QType::F32) {
      owned_.push_back(ctx_.be.resident(w.data(), n * sizeof(float), what));
      return owned_.back().as<float>();
    }
    std::vector<float> v(n);
    dequantize(quant_traits(w.type(), what).type, w.data(), v.data(), n);
    return floats(std::move(v), what);
  }
  const float* floats(std::vector<float> v, const char* what) {
    converted_.push_back(std::move(v));
    owned_.push_back(
        ctx_.be.resident(converted_.back().data(), converted_.back().size() * sizeof(float), what));
    return owned_.back().as<float>();
  }
  HcSite site(const WeightRef& fn, const WeightRef& scale, const WeightRef& base) {
    return HcSite{dense(fn, "hc fn"), vec(scale, "hc scale"), vec(base, "hc base"), d_.hc_eps,
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
  Ds4Scratch sc_;
  std::vector<std::vector<float>> converted_;  // before owned_: borrowed buffers may point into it
  std::vector<DeviceBuffer> owned_;
  std::vector<Ds4LayerWeights> layers_;
  Ds4RopeDev main_rope_, comp_rope_;
  HcSite head_;
  DeviceBuffer token_embd_;
  const float* output_norm_ = nullptr;
  DenseMatrix output_;
  DeviceBuffer logits_dev_;
};

std::string no_v4_ops(const Backend& be) {
  return str("DeepSeek V4 runs on the CPU backend only; the ", be.name(),
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
