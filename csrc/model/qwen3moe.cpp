// Qwen3-MoE (GGUF arch "qwen3moe"): hyperparameters and tensors from metadata, and its forward
// pass: pre-norm GQA with per-head q/k RMSNorm and NEOX RoPE, softmax -> top-K -> renormalize
// routing over SwiGLU experts, all written with the shared blocks of model/blocks.h.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/utf8.h"
#include "model/arch.h"
#include "model/blocks.h"
#include "model/spec.h"
#include "quant/quant.h"

namespace strata {

namespace {

WeightRef need(const gguf::File& f, const std::string& name, std::vector<int64_t> ne) {
  const gguf::TensorInfo& t = f.tensor(name);
  bool ok = t.ne.size() == ne.size();
  for (size_t i = 0; ok && i < ne.size(); ++i) ok = t.ne[i] == ne[i];
  if (!ok) {
    std::string got, want;
    for (auto v : t.ne) got += (got.empty() ? "" : ", ") + std::to_string(v);
    for (auto v : ne) want += (want.empty() ? "" : ", ") + std::to_string(v);
    throw FormatError(str(f.path(), ": tensor '", name, "' has shape [", got, "], expected [", want,
                          "] from the metadata"));
  }
  quant_traits(t.type, str(f.path(), ": tensor '", name, "'"));  // unsupported types fail at load
  return WeightRef{&t};
}

AttentionShape attention_shape(const ModelSpec& s) {
  return AttentionShape{s.n_head, s.n_kv_head, s.head_dim, s.rms_eps,
                        RopeParams{s.head_dim, s.rope_base, true}};
}

// The chunk scratch beyond the common buffers: the attention block's. The spec reader stores the
// list, the forward pass takes the handles of the same declaration.
AttentionScratch declare_scratch(const ModelSpec& s, ScratchList& list) {
  return declare_attention(list, attention_shape(s));
}

}  // namespace

ModelSpec read_qwen3moe(const gguf::File& f) {
  ModelSpec s;
  const std::string a = "qwen3moe.";
  s.arch = "qwen3moe";
  s.name = printable(f.get_string("general.name", ""));
  // Each number is bounded before anything is derived from it (key_length's default divides by
  // head_count; the q width multiplies two of them).
  s.L = read_count(f, a + "block_count", 1, limits::kLayers);
  s.D = read_count(f, a + "embedding_length", 1, limits::kHidden);
  s.n_head = read_count(f, a + "attention.head_count", 1, limits::kHeads);
  s.n_kv_head = read_count(f, a + "attention.head_count_kv", 1, s.n_head, s.n_head);
  STRATA_CHECK(s.n_head % s.n_kv_head == 0, FormatError, f.path(), ": ", a, "attention.head_count ", s.n_head,
               " is not a multiple of ", a, "attention.head_count_kv ", s.n_kv_head);
  s.head_dim = read_count(f, a + "attention.key_length", 2, limits::kHeadDim, s.D / s.n_head);
  STRATA_CHECK(s.head_dim >= 2 && s.head_dim <= limits::kHeadDim && s.head_dim % 2 == 0, FormatError,
               f.path(), ": ", a,
               "attention.key_length (or embedding_length / head_count when it is absent) = ", s.head_dim,
               " must be even and in [2, ", limits::kHeadDim, "] (RoPE rotates pairs)");
  s.E = read_count(f, a + "expert_count", 1, limits::kExperts);
  s.K = read_count(f, a + "expert_used_count", 1, std::min(s.E, limits::kExpertsUsed));
  s.F = read_count(f, a + "expert_feed_forward_length", 1, limits::kFfn);
  s.ctx_train = read_count(f, a + "context_length", 1, limits::kContext, 4096);
  s.rms_eps = (float)read_real(f, a + "attention.layer_norm_rms_epsilon", 1e-30, 1.0, 1e-6);
  s.rope_base = (float)read_real(f, a + "rope.freq_base", 1.0, 1e30, 1e6);
  const int64_t vlen = read_count(f, a + "attention.value_length", 1, limits::kHeadDim, s.head_dim);
  STRATA_CHECK(vlen == s.head_dim, UnsupportedError, f.path(), ": value_length ", vlen, " != key_length ",
               s.head_dim, " is not supported");

  const gguf::TensorInfo& emb = f.tensor("token_embd.weight");
  STRATA_CHECK(emb.ne.size() == 2 && emb.ne[0] == s.D, FormatError, f.path(),
               ": tensor 'token_embd.weight' must be [", s.D, ", vocab]");
  s.V = emb.ne[1];
  STRATA_CHECK(s.V <= limits::kVocab, FormatError, f.path(), ": tensor 'token_embd.weight' has ", s.V,
               " rows, more token ids than int32 holds");
  s.token_embd = need(f, "token_embd.weight", {s.D, s.V});
  s.output_norm = need(f, "output_norm.weight", {s.D});
  s.output = f.find_tensor("output.weight") ? need(f, "output.weight", {s.D, s.V}) : s.token_embd;
  const int64_t Hd = checked_mul(f, s.n_head, s.head_dim, "head_count * key_length");
  const int64_t KVd = checked_mul(f, s.n_kv_head, s.head_dim, "head_count_kv * key_length");
  for (int64_t l = 0; l < s.L; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerSpec ls;
    ls.attn_norm = need(f, p + "attn_norm.weight", {s.D});
    ls.q = need(f, p + "attn_q.weight", {s.D, Hd});
    ls.k = need(f, p + "attn_k.weight", {s.D, KVd});
    ls.v = need(f, p + "attn_v.weight", {s.D, KVd});
    ls.o = need(f, p + "attn_output.weight", {Hd, s.D});
    ls.q_norm = need(f, p + "attn_q_norm.weight", {s.head_dim});
    ls.k_norm = need(f, p + "attn_k_norm.weight", {s.head_dim});
    ls.ffn_norm = need(f, p + "ffn_norm.weight", {s.D});
    ls.router = need(f, p + "ffn_gate_inp.weight", {s.D, s.E});
    ls.gate_exps = need(f, p + "ffn_gate_exps.weight", {s.D, s.F, s.E});
    ls.up_exps = need(f, p + "ffn_up_exps.weight", {s.D, s.F, s.E});
    ls.down_exps = need(f, p + "ffn_down_exps.weight", {s.F, s.D, s.E});
    s.layers.push_back(ls);
  }
  ScratchList scratch;
  declare_scratch(s, scratch);
  s.scratch = scratch.specs();
  return s;
}

namespace {

class Qwen3MoeForward final : public ForwardPass {
 public:
  explicit Qwen3MoeForward(const ForwardContext& ctx) : ctx_(ctx) {
    Backend& be = ctx.be;
    const ModelSpec& s = ctx.spec;
    for (const auto& l : s.layers) {
      Layer ly;
      ly.attn.q = dense(l.q, "attn_q");
      ly.attn.k = dense(l.k, "attn_k");
      ly.attn.v = dense(l.v, "attn_v");
      ly.attn.o = dense(l.o, "attn_output");
      ly.attn.q_norm = norm(l.q_norm, "attn_q_norm");
      ly.attn.k_norm = norm(l.k_norm, "attn_k_norm");
      ly.attn_norm = norm(l.attn_norm, "attn_norm");
      ly.ffn_norm = norm(l.ffn_norm, "ffn_norm");
      ly.router = dense(l.router, "ffn_gate_inp");
      layers_.push_back(ly);
    }
    token_embd_ = be.resident(s.token_embd.data(), s.token_embd.t->nbytes, "token_embd");
    output_norm_ = norm(s.output_norm, "output_norm");
    // A tied head reads the embedding table itself.
    output_ = s.output.t == s.token_embd.t ? DenseMatrix{s.output.type(), token_embd_.get(), s.V, s.D}
                                           : dense(s.output, "output");
    shape_ = attention_shape(s);
    ScratchList scratch;
    scratch_ = declare_scratch(s, scratch);
    STRATA_CHECK(scratch.specs() == s.scratch, Error,
                 "internal error: the qwen3moe scratch is not the spec's");
    logits_dev_ = DeviceBuffer(be, (size_t)kHeadRows * s.V * sizeof(float), "the logits");
  }

  void run_chunk(const PrefillBuffers& b, const int32_t* ids, int64_t T, int64_t pos0, float* logits,
                 bool all_logits) override {
    const ModelSpec& s = ctx_.spec;
    Backend& be = ctx_.be;
    const int64_t D = s.D;
    // Token ids live in the router-ids buffer until the first router overwrites them.
    be.upload(b.topk_ids, ids, (size_t)T * sizeof(int32_t));
    be.embed(s.token_embd.type(), token_embd_.get(), D, b.topk_ids, T, b.R);
    // The GR read stages its rows in proj when the plan has no xn: proj is free at both read points.
    for (int64_t l = 0; l < s.L; ++l) {
      between_layers(ctx_, l, T, pos0);
      const Layer& ly = layers_[l];
      // Each sublayer's output (proj) joins the residual in the next GR read's op.
      const float* x = l == 0 ? gr_read(be, b, T, D, s.rms_eps, ly.attn_norm, b.proj)
                              : add_gr_read(be, b, T, D, s.rms_eps, ly.attn_norm, b.proj);
      attention_block(ctx_, b, l, ly.attn, shape_, scratch_, x, T, pos0);
      x = add_gr_read(be, b, T, D, s.rms_eps, ly.ffn_norm, b.proj);
      softmax_router(be, b, ly.router, x, T, s.K, s.norm_topk);
      moe_block(ctx_, b, l, T, ly.ffn_norm);
    }
    between_layers(ctx_, s.L, T, pos0);
    if (!logits) return;
    be.add(b.R, b.proj, T * D);  // the last layer's MoE output
    be.rms_scale(b.R, T, D, s.rms_eps, b.grs);
    const int64_t first = all_logits ? 0 : T - 1;
    float* x = b.xn ? b.xn : b.proj;
    be.apply_norm(b.R + first * D, b.grs + first, output_norm_, D, nullptr, 1, T - first, x);
    head_block(be, output_, x, T - first, logits_dev_.as<float>(), logits);
  }

 private:
  struct Layer {
    AttentionWeights attn;
    const float *attn_norm = nullptr, *ffn_norm = nullptr;
    DenseMatrix router;
  };

  DenseMatrix dense(const WeightRef& w, const char* what) {
    owned_.push_back(ctx_.be.resident(w.data(), w.t->nbytes, what));
    return DenseMatrix{w.type(), owned_.back().get(), w.t->ne.size() > 1 ? w.t->ne[1] : 1, w.t->ne[0]};
  }
  // Norm weights are read as float32: other types are converted once at load.
  const float* norm(const WeightRef& w, const char* what) {
    const int64_t n = w.t->nelements();
    const void* host = w.data();
    if (w.type() != (uint32_t)QType::F32) {
      converted_.emplace_back(n);
      dequantize(quant_traits(w.type(), what).type, w.data(), converted_.back().data(), n);
      host = converted_.back().data();
    }
    owned_.push_back(ctx_.be.resident(host, n * sizeof(float), what));
    return owned_.back().as<float>();
  }

  ForwardContext ctx_;
  std::vector<std::vector<float>> converted_;  // before owned_: borrowed buffers may point into it
  std::vector<DeviceBuffer> owned_;
  std::vector<Layer> layers_;
  DeviceBuffer token_embd_;
  const float* output_norm_ = nullptr;
  DenseMatrix output_;
  AttentionShape shape_;
  AttentionScratch scratch_;
  DeviceBuffer logits_dev_;
};

std::unique_ptr<ForwardPass> make_qwen3moe(const ForwardContext& ctx) {
  return std::make_unique<Qwen3MoeForward>(ctx);
}

}  // namespace

extern const Architecture kQwen3Moe{"qwen3moe", read_qwen3moe, make_qwen3moe};

}  // namespace strata
