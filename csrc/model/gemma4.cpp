// gemma4 (GGUF arch "gemma4", the 26B-A4B MoE text model): hyperparameters and tensors from llama.cpp's
// key and tensor names, and its forward pass: sliding-window layers and global layers with their own
// head size, KV heads and RoPE (the global ones proportional: the table rope_freqs leaves the pairs past
// the rotated fraction still; K = V where a layer has no attn_v), per-head norms on q, k and v, scale 1;
// post-norms on the attention and the FFN; a dense GELU FFN beside the routed experts in every layer
// (each with its own pre- and post-norm), the router on its own norm and scale with a per-expert scale;
// the layer's output scale, the embedding scale sqrt(D), the tied head and the final logit softcap.
// Its own ops are Gemma4Ops (backend/gemma4_ops.h), which the CPU backend implements.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "backend/gemma4_ops.h"
#include "core/error.h"
#include "core/utf8.h"
#include "model/arch.h"
#include "model/blocks.h"
#include "model/kv_cache.h"
#include "model/spec.h"
#include "model/weights.h"
#include "quant/quant.h"

namespace strata {

namespace {

// gemma4's tensors beyond LayerSpec (whose ffn_norm is the dense FFN's pre-norm, q_norm/k_norm the
// per-head norms, v null on a layer whose values are its keys).
struct Gemma4Layer {
  WeightRef post_attn_norm, out_scale, ffn_gate, ffn_up, ffn_down, post_ffw_norm;
  WeightRef router_scale, pre_ffw_norm_2, post_ffw_norm_1, post_ffw_norm_2, exp_scale;
};

// A layer's attention shape: sliding (window, the swa head size and base) or global.
struct Gemma4LayerShape {
  bool sliding = false;
  int64_t kv = 0, hd = 0, ffn = 0;
};

struct Gemma4Spec final : ArchSpec {
  int64_t window = 0;                 // the sliding layers' window (keys at p - window + 1 .. p)
  int64_t hd_swa = 0, hd_full = 0;    // head sizes of the sliding and the global layers
  int64_t ffn_max = 0, kv_width = 0;  // the widest dense FFN; the widest KV row (KV * hd)
  float softcap = 0.f;                // final logit softcapping (0: none)
  // The rotations: inverse frequencies of the hd / 2 pairs of each layer kind.
  std::vector<float> inv_freq_swa, inv_freq_full;
  std::vector<Gemma4LayerShape> shapes;
  std::vector<Gemma4Layer> layers;
};

const Gemma4Spec& gemma_spec(const ModelSpec& s) {
  const auto* d = dynamic_cast<const Gemma4Spec*>(s.arch_spec.get());
  STRATA_CHECK(d, Error, "internal error: the spec of '", s.arch, "' is not a gemma4 spec");
  return *d;
}

// A per-layer count given as an array (at least L entries) or one integer for every layer, each in [lo, hi].
std::vector<int64_t> per_layer_count(const gguf::File& f, const std::string& key, int64_t L, int64_t lo,
                                     int64_t hi) {
  const gguf::Value* v = f.find(key);
  STRATA_CHECK(v, FormatError, f.path(), ": metadata key '", key, "' is missing");
  std::vector<int64_t> out;
  if (v->is_array()) {
    STRATA_CHECK(v->elem_type != gguf::ValueType::BOOL && v->floats.empty() && v->strings.empty(),
                 FormatError, f.path(), ": metadata '", key, "' must be an integer or an array of integers");
    out = v->ints;
  } else {
    out.assign(L, read_count(f, key, lo, hi));
  }
  STRATA_CHECK((int64_t)out.size() >= L, FormatError, f.path(), ": metadata '", key, "' has ", out.size(),
               " entries, fewer than the ", L, " blocks");
  out.resize(L);
  for (int64_t l = 0; l < L; ++l)
    STRATA_CHECK(out[l] >= lo && out[l] <= hi, FormatError, f.path(), ": metadata '", key, "'[", l,
                 "] = ", out[l], " is out of range [", lo, ", ", hi,
                 "]; the file is corrupt or not a model strata can run");
  return out;
}

// per_layer_count's value, the same in every layer: UnsupportedError naming the key otherwise.
int64_t uniform_count(const gguf::File& f, const std::string& key, int64_t L, int64_t lo, int64_t hi) {
  const std::vector<int64_t> v = per_layer_count(f, key, L, lo, hi);
  for (int64_t l = 1; l < L; ++l)
    STRATA_CHECK(v[l] == v[0], UnsupportedError, f.path(), ": metadata '", key, "' differs between layers (",
                 v[0], " in layer 0, ", v[l], " in layer ", l,
                 "); strata runs gemma4 with one value for all");
  return v[0];
}

// transformers' default RoPE over a head of hd: inv_freq[i] = 1 / base^(2i / hd), in float as torch
// computes it; `factors` (llama.cpp's rope_freqs, proportional RoPE) divide it.
std::vector<float> rope_inv_freq(int64_t hd, double base, const std::vector<float>& factors) {
  std::vector<float> f(hd / 2);
  for (int64_t i = 0; i < hd / 2; ++i) {
    f[i] = 1.0f / std::pow((float)base, (float)(2 * i) / (float)hd);
    if (!factors.empty()) f[i] /= factors[i];
  }
  return f;
}

// The chunk's buffers beyond the common ones: the attention's (sized for the widest layer kind) and
// the dense FFN's (its input, gate, up and output, and the post-norms' RMS scales).
struct Gemma4Scratch {
  Scratch<float> q, k, v, out, x, gate, up, ffn_out, ngrs;
};
Gemma4Scratch declare_gemma4_scratch(const ModelSpec& s, const Gemma4Spec& d, ScratchList& list) {
  Gemma4Scratch sc;
  sc.q = list.f32("attn.q", {s.n_head, s.head_dim});
  sc.k = list.f32("attn.k", {d.kv_width});
  sc.v = list.f32("attn.v", {d.kv_width});
  sc.out = list.f32("attn.out", {s.n_head * s.head_dim});
  sc.x = list.f32("ffn.x", {s.D});
  sc.gate = list.f32("ffn.gate", {d.ffn_max});
  sc.up = list.f32("ffn.up", {d.ffn_max});
  sc.ffn_out = list.f32("ffn.out", {s.D});
  sc.ngrs = list.f32("ffn.grs", {1});
  return sc;
}

}  // namespace

ModelSpec read_gemma4(const gguf::File& f) {
  ModelSpec s;
  const std::string a = "gemma4.";
  s.arch = "gemma4";
  s.name = printable(f.get_string("general.name", ""));
  s.L = read_count(f, a + "block_count", 1, limits::kLayers);
  s.D = read_count(f, a + "embedding_length", 1, limits::kHidden);
  s.E = read_count(f, a + "expert_count", 1, limits::kExperts);
  s.K = read_count(f, a + "expert_used_count", 1, std::min(s.E, limits::kExpertsUsed));
  // llama.cpp reads these as one number or one a layer; strata runs them equal in every layer.
  s.n_head = uniform_count(f, a + "attention.head_count", s.L, 1, limits::kHeads);
  s.F = uniform_count(f, a + "expert_feed_forward_length", s.L, 1, limits::kFfn);
  s.ctx_train = read_count(f, a + "context_length", 1, limits::kContext, 131072);
  s.rms_eps = (float)read_real(f, a + "attention.layer_norm_rms_epsilon", 1e-30, 1.0, 1e-6);
  s.rope_base = (float)read_real(f, a + "rope.freq_base", 1.0, 1e30, 1e6);
  s.norm_topk = true;  // softmax over all E, top-K, renormalized

  auto d = std::make_shared<Gemma4Spec>();
  STRATA_CHECK(read_count(f, a + "embedding_length_per_layer_input", 0, limits::kHidden, 0) == 0,
               UnsupportedError, f.path(), ": ", a,
               "embedding_length_per_layer_input is set: the per-layer input embeddings of the small gemma4 "
               "models are not supported (strata runs the MoE gemma4)");
  STRATA_CHECK(read_count(f, a + "attention.shared_kv_layers", 0, s.L, 0) == 0, UnsupportedError, f.path(),
               ": ", a,
               "attention.shared_kv_layers is set: layers that reuse another layer's KV are not supported");
  const double base_swa = read_real(f, a + "rope.freq_base_swa", 1.0, 1e30, 1e4);
  d->window = read_count(f, a + "attention.sliding_window", 1, limits::kContext);
  // Absent: 30, as llama.cpp reads such a file (its default); an explicit 0 is none.
  d->softcap = (float)read_real(f, a + "final_logit_softcapping", 0.0, 1e6, 30.0);
  d->hd_full = read_count(f, a + "attention.key_length", 2, limits::kHeadDim);
  d->hd_swa = read_count(f, a + "attention.key_length_swa", 2, limits::kHeadDim);
  for (const auto& [key, hd] : {std::pair{std::string("key_length"), d->hd_full},
                                std::pair{std::string("key_length_swa"), d->hd_swa}}) {
    STRATA_CHECK(hd % 2 == 0, FormatError, f.path(), ": ", a, "attention.", key, " = ", hd,
                 " must be even (RoPE rotates pairs)");
    const std::string vkey = key == "key_length" ? "value_length" : "value_length_swa";
    const int64_t vlen = read_count(f, a + "attention." + vkey, 1, limits::kHeadDim, hd);
    STRATA_CHECK(vlen == hd, UnsupportedError, f.path(), ": ", a, "attention.", vkey, " ", vlen, " != ", key,
                 " ", hd, " is not supported");
    const std::string rkey = key == "key_length" ? "rope.dimension_count" : "rope.dimension_count_swa";
    const int64_t rot = read_count(f, a + rkey, 1, limits::kHeadDim, hd);
    STRATA_CHECK(
        rot == hd, UnsupportedError, f.path(), ": ", a, rkey, " ", rot, " != attention.", key, " ", hd,
        " is not supported (gemma4 rotates whole heads; the global layers' fraction is rope_freqs')");
  }
  const std::vector<int64_t> kv = per_layer_count(f, a + "attention.head_count_kv", s.L, 1, s.n_head);
  const std::vector<int64_t> ffn = per_layer_count(f, a + "feed_forward_length", s.L, 1, limits::kFfn);
  const gguf::Value* pat = f.find(a + "attention.sliding_window_pattern");
  STRATA_CHECK(
      pat && pat->is_array() && pat->elem_type == gguf::ValueType::BOOL && (int64_t)pat->ints.size() >= s.L,
      FormatError, f.path(), ": metadata '", a,
      "attention.sliding_window_pattern' must be an array of booleans, one a block (", s.L, ")");

  const TensorReader r(f, s.arch);
  r.common(s, true);
  bool any_full = false;
  for (int64_t l = 0; l < s.L; ++l) {
    Gemma4LayerShape sh;
    sh.sliding = pat->ints[l] != 0;
    sh.kv = kv[l];
    sh.hd = sh.sliding ? d->hd_swa : d->hd_full;
    sh.ffn = ffn[l];
    STRATA_CHECK(s.n_head % sh.kv == 0, FormatError, f.path(), ": ", a, "attention.head_count ", s.n_head,
                 " is not a multiple of head_count_kv[", l, "] = ", sh.kv);
    any_full |= !sh.sliding;
    d->ffn_max = std::max(d->ffn_max, sh.ffn);
    d->kv_width = std::max(d->kv_width, checked_mul(f, sh.kv, sh.hd, "head_count_kv * key_length"));
    d->shapes.push_back(sh);
  }
  const int64_t hd_max = std::max(d->hd_swa, d->hd_full);
  // The KV cache keeps rows of the widest layer (its width n_kv_head * head_dim); a narrower layer
  // uses the start of its rows.
  s.head_dim = hd_max;
  s.n_kv_head = (d->kv_width + hd_max - 1) / hd_max;

  for (int64_t l = 0; l < s.L; ++l) {
    const Gemma4LayerShape& sh = d->shapes[l];
    const int64_t Hl = s.n_head * sh.hd, KVl = sh.kv * sh.hd;
    const std::string p = "blk." + std::to_string(l) + ".";
    STRATA_CHECK(!f.find_tensor(p + "ffn_gate_up_exps.weight"), UnsupportedError, f.path(), ": tensor '", p,
                 "ffn_gate_up_exps.weight' (gate and up experts fused) is not supported; strata reads "
                 "ffn_gate_exps and ffn_up_exps");
    LayerSpec ls;
    r.layer<LayerSpec>(l, ls,
                       {
                           {"attn_norm.weight", &LayerSpec::attn_norm, {s.D}},
                           {"attn_q.weight", &LayerSpec::q, {s.D, Hl}},
                           {"attn_k.weight", &LayerSpec::k, {s.D, KVl}},
                           {"attn_output.weight", &LayerSpec::o, {Hl, s.D}},
                           {"attn_q_norm.weight", &LayerSpec::q_norm, {sh.hd}},
                           {"attn_k_norm.weight", &LayerSpec::k_norm, {sh.hd}},
                           {"ffn_norm.weight", &LayerSpec::ffn_norm, {s.D}},
                           {"ffn_gate_inp.weight", &LayerSpec::router, {s.D, s.E}},
                           {"ffn_gate_exps.weight", &LayerSpec::gate_exps, {s.D, s.F, s.E}},
                           {"ffn_up_exps.weight", &LayerSpec::up_exps, {s.D, s.F, s.E}},
                           {"ffn_down_exps.weight", &LayerSpec::down_exps, {s.F, s.D, s.E}},
                       });
    // Without attn_v the values are the keys' projection (transformers' attention_k_eq_v).
    if (f.find_tensor(p + "attn_v.weight")) ls.v = r.need(p + "attn_v.weight", {s.D, KVl});
    Gemma4Layer gl;
    r.layer<Gemma4Layer>(l, gl,
                         {
                             {"post_attention_norm.weight", &Gemma4Layer::post_attn_norm, {s.D}},
                             {"ffn_gate.weight", &Gemma4Layer::ffn_gate, {s.D, sh.ffn}},
                             {"ffn_up.weight", &Gemma4Layer::ffn_up, {s.D, sh.ffn}},
                             {"ffn_down.weight", &Gemma4Layer::ffn_down, {sh.ffn, s.D}},
                             {"post_ffw_norm.weight", &Gemma4Layer::post_ffw_norm, {s.D}},
                             {"ffn_gate_inp.scale", &Gemma4Layer::router_scale, {s.D}},
                             {"pre_ffw_norm_2.weight", &Gemma4Layer::pre_ffw_norm_2, {s.D}},
                             {"post_ffw_norm_1.weight", &Gemma4Layer::post_ffw_norm_1, {s.D}},
                             {"post_ffw_norm_2.weight", &Gemma4Layer::post_ffw_norm_2, {s.D}},
                         });
    // Optional in llama.cpp's loader: the layer's output scale and the experts' scale (1 when absent).
    if (f.find_tensor(p + "layer_output_scale.weight"))
      gl.out_scale = r.need(p + "layer_output_scale.weight", {1});
    if (f.find_tensor(p + "ffn_down_exps.scale")) gl.exp_scale = r.need(p + "ffn_down_exps.scale", {s.E});
    s.layers.push_back(ls);
    d->layers.push_back(gl);
  }

  std::vector<float> factors;
  if (any_full) {
    const WeightRef rf = r.need("rope_freqs.weight", {d->hd_full / 2});
    factors.resize(d->hd_full / 2);
    dequantize(quant_traits(rf.type(), str(f.path(), ": tensor 'rope_freqs.weight'")).type, rf.data(),
               factors.data(), (int64_t)factors.size());
    for (size_t i = 0; i < factors.size(); ++i)
      STRATA_CHECK(std::isfinite(factors[i]) && factors[i] > 0, FormatError, f.path(),
                   ": tensor 'rope_freqs.weight'[", i, "] = ", factors[i], " must be finite and positive");
  }
  d->inv_freq_full = rope_inv_freq(d->hd_full, s.rope_base, factors);
  d->inv_freq_swa = rope_inv_freq(d->hd_swa, base_swa, {});

  // Per kind: the layers, and their KV heads (a range when the file varies them).
  int64_t n[2] = {0, 0}, kv_lo[2] = {s.n_head, s.n_head}, kv_hi[2] = {0, 0};
  for (const auto& sh : d->shapes) {
    const int k = sh.sliding ? 0 : 1;
    ++n[k];
    kv_lo[k] = std::min(kv_lo[k], sh.kv);
    kv_hi[k] = std::max(kv_hi[k], sh.kv);
  }
  const auto kvs = [&](int k) { return kv_lo[k] == kv_hi[k] ? str(kv_lo[k]) : str(kv_lo[k], "-", kv_hi[k]); };
  s.details.push_back(
      {"attention", str(n[0], " sliding layers (window ", d->window, ", head ", d->hd_swa, " x ", kvs(0),
                        " KV, RoPE base ", base_swa, "), ", n[1], " global (head ", d->hd_full, " x ", kvs(1),
                        " KV, proportional RoPE base ", s.rope_base, ")")});
  s.details.push_back({"dense FFN", str("width ", d->ffn_max, " beside the routed experts in every layer")});
  s.details.push_back({"logit softcap", d->softcap > 0 ? str(d->softcap) : std::string("none")});
  s.arch_spec = d;
  ScratchList scratch;
  declare_gemma4_scratch(s, *d, scratch);
  s.scratch = scratch.specs();
  return s;
}

namespace {

// The experts read the residual through pre_ffw_norm_2 (the plain GR read with that weight) and run
// the GELU-tanh GLU.
class Gemma4Moe final : public MoeVariant {
 public:
  explicit Gemma4Moe(Gemma4Ops& ops) : ops_(ops) {}
  void input(Backend& be, const PrefillBuffers& b, const float* ffn_norm, int64_t D, int64_t K,
             const int32_t* rows, int64_t n, float* out) const override {
    be.apply_norm(b.R, b.grs, ffn_norm, D, rows, K, n, out);
  }
  void input_q8(Backend& be, const PrefillBuffers& b, const float* ffn_norm, int64_t D, int64_t K,
                const int32_t* rows, int64_t n, uint8_t* out, size_t rb) const override {
    be.quantize_q8_0(b.R, b.grs, ffn_norm, D, rows, K, n, out, rb);
  }
  void activate(Backend&, float* g, const float* u, int64_t n) const override { ops_.geglu(g, u, n); }

 private:
  Gemma4Ops& ops_;
};

class Gemma4Forward final : public RowsForwardPass {
 public:
  Gemma4Forward(const ForwardContext& ctx, Gemma4Ops& ops) : ctx_(ctx), ops_(ops), w_(ctx.be), moe_(ops) {
    const ModelSpec& s = ctx.spec;
    const Gemma4Spec& d = gemma_spec(s);
    const float* inv_swa = w_.floats(d.inv_freq_swa, "rope frequencies (sliding)");
    const float* inv_full = w_.floats(d.inv_freq_full, "rope frequencies (global)");
    for (int64_t l = 0; l < s.L; ++l) {
      Layer ly;
      w_.layer<LayerSpec, Layer>(s.layers[l], ly,
                                 {
                                     {&LayerSpec::q, &Layer::q, "attn_q"},
                                     {&LayerSpec::k, &Layer::k, "attn_k"},
                                     {&LayerSpec::v, &Layer::v, "attn_v"},
                                     {&LayerSpec::o, &Layer::o, "attn_output"},
                                     {&LayerSpec::attn_norm, &Layer::attn_norm, "attn_norm"},
                                     {&LayerSpec::q_norm, &Layer::q_norm, "attn_q_norm"},
                                     {&LayerSpec::k_norm, &Layer::k_norm, "attn_k_norm"},
                                     {&LayerSpec::ffn_norm, &Layer::ffn_norm, "ffn_norm"},
                                     {&LayerSpec::router, &Layer::router, "ffn_gate_inp"},
                                 });
      w_.layer<Gemma4Layer, Layer>(
          d.layers[l], ly,
          {
              {&Gemma4Layer::post_attn_norm, &Layer::post_attn_norm, "post_attention_norm"},
              {&Gemma4Layer::out_scale, &Layer::out_scale, "layer_output_scale"},
              {&Gemma4Layer::ffn_gate, &Layer::ffn_gate, "ffn_gate"},
              {&Gemma4Layer::ffn_up, &Layer::ffn_up, "ffn_up"},
              {&Gemma4Layer::ffn_down, &Layer::ffn_down, "ffn_down"},
              {&Gemma4Layer::post_ffw_norm, &Layer::post_ffw_norm, "post_ffw_norm"},
              {&Gemma4Layer::router_scale, &Layer::router_scale, "ffn_gate_inp.scale"},
              {&Gemma4Layer::pre_ffw_norm_2, &Layer::pre_ffw_norm_2, "pre_ffw_norm_2"},
              {&Gemma4Layer::post_ffw_norm_1, &Layer::post_ffw_norm_1, "post_ffw_norm_1"},
              {&Gemma4Layer::post_ffw_norm_2, &Layer::post_ffw_norm_2, "post_ffw_norm_2"},
              {&Gemma4Layer::exp_scale, &Layer::exp_scale, "ffn_down_exps.scale"},
          });
      const Gemma4LayerShape& sh = d.shapes[l];
      ly.kv = sh.kv;
      ly.hd = sh.hd;
      ly.ffn = sh.ffn;
      ly.window = sh.sliding ? d.window : 0;
      ly.inv_freq = sh.sliding ? inv_swa : inv_full;
      layers_.push_back(ly);
    }
    head_ = w_.head(s);
    embed_scale_ = w_.floats({(float)std::sqrt((double)s.D)}, "embedding scale");
    router_root_ = w_.floats({(float)std::pow((double)s.D, -0.5)}, "router scale");
    softcap_ = d.softcap;
    if (softcap_ > 0)  // on the device, before the logits leave it: a recorded step computes them whole
      head_.on_logits = [this](float* x, int64_t n) { ops_.softcap(x, n, softcap_); };
    ScratchList scratch;
    sc_ = declare_gemma4_scratch(s, d, scratch);
    STRATA_CHECK(scratch.specs() == s.scratch, Error, "internal error: the gemma4 scratch is not the spec's");
  }

  // RoPE and the windowed attention read the backend's position source while it is set (a batched step's
  // rows through for_row_runs), the softcap runs on the device: a decode step records as one graph.
  bool graphable() const override { return true; }

 private:
  struct Layer {
    DenseMatrix q, k, v, o, router, ffn_gate, ffn_up, ffn_down;
    const float *attn_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr, *ffn_norm = nullptr;
    const float *post_attn_norm = nullptr, *out_scale = nullptr, *post_ffw_norm = nullptr;
    const float *router_scale = nullptr, *pre_ffw_norm_2 = nullptr, *post_ffw_norm_1 = nullptr;
    const float *post_ffw_norm_2 = nullptr, *exp_scale = nullptr;
    int64_t kv = 0, hd = 0, ffn = 0, window = 0;
    const float* inv_freq = nullptr;
  };

  void matmul(const DenseMatrix& m, const float* x, int64_t T, float* y) {
    ctx_.be.matmul(m.type, m.data, m.rows, m.cols, x, m.cols, T, y, m.rows);
  }

  // A chunk of one sequence at pos0, or (rows) the rows of several sequences.
  void run(const PrefillBuffers& b, const int32_t* ids, int64_t T, int64_t pos0, const SeqRows* rows,
           float* logits, bool all_logits) override {
    const ModelSpec& s = ctx_.spec;
    Backend& be = ctx_.be;
    const int64_t D = s.D;
    const float eps = s.rms_eps;
    float *x_stage = b[sc_.x], *ffn_out = b[sc_.ffn_out], *ngrs = b[sc_.ngrs];
    be.upload(b.topk_ids, ids, (size_t)T * sizeof(int32_t));
    be.embed(s.token_embd.type(), head_.token_embd.get(), D, b.topk_ids, T, b.R);
    ops_.scale(b.R, T * D, embed_scale_);
    for (int64_t l = 0; l < s.L; ++l) {
      between_layers(ctx_, l, T, pos0);
      const Layer& ly = layers_[l];
      // Attention, its post-norm into proj, joined to R with the dense FFN's GR read.
      const float* x = gr_read(be, b, T, D, eps, ly.attn_norm, x_stage);
      attention(b, l, ly, x, T, pos0, rows, ffn_out);
      be.rms_norm_read(ffn_out, T, D, eps, ly.post_attn_norm, ngrs, b.proj);
      x = add_gr_read(be, b, T, D, eps, ly.ffn_norm, x_stage);
      float *gate = b[sc_.gate], *up = b[sc_.up];
      matmul_same_x(be, x, T, {{ly.ffn_gate, gate}, {ly.ffn_up, up}});  // one launch where the types agree
      // The router reads R through its own unweighted norm, times its scale and 1 / sqrt(D).
      be.apply_norm(b.R, b.grs, ly.router_scale, D, nullptr, 1, T, ffn_out);
      ops_.scale(ffn_out, T * D, router_root_);
      be.matmul(ly.router.type, ly.router.data, s.E, D, ffn_out, D, T, b.router, s.E);
      be.router_topk(b.router, T, s.E, s.K, true, b.topk_ids, b.topk_w);
      if (ly.exp_scale) ops_.expert_scale(b.topk_w, b.topk_ids, ly.exp_scale, T * s.K);
      be.group_by_expert(b.topk_ids, T, s.K, s.E, b.expert_off, b.expert_rows);
      // The dense FFN, post-normed into ffn.x.
      ops_.geglu(gate, up, T * ly.ffn);
      matmul(ly.ffn_down, gate, T, ffn_out);
      be.rms_norm_read(ffn_out, T, D, eps, ly.post_ffw_norm_1, ngrs, x_stage);
      // The routed experts on pre_ffw_norm_2 (an unfused plan's experts read xn).
      if (b.xn) be.apply_norm(b.R, b.grs, ly.pre_ffw_norm_2, D, nullptr, 1, T, b.xn);
      moe_block(ctx_, b, l, T, ly.pre_ffw_norm_2, &moe_);
      be.rms_norm_read(b.proj, T, D, eps, ly.post_ffw_norm_2, ngrs, ffn_out);
      be.add(ffn_out, x_stage, T * D);
      be.rms_norm_read(ffn_out, T, D, eps, ly.post_ffw_norm, ngrs, b.proj);
      be.add(b.R, b.proj, T * D);
      if (ly.out_scale) ops_.scale(b.R, T * D, ly.out_scale);
    }
    between_layers(ctx_, s.L, T, pos0);
    if (!logits) return;
    be.zero(b.proj, (size_t)T * D * sizeof(float));                   // R is whole: final_logits adds proj
    final_logits(be, b, head_, T, D, eps, all_logits, logits, rows);  // the softcap in head_.on_logits
  }

  // q/k/v, their per-head norms (v's unweighted; a layer without attn_v takes the keys' projection as
  // values), RoPE, the KV cache, attention (windowed on sliding layers) at scale 1, the output projection
  // into `out`. With `rows`, store and attention run on each span of one sequence (RowRun).
  void attention(const PrefillBuffers& b, int64_t l, const Layer& w, const float* x, int64_t T, int64_t pos0,
                 const SeqRows* rows, float* out_proj) {
    const ModelSpec& s = ctx_.spec;
    Backend& be = ctx_.be;
    const int64_t H = s.n_head, KV = w.kv, hd = w.hd;
    float *q = b[sc_.q], *k = b[sc_.k], *v = b[sc_.v], *out = b[sc_.out];
    if (w.v.data) {
      matmul_same_x(be, x, T, {{w.q, q}, {w.k, k}, {w.v, v}});  // one launch where the types agree
    } else {
      matmul_same_x(be, x, T, {{w.q, q}, {w.k, k}});
      be.copy(v, k, (size_t)T * KV * hd * sizeof(float));
    }
    ops_.head_norm(q, T, H, hd, w.q_norm, s.rms_eps);
    ops_.head_norm(k, T, KV, hd, w.k_norm, s.rms_eps);
    ops_.head_norm(v, T, KV, hd, nullptr, s.rms_eps);
    const KvType kt = ctx_.kv.type();
    if (rows) {
      for_row_runs(be, *rows, T, [&](const RowRun& r) {
        const int64_t t = r.first, p = r.pos0, n = r.n;
        ops_.rope_freqs(q + t * H * hd, n, H, hd, w.inv_freq, p, nullptr);
        ops_.rope_freqs(k + t * KV * hd, n, KV, hd, w.inv_freq, p, nullptr);
        void* kc = ctx_.kv.k(l, r.seq);
        void* vc = ctx_.kv.v(l, r.seq);
        be.kv_store(kc, kt, p, n, KV * hd, k + t * KV * hd);
        be.kv_store(vc, kt, p, n, KV * hd, v + t * KV * hd);
        ops_.attention_window(q + t * H * hd, kc, vc, kt, n, p, H, KV, hd, 1.0f, w.window, out + t * H * hd);
      });
    } else {
      ops_.rope_freqs(q, T, H, hd, w.inv_freq, pos0, nullptr);
      ops_.rope_freqs(k, T, KV, hd, w.inv_freq, pos0, nullptr);
      be.kv_store(ctx_.kv.k(l), kt, pos0, T, KV * hd, k);
      be.kv_store(ctx_.kv.v(l), kt, pos0, T, KV * hd, v);
      ops_.attention_window(q, ctx_.kv.k(l), ctx_.kv.v(l), kt, T, pos0, H, KV, hd, 1.0f, w.window, out);
    }
    matmul(w.o, out, T, out_proj);
  }

  ForwardContext ctx_;
  Gemma4Ops& ops_;
  ResidentWeights w_;
  Gemma4Moe moe_;
  std::vector<Layer> layers_;
  HeadWeights head_;
  const float *embed_scale_ = nullptr, *router_root_ = nullptr;
  float softcap_ = 0.f;
  Gemma4Scratch sc_;
};

std::string no_gemma4_ops(Backend& be) {
  return str("gemma4 runs on the CPU and CUDA backends; the ", be.name(),
             " backend has no gemma4 ops (proportional RoPE, windowed attention, the GELU experts). Use "
             "--device cpu.");
}

void check_gemma4_backend(Backend& be, const std::string& path) {
  STRATA_CHECK(gemma4_ops(be), UnsupportedError, path, ": ", no_gemma4_ops(be));
}

std::unique_ptr<ForwardPass> make_gemma4(const ForwardContext& ctx) {
  Gemma4Ops* ops = gemma4_ops(ctx.be);
  STRATA_CHECK(ops, UnsupportedError, no_gemma4_ops(ctx.be));
  return std::make_unique<Gemma4Forward>(ctx, *ops);
}

}  // namespace

extern const Architecture kGemma4{"gemma4", read_gemma4, make_gemma4, check_gemma4_backend};

}  // namespace strata
