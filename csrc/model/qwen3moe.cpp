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
#include "model/weights.h"

namespace strata {

ModelSpec read_qwen3moe(const gguf::File& f) {
  ModelSpec s;
  const std::string a = "qwen3moe.";
  s.arch = "qwen3moe";
  read_gqa_moe(f, a, GqaMoeDefaults{4096, 1e-6, 1e6}, s);

  const TensorReader r(f, s.arch);
  r.common(s, true);
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
                           {"attn_q_norm.weight", &LayerSpec::q_norm, {s.head_dim}},
                           {"attn_k_norm.weight", &LayerSpec::k_norm, {s.head_dim}},
                           {"ffn_norm.weight", &LayerSpec::ffn_norm, {s.D}},
                           {"ffn_gate_inp.weight", &LayerSpec::router, {s.D, s.E}},
                           {"ffn_gate_exps.weight", &LayerSpec::gate_exps, {s.D, s.F, s.E}},
                           {"ffn_up_exps.weight", &LayerSpec::up_exps, {s.D, s.F, s.E}},
                           {"ffn_down_exps.weight", &LayerSpec::down_exps, {s.F, s.D, s.E}},
                       });
    s.layers.push_back(ls);
  }
  ScratchList scratch;
  declare_gqa_scratch(s, scratch);
  s.scratch = scratch.specs();
  return s;
}

namespace {

class Qwen3MoeForward final : public RowsForwardPass {
 public:
  explicit Qwen3MoeForward(const ForwardContext& ctx) : ctx_(ctx), w_(ctx.be) {
    const ModelSpec& s = ctx.spec;
    for (const auto& l : s.layers) {
      Layer ly;
      w_.layer<LayerSpec, Layer>(l, ly,
                                 {
                                     {&LayerSpec::q, &Layer::q, "attn_q"},
                                     {&LayerSpec::k, &Layer::k, "attn_k"},
                                     {&LayerSpec::v, &Layer::v, "attn_v"},
                                     {&LayerSpec::o, &Layer::o, "attn_output"},
                                     {&LayerSpec::q_norm, &Layer::q_norm, "attn_q_norm"},
                                     {&LayerSpec::k_norm, &Layer::k_norm, "attn_k_norm"},
                                     {&LayerSpec::attn_norm, &Layer::attn_norm, "attn_norm"},
                                     {&LayerSpec::ffn_norm, &Layer::ffn_norm, "ffn_norm"},
                                     {&LayerSpec::router, &Layer::router, "ffn_gate_inp"},
                                 });
      layers_.push_back(ly);
    }
    head_ = w_.head(s);
    shape_ = gqa_attention_shape(s);
    ScratchList scratch;
    scratch_ = declare_gqa_scratch(s, scratch);
    STRATA_CHECK(scratch.specs() == s.scratch, Error,
                 "internal error: the qwen3moe scratch is not the spec's");
  }

 private:
  // A chunk of one sequence at pos0, or (rows) the rows of several sequences.
  void run(const PrefillBuffers& b, const int32_t* ids, int64_t T, int64_t pos0, const SeqRows* rows,
           float* logits, bool all_logits) override {
    const ModelSpec& s = ctx_.spec;
    Backend& be = ctx_.be;
    const int64_t D = s.D;
    // Token ids live in the router-ids buffer until the first router overwrites them.
    be.upload(b.topk_ids, ids, (size_t)T * sizeof(int32_t));
    be.embed(s.token_embd.type(), head_.token_embd.get(), D, b.topk_ids, T, b.R);
    // The GR read stages its rows in proj when the plan has no xn: proj is free at both read points.
    for (int64_t l = 0; l < s.L; ++l) {
      between_layers(ctx_, l, T, pos0);
      const Layer& ly = layers_[l];
      // Each sublayer's output (proj) joins the residual in the next GR read's op.
      const float* x = l == 0 ? gr_read(be, b, T, D, s.rms_eps, ly.attn_norm, b.proj)
                              : add_gr_read(be, b, T, D, s.rms_eps, ly.attn_norm, b.proj);
      attention_block(ctx_, b, l, ly, shape_, scratch_, x, T, pos0, rows);
      x = add_gr_read(be, b, T, D, s.rms_eps, ly.ffn_norm, b.proj);
      softmax_router(be, b, ly.router, x, T, s.K, s.norm_topk);
      NextRouter next;
      if (l + 1 < s.L) {
        next.router = &layers_[l + 1].router;
        next.ffn_norm = layers_[l + 1].ffn_norm;
        next.norm_topk = s.norm_topk;
      }
      moe_block(ctx_, b, l, T, ly.ffn_norm, nullptr, l + 1 < s.L ? &next : nullptr);
    }
    between_layers(ctx_, s.L, T, pos0);
    if (!logits) return;
    final_logits(be, b, head_, T, D, s.rms_eps, all_logits, logits, rows);
  }

  struct Layer : AttentionWeights {
    const float *attn_norm = nullptr, *ffn_norm = nullptr;
    DenseMatrix router;
  };

  ForwardContext ctx_;
  ResidentWeights w_;
  std::vector<Layer> layers_;
  HeadWeights head_;
  AttentionShape shape_;
  AttentionScratch scratch_;
};

std::unique_ptr<ForwardPass> make_qwen3moe(const ForwardContext& ctx) {
  return std::make_unique<Qwen3MoeForward>(ctx);
}

}  // namespace

extern const Architecture kQwen3Moe{"qwen3moe", read_qwen3moe, make_qwen3moe};

}  // namespace strata
