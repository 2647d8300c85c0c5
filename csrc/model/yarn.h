// Rotary inverse frequencies with YaRN, as transformers computes them (`_compute_yarn_parameters`) and
// ggml's rope applies them: gpt-oss's (the correction range not rounded) and deepseek2's (rounded out to
// whole dims) share it.
#pragma once
#include <cstdint>
#include <vector>

namespace strata {

struct Yarn {
  double factor = 0;  // <= 1: no scaling, the plain frequencies
  int64_t orig_ctx = 0;
  double beta_fast = 32, beta_slow = 1;
  bool truncate = false;  // floor / ceil the correction range (transformers' default, ggml's always)
};

// The inverse frequencies of the n_dims / 2 pairs at `base`, YaRN folded in.
std::vector<float> yarn_inv_freq(int64_t n_dims, double base, const Yarn& y);

}  // namespace strata
