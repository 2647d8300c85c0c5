// ModelSpec: an architecture's hyperparameters and weight tensors, read from GGUF metadata.
#pragma once
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf.h"
#include "prefill/prefill.h"

namespace strata {

struct WeightRef {
  const gguf::TensorInfo* t = nullptr;
  uint32_t type() const { return t->type; }
  const uint8_t* data() const { return t->data; }
};

struct LayerSpec {
  WeightRef attn_norm, q, k, v, o, q_norm, k_norm, ffn_norm, router;
  WeightRef gate_exps, up_exps, down_exps;
};

// An architecture's hyperparameters and tensors beyond ModelSpec's common ones, which only its own
// files read (DeepSeek V4's Ds4Spec).
struct ArchSpec {
  virtual ~ArchSpec() = default;
};

// One tensor of a layer's KV cache in an architecture's own cache layout: rows of `width` float32,
// `rows` of them plus ceil(ctx / ctx_div) when ctx_div > 0.
struct KvTensorSpec {
  std::string name;
  int64_t rows = 0;
  int64_t ctx_div = 0;
  int64_t width = 0;
};

struct ModelSpec {
  std::string arch, name;
  int64_t L = 0, D = 0, V = 0;
  int64_t n_head = 0, n_kv_head = 0, head_dim = 0;
  int64_t E = 0, K = 0, F = 0;
  int64_t ctx_train = 0;
  float rms_eps = 1e-6f, rope_base = 10000.f;
  bool norm_topk = true;
  WeightRef token_embd, output_norm, output;  // output may alias token_embd (tied)
  // One per layer with routed experts, in order: every layer, or (deepseek2's leading dense layers) the
  // layers from the first MoE one on; the expert cache's layer l is layers[l], and a pass whose first
  // layers are dense maps its layer to that index.
  std::vector<LayerSpec> layers;
  int64_t HC = 1;  // residual streams per token

  // The keys are the values: the cache holds one [ctx, n_kv_head * head_dim] tensor a layer, which
  // attention reads as both (deepseek2's latent rows: the compressed KV and the rope key).
  bool kv_values_are_keys = false;
  // The KV cache per layer when the architecture lays it out itself (DeepSeek V4: the raw window,
  // compressed rows, indexer keys, compressor state); empty: keys and values, ctx rows of
  // n_kv_head * head_dim each.
  std::vector<std::vector<KvTensorSpec>> kv_layers;
  // The architecture's prompt-chunk scratch beyond the common buffers (its attention's, any stream
  // mixing), declared by its ScratchList: Prefill sizes and carves it with the rest.
  std::vector<ScratchSpec> scratch;
  // Architecture-specific lines for `strata info`: (label, value).
  std::vector<std::pair<std::string, std::string>> details;
  // The architecture's own spec (null when it has none).
  std::shared_ptr<const ArchSpec> arch_spec;

  // Totals for `strata info`.
  uint64_t dense_bytes = 0, expert_bytes = 0;
  uint64_t params_total = 0, params_active = 0;
};

// Reads and validates the spec; throws UnsupportedError for an unknown architecture and
// FormatError for a missing key or a tensor of the wrong shape.
ModelSpec read_spec(const gguf::File& f);

// ---- for spec readers: every number a file gives is bounded before any arithmetic uses it ----

// Bounds of the integer hyperparameters, far above any model published and low enough that every
// product the engine forms from them (q width, expert bytes, the chunk plan) fits in int64.
namespace limits {
constexpr int64_t kLayers = 1 << 12;
constexpr int64_t kHidden = 1 << 18;       // embedding_length
constexpr int64_t kHeads = 1 << 12;        // head_count, head_count_kv
constexpr int64_t kHeadDim = 1 << 12;      // key_length, value_length
constexpr int64_t kExperts = 1 << 16;      // expert_count
constexpr int64_t kExpertsUsed = 1 << 10;  // expert_used_count
constexpr int64_t kFfn = 1 << 20;          // expert_feed_forward_length
constexpr int64_t kVocab = INT32_MAX;      // token ids are int32
constexpr int64_t kContext = int64_t(1) << 32;
}  // namespace limits

// The integer at `key`, required (or `dflt` when absent), checked to lie in [lo, hi]: FormatError
// naming the file, the key, the value and the range otherwise.
int64_t read_count(const gguf::File& f, const std::string& key, int64_t lo, int64_t hi);
int64_t read_count(const gguf::File& f, const std::string& key, int64_t lo, int64_t hi, int64_t dflt);
// The number at `key` (or `dflt` when absent), finite and within [lo, hi].
double read_real(const gguf::File& f, const std::string& key, double lo, double hi, double dflt);
// a * b, or FormatError naming `what` (the keys the factors came from) when it overflows int64.
int64_t checked_mul(const gguf::File& f, int64_t a, int64_t b, const char* what);

// The keys a grouped-query-attention MoE architecture reads alike, under its prefix a ("qwen3moe."):
// general.name, block_count, embedding_length, attention.head_count / head_count_kv / key_length
// (default embedding_length / head_count) / value_length (= key_length), expert_count,
// expert_used_count, expert_feed_forward_length, and with the architecture's defaults context_length,
// attention.layer_norm_rms_epsilon and rope.freq_base. Each number is bounded before anything is
// derived from it (key_length's default divides by head_count); FormatError or UnsupportedError
// naming the file and key otherwise.
struct GqaMoeDefaults {
  int64_t ctx_train;
  double rms_eps, rope_base;
};
void read_gqa_moe(const gguf::File& f, const std::string& a, const GqaMoeDefaults& d, ModelSpec& s);

}  // namespace strata
