// GptOssOps: gpt-oss's ops beyond the shared Backend surface (bias rows, NEOX RoPE with YaRN
// frequencies, attention with per-head sinks over a sliding window, the experts' biased clamped
// SwiGLU and their down biases). A backend that runs gpt-oss implements this beside Backend (the
// CPU's in backend/cpu/gptoss_ops.cpp, CUDA's in backend/cuda/gptoss.cu); gpt-oss's forward pass finds it
// with gptoss_ops(), and a gpt-oss load on a backend without it is refused before anything is allocated
// (kGptOss's check_backend). As Backend's ops: every pointer is device memory of that backend, every op runs
// on its compute stream.
#pragma once
#include <cstdint>

#include "backend/backend.h"

namespace strata {

class GptOssOps {
 public:
  virtual ~GptOssOps() = default;

  // y[t, i] += bias[i] for t < T, i < n.
  virtual void add_bias(float* y, const float* bias, int64_t T, int64_t n) = 0;
  // NEOX RoPE: in each head of hd (T x n_heads x hd), the pair (i, i + hd / 2) rotates by the angle
  // (float)(pos0 + t) * inv_freq[i], cos and sin times mscale.
  virtual void rope_neox(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* inv_freq,
                         float mscale, int64_t pos0) = 0;
  // Causal GQA attention of T queries q (T x H x hd) at positions p = pos0 + t against the cached keys and
  // values kc/vc ([ctx, KV, hd] of type t) at positions max(0, p - window + 1) .. p (window 0: from 0):
  // the softmax of the scaled dot products with the sink logit sinks[h] in its denominator (and in its
  // max), the sink contributing no value.
  virtual void attention_sinks(const float* q, const void* kc, const void* vc, KvType t, int64_t T,
                               int64_t pos0, int64_t H, int64_t KV, int64_t hd, float scale,
                               const float* sinks, int64_t window, float* out) = 0;
  // The experts' activation of n rows of F: row i belongs to expert e = ids[rows[i]]; with
  // g = g[i] + gate_b[e], u = u[i] + up_b[e] (biases E x F), g[i] = (clamp(u, -limit, limit) + 1) *
  // min(g, limit) * sigmoid(alpha * min(g, limit)).
  virtual void swiglu_oai(float* g, const float* u, const int32_t* ids, const int32_t* rows, int64_t n,
                          int64_t F, const float* gate_b, const float* up_b, float alpha, float limit) = 0;
  // The experts' down biases: y[t, :] += sum over k in order of w[t K + k] * bias[ids[t K + k], :]
  // (bias E x D).
  virtual void expert_bias(float* y, const int32_t* ids, const float* w, const float* bias, int64_t T,
                           int64_t K, int64_t D) = 0;
};

// The gpt-oss ops of `be`, or null when the backend has none.
inline GptOssOps* gptoss_ops(Backend& be) { return dynamic_cast<GptOssOps*>(&be); }

}  // namespace strata
