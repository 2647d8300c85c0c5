// DeepSeek V4's spec reader: every hyperparameter from llama.cpp's deepseek4 metadata keys, every tensor
// shape checked against them, the KV-cache layout and the lines `strata info` shows.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/utf8.h"
#include "model/deepseek4.h"
#include "model/weights.h"

namespace strata {

namespace {

// Bounds of V4's own hyperparameters beyond model/spec.h's limits: far above DeepSeek V4 (HC 4,
// 20 Sinkhorn iterations, indexer top-512), low enough that the chunk plan's products fit in int64.
constexpr int64_t kMaxHC = 16;
constexpr int64_t kMaxSinkhornIters = 1 << 10;
constexpr int64_t kMaxIndexTopk = 1 << 16;

class Reader {
 public:
  explicit Reader(const gguf::File& f) : f_(f) {}

  // Every number is bounded ([lo, hi]) before anything is derived from it (model/spec.h).
  int64_t u(const std::string& key, int64_t lo, int64_t hi) const {
    return read_count(f_, "deepseek4." + key, lo, hi);
  }
  int64_t u(const std::string& key, int64_t lo, int64_t hi, int64_t dflt) const {
    return read_count(f_, "deepseek4." + key, lo, hi, dflt);
  }
  float fl(const std::string& key, double lo, double hi) const {
    (void)f_.get_float("deepseek4." + key);  // required: FormatError naming the key when missing
    return fl(key, lo, hi, 0.0);
  }
  float fl(const std::string& key, double lo, double hi, double dflt) const {
    return (float)read_real(f_, "deepseek4." + key, lo, hi, dflt);
  }
  // A per-layer value given as an array (at least n entries) or one scalar for every layer, each
  // finite and in [lo, hi]. n is bounded by the caller (block_count).
  std::vector<double> per_layer(const std::string& key, int64_t n, bool required, double dflt, double lo,
                                double hi) const {
    const gguf::Value* v = f_.find("deepseek4." + key);
    if (!v) {
      STRATA_CHECK(!required, FormatError, f_.path(), ": metadata key 'deepseek4.", key, "' is missing");
      return std::vector<double>(n, dflt);
    }
    std::vector<double> out;
    if (!v->is_array()) {
      out.assign(n, v->as_float());
    } else {
      for (int64_t x : v->ints) out.push_back((double)x);
      for (double x : v->floats) out.push_back(x);
    }
    STRATA_CHECK((int64_t)out.size() >= n, FormatError, f_.path(), ": metadata 'deepseek4.", key, "' has ",
                 out.size(), " entries, fewer than the ", n, " blocks");
    for (int64_t l = 0; l < n; ++l)
      STRATA_CHECK(std::isfinite(out[l]) && out[l] >= lo && out[l] <= hi, FormatError, f_.path(),
                   ": metadata 'deepseek4.", key, "'[", l, "] = ", out[l], " is out of range [", lo, ", ", hi,
                   "]; the file is corrupt or not a model strata can run");
    return out;
  }
  const gguf::File& f() const { return f_; }

 private:
  const gguf::File& f_;
};

// "0-2, 5, 7" from a sorted list of layer indices.
std::string ranges(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    s += str(s.empty() ? "" : ", ", v[i]);
    if (j > i) s += str("-", v[j]);
    i = j + 1;
  }
  return s;
}

std::string num(double x) { return str(x); }

}  // namespace

ModelSpec read_deepseek4(const gguf::File& f) {
  const Reader r(f);
  ModelSpec s;
  auto ds = std::make_shared<Ds4Spec>();
  Ds4Spec& d = *ds;
  s.arch = "deepseek4";
  s.name = printable(f.get_string("general.name", ""));
  // As llama.cpp: block_count counts the MTP blocks when their tensors are in the file.
  const int64_t n_all = r.u("block_count", 1, limits::kLayers);
  d.mtp_blocks = r.u("nextn_predict_layers", 0, n_all - 1, 0);
  if (d.mtp_blocks > 0 && !f.find_tensor(str("blk.", n_all - d.mtp_blocks, ".nextn.eh_proj.weight")))
    d.mtp_blocks = 0;
  s.L = n_all - d.mtp_blocks;
  s.D = r.u("embedding_length", 1, limits::kHidden);
  s.n_head = r.u("attention.head_count", 1, limits::kHeads);
  s.n_kv_head = r.u("attention.head_count_kv", 1, limits::kHeads, 1);
  s.head_dim = r.u("attention.key_length", 2, limits::kHeadDim, s.D / s.n_head);
  const int64_t vlen = r.u("attention.value_length", 1, limits::kHeadDim, s.head_dim);
  d.rope_dim = r.u("rope.dimension_count", 2, limits::kHeadDim, s.head_dim);
  s.E = r.u("expert_count", 1, limits::kExperts);
  s.K = r.u("expert_used_count", 1, std::min(s.E, limits::kExpertsUsed));
  const std::vector<double> ffn = r.per_layer("expert_feed_forward_length", n_all, true, 0, 1, limits::kFfn);
  s.F = (int64_t)ffn[0];
  s.ctx_train = r.u("context_length", 1, limits::kContext, 4096);
  s.rms_eps = r.fl("attention.layer_norm_rms_epsilon", 1e-30, 1.0, 1e-6);
  s.rope_base = r.fl("rope.freq_base", 1.0, 1e30, 10000.0);
  d.q_lora = r.u("attention.q_lora_rank", 1, limits::kHidden);
  d.window = r.u("attention.sliding_window", 1, limits::kContext);
  d.o_groups = r.u("attention.output_group_count", 1, limits::kHeads);
  d.o_lora = r.u("attention.output_lora_rank", 1, limits::kHidden);
  d.idx_heads = r.u("attention.indexer.head_count", 1, limits::kHeads);
  d.idx_dim = r.u("attention.indexer.key_length", 2, limits::kHeadDim);
  d.idx_topk = r.u("attention.indexer.top_k", 1, kMaxIndexTopk);
  d.HC = r.u("hyper_connection.count", 1, kMaxHC);
  d.sinkhorn_iters = r.u("hyper_connection.sinkhorn_iterations", 1, kMaxSinkhornIters);
  d.hc_eps = r.fl("hyper_connection.epsilon", 0.0, 1.0);
  d.hash_layers = r.u("hash_layer_count", 0, s.L);
  const int64_t n_shared = r.u("expert_shared_count", 1, limits::kExpertsUsed);
  d.routed_scale = r.fl("expert_weights_scale", 0.0, 1e6);
  d.norm_weights = f.get_bool("deepseek4.expert_weights_norm", false);
  s.norm_topk = d.norm_weights;
  const int64_t gating = r.u("expert_gating_func", 0, INT32_MAX);
  d.compress_rope_base = r.fl("attention.compress_rope_freq_base", 1.0, 1e30);
  const std::string scaling = printable(f.get_string("deepseek4.rope.scaling.type", "none"));
  if (scaling == "yarn") {
    d.yarn_factor = r.fl("rope.scaling.factor", 1e-6, 1e6);
    d.yarn_orig_ctx = r.u("rope.scaling.original_context_length", 1, limits::kContext, s.ctx_train);
    // llama.cpp reads neither beta key for deepseek4 (it keeps 32 and 1); transformers and ds4 take
    // the file's values. We take the file's values, which are 32 and 1 in every V4 file.
    d.beta_fast = r.fl("rope.scaling.yarn_beta_fast", 1e-6, 1e6, 32.0);
    d.beta_slow = r.fl("rope.scaling.yarn_beta_slow", 1e-6, 1e6, 1.0);
  } else {
    STRATA_CHECK(scaling == "none", UnsupportedError, f.path(), ": deepseek4.rope.scaling.type '", scaling,
                 "' is not supported (yarn or none)");
  }
  const std::vector<double> ratios = r.per_layer("attention.compress_ratios", n_all, true, 0, 0, 1e9);
  const std::vector<double> clamp_exp = r.per_layer("swiglu_clamp_exp", n_all, false, 0, 0, 1e6);
  const std::vector<double> clamp_shexp = r.per_layer("swiglu_clamp_shexp", n_all, false, -1, -1, 1e6);

  STRATA_CHECK(s.head_dim >= 2 && s.head_dim <= limits::kHeadDim && s.n_head % d.o_groups == 0 &&
                   d.rope_dim % 2 == 0 && d.rope_dim <= s.head_dim && d.idx_dim >= d.rope_dim,
               FormatError, f.path(), ": deepseek4 hyperparameters out of range: embedding_length=", s.D,
               " head_count=", s.n_head, " key_length=", s.head_dim, " (in [2, ", limits::kHeadDim,
               "]; embedding_length / head_count when absent) rope.dimension_count=", d.rope_dim,
               " (even, at most key_length) output_group_count=", d.o_groups,
               " (divides head_count) indexer.key_length=", d.idx_dim, " (at least rope.dimension_count)");
  STRATA_CHECK(s.n_kv_head == 1 && vlen == s.head_dim, FormatError, f.path(),
               ": deepseek4 attends one shared KV head with value_length == key_length; got head_count_kv=",
               s.n_kv_head, " value_length=", vlen, " key_length=", s.head_dim);
  STRATA_CHECK(gating == 4, UnsupportedError, f.path(), ": deepseek4.expert_gating_func ", gating,
               " is not supported; DeepSeek V4 scores experts with sqrt(softplus) (4)");
  for (int64_t l = 0; l < s.L; ++l)
    STRATA_CHECK(ffn[l] == (double)s.F, UnsupportedError, f.path(),
                 ": deepseek4.expert_feed_forward_length differs by layer (", ffn[l], " at ", l, ", ", s.F,
                 " at 0); strata needs one width");
  d.shared_ffn = s.F * n_shared;
  s.HC = d.HC;

  const TensorReader t(f, s.arch);
  t.common(s, false);
  const int64_t hd = s.head_dim, H = s.n_head, HCD = d.HC * s.D, M = (2 + d.HC) * d.HC;
  d.hc_head_fn = t.need("output_hc_fn.weight", {HCD, d.HC});
  d.hc_head_base = t.need("output_hc_base.weight", {d.HC});
  d.hc_head_scale = t.need("output_hc_scale.weight", {1});
  for (int64_t l = 0; l < s.L; ++l) {
    Ds4Layer y;
    STRATA_CHECK(ratios[l] == 0 || ratios[l] == 4 || ratios[l] == 128, UnsupportedError, f.path(),
                 ": deepseek4.attention.compress_ratios[", l, "] = ", ratios[l],
                 "; llama.cpp and strata run 0, 4 and 128");
    y.ratio = (int64_t)ratios[l];
    y.hash = l < d.hash_layers;
    y.clamp_exp = (float)clamp_exp[l];
    y.clamp_shexp = clamp_shexp[l] < 0 ? y.clamp_exp : (float)clamp_shexp[l];
    using Y = Ds4Layer;
    t.layer<Y>(l, y,
               {
                   {"attn_norm.weight", &Y::attn_norm, {s.D}},
                   {"attn_sinks.weight", &Y::sinks, {H}},
                   {"attn_q_a.weight", &Y::q_a, {s.D, d.q_lora}},
                   {"attn_q_a_norm.weight", &Y::q_a_norm, {d.q_lora}},
                   {"attn_q_b.weight", &Y::q_b, {d.q_lora, H * hd}},
                   {"attn_kv.weight", &Y::kv, {s.D, hd}},
                   {"attn_kv_a_norm.weight", &Y::kv_norm, {hd}},
                   {"attn_output_a.weight", &Y::o_a, {H * hd / d.o_groups, d.o_groups * d.o_lora}},
                   {"attn_output_b.weight", &Y::o_b, {d.o_groups * d.o_lora, s.D}},
                   {"hc_attn_fn.weight", &Y::hc_attn_fn, {HCD, M}},
                   {"hc_attn_base.weight", &Y::hc_attn_base, {M}},
                   {"hc_attn_scale.weight", &Y::hc_attn_scale, {3}},
                   {"hc_ffn_fn.weight", &Y::hc_ffn_fn, {HCD, M}},
                   {"hc_ffn_base.weight", &Y::hc_ffn_base, {M}},
                   {"hc_ffn_scale.weight", &Y::hc_ffn_scale, {3}},
               });
    if (y.ratio) {
      const int64_t lanes = y.ratio == 4 ? 2 : 1;  // ratio 4 pools two overlapping windows
      t.layer<Y>(l, y,
                 {
                     {"attn_compressor_kv.weight", &Y::comp_kv, {s.D, lanes * hd}},
                     {"attn_compressor_gate.weight", &Y::comp_gate, {s.D, lanes * hd}},
                     {"attn_compressor_ape.weight", &Y::comp_ape, {lanes * hd, y.ratio}},
                     {"attn_compressor_norm.weight", &Y::comp_norm, {hd}},
                 });
    }
    if (y.ratio == 4) {
      t.layer<Y>(l, y,
                 {
                     {"indexer.proj.weight", &Y::idx_proj, {s.D, d.idx_heads}},
                     {"indexer.attn_q_b.weight", &Y::idx_q_b, {d.q_lora, d.idx_heads * d.idx_dim}},
                     {"indexer_compressor_kv.weight", &Y::idx_kv, {s.D, 2 * d.idx_dim}},
                     {"indexer_compressor_gate.weight", &Y::idx_gate, {s.D, 2 * d.idx_dim}},
                     {"indexer_compressor_ape.weight", &Y::idx_ape, {2 * d.idx_dim, 4}},
                     {"indexer_compressor_norm.weight", &Y::idx_norm, {d.idx_dim}},
                 });
    }
    t.layer<Y>(l, y, {{"ffn_gate_inp.weight", &Y::router, {s.D, s.E}}});
    if (y.hash)
      t.layer<Y>(l, y, {{"ffn_gate_tid2eid.weight", &Y::tid2eid, {s.K, s.V}, TensorKind::I32}});
    else
      t.layer<Y>(l, y, {{"exp_probs_b.bias", &Y::probs_b, {s.E}}});
    t.layer<Y>(l, y,
               {
                   {"ffn_norm.weight", &Y::ffn_norm, {s.D}},
                   {"ffn_gate_shexp.weight", &Y::gate_shexp, {s.D, d.shared_ffn}},
                   {"ffn_up_shexp.weight", &Y::up_shexp, {s.D, d.shared_ffn}},
                   {"ffn_down_shexp.weight", &Y::down_shexp, {d.shared_ffn, s.D}},
               });
    LayerSpec ls;
    ls.attn_norm = y.attn_norm;
    ls.ffn_norm = y.ffn_norm;
    ls.router = y.router;
    t.layer<LayerSpec>(l, ls,
                       {
                           {"ffn_gate_exps.weight", &LayerSpec::gate_exps, {s.D, s.F, s.E}},
                           {"ffn_up_exps.weight", &LayerSpec::up_exps, {s.D, s.F, s.E}},
                           {"ffn_down_exps.weight", &LayerSpec::down_exps, {s.F, s.D, s.E}},
                       });
    s.layers.push_back(ls);
    d.layers.push_back(y);

    // The cache: the raw window as a ring (position p in row p % window), and for compressed layers the
    // compressed rows (one per `ratio` positions) with the projections of the tokens of the windows
    // still open (a ring of lanes * ratio rows), likewise the indexer's keys for ratio 4.
    std::vector<KvTensorSpec> kv{{"window", d.window, 0, hd}};
    if (y.ratio) {
      const int64_t lanes = y.ratio == 4 ? 2 : 1;
      kv.push_back({"comp", 0, y.ratio, hd});
      kv.push_back({"comp.state.kv", lanes * y.ratio, 0, lanes * hd});
      kv.push_back({"comp.state.score", lanes * y.ratio, 0, lanes * hd});
    }
    if (y.ratio == 4) {
      kv.push_back({"index", 0, 4, d.idx_dim});
      kv.push_back({"index.state.kv", 8, 0, 2 * d.idx_dim});
      kv.push_back({"index.state.score", 8, 0, 2 * d.idx_dim});
    }
    s.kv_layers.push_back(kv);
  }

  std::vector<int64_t> by_kind[3], hashed;
  for (int64_t l = 0; l < s.L; ++l) {
    const int64_t ra = d.layers[l].ratio;
    by_kind[ra == 0 ? 0 : ra == 4 ? 1 : 2].push_back(l);
    if (d.layers[l].hash) hashed.push_back(l);
  }
  s.details.push_back({"hyper-connections", str("HC ", d.HC, ", Sinkhorn ", d.sinkhorn_iters,
                                                " iterations, eps ", num(d.hc_eps))});
  s.details.push_back(
      {"attention layout",
       str(H, " heads x ", hd, " (rope on the last ", d.rope_dim, "), one shared KV head; q_lora ", d.q_lora,
           "; output ", d.o_groups, " groups x ", d.o_lora, "; window ", d.window, "; sinks")});
  if (!by_kind[0].empty()) s.details.push_back({"layers: window", ranges(by_kind[0])});
  if (!by_kind[1].empty())
    s.details.push_back({"layers: ratio 4 + indexer", str(ranges(by_kind[1]), " (indexer top-", d.idx_topk,
                                                          " of ", d.idx_heads, " heads x ", d.idx_dim, ")")});
  if (!by_kind[2].empty()) s.details.push_back({"layers: ratio 128", ranges(by_kind[2])});
  s.details.push_back(
      {"rope",
       str("base ", num(s.rope_base), " (window layers); compressed layers base ", num(d.compress_rope_base),
           d.yarn_factor > 0 ? str(", YaRN x", num(d.yarn_factor), " of ", d.yarn_orig_ctx, " (beta ",
                                   num(d.beta_fast), "/", num(d.beta_slow), ")")
                             : std::string())});
  s.details.push_back(
      {"routing",
       str("sqrt(softplus) scores, top-", s.K, " on score + bias", d.norm_weights ? ", normalized" : "",
           ", x", num(d.routed_scale),
           hashed.empty() ? std::string("; no hash layers") : str("; hash-routed layers ", ranges(hashed)),
           "; ", n_shared, " shared expert", n_shared > 1 ? "s" : "", " (ffn ", d.shared_ffn, ")")});
  s.details.push_back({"swiglu clamp", str(num(d.layers[0].clamp_exp), " routed, ",
                                           num(d.layers[0].clamp_shexp), " shared (layer 0)")});
  if (d.mtp_blocks) s.details.push_back({"ignored", str(d.mtp_blocks, " MTP block(s)")});
  ScratchList scratch;
  ds4_scratch(s, d, scratch);
  s.scratch = scratch.specs();
  s.arch_spec = std::move(ds);
  return s;
}

const Ds4Spec& ds4_spec(const ModelSpec& s) {
  const auto* d = dynamic_cast<const Ds4Spec*>(s.arch_spec.get());
  STRATA_CHECK(d, Error, "internal error: a ", s.arch, " spec has no DeepSeek V4 part");
  return *d;
}

Ds4Scratch ds4_scratch(const ModelSpec& s, const Ds4Spec& d, ScratchList& list) {
  const int64_t HC = d.HC, H = s.n_head, hd = s.head_dim;
  Ds4Scratch sc;
  sc.hc_mix = list.f32("hc.mix", {(2 + HC) * HC});
  sc.hc_post = list.f32("hc.post", {HC});
  sc.hc_comb = list.f32("hc.comb", {HC, HC});
  sc.tokens = list.i32("tokens", {});
  sc.qa = list.f32("attn.qa", {d.q_lora});
  sc.q = list.f32("attn.q", {H, hd});
  sc.kv = list.f32("attn.kv", {hd});
  sc.out = list.f32("attn.out", {H, hd});
  sc.oa = list.f32("attn.oa", {d.o_groups * d.o_lora});
  // The widest compressor: two lanes (a ratio-4 layer's overlapping windows), else one (ratio 128).
  const int64_t lanes = d.any_ratio(4) ? 2 : d.any_ratio(128) ? 1 : 0;
  if (lanes > 0) {
    sc.comp_kv = list.f32("comp.kv", {lanes * hd});
    sc.comp_score = list.f32("comp.score", {lanes * hd});
  }
  if (d.any_ratio(4)) {
    sc.idx_kv = list.f32("index.kv", {2 * d.idx_dim});
    sc.idx_score = list.f32("index.score", {2 * d.idx_dim});
    sc.idx_q = list.f32("index.q", {d.idx_heads, d.idx_dim});
    sc.idx_w = list.f32("index.w", {d.idx_heads});
    sc.idx_sel = list.i32("index.sel", {d.idx_topk});
  }
  sc.sh_gate = list.f32("shexp.gate", {d.shared_ffn});
  sc.sh_up = list.f32("shexp.up", {d.shared_ffn});
  sc.sh_out = list.f32("shexp.out", {s.D});
  return sc;
}

Ds4Rope ds4_rope(const Ds4Spec& s, float rope_base, bool compressed) {
  // transformers' _compute_yarn_parameters (and ggml's rope_yarn): interpolate the low frequencies by
  // the factor, keep the high ones, ramp between the correction dims; cos/sin are not scaled
  // (transformers forces attention_factor 1, llama.cpp cancels ggml's mscale).
  const int64_t n = s.rope_dim, half = n / 2;
  const double base = compressed ? s.compress_rope_base : rope_base;
  Ds4Rope r;
  r.inv_freq.resize(half);
  std::vector<float> pos_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    pos_freq[i] = std::pow((float)base, (float)(2 * i) / (float)n);
    r.inv_freq[i] = 1.0f / pos_freq[i];
  }
  if (!compressed || s.yarn_factor <= 0) return r;
  auto corr = [&](double rot) {
    return n * std::log(s.yarn_orig_ctx / (rot * 2 * M_PI)) / (2 * std::log(base));
  };
  double lo = std::max(0.0, std::floor(corr(s.beta_fast))),
         hi = std::min((double)n - 1, std::ceil(corr(s.beta_slow)));
  if (lo == hi) hi += 0.001;
  for (int64_t i = 0; i < half; ++i) {
    const float ramp = std::clamp((float)((i - lo) / (hi - lo)), 0.0f, 1.0f);
    const float extrap = 1.0f - ramp;
    const float interp = 1.0f / (s.yarn_factor * pos_freq[i]);
    r.inv_freq[i] = interp * (1.0f - extrap) + r.inv_freq[i] * extrap;
  }
  return r;
}

}  // namespace strata
