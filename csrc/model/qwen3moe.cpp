// Qwen3-MoE (GGUF arch "qwen3moe"): hyperparameters and tensors from metadata.
// The forward pass itself is shared MoE machinery in model.cpp; qwen3moe is
// pre-norm GQA with per-head q/k RMSNorm, NEOX RoPE, softmax -> top-K -> renormalize.
#include "core/error.h"
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

}  // namespace

ModelSpec read_qwen3moe(const gguf::File& f) {
  ModelSpec s;
  const std::string a = "qwen3moe.";
  s.arch = "qwen3moe";
  s.name = f.get_string("general.name", "");
  s.L = f.get_int(a + "block_count");
  s.D = f.get_int(a + "embedding_length");
  s.n_head = f.get_int(a + "attention.head_count");
  s.n_kv_head = f.get_int(a + "attention.head_count_kv", s.n_head);
  s.head_dim = f.get_int(a + "attention.key_length", s.D / s.n_head);
  s.E = f.get_int(a + "expert_count");
  s.K = f.get_int(a + "expert_used_count");
  s.F = f.get_int(a + "expert_feed_forward_length");
  s.ctx_train = f.get_int(a + "context_length", 4096);
  s.rms_eps = (float)f.get_float(a + "attention.layer_norm_rms_epsilon", 1e-6);
  s.rope_base = (float)f.get_float(a + "rope.freq_base", 1e6);
  const int64_t vlen = f.get_int(a + "attention.value_length", s.head_dim);
  STRATA_CHECK(s.L > 0 && s.D > 0 && s.n_head > 0 && s.n_kv_head > 0 && s.n_head % s.n_kv_head == 0 &&
                   s.head_dim > 0 && s.head_dim % 2 == 0 && s.E > 0 && s.K > 0 && s.K <= s.E && s.F > 0,
               FormatError, f.path(), ": qwen3moe hyperparameters out of range: block_count=", s.L,
               " embedding_length=", s.D, " head_count=", s.n_head, " head_count_kv=", s.n_kv_head,
               " key_length=", s.head_dim, " expert_count=", s.E, " expert_used_count=", s.K,
               " expert_feed_forward_length=", s.F);
  STRATA_CHECK(vlen == s.head_dim, UnsupportedError, f.path(), ": value_length ", vlen, " != key_length ",
               s.head_dim, " is not supported");

  const gguf::TensorInfo& emb = f.tensor("token_embd.weight");
  STRATA_CHECK(emb.ne.size() == 2 && emb.ne[0] == s.D, FormatError, f.path(),
               ": tensor 'token_embd.weight' must be [", s.D, ", vocab]");
  s.V = emb.ne[1];
  s.token_embd = need(f, "token_embd.weight", {s.D, s.V});
  s.output_norm = need(f, "output_norm.weight", {s.D});
  s.output = f.find_tensor("output.weight") ? need(f, "output.weight", {s.D, s.V}) : s.token_embd;
  const int64_t Hd = s.n_head * s.head_dim, KVd = s.n_kv_head * s.head_dim;
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
  return s;
}

}  // namespace strata
