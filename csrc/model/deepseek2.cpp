// deepseek2 (GGUF arch "deepseek2": DeepSeek V2/V3/R1, Kimi-K2, GLM-4.7-Flash): hyperparameters and
// tensors from llama.cpp's key and tensor names, and its forward pass: multi-head latent attention in the
// absorbed form (the KV cache holds each position's normalized kv latent and its rotated rope key, one
// row that attention reads as key and value), YaRN with its attention-scale correction, leading dense
// layers, then MoE layers with shared experts and the grouped router (sigmoid or softmax gating, the
// selection bias exp_probs_b, group-limited top-k, normalized and scaled weights).
// Its own ops are Deepseek2Ops (backend/deepseek2_ops.h).
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "backend/deepseek2_ops.h"
#include "core/error.h"
#include "core/utf8.h"
#include "model/arch.h"
#include "model/blocks.h"
#include "model/kv_cache.h"
#include "model/spec.h"
#include "model/weights.h"
#include "model/yarn.h"
#include "quant/quant.h"

namespace strata {

namespace {

// A layer's tensors: the attention's always; the dense FFN's on the leading dense layers; the router,
// its selection bias (optional) and the shared expert's on the MoE layers (whose routed experts are in
// ModelSpec::layers).
struct Ds2LayerSpec {
  WeightRef attn_norm, q_a, q_a_norm, q_b, q, kv_a, kv_a_norm, k_b, v_b, o, ffn_norm;
  WeightRef gate, up, down;
  WeightRef router, probs_b, gate_sh, up_sh, down_sh;
};

struct Ds2Spec final : ArchSpec {
  int64_t q_lora = 0;              // 0: the query is one projection (attn_q), as V2-Lite
  int64_t kv_lora = 0;             // C: the kv latent
  int64_t dn = 0, dr = 0, dv = 0;  // a head's key dims without / with RoPE, its value dims
  int64_t n_dense = 0, dense_ffn = 0, shared = 0;
  bool sigmoid = true, w_norm = false;
  int64_t groups = 0, groups_used = 0;
  float w_scale = 1.f;
  std::vector<float> inv_freq;  // dr / 2 pairs, YaRN folded in
  float kq_scale = 1.f;
  Yarn yarn;
  double mscale_all_dim = 0;
  std::vector<Ds2LayerSpec> layers;  // all L

  int64_t dk() const { return dn + dr; }
  int64_t latent() const { return kv_lora + dr; }  // a KV cache row
  int64_t ffn_width() const { return std::max<int64_t>({dense_ffn, shared, 1}); }
};

const Ds2Spec& ds2_spec(const ModelSpec& s) {
  const auto* d = dynamic_cast<const Ds2Spec*>(s.arch_spec.get());
  STRATA_CHECK(d, Error, "internal error: the spec of '", s.arch, "' is not a deepseek2 spec");
  return *d;
}

struct Ds2Scratch {
  Scratch<float> q_a, q, kv, q_lat, out_lat, out, gate, up, shared;
};

// The chunk scratch beyond the common buffers, per token: the query (and its low-rank step), the
// latent row, the absorbed query and attention's output over latent rows, the heads' values, and the
// dense or shared FFN's gate, up and output.
Ds2Scratch declare_ds2(const ModelSpec& s, const Ds2Spec& d, ScratchList& list) {
  Ds2Scratch sc;
  sc.q_a = list.f32("mla.q_a", {std::max<int64_t>(d.q_lora, 1)});
  sc.q = list.f32("mla.q", {s.n_head, d.dk()});
  sc.kv = list.f32("mla.kv", {d.latent()});
  sc.q_lat = list.f32("mla.q_latent", {s.n_head, d.latent()});
  sc.out_lat = list.f32("mla.out_latent", {s.n_head, d.latent()});
  sc.out = list.f32("mla.out", {s.n_head * d.dv});
  sc.gate = list.f32("ffn.gate", {d.ffn_width()});
  sc.up = list.f32("ffn.up", {d.ffn_width()});
  sc.shared = list.f32("ffn.shared", {s.D});
  return sc;
}

// llama.cpp's expert_gating_func values.
constexpr int64_t kGatingSoftmax = 1, kGatingSigmoid = 2;

void read_hparams(const gguf::File& f, const std::string& a, ModelSpec& s, Ds2Spec& d) {
  s.name = printable(f.get_string("general.name", ""));
  s.L = read_count(f, a + "block_count", 1, limits::kLayers);
  s.D = read_count(f, a + "embedding_length", 1, limits::kHidden);
  s.n_head = read_count(f, a + "attention.head_count", 1, limits::kHeads);
  STRATA_CHECK(
      f.find(a + "attention.key_length_mla"), UnsupportedError, f.path(), ": this deepseek2 file has no ", a,
      "attention.key_length_mla: it was converted before llama.cpp split attn_kv_b into attn_k_b and "
      "attn_v_b, the form strata runs. Re-convert it with a current llama.cpp convert_hf_to_gguf.py.");
  d.kv_lora = read_count(f, a + "attention.kv_lora_rank", 1, limits::kHeadDim);
  d.q_lora = read_count(f, a + "attention.q_lora_rank", 0, limits::kHidden, 0);
  const int64_t dk = read_count(f, a + "attention.key_length_mla", 2, limits::kHeadDim);
  d.dv = read_count(f, a + "attention.value_length_mla", 1, limits::kHeadDim, dk);
  d.dr = read_count(f, a + "rope.dimension_count", 2, dk - 1);
  STRATA_CHECK(d.dr % 2 == 0, FormatError, f.path(), ": ", a, "rope.dimension_count ", d.dr,
               " must be even (RoPE rotates pairs)");
  d.dn = dk - d.dr;
  // The absorbed (MQA) view llama.cpp's converter writes beside: one KV head of kv_lora + rope dims.
  const int64_t kv_heads = read_count(f, a + "attention.head_count_kv", 1, limits::kHeads, 1);
  const int64_t klen = read_count(f, a + "attention.key_length", 1, 2 * limits::kHeadDim, d.latent());
  const int64_t vlen = read_count(f, a + "attention.value_length", 1, limits::kHeadDim, d.kv_lora);
  STRATA_CHECK(kv_heads == 1 && klen == d.latent() && vlen == d.kv_lora, FormatError, f.path(), ": ", a,
               "attention.head_count_kv / key_length / value_length = ", kv_heads, " / ", klen, " / ", vlen,
               " do not describe the absorbed latent attention (1 / ", d.latent(), " / ", d.kv_lora,
               " from kv_lora_rank ", d.kv_lora, " and rope.dimension_count ", d.dr, ")");
  s.n_kv_head = 1;
  s.head_dim = d.latent();
  s.kv_values_are_keys = true;

  s.E = read_count(f, a + "expert_count", 1, limits::kExperts);
  s.K = read_count(f, a + "expert_used_count", 1, std::min(s.E, limits::kExpertsUsed));
  s.F = read_count(f, a + "expert_feed_forward_length", 1, limits::kFfn);
  d.n_dense = read_count(f, a + "leading_dense_block_count", 0, s.L - 1, 0);
  if (d.n_dense > 0) d.dense_ffn = read_count(f, a + "feed_forward_length", 1, limits::kFfn);
  const int64_t n_shared = read_count(f, a + "expert_shared_count", 0, 64, 0);
  d.shared = checked_mul(f, n_shared, s.F, "expert_shared_count * expert_feed_forward_length");
  const int64_t gating = read_count(f, a + "expert_gating_func", 0, 4, kGatingSoftmax);
  STRATA_CHECK(gating == kGatingSoftmax || gating == kGatingSigmoid || gating == 0, UnsupportedError,
               f.path(), ": ", a, "expert_gating_func ", gating,
               " is not supported (deepseek2 routes by softmax (1) or sigmoid (2))");
  d.sigmoid = gating == kGatingSigmoid;
  d.w_norm = f.get_bool(a + "expert_weights_norm", false);
  d.w_scale = (float)read_real(f, a + "expert_weights_scale", 1e-6, 1e6, 1.0);
  d.groups = read_count(f, a + "expert_group_count", 0, s.E, 0);
  if (d.groups > 1) {
    d.groups_used = read_count(f, a + "expert_group_used_count", 1, d.groups);
    STRATA_CHECK(s.E % d.groups == 0 && s.E / d.groups >= 2, FormatError, f.path(), ": ", a,
                 "expert_group_count ", d.groups, " must divide expert_count ", s.E,
                 " into groups of at least 2 (a group scores its two best experts)");
    STRATA_CHECK(d.groups_used * (s.E / d.groups) >= s.K, FormatError, f.path(), ": ", a,
                 "expert_group_used_count ", d.groups_used, " groups of ", s.E / d.groups,
                 " experts cannot hold expert_used_count ", s.K);
  }
  s.norm_topk = d.w_norm;
  s.ctx_train = read_count(f, a + "context_length", 1, limits::kContext, 4096);
  s.rms_eps = (float)read_real(f, a + "attention.layer_norm_rms_epsilon", 1e-30, 1.0, 1e-6);
  s.rope_base = (float)read_real(f, a + "rope.freq_base", 1.0, 1e30, 10000.0);
  const double temp = read_real(f, a + "attention.temperature_scale", -1e6, 1e6, 0.0);
  STRATA_CHECK(temp == 0.0, UnsupportedError, f.path(), ": ", a,
               "attention.temperature_scale (Mistral-Large's attention temperature tuning) is not supported");

  const std::string scaling = printable(f.get_string(a + "rope.scaling.type", "none"));
  STRATA_CHECK(scaling == "none" || scaling == "yarn", UnsupportedError, f.path(), ": ", a,
               "rope.scaling.type '", scaling, "' is not supported (deepseek2 uses 'yarn' or none)");
  double mscale = 1.0;
  if (scaling == "yarn") {
    d.yarn.factor = read_real(f, a + "rope.scaling.factor", 1.0, 1e6, 1.0);
    d.yarn.orig_ctx = read_count(f, a + "rope.scaling.original_context_length", 1, limits::kContext, 4096);
    d.yarn.beta_fast = read_real(f, a + "rope.scaling.yarn_beta_fast", 1e-3, 1e6, 32.0);
    d.yarn.beta_slow = read_real(f, a + "rope.scaling.yarn_beta_slow", 1e-3, 1e6, 1.0);
    STRATA_CHECK(d.yarn.beta_fast > d.yarn.beta_slow, FormatError, f.path(), ": ", a,
                 "rope.scaling.yarn_beta_fast ", d.yarn.beta_fast, " must exceed yarn_beta_slow ",
                 d.yarn.beta_slow);
    // The converter stores 0.1 * mscale_all_dim (llama.cpp divides it back out).
    d.mscale_all_dim = read_real(f, a + "rope.scaling.yarn_log_multiplier", 0.0, 1e3, 0.0) / 0.1;
    // transformers' attention scale correction; the rotation itself is unscaled (llama.cpp cancels its
    // own YaRN magnitude for deepseek2, transformers' mscale / mscale_all_dim is 1 in the published configs).
    if (d.yarn.factor > 1) mscale = 0.1 * d.mscale_all_dim * std::log(d.yarn.factor) + 1.0;
  }
  d.yarn.truncate = true;
  d.inv_freq = yarn_inv_freq(d.dr, s.rope_base, d.yarn);
  d.kq_scale = (float)(mscale * mscale / std::sqrt((double)d.dk()));
}

}  // namespace

ModelSpec read_deepseek2(const gguf::File& f) {
  ModelSpec s;
  const std::string a = "deepseek2.";
  s.arch = "deepseek2";
  auto d = std::make_shared<Ds2Spec>();
  read_hparams(f, a, s, *d);

  const TensorReader r(f, s.arch);
  r.common(s, true);
  const int64_t H = s.n_head, C = d->kv_lora;
  const int64_t Hk = checked_mul(f, H, d->dk(), "head_count * key_length_mla");
  const int64_t Hv = checked_mul(f, H, d->dv, "head_count * value_length_mla");
  for (int64_t l = 0; l < s.L; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    STRATA_CHECK(
        !f.find_tensor(p + "attn_kv_b.weight"), UnsupportedError, f.path(), ": tensor '", p,
        "attn_kv_b.weight' is the unsplit form of older converters; strata reads attn_k_b and attn_v_b. "
        "Re-convert the model with a current llama.cpp convert_hf_to_gguf.py.");
    Ds2LayerSpec dl;
    r.layer<Ds2LayerSpec>(l, dl,
                          {
                              {"attn_norm.weight", &Ds2LayerSpec::attn_norm, {s.D}},
                              {"attn_kv_a_mqa.weight", &Ds2LayerSpec::kv_a, {s.D, d->latent()}},
                              {"attn_kv_a_norm.weight", &Ds2LayerSpec::kv_a_norm, {C}},
                              {"attn_k_b.weight", &Ds2LayerSpec::k_b, {d->dn, C, H}},
                              {"attn_v_b.weight", &Ds2LayerSpec::v_b, {C, d->dv, H}},
                              {"attn_output.weight", &Ds2LayerSpec::o, {Hv, s.D}},
                              {"ffn_norm.weight", &Ds2LayerSpec::ffn_norm, {s.D}},
                          });
    if (d->q_lora > 0)
      r.layer<Ds2LayerSpec>(l, dl,
                            {
                                {"attn_q_a.weight", &Ds2LayerSpec::q_a, {s.D, d->q_lora}},
                                {"attn_q_a_norm.weight", &Ds2LayerSpec::q_a_norm, {d->q_lora}},
                                {"attn_q_b.weight", &Ds2LayerSpec::q_b, {d->q_lora, Hk}},
                            });
    else
      r.layer<Ds2LayerSpec>(l, dl, {{"attn_q.weight", &Ds2LayerSpec::q, {s.D, Hk}}});
    if (l < d->n_dense) {
      r.layer<Ds2LayerSpec>(l, dl,
                            {
                                {"ffn_gate.weight", &Ds2LayerSpec::gate, {s.D, d->dense_ffn}},
                                {"ffn_up.weight", &Ds2LayerSpec::up, {s.D, d->dense_ffn}},
                                {"ffn_down.weight", &Ds2LayerSpec::down, {d->dense_ffn, s.D}},
                            });
    } else {
      r.layer<Ds2LayerSpec>(l, dl, {{"ffn_gate_inp.weight", &Ds2LayerSpec::router, {s.D, s.E}}});
      if (f.find_tensor(p + "exp_probs_b.bias")) dl.probs_b = r.need(p + "exp_probs_b.bias", {s.E});
      if (d->shared > 0)
        r.layer<Ds2LayerSpec>(l, dl,
                              {
                                  {"ffn_gate_shexp.weight", &Ds2LayerSpec::gate_sh, {s.D, d->shared}},
                                  {"ffn_up_shexp.weight", &Ds2LayerSpec::up_sh, {s.D, d->shared}},
                                  {"ffn_down_shexp.weight", &Ds2LayerSpec::down_sh, {d->shared, s.D}},
                              });
      LayerSpec ls;
      r.layer<LayerSpec>(l, ls,
                         {
                             {"ffn_gate_exps.weight", &LayerSpec::gate_exps, {s.D, s.F, s.E}},
                             {"ffn_up_exps.weight", &LayerSpec::up_exps, {s.D, s.F, s.E}},
                             {"ffn_down_exps.weight", &LayerSpec::down_exps, {s.F, s.D, s.E}},
                         });
      s.layers.push_back(ls);
    }
    d->layers.push_back(dl);
  }
  s.details.push_back(
      {"attention", str("latent (MLA): ", d->q_lora ? str("q LoRA ", d->q_lora, ", ") : std::string(),
                        "kv LoRA ", C, ", key ", d->dn, " + rope ", d->dr, ", value ", d->dv,
                        "; KV cache rows of ", d->latent(), " (latent + rope key)")});
  s.details.push_back(
      {"routing",
       str(d->sigmoid ? "sigmoid" : "softmax",
           d->layers.size() > (size_t)d->n_dense && d->layers[d->n_dense].probs_b.t ? " + selection bias"
                                                                                    : "",
           d->groups > 1 ? str(", top ", d->groups_used, " of ", d->groups, " groups") : std::string(),
           d->w_norm ? ", normalized" : "", ", scale ", d->w_scale, "; ", d->shared / s.F,
           " shared expert(s)")});
  s.details.push_back(
      {"layers", str(d->n_dense, " dense (FFN ", d->dense_ffn, "), ", s.L - d->n_dense, " MoE")});
  s.details.push_back({"rope", d->yarn.factor > 1 ? str("interleaved pairs; YaRN factor ", d->yarn.factor,
                                                        ", original context ", d->yarn.orig_ctx,
                                                        ", mscale_all_dim ", d->mscale_all_dim)
                                                  : std::string("interleaved pairs, no scaling")});
  s.arch_spec = d;
  ScratchList scratch;
  declare_ds2(s, *d, scratch);
  s.scratch = scratch.specs();
  return s;
}

namespace {

class Deepseek2Forward final : public RowsForwardPass {
 public:
  Deepseek2Forward(const ForwardContext& ctx, Deepseek2Ops& ops) : ctx_(ctx), ops_(ops), w_(ctx.be) {
    const ModelSpec& s = ctx.spec;
    const Ds2Spec& d = ds2_spec(s);
    for (const Ds2LayerSpec& dl : d.layers) {
      Layer ly;
      w_.layer<Ds2LayerSpec, Layer>(dl, ly,
                                    {
                                        {&Ds2LayerSpec::attn_norm, &Layer::attn_norm, "attn_norm"},
                                        {&Ds2LayerSpec::q_a, &Layer::q_a, "attn_q_a"},
                                        {&Ds2LayerSpec::q_a_norm, &Layer::q_a_norm, "attn_q_a_norm"},
                                        {&Ds2LayerSpec::q_b, &Layer::q_b, "attn_q_b"},
                                        {&Ds2LayerSpec::q, &Layer::q, "attn_q"},
                                        {&Ds2LayerSpec::kv_a, &Layer::kv_a, "attn_kv_a_mqa"},
                                        {&Ds2LayerSpec::kv_a_norm, &Layer::kv_a_norm, "attn_kv_a_norm"},
                                        {&Ds2LayerSpec::k_b, &Layer::k_b, "attn_k_b"},
                                        {&Ds2LayerSpec::v_b, &Layer::v_b, "attn_v_b"},
                                        {&Ds2LayerSpec::o, &Layer::o, "attn_output"},
                                        {&Ds2LayerSpec::ffn_norm, &Layer::ffn_norm, "ffn_norm"},
                                        {&Ds2LayerSpec::gate, &Layer::gate, "ffn_gate"},
                                        {&Ds2LayerSpec::up, &Layer::up, "ffn_up"},
                                        {&Ds2LayerSpec::down, &Layer::down, "ffn_down"},
                                        {&Ds2LayerSpec::router, &Layer::router, "ffn_gate_inp"},
                                        {&Ds2LayerSpec::probs_b, &Layer::probs_b, "exp_probs_b"},
                                        {&Ds2LayerSpec::gate_sh, &Layer::gate_sh, "ffn_gate_shexp"},
                                        {&Ds2LayerSpec::up_sh, &Layer::up_sh, "ffn_up_shexp"},
                                        {&Ds2LayerSpec::down_sh, &Layer::down_sh, "ffn_down_shexp"},
                                    });
      // The per-head slices of k_b (C rows of dn) and v_b (dv rows of C), as matmul reads them.
      ly.k_b_head = (size_t)d.kv_lora * row_bytes(static_cast<QType>(ly.k_b.type), d.dn);
      ly.v_b_head = (size_t)d.dv * row_bytes(static_cast<QType>(ly.v_b.type), d.kv_lora);
      layers_.push_back(ly);
    }
    head_ = w_.head(s);
    inv_freq_ = w_.floats(d.inv_freq, "rope frequencies");
    ScratchList scratch;
    sc_ = declare_ds2(s, d, scratch);
    STRATA_CHECK(scratch.specs() == s.scratch, Error,
                 "internal error: the deepseek2 scratch is not the spec's");
  }

 private:
  struct Layer {
    const float *attn_norm = nullptr, *q_a_norm = nullptr, *kv_a_norm = nullptr, *ffn_norm = nullptr;
    const float* probs_b = nullptr;
    DenseMatrix q_a, q_b, q, kv_a, k_b, v_b, o;
    DenseMatrix gate, up, down, router, gate_sh, up_sh, down_sh;
    size_t k_b_head = 0, v_b_head = 0;
  };

  // A chunk of one sequence at pos0, or (rows) the rows of several sequences.
  void run(const PrefillBuffers& b, const int32_t* ids, int64_t T, int64_t pos0, const SeqRows* rows,
           float* logits, bool all_logits) override {
    const ModelSpec& s = ctx_.spec;
    const Ds2Spec& d = ds2_spec(s);
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
      if (l < d.n_dense) {
        swiglu_ffn(b, ly.gate, ly.up, ly.down, x, T, b.proj);  // x (in proj) is read before proj is written
        continue;
      }
      be.matmul(ly.router.type, ly.router.data, s.E, D, x, D, T, b.router, s.E);
      ops_.router_grouped(b.router, T, s.E, s.K, d.sigmoid, ly.probs_b, d.groups, d.groups_used, d.w_norm,
                          d.w_scale, b.topk_ids, b.topk_w);
      be.group_by_expert(b.topk_ids, T, s.K, s.E, b.expert_off, b.expert_rows);
      // The shared expert reads x before the routed experts overwrite proj (where x may be staged).
      if (d.shared > 0) swiglu_ffn(b, ly.gate_sh, ly.up_sh, ly.down_sh, x, T, b[sc_.shared]);
      // The next layer's router and its grouped selection: the guess of its experts that a prompt's look
      // ahead and --prefetch fill ahead of it.
      NextRouter next;
      if (l + 1 < s.L) {
        const Layer& nl = layers_[l + 1];
        next.router = &nl.router;
        next.ffn_norm = nl.ffn_norm;
        next.select = [this, &nl](float* logits, int64_t n, int32_t* ids, float* w) {
          const ModelSpec& sp = ctx_.spec;
          const Ds2Spec& dd = ds2_spec(sp);
          ops_.router_grouped(logits, n, sp.E, sp.K, dd.sigmoid, nl.probs_b, dd.groups, dd.groups_used,
                              dd.w_norm, dd.w_scale, ids, w);
        };
      }
      moe_block(ctx_, b, l - d.n_dense, T, ly.ffn_norm, nullptr, next.router ? &next : nullptr);
      if (d.shared > 0) be.add(b.proj, b[sc_.shared], T * D);
    }
    between_layers(ctx_, s.L, T, pos0);
    if (!logits) return;
    final_logits(be, b, head_, T, D, s.rms_eps, all_logits, logits, rows);
  }

  void matmul(const DenseMatrix& m, const float* x, int64_t T, float* y) {
    ctx_.be.matmul(m.type, m.data, m.rows, m.cols, x, m.cols, T, y, m.rows);
  }

  // down(silu(gate x) * (up x)) into y.
  void swiglu_ffn(const PrefillBuffers& b, const DenseMatrix& gate, const DenseMatrix& up,
                  const DenseMatrix& down, const float* x, int64_t T, float* y) {
    float *g = b[sc_.gate], *u = b[sc_.up];
    matmul_same_x(ctx_.be, x, T, {{gate, g}, {up, u}});
    ctx_.be.swiglu(g, u, T * gate.rows);
    matmul(down, g, T, y);
  }

  // Latent attention, absorbed: the query's nope part times k_b per head becomes a query over latent
  // rows, its rope part rotated behind it; the latent row (normalized kv latent, rotated rope key) goes
  // to the KV cache; attention over those rows as keys and values gives each head a latent output, which
  // v_b per head turns into its values; then the output projection into b.proj. With `rows`, row t is
  // token of its sequence: RoPE, store and attention run on each span of one sequence (RowRun).
  void attention(const PrefillBuffers& b, int64_t l, const Layer& w, const float* x, int64_t T, int64_t pos0,
                 const SeqRows* rows) {
    const ModelSpec& s = ctx_.spec;
    const Ds2Spec& d = ds2_spec(s);
    Backend& be = ctx_.be;
    const int64_t H = s.n_head, C = d.kv_lora, dn = d.dn, dk = d.dk(), W = d.latent(), P = d.dr / 2;
    float *q = b[sc_.q], *kv = b[sc_.kv], *ql = b[sc_.q_lat], *ol = b[sc_.out_lat], *out = b[sc_.out];
    // The query's first projection and the kv latent's read the same x: one launch where they can.
    if (d.q_lora > 0) {
      float* qa = b[sc_.q_a];
      matmul_same_x(be, x, T, {{w.q_a, qa}, {w.kv_a, kv}});
      ops_.rms_norm_rows(qa, T, d.q_lora, d.q_lora, w.q_a_norm, s.rms_eps);
      matmul(w.q_b, qa, T, q);
    } else {
      matmul_same_x(be, x, T, {{w.q, q}, {w.kv_a, kv}});
    }
    ops_.rms_norm_rows(kv, T, C, W, w.kv_a_norm, s.rms_eps);
    be.matmul_strided(w.k_b.type, w.k_b.data, w.k_b_head, C, dn, q, dk, H * dk, T, ql, W, H * W, H);
    const KvType kt = ctx_.kv.type();
    if (rows) {
      for_row_runs(be, *rows, T, [&](const RowRun& r) {
        const int64_t t = r.first, p = r.pos0, n = r.n;
        float* kvt = kv + t * W;
        ops_.rope_pairs(q + t * H * dk + dn, H * dk, dk, ql + t * H * W + C, H * W, W, n, H, P, inv_freq_, p);
        ops_.rope_pairs(kvt + C, W, W, kvt + C, W, W, n, 1, P, inv_freq_, p);
        void* kc = ctx_.kv.k(l, r.seq);
        be.kv_store(kc, kt, p, n, W, kvt);
        be.attention(ql + t * H * W, kc, kc, kt, n, p, H, 1, W, d.kq_scale, ol + t * H * W);
      });
    } else {
      ops_.rope_pairs(q + dn, H * dk, dk, ql + C, H * W, W, T, H, P, inv_freq_, pos0);
      ops_.rope_pairs(kv + C, W, W, kv + C, W, W, T, 1, P, inv_freq_, pos0);
      void* kc = ctx_.kv.k(l);
      be.kv_store(kc, kt, pos0, T, W, kv);
      be.attention(ql, kc, kc, kt, T, pos0, H, 1, W, d.kq_scale, ol);
    }
    be.matmul_strided(w.v_b.type, w.v_b.data, w.v_b_head, d.dv, C, ol, W, H * W, T, out, d.dv, H * d.dv, H);
    matmul(w.o, out, T, b.proj);
  }

  ForwardContext ctx_;
  Deepseek2Ops& ops_;
  ResidentWeights w_;
  std::vector<Layer> layers_;
  HeadWeights head_;
  const float* inv_freq_ = nullptr;
  Ds2Scratch sc_;

 public:
  // Every op that takes a position reads the backend's position source while it is set (rope_pairs, the KV
  // store, attention; a batched row's through for_row_runs): a decode step records as one graph.
  bool graphable() const override { return true; }
};

std::string no_ds2_ops(Backend& be) {
  return str("deepseek2 runs on the CPU and CUDA backends; the ", be.name(),
             " backend has no deepseek2 ops (the latent RMSNorm, interleaved RoPE, grouped router). "
             "Use --device cpu.");
}

void check_deepseek2_backend(Backend& be, const std::string& path) {
  STRATA_CHECK(deepseek2_ops(be), UnsupportedError, path, ": ", no_ds2_ops(be));
}

std::unique_ptr<ForwardPass> make_deepseek2(const ForwardContext& ctx) {
  Deepseek2Ops* ops = deepseek2_ops(ctx.be);
  STRATA_CHECK(ops, UnsupportedError, no_ds2_ops(ctx.be));
  return std::make_unique<Deepseek2Forward>(ctx, *ops);
}

}  // namespace

extern const Architecture kDeepseek2{"deepseek2", read_deepseek2, make_deepseek2, check_deepseek2_backend};

}  // namespace strata
