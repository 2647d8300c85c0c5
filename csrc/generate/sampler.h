// Sampler: repetition penalty, top-k, top-p, min-p, temperature and a seeded draw (greedy at temperature 0).
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace strata {

struct SamplerParams {
  float temperature = 0.8f;         // >= 0; 0: greedy
  int32_t top_k = 40;               // >= 0; 0: off
  float top_p = 0.95f;              // (0, 1]; 1: off
  float min_p = 0.05f;              // [0, 1]; 0: off
  float repetition_penalty = 1.0f;  // > 0; 1: off
  int32_t penalty_last_n = 64;      // >= -1: the last N tokens the penalty sees; -1: all, 0: none
  uint64_t seed = 0;
};

// ConfigError naming the parameter (and its CLI flag) of the first value out of range.
void check_sampler_params(const SamplerParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplerParams& p);
  // Picks the next token from V logits, given the tokens so far (for the penalty).
  int32_t sample(const float* logits, int64_t V, const std::vector<int32_t>& history);

 private:
  SamplerParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<float> work_;
};

}  // namespace strata
