// A decode step's CPU share of the routed experts (ModelConfig::cpu_experts): a missed expert computed on
// the host from its source bytes, beside the link that brings the step's other misses, with the bits the
// backend's q8_0 expert products give (the MMQ layout): matmul_q8 of the gate and up matrices against the
// token's q8_0 row, swiglu_portable, the CPU's q8_0 quantization of the result, matmul_q8 of the down matrix.
// The op harness holds every backend's matmul_q8, activation and quantization to these bits, so the logits
// do not depend on which side computed an expert.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "expert_cache/expert_source.h"

namespace strata {

class HostExperts {
 public:
  explicit HostExperts(int threads) : pool_(threads) {}

  // Whether a layer's experts can be computed here: every matrix of a type with an integer kernel
  // (uses_matmul_q8), gate and up F x D, down D x F, whole q8_0 blocks. Else the reason, for the error.
  static const char* unsupported(const ExpertLayerLayout& lay);

  // y[0..D) = expert e of `layer`'s output for the token whose q8_0 row (D / 32 blocks) is xq, its matrices
  // read from `src`.
  void run(const ExpertLayerLayout& lay, const ExpertSource& src, int64_t layer, int64_t e, const uint8_t* xq,
           float* y);

  int threads() const { return pool_.size(); }
  // Room for n output rows of D floats, the rows a step's uploads read until they run: it grows, never
  // shrinks, and the caller writes it only once the uploads from the last use have completed.
  float* rows(int64_t n, int64_t D) {
    if (out_.size() < static_cast<size_t>(n * D)) out_.resize(static_cast<size_t>(n * D));
    return out_.data();
  }

 private:
  ThreadPool pool_;
  std::vector<float> g_, u_, out_;
  std::vector<uint8_t> hq_;
};

}  // namespace strata
