// read_spec: dispatches on general.architecture and totals the bytes and parameters.
#include "model/spec.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/utf8.h"
#include "model/arch.h"

namespace strata {

int64_t read_count(const gguf::File& f, const std::string& key, int64_t lo, int64_t hi) {
  const int64_t v = f.get_int(key);
  STRATA_CHECK(v >= lo && v <= hi, FormatError, f.path(), ": metadata key '", key, "' = ", v,
               " is out of range [", lo, ", ", hi, "]; the file is corrupt or not a model strata can run");
  return v;
}

int64_t read_count(const gguf::File& f, const std::string& key, int64_t lo, int64_t hi, int64_t dflt) {
  return f.find(key) ? read_count(f, key, lo, hi) : dflt;
}

void read_gqa_moe(const gguf::File& f, const std::string& a, const GqaMoeDefaults& d, ModelSpec& s) {
  s.name = printable(f.get_string("general.name", ""));
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
  const int64_t vlen = read_count(f, a + "attention.value_length", 1, limits::kHeadDim, s.head_dim);
  STRATA_CHECK(vlen == s.head_dim, UnsupportedError, f.path(), ": ", a, "attention.value_length ", vlen,
               " != key_length ", s.head_dim, " is not supported");
  s.E = read_count(f, a + "expert_count", 1, limits::kExperts);
  s.K = read_count(f, a + "expert_used_count", 1, std::min(s.E, limits::kExpertsUsed));
  s.F = read_count(f, a + "expert_feed_forward_length", 1, limits::kFfn);
  s.ctx_train = read_count(f, a + "context_length", 1, limits::kContext, d.ctx_train);
  s.rms_eps = (float)read_real(f, a + "attention.layer_norm_rms_epsilon", 1e-30, 1.0, d.rms_eps);
  s.rope_base = (float)read_real(f, a + "rope.freq_base", 1.0, 1e30, d.rope_base);
}

double read_real(const gguf::File& f, const std::string& key, double lo, double hi, double dflt) {
  if (!f.find(key)) return dflt;
  const double v = f.get_float(key);
  STRATA_CHECK(std::isfinite(v) && v >= lo && v <= hi, FormatError, f.path(), ": metadata key '", key,
               "' = ", v, " is out of range [", lo, ", ", hi,
               "]; the file is corrupt or not a model strata can run");
  return v;
}

int64_t checked_mul(const gguf::File& f, int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  STRATA_CHECK(!__builtin_mul_overflow(a, b, &r), FormatError, f.path(), ": ", what, " = ", a, " * ", b,
               " overflows int64; the file is corrupt");
  return r;
}

ModelSpec read_spec(const gguf::File& f) {
  // The name is only shown, but it may hold any bytes: keep it printable.
  ModelSpec s = find_architecture(printable(f.get_string("general.architecture")), f.path()).read_spec(f);
  for (const auto& l : s.layers)
    for (const WeightRef* w : {&l.gate_exps, &l.up_exps, &l.down_exps}) {
      s.expert_bytes += w->t->nbytes;
      s.params_total += w->t->nelements();
      s.params_active += w->t->nelements() / s.E * s.K;
    }
  for (const auto& t : f.tensors()) {
    // The routed experts' matrices were counted above; their biases (gpt-oss) stay resident, as dense.
    if (t.name.find("_exps.weight") != std::string::npos) continue;
    s.dense_bytes += t.nbytes;
    s.params_total += t.nelements();
    // The embedding is a lookup: one row per token is read, not counted as active compute.
    if (t.name != "token_embd.weight" || s.output.t == &t) s.params_active += t.nelements();
  }
  return s;
}

}  // namespace strata
