// Gemma4Ops: gemma4's ops beyond the shared Backend surface (per-head RMSNorm with or without a
// weight, NEOX RoPE from a table of inverse frequencies (proportional RoPE: zeros past the rotated
// fraction), causal attention over a sliding window at a given scale, the GELU-tanh GLU, a scale by a
// device scalar and the router's per-expert scale). A backend that runs gemma4 implements this beside
// Backend (the CPU's in backend/cpu/gemma4_ops.cpp); gemma4's forward pass finds it with gemma4_ops(),
// and a gemma4 load on a backend without it is refused before anything is allocated (kGemma4's
// check_backend). As Backend's ops: every pointer is device memory of that backend, every op runs on
// its compute stream.
#pragma once
#include <cstdint>

#include "backend/backend.h"

namespace strata {

class Gemma4Ops {
 public:
  virtual ~Gemma4Ops() = default;

  // In place per head of hd (T x n_heads x hd): x = x / sqrt(mean(x^2) + eps), times w[i] when w is set.
  virtual void head_norm(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* w, float eps) = 0;
  // NEOX RoPE: in each head of hd (T x n_heads x hd), the pair (i, i + hd / 2) rotates by the angle
  // (float)(pos0 + t) * inv_freq[i] (an inverse frequency of 0 leaves the pair as it is). With `pos`
  // (host memory, T entries) row t is at pos[t] instead. With the backend's position source set (a recorded
  // decode step; pos null) the device's int32 is added to pos0.
  virtual void rope_freqs(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* inv_freq,
                          int64_t pos0, const int64_t* pos) = 0;
  // Causal GQA attention of T queries q (T x H x hd) at positions p = pos0 + t against the cached keys and
  // values kc/vc ([ctx, KV, hd] of type t) at positions max(0, p - window + 1) .. p (window 0: from 0):
  // softmax(q . k * scale) v.
  virtual void attention_window(const float* q, const void* kc, const void* vc, KvType t, int64_t T,
                                int64_t pos0, int64_t H, int64_t KV, int64_t hd, float scale, int64_t window,
                                float* out) = 0;
  // g[i] = gelu_tanh(g[i]) * u[i] for i < n, gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715
  // x^3))).
  virtual void geglu(float* g, const float* u, int64_t n) = 0;
  // x[i] *= s[0] for i < n (s: one float of device memory).
  virtual void scale(float* x, int64_t n, const float* s) = 0;
  // x[i] = tanh(x[i] / cap) * cap for i < n, in float (the final logit softcap).
  virtual void softcap(float* x, int64_t n, float cap) = 0;
  // w[i] *= scale[ids[i]] for i < n (the router's per-expert scale on its top-K weights).
  virtual void expert_scale(float* w, const int32_t* ids, const float* scale, int64_t n) = 0;
};

// The gemma4 ops of `be`, or null when the backend has none.
inline Gemma4Ops* gemma4_ops(Backend& be) { return dynamic_cast<Gemma4Ops*>(&be); }

}  // namespace strata
