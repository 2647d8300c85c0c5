// The shared weight loader (see weights.h).
#include "model/weights.h"

#include "core/error.h"
#include "core/ggml_types.h"
#include "quant/quant.h"

namespace strata {

namespace {

constexpr uint32_t kI32 = 26;  // ggml's I32

std::string shape_str(const std::vector<int64_t>& ne) {
  std::string s;
  for (auto v : ne) s += (s.empty() ? "" : ", ") + std::to_string(v);
  return "[" + s + "]";
}

}  // namespace

WeightRef TensorReader::need(const std::string& name, const std::vector<int64_t>& ne, TensorKind kind) const {
  const gguf::TensorInfo* t = f_.find_tensor(name);
  STRATA_CHECK(t, FormatError, f_.path(), ": ", arch_, " tensor '", name, "' is missing (expected shape ",
               shape_str(ne), " from the metadata)");
  STRATA_CHECK(t->ne == ne, FormatError, f_.path(), ": tensor '", name, "' has shape ", shape_str(t->ne),
               ", expected ", shape_str(ne), " from the metadata");
  if (kind == TensorKind::I32) {
    const char* tn = ggml_type_name(t->type);
    STRATA_CHECK(t->type == kI32, FormatError, f_.path(), ": tensor '", name, "' must be I32, got ",
                 tn ? tn : "unknown");
  } else {
    quant_traits(t->type, str(f_.path(), ": tensor '", name, "'"));  // unsupported types fail at load
  }
  return WeightRef{t};
}

void TensorReader::common(ModelSpec& s, bool tied_ok) const {
  const gguf::TensorInfo& emb = f_.tensor("token_embd.weight");
  STRATA_CHECK(emb.ne.size() == 2 && emb.ne[0] == s.D, FormatError, f_.path(),
               ": tensor 'token_embd.weight' must be [", s.D, ", vocab]");
  s.V = emb.ne[1];
  STRATA_CHECK(s.V <= limits::kVocab, FormatError, f_.path(), ": tensor 'token_embd.weight' has ", s.V,
               " rows, more token ids than int32 holds");
  s.token_embd = need("token_embd.weight", {s.D, s.V});
  s.output_norm = need("output_norm.weight", {s.D});
  s.output = tied_ok && !f_.find_tensor("output.weight") ? s.token_embd : need("output.weight", {s.D, s.V});
}

DenseMatrix ResidentWeights::dense(const WeightRef& w, const char* what) {
  owned_.push_back(be_.resident(w.data(), w.t->nbytes, what));
  return DenseMatrix{w.type(), owned_.back().get(), w.t->ne.size() > 1 ? w.t->ne[1] : 1, w.t->ne[0]};
}

const float* ResidentWeights::vec(const WeightRef& w, const char* what) {
  const int64_t n = w.t->nelements();
  if (w.type() == (uint32_t)QType::F32) {
    owned_.push_back(be_.resident(w.data(), n * sizeof(float), what));
    return owned_.back().as<float>();
  }
  std::vector<float> v(n);
  dequantize(quant_traits(w.type(), what).type, w.data(), v.data(), n);
  return floats(std::move(v), what);
}

const float* ResidentWeights::floats(std::vector<float> v, const char* what) {
  converted_.push_back(std::move(v));
  owned_.push_back(be_.resident(converted_.back().data(), converted_.back().size() * sizeof(float), what));
  return owned_.back().as<float>();
}

const void* ResidentWeights::raw(const WeightRef& w, const char* what) {
  owned_.push_back(be_.resident(w.data(), w.t->nbytes, what));
  return owned_.back().get();
}

HeadWeights ResidentWeights::head(const ModelSpec& s) {
  HeadWeights h;
  h.token_embd = be_.resident(s.token_embd.data(), s.token_embd.t->nbytes, "token_embd");
  h.output_norm = vec(s.output_norm, "output_norm");
  // A tied head reads the embedding table itself.
  h.output = s.output.t == s.token_embd.t ? DenseMatrix{s.output.type(), h.token_embd.get(), s.V, s.D}
                                          : dense(s.output, "output");
  h.logits_dev = DeviceBuffer(be_, (size_t)kHeadRows * s.V * sizeof(float), "the logits");
  return h;
}

}  // namespace strata
