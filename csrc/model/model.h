// Model: a loaded GGUF on a backend: dense weights resident, experts behind the ExpertCache,
// KV cache and decode scratch allocated once, prompt scratch borrowed from the cache per chunk.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "expert_cache/expert_cache.h"
#include "expert_cache/expert_source.h"
#include "gguf/gguf.h"
#include "model/spec.h"
#include "prefill/prefill.h"

namespace strata {

struct ModelConfig {
  std::string device = "cpu";
  int threads = 0;            // 0: STRATA_THREADS or every core
  int64_t ctx = 4096;         // KV cache length in tokens
  bool all_resident = false;  // --expert-cache all
  size_t cache_bytes = 0;     // --expert-cache in bytes when not all_resident
  std::string source = "auto";  // host | mmap | auto
  int64_t prefill = 8192;     // tokens per prompt chunk; with prefill_auto, the largest tried
  bool prefill_auto = false;  // --prefill auto[:MAX]: the largest chunk <= prefill that fits
  Progress progress;          // long loads report here
};

struct ChunkStats {
  int64_t chunks = 0, chunk_tokens = 0, slots_borrowed = 0;
  uint64_t region_bytes = 0;
};

class Model {
 public:
  Model(const std::string& path, const ModelConfig& cfg);
  ~Model();

  const ModelSpec& spec() const { return spec_; }
  const ModelConfig& config() const { return cfg_; }
  const gguf::File& file() const { return *file_; }
  const Prefill& prefill() const { return prefill_; }
  const ExpertLayout& expert_layout() const { return xlayout_; }
  ExpertCache& cache() { return *cache_; }
  // Tokens per prompt chunk, as resolved at load (auto picks it from the cache size).
  int64_t chunk() const { return chunk_; }
  // Slots the prompt borrows for a chunk of T tokens (0 with an all-resident cache).
  int64_t slots_for(int64_t T) const;
  bool has_source() const { return src_ != nullptr; }
  const char* source_kind() const { return src_ ? source_kind_name(src_->kind()) : "none"; }
  Backend& backend() { return *be_; }
  const ChunkStats& chunk_stats() const { return chunk_stats_; }
  void reset_stats();

  // Runs ids[0..n) at positions pos0.. through the model, chunked by cfg.prefill, filling the KV
  // cache. Writes V logits per position into `logits` (host memory) when all_logits, else only
  // the last position's.
  void forward(const int32_t* ids, int64_t n, int64_t pos0, float* logits, bool all_logits);

 private:
  struct DenseLayer {
    const float *attn_norm, *q_norm, *k_norm, *ffn_norm;
  };
  void run_chunk(const PrefillBuffers& b, const int32_t* ids, int64_t T, int64_t pos0, float* logits,
                 bool all_logits);
  void check_guards(const uint8_t* tail, size_t n, int64_t T);
  void moe(const PrefillBuffers& b, int64_t l, int64_t T, const float* x_in);
  const float* norm_weight(const WeightRef& w, const char* what);
  void head(const PrefillBuffers& b, const float* x, int64_t rows, float* logits_host);

  ModelConfig cfg_;
  std::shared_ptr<gguf::File> file_;
  ModelSpec spec_;
  std::unique_ptr<Backend> be_;
  Prefill prefill_;
  ExpertLayout xlayout_;
  std::unique_ptr<ExpertSource> src_;
  std::unique_ptr<ExpertCache> cache_;
  std::vector<DenseLayer> dense_;
  const float* output_norm_ = nullptr;
  std::vector<std::vector<float>> owned_norms_;  // non-F32 norm weights converted at load
  float* kc_ = nullptr;     // [L, ctx, KV, hd]
  float* vc_ = nullptr;
  void* decode_region_ = nullptr;  // layout(1, src), allocated once
  void* own_region_ = nullptr;     // all-resident cache: the chunk region has no slots to borrow
  size_t own_region_bytes_ = 0;
  float* logits_dev_ = nullptr;    // kHeadRows x V
  ChunkStats chunk_stats_;
  int64_t chunk_ = 0;
};

}  // namespace strata
