// Deepseek2Ops: the ops of `deepseek2` (DeepSeek V2/V3/R1, Kimi-K2, GLM-4.7-Flash) beyond the shared
// Backend surface: the RMSNorm of the low-rank latents (rows inside wider rows), the interleaved-pair
// RoPE of the rope part of each head (llama.cpp's NORM mode) written where the absorbed query wants it,
// and the grouped router (sigmoid or softmax gating, a selection bias, group-limited top-k, normalized
// and scaled weights). The latent attention itself is the shared Backend::attention over one KV head
// that is both key and value. A backend that runs deepseek2 implements this beside Backend (the CPU's in
// backend/cpu/deepseek2_ops.cpp); the forward pass finds it with deepseek2_ops(), and a load on a backend
// without it is refused before anything is allocated (kDeepseek2's check_backend). As Backend's ops:
// every pointer is device memory of that backend, every op runs on its compute stream.
#pragma once
#include <cstdint>

#include "backend/backend.h"

namespace strata {

class Deepseek2Ops {
 public:
  virtual ~Deepseek2Ops() = default;

  // In place for r < rows: the first D floats of row r (rows `stride` floats apart) become
  // x / sqrt(mean(x^2) + eps) * w.
  virtual void rms_norm_rows(float* x, int64_t rows, int64_t D, int64_t stride, const float* w,
                             float eps) = 0;
  // RoPE over interleaved pairs: for t < T, h < n_heads, i < n_pairs, the pair (2i, 2i + 1) at
  // x + t * x_row + h * x_head rotates by the angle (float)(pos0 + t) * inv_freq[i] and lands at the same
  // place of y (y_row, y_head); y may be x. With the backend's position source set (a recorded decode
  // step), the device's int32 is added to pos0.
  virtual void rope_pairs(const float* x, int64_t x_row, int64_t x_head, float* y, int64_t y_row,
                          int64_t y_head, int64_t T, int64_t n_heads, int64_t n_pairs, const float* inv_freq,
                          int64_t pos0) = 0;
  // The grouped router of T rows of E logits: p = sigmoid(logits) (softmax over E when !sigmoid);
  // s = p + bias (bias null: p). With groups > 1 the E experts form `groups` groups of E / groups in
  // order; a group scores the sum of its two highest s, and only the experts of the groups_used groups
  // of highest score (ties to the lower group) stay selectable. ids[t] = the K selectable experts of
  // highest s (ties to the lower id), in that order; weights = p[ids], divided by max(their sum,
  // 2^-14) when norm, times scale.
  virtual void router_grouped(const float* logits, int64_t T, int64_t E, int64_t K, bool sigmoid,
                              const float* bias, int64_t groups, int64_t groups_used, bool norm, float scale,
                              int32_t* ids, float* weights) = 0;
};

// The deepseek2 ops of `be`, or null when the backend has none.
inline Deepseek2Ops* deepseek2_ops(Backend& be) { return dynamic_cast<Deepseek2Ops*>(&be); }

}  // namespace strata
