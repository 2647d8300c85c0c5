// gpt-oss (GGUF arch "gpt-oss"): hyperparameters and tensors from llama.cpp's key and tensor names,
// and its forward pass: pre-norm GQA with q/k/v/o biases, NEOX RoPE with YaRN, attention with a
// per-head sink on alternating sliding-window (even layers) and full layers; a biased router, softmax
// over the top-K logits, experts with gate/up/down biases and the clamped SwiGLU (`(up + 1) * glu`).
// Its own ops are GptOssOps (backend/gptoss_ops.h), which the CPU and CUDA backends implement.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "backend/gptoss_ops.h"
#include "core/error.h"
#include "core/utf8.h"
#include "model/arch.h"
#include "model/blocks.h"
#include "model/kv_cache.h"
#include "model/spec.h"
#include "model/weights.h"
#include "model/yarn.h"

namespace strata {

namespace {

// gpt-oss's tensors beyond LayerSpec: the biases, the sinks.
struct GptOssLayer {
  WeightRef q_b, k_b, v_b, o_b, sinks, router_b, gate_b, up_b, down_b;
};

struct GptOssSpec final : ArchSpec {
  int64_t window = 0;  // the sliding layers' window (keys at p - window + 1 .. p)
  // The rotation: inverse frequencies of the head_dim / 2 pairs (YaRN folded in), cos/sin scale.
  std::vector<float> inv_freq;
  float mscale = 1.f;
  // YaRN as read (factor 0: none), for `strata info`.
  float yarn_factor = 0.f, beta_fast = 32.f, beta_slow = 1.f;
  int64_t yarn_orig_ctx = 0;
  // The experts' clamped SwiGLU: llama.cpp's and transformers' constants (no metadata key).
  float swiglu_alpha = 1.702f, swiglu_limit = 7.0f;
  std::vector<GptOssLayer> layers;
};

const GptOssSpec& oss_spec(const ModelSpec& s) {
  const auto* d = dynamic_cast<const GptOssSpec*>(s.arch_spec.get());
  STRATA_CHECK(d, Error, "internal error: the spec of '", s.arch, "' is not a gpt-oss spec");
  return *d;
}

// Even layers slide (transformers' layer_types, llama.cpp's swa pattern 2), odd ones see everything.
bool sliding(int64_t l) { return l % 2 == 0; }

}  // namespace

ModelSpec read_gptoss(const gguf::File& f) {
  ModelSpec s;
  const std::string a = "gpt-oss.";
  s.arch = "gpt-oss";
  read_gqa_moe(f, a, GqaMoeDefaults{131072, 1e-5, 150000}, s);
  s.norm_topk = true;  // softmax over the top-K logits

  auto d = std::make_shared<GptOssSpec>();
  d->window = read_count(f, a + "attention.sliding_window", 1, limits::kContext, 128);
  const std::string scaling = printable(f.get_string(a + "rope.scaling.type", "none"));
  STRATA_CHECK(scaling == "none" || scaling == "yarn", UnsupportedError, f.path(), ": ", a,
               "rope.scaling.type '", scaling, "' is not supported (gpt-oss uses 'yarn' or none)");
  if (scaling == "yarn") {
    d->yarn_factor = (float)read_real(f, a + "rope.scaling.factor", 1.0, 1e6, 32.0);
    d->yarn_orig_ctx = read_count(f, a + "rope.scaling.original_context_length", 1, limits::kContext, 4096);
    d->beta_fast = (float)read_real(f, a + "rope.scaling.yarn_beta_fast", 1e-3, 1e6, 32.0);
    d->beta_slow = (float)read_real(f, a + "rope.scaling.yarn_beta_slow", 1e-3, 1e6, 1.0);
    STRATA_CHECK(d->beta_fast > d->beta_slow, FormatError, f.path(), ": ", a, "rope.scaling.yarn_beta_fast ",
                 d->beta_fast, " must exceed yarn_beta_slow ", d->beta_slow);
  }
  // transformers' rotary frequencies for gpt-oss: the default RoPE, or YaRN with its published
  // `truncate: false`.
  d->inv_freq = yarn_inv_freq(s.head_dim, s.rope_base,
                              Yarn{d->yarn_factor, d->yarn_orig_ctx, d->beta_fast, d->beta_slow, false});
  if (d->yarn_factor > 1) d->mscale = (float)(0.1 * std::log((double)d->yarn_factor) + 1.0);

  const TensorReader r(f, s.arch);
  r.common(s, false);
  const int64_t Hd = checked_mul(f, s.n_head, s.head_dim, "head_count * key_length");
  const int64_t KVd = checked_mul(f, s.n_kv_head, s.head_dim, "head_count_kv * key_length");
  for (int64_t l = 0; l < s.L; ++l) {
    LayerSpec ls;
    r.layer<LayerSpec>(l, ls,
                       {
                           {"attn_norm.weight", &LayerSpec::attn_norm, {s.D}},
                           {"attn_q.weight", &LayerSpec::q, {s.D, Hd}},
                           {"attn_k.weight", &LayerSpec::k, {s.D, KVd}},
                           {"attn_v.weight", &LayerSpec::v, {s.D, KVd}},
                           {"attn_output.weight", &LayerSpec::o, {Hd, s.D}},
                           {"post_attention_norm.weight", &LayerSpec::ffn_norm, {s.D}},
                           {"ffn_gate_inp.weight", &LayerSpec::router, {s.D, s.E}},
                           {"ffn_gate_exps.weight", &LayerSpec::gate_exps, {s.D, s.F, s.E}},
                           {"ffn_up_exps.weight", &LayerSpec::up_exps, {s.D, s.F, s.E}},
                           {"ffn_down_exps.weight", &LayerSpec::down_exps, {s.F, s.D, s.E}},
                       });
    GptOssLayer gl;
    r.layer<GptOssLayer>(l, gl,
                         {
                             {"attn_q.bias", &GptOssLayer::q_b, {Hd}},
                             {"attn_k.bias", &GptOssLayer::k_b, {KVd}},
                             {"attn_v.bias", &GptOssLayer::v_b, {KVd}},
                             {"attn_output.bias", &GptOssLayer::o_b, {s.D}},
                             {"attn_sinks.weight", &GptOssLayer::sinks, {s.n_head}},
                             {"ffn_gate_inp.bias", &GptOssLayer::router_b, {s.E}},
                             {"ffn_gate_exps.bias", &GptOssLayer::gate_b, {s.F, s.E}},
                             {"ffn_up_exps.bias", &GptOssLayer::up_b, {s.F, s.E}},
                             {"ffn_down_exps.bias", &GptOssLayer::down_b, {s.D, s.E}},
                         });
    s.layers.push_back(ls);
    d->layers.push_back(gl);
  }
  s.details.push_back(
      {"attention", str("sinks; sliding window ", d->window, " on even layers, full on odd")});
  s.details.push_back({"rope", d->yarn_factor > 1
                                   ? str("YaRN factor ", d->yarn_factor, ", original context ",
                                         d->yarn_orig_ctx, ", beta ", d->beta_fast, "/", d->beta_slow)
                                   : std::string("no scaling")});
  s.arch_spec = d;
  ScratchList scratch;
  declare_gqa_scratch(s, scratch);
  s.scratch = scratch.specs();
  return s;
}

namespace {

// The experts' input is the plain GR read; their activation adds each row's expert's gate/up biases
// and clamps (GptOssOps::swiglu_oai).
class OssMoe final : public MoeVariant {
 public:
  OssMoe(GptOssOps& ops, const float* gate_b, const float* up_b, float alpha, float limit)
      : ops_(ops), gate_b_(gate_b), up_b_(up_b), alpha_(alpha), limit_(limit) {}
  void input(Backend& be, const PrefillBuffers& b, const float* ffn_norm, int64_t D, int64_t K,
             const int32_t* rows, int64_t n, float* out) const override {
    be.apply_norm(b.R, b.grs, ffn_norm, D, rows, K, n, out);
  }
  void input_q8(Backend& be, const PrefillBuffers& b, const float* ffn_norm, int64_t D, int64_t K,
                const int32_t* rows, int64_t n, uint8_t* out, size_t rb) const override {
    be.quantize_q8_0(b.R, b.grs, ffn_norm, D, rows, K, n, out, rb);
  }
  void activate(Backend&, float*, const float*, int64_t) const override {
    throw Error("internal error: gpt-oss's expert activation needs the rows' experts (activate_rows)");
  }
  void activate_rows(Backend&, const PrefillBuffers& b, const int32_t* rows, int64_t n, int64_t F, float* g,
                     const float* u) const override {
    ops_.swiglu_oai(g, u, b.topk_ids, rows, n, F, gate_b_, up_b_, alpha_, limit_);
  }

 private:
  GptOssOps& ops_;
  const float *gate_b_, *up_b_;
  float alpha_, limit_;
};

class GptOssForward final : public RowsForwardPass {
 public:
  GptOssForward(const ForwardContext& ctx, GptOssOps& ops) : ctx_(ctx), ops_(ops), w_(ctx.be) {
    const ModelSpec& s = ctx.spec;
    const GptOssSpec& d = oss_spec(s);
    for (int64_t l = 0; l < s.L; ++l) {
      Layer ly;
      w_.layer<LayerSpec, Layer>(s.layers[l], ly,
                                 {
                                     {&LayerSpec::q, &Layer::q, "attn_q"},
                                     {&LayerSpec::k, &Layer::k, "attn_k"},
                                     {&LayerSpec::v, &Layer::v, "attn_v"},
                                     {&LayerSpec::o, &Layer::o, "attn_output"},
                                     {&LayerSpec::attn_norm, &Layer::attn_norm, "attn_norm"},
                                     {&LayerSpec::ffn_norm, &Layer::ffn_norm, "post_attention_norm"},
                                     {&LayerSpec::router, &Layer::router, "ffn_gate_inp"},
                                 });
      w_.layer<GptOssLayer, Layer>(d.layers[l], ly,
                                   {
                                       {&GptOssLayer::q_b, &Layer::q_b, "attn_q.bias"},
                                       {&GptOssLayer::k_b, &Layer::k_b, "attn_k.bias"},
                                       {&GptOssLayer::v_b, &Layer::v_b, "attn_v.bias"},
                                       {&GptOssLayer::o_b, &Layer::o_b, "attn_output.bias"},
                                       {&GptOssLayer::sinks, &Layer::sinks, "attn_sinks"},
                                       {&GptOssLayer::router_b, &Layer::router_b, "ffn_gate_inp.bias"},
                                       {&GptOssLayer::gate_b, &Layer::gate_b, "ffn_gate_exps.bias"},
                                       {&GptOssLayer::up_b, &Layer::up_b, "ffn_up_exps.bias"},
                                       {&GptOssLayer::down_b, &Layer::down_b, "ffn_down_exps.bias"},
                                   });
      layers_.push_back(ly);
      moe_.push_back(std::make_unique<OssMoe>(ops, ly.gate_b, ly.up_b, d.swiglu_alpha, d.swiglu_limit));
    }
    head_ = w_.head(s);
    inv_freq_ = w_.floats(d.inv_freq, "rope frequencies");
    ScratchList scratch;
    scratch_ = declare_gqa_scratch(s, scratch);
    STRATA_CHECK(scratch.specs() == s.scratch, Error,
                 "internal error: the gpt-oss scratch is not the spec's");
  }

 private:
  // A chunk of one sequence at pos0, or (rows) the rows of several sequences.
  void run(const PrefillBuffers& b, const int32_t* ids, int64_t T, int64_t pos0, const SeqRows* rows,
           float* logits, bool all_logits) override {
    const ModelSpec& s = ctx_.spec;
    Backend& be = ctx_.be;
    const int64_t D = s.D;
    be.upload(b.topk_ids, ids, (size_t)T * sizeof(int32_t));
    be.embed(s.token_embd.type(), head_.token_embd.get(), D, b.topk_ids, T, b.R);
    for (int64_t l = 0; l < s.L; ++l) {
      between_layers(ctx_, l, T, pos0);
      const Layer& ly = layers_[l];
      const float* x = l == 0 ? gr_read(be, b, T, D, s.rms_eps, ly.attn_norm, b.proj)
                              : add_gr_read(be, b, T, D, s.rms_eps, ly.attn_norm, b.proj);
      attention(b, l, ly, x, T, pos0, rows);
      x = add_gr_read(be, b, T, D, s.rms_eps, ly.ffn_norm, b.proj);
      // Softmax over all E, top-K, renormalized: the softmax of the top-K logits.
      be.matmul(ly.router.type, ly.router.data, s.E, D, x, D, T, b.router, s.E);
      ops_.add_bias(b.router, ly.router_b, T, s.E);
      be.router_topk(b.router, T, s.E, s.K, true, b.topk_ids, b.topk_w);
      be.group_by_expert(b.topk_ids, T, s.K, s.E, b.expert_off, b.expert_rows);
      moe_block(ctx_, b, l, T, ly.ffn_norm, moe_[l].get());
      ops_.expert_bias(b.proj, b.topk_ids, b.topk_w, ly.down_b, T, s.K, D);
    }
    between_layers(ctx_, s.L, T, pos0);
    if (!logits) return;
    final_logits(be, b, head_, T, D, s.rms_eps, all_logits, logits, rows);
  }

  struct Layer {
    DenseMatrix q, k, v, o, router;
    const float *attn_norm = nullptr, *ffn_norm = nullptr;
    const float *q_b = nullptr, *k_b = nullptr, *v_b = nullptr, *o_b = nullptr, *sinks = nullptr;
    const float *router_b = nullptr, *gate_b = nullptr, *up_b = nullptr, *down_b = nullptr;
  };

  void matmul(const DenseMatrix& m, const float* x, int64_t T, float* y) {
    ctx_.be.matmul(m.type, m.data, m.rows, m.cols, x, m.cols, T, y, m.rows);
  }

  // Biased q/k/v, RoPE, the KV cache at pos0, attention with sinks (windowed on sliding layers), the
  // biased output projection into b.proj. With `rows`, RoPE, store and attention run on each span of
  // one sequence (RowRun) in its KV region.
  void attention(const PrefillBuffers& b, int64_t l, const Layer& w, const float* x, int64_t T, int64_t pos0,
                 const SeqRows* rows) {
    const ModelSpec& s = ctx_.spec;
    Backend& be = ctx_.be;
    const int64_t H = s.n_head, KV = s.n_kv_head, hd = s.head_dim;
    float *q = b[scratch_.q], *k = b[scratch_.k], *v = b[scratch_.v], *out = b[scratch_.out];
    matmul_same_x(be, x, T, {{w.q, q}, {w.k, k}, {w.v, v}});  // one launch where the types agree
    ops_.add_bias(q, w.q_b, T, H * hd);
    ops_.add_bias(k, w.k_b, T, KV * hd);
    ops_.add_bias(v, w.v_b, T, KV * hd);
    const GptOssSpec& d = oss_spec(s);
    const KvType kt = ctx_.kv.type();
    const float scale = 1.0f / std::sqrt((float)hd);
    const int64_t window = sliding(l) ? d.window : 0;
    if (rows) {
      for_row_runs(be, *rows, T, [&](const RowRun& r) {
        const int64_t t = r.first, p = r.pos0, n = r.n;
        float *qt = q + t * H * hd, *kt_ = k + t * KV * hd, *vt = v + t * KV * hd;
        void* kc = ctx_.kv.k(l, r.seq);
        void* vc = ctx_.kv.v(l, r.seq);
        ops_.rope_neox(qt, n, H, hd, inv_freq_, d.mscale, p);
        ops_.rope_neox(kt_, n, KV, hd, inv_freq_, d.mscale, p);
        be.kv_store(kc, kt, p, n, KV * hd, kt_);
        be.kv_store(vc, kt, p, n, KV * hd, vt);
        ops_.attention_sinks(qt, kc, vc, kt, n, p, H, KV, hd, scale, w.sinks, window, out + t * H * hd);
      });
    } else {
      ops_.rope_neox(q, T, H, hd, inv_freq_, d.mscale, pos0);
      ops_.rope_neox(k, T, KV, hd, inv_freq_, d.mscale, pos0);
      be.kv_store(ctx_.kv.k(l), kt, pos0, T, KV * hd, k);
      be.kv_store(ctx_.kv.v(l), kt, pos0, T, KV * hd, v);
      ops_.attention_sinks(q, ctx_.kv.k(l), ctx_.kv.v(l), kt, T, pos0, H, KV, hd, scale, w.sinks, window,
                           out);
    }
    matmul(w.o, out, T, b.proj);
    ops_.add_bias(b.proj, w.o_b, T, s.D);
  }

  ForwardContext ctx_;
  GptOssOps& ops_;
  ResidentWeights w_;
  std::vector<Layer> layers_;
  std::vector<std::unique_ptr<OssMoe>> moe_;
  HeadWeights head_;
  const float* inv_freq_ = nullptr;
  AttentionScratch scratch_;
};

std::string no_oss_ops(Backend& be) {
  return str("gpt-oss runs on the CPU and CUDA backends; the ", be.name(),
             " backend has no gpt-oss ops (attention sinks, YaRN, the biased experts). Use --device cpu.");
}

void check_gptoss_backend(Backend& be, const std::string& path) {
  STRATA_CHECK(gptoss_ops(be), UnsupportedError, path, ": ", no_oss_ops(be));
}

std::unique_ptr<ForwardPass> make_gptoss(const ForwardContext& ctx) {
  GptOssOps* ops = gptoss_ops(ctx.be);
  STRATA_CHECK(ops, UnsupportedError, no_oss_ops(ctx.be));
  return std::make_unique<GptOssForward>(ctx, *ops);
}

}  // namespace

extern const Architecture kGptOss{"gpt-oss", read_gptoss, make_gptoss, check_gptoss_backend};

}  // namespace strata
