// Qwen35Ops: qwen35moe's ops beyond the shared Backend surface (the gated DeltaNet's short causal
// conv1d, its gated delta rule and gated RMSNorm; the full-attention layers' output gate; the shared
// expert's sigmoid gate). A backend that runs qwen35moe implements this beside Backend (the CPU's
// does, in backend/cpu/qwen35_ops.cpp); the forward pass finds it with qwen35_ops(), and a qwen35moe
// load on a backend without it is refused before anything is allocated (kQwen35Moe's check_backend).
// As Backend's ops: every pointer is device memory of that backend, every op runs on its compute
// stream, and each output element is computed the same way whatever T is.
#pragma once
#include <cstdint>

#include "backend/backend.h"

namespace strata {

class Qwen35Ops {
 public:
  virtual ~Qwen35Ops() = default;

  // The depthwise causal conv1d of Kc taps over T rows x (T x C), then SiLU: with xx the Kc - 1 rows
  // of state_in (oldest first; null: zeros) followed by x, y[t, c] = silu(sum over j < Kc of
  // w[c * Kc + j] * xx[t + j, c]), summed in j order. state_out (Kc - 1 rows of C) = the last Kc - 1
  // rows of xx. state_out overlaps neither x nor state_in.
  virtual void conv1d_silu(const float* x, int64_t T, int64_t C, int64_t Kc, const float* w,
                           const float* state_in, float* state_out, float* y) = 0;
  // The gated delta rule of T tokens at positions pos0.. in its chunked form. Per token p and value
  // head h (reading key head h % Hk): q and k of qkv (T rows of 2 Hk dk + Hv dv: q of Hk heads, k of
  // Hk heads, v of Hv heads) L2-normalized (x / sqrt(sum x^2 + 1e-6)), q times 1 / sqrt(dk);
  // g_p = A[h] * softplus(a[p, h] + dt_bias[h]) (softplus linear above 20), beta_p = sigmoid(b[p, h])
  // (a, b: T x Hv). Positions fall in chunks of C anchored at multiples of C; with a the start of p's
  // chunk, S_a its starting state ([dk, dv] per head), and the log decays summed back from p,
  // gam_p - gam_m = g_p + g_{p-1} + ... + g_{m+1} (in that order; gam_p: the same sum down to g_a):
  //   d_p   = beta_p (v_p - exp(gam_p) S_a^T k_p - sum over a <= m < p of exp(gam_p - gam_m) (k_p.k_m) d_m)
  //   out_p = exp(gam_p) S_a^T q_p + sum over a <= m <= p of exp(gam_p - gam_m) (q_p.k_m) d_m
  //   at p = a + C - 1: S_{a+C} = exp(gam_p) S_a + sum over a <= m <= p of exp(gam_p - gam_m) k_m d_m^T
  // which is the recurrent form (S = exp(g) S; d = (v - S^T k) beta; S += k d^T; out = S^T q) in
  // exact arithmetic. The sums over m run in ascending m, those of g as written: a position's output
  // and the states do not depend on how the positions are split into passes. out: T x Hv x dv.
  // rows_k (C x Hv x dk, the normalized keys), rows_d (C x Hv x dv) and rows_g (C x Hv, the log decays
  // g): slot p % C holds position p's; the slots of [a of pos0, pos0) are read, those of the pass's positions
  // written. s_cur holds S_a of pos0's chunk ([Hv, dk, dv]; `fresh`: set to zeros first); each chunk end the
  // pass reaches writes the next state into the other of (s_cur, s_other) and the two swap roles: after
  // n chunk ends the current state is in s_other when n is odd, else in s_cur.
  virtual void gated_delta_chunked(const float* qkv, const float* a, const float* b, int64_t T, int64_t pos0,
                                   int64_t C, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, const float* A,
                                   const float* dt_bias, bool fresh, float* s_cur, float* s_other,
                                   float* rows_k, float* rows_d, float* rows_g, float* out) = 0;
  // One token at position p = pos0 plus the backend's position source (Backend::set_position_source; the
  // CPU has none), its state copies chosen by p as qwen35moe keeps them: conv1d_silu of the token with
  // state_in conv[p % 2] (none at p = 0) and state_out conv[(p + 1) % 2]; gated_delta_chunked of the token
  // at p with s_cur state[(p / C) % 2] (zeros first at p = 0) and s_other the other. A recorded decode step
  // replays them at each step's position.
  virtual void conv1d_silu_at(const float* x, int64_t C, int64_t Kc, const float* w, float* conv0,
                              float* conv1, int64_t pos0, float* y) = 0;
  virtual void gated_delta_at(const float* qkv, const float* a, const float* b, int64_t pos0, int64_t C,
                              int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, const float* A,
                              const float* dt_bias, float* state0, float* state1, float* rows_k,
                              float* rows_d, float* rows_g, float* out) = 0;
  // In place over `rows` rows of n: x = x / sqrt(mean(x^2) + eps) * w * silu(z) (z: rows x n).
  virtual void gated_rms_norm(float* x, const float* z, const float* w, int64_t rows, int64_t n,
                              float eps) = 0;
  // The full-attention q projection's heads of [query (hd) | gate (hd)] (T x H x 2 hd) split into
  // q (T x H x hd) and gate (T x H x hd).
  virtual void split_q_gate(const float* qg, int64_t T, int64_t H, int64_t hd, float* q, float* gate) = 0;
  // x[i] *= sigmoid(g[i]) for i < n.
  virtual void sigmoid_mul(float* x, const float* g, int64_t n) = 0;
  // y[t, :] += sigmoid(s[t]) * x[t, :] for t < T (rows of D): the shared expert joining the routed ones.
  virtual void add_sigmoid_scaled(float* y, const float* x, const float* s, int64_t T, int64_t D) = 0;
};

// The qwen35moe ops of `be`, or null when the backend has none.
inline Qwen35Ops* qwen35_ops(Backend& be) { return dynamic_cast<Qwen35Ops*>(&be); }

}  // namespace strata
