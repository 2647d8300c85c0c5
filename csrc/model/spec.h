// ModelSpec: an architecture's hyperparameters and weight tensors, read from GGUF metadata.
#pragma once
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf.h"

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

struct ModelSpec {
  std::string arch, name;
  int64_t L = 0, D = 0, V = 0;
  int64_t n_head = 0, n_kv_head = 0, head_dim = 0;
  int64_t E = 0, K = 0, F = 0;
  int64_t ctx_train = 0;
  float rms_eps = 1e-6f, rope_base = 10000.f;
  bool norm_topk = true;
  WeightRef token_embd, output_norm, output;  // output may alias token_embd (tied)
  std::vector<LayerSpec> layers;

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

}  // namespace strata
