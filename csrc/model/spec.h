// ModelSpec: an architecture's hyperparameters and weight tensors, read from GGUF metadata.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
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

struct Ds4Spec;  // model/deepseek4.h

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
  std::vector<LayerSpec> layers;
  int64_t HC = 1;  // residual streams per token

  // The KV cache per layer when the architecture lays it out itself (DeepSeek V4: the raw window,
  // compressed rows, indexer keys, compressor state); empty: keys and values, ctx rows of
  // n_kv_head * head_dim each.
  std::vector<std::vector<KvTensorSpec>> kv_layers;
  // Architecture-specific lines for `strata info`: (label, value).
  std::vector<std::pair<std::string, std::string>> details;
  // DeepSeek V4's hyperparameters and tensors beyond the common ones (null for other architectures).
  std::shared_ptr<const Ds4Spec> ds4;

  // Totals for `strata info`.
  uint64_t dense_bytes = 0, expert_bytes = 0;
  uint64_t params_total = 0, params_active = 0;
};

// Reads and validates the spec; throws UnsupportedError for an unknown architecture and
// FormatError for a missing key or a tensor of the wrong shape.
ModelSpec read_spec(const gguf::File& f);

}  // namespace strata
