// Plain references for qwen35moe's backend ops (backend/qwen35_ops.h documents each), in double
// precision; test_backend_ops_qwen35.cpp checks every backend that has the ops against them.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

namespace strata::ref {

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The depthwise causal conv1d then SiLU of T rows of C after the Kc - 1 state rows (empty: zeros);
// returns y (T x C) and, in *state, the last Kc - 1 rows of the concatenation.
inline std::vector<double> conv1d_silu(const std::vector<float>& x, int64_t T, int64_t C, int64_t Kc,
                                       const std::vector<float>& w, const std::vector<float>& state,
                                       std::vector<double>* state_out) {
  const int64_t S = Kc - 1;
  std::vector<double> xx((S + T) * C, 0.0);
  for (size_t i = 0; i < state.size(); ++i) xx[i] = state[i];
  for (int64_t i = 0; i < T * C; ++i) xx[S * C + i] = x[i];
  std::vector<double> y(T * C);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < Kc; ++j) acc += (double)w[c * Kc + j] * xx[(t + j) * C + c];
      y[t * C + c] = acc * sigmoid(acc);
    }
  state_out->assign(xx.begin() + T * C, xx.end());
  return y;
}

// The gated delta rule token by token (transformers' torch_recurrent_gated_delta_rule with its L2
// norms, the decay and beta from the raw projections as Qwen3_5MoeGatedDeltaNet forms them; value head h
// reads key head h % Hk). state ([Hv, dk, dv]; empty: zeros) is advanced in place; returns T x Hv x dv.
inline std::vector<double> gated_delta_rule(const std::vector<float>& qkv, const std::vector<float>& a,
                                            const std::vector<float>& b, int64_t T, int64_t Hk, int64_t Hv,
                                            int64_t dk, int64_t dv, const std::vector<float>& A,
                                            const std::vector<float>& dt_bias, std::vector<double>& state) {
  const int64_t W = 2 * Hk * dk + Hv * dv;
  if (state.empty()) state.assign(Hv * dk * dv, 0.0);
  std::vector<double> out(T * Hv * dv);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < Hv; ++h) {
      const int64_t kh = h % Hk;
      const float* q = &qkv[t * W + kh * dk];
      const float* k = &qkv[t * W + Hk * dk + kh * dk];
      const float* v = &qkv[t * W + 2 * Hk * dk + h * dv];
      double sq = 0, sk = 0;
      for (int64_t i = 0; i < dk; ++i) {
        sq += (double)q[i] * q[i];
        sk += (double)k[i] * k[i];
      }
      std::vector<double> qn(dk), kn(dk);
      for (int64_t i = 0; i < dk; ++i) {
        qn[i] = q[i] / std::sqrt(sq + 1e-6) / std::sqrt((double)dk);
        kn[i] = k[i] / std::sqrt(sk + 1e-6);
      }
      const double x = (double)a[t * Hv + h] + dt_bias[h];
      const double g = (double)A[h] * (x > 20 ? x : std::log1p(std::exp(x)));
      const double beta = sigmoid(b[t * Hv + h]);
      double* S = &state[h * dk * dv];
      for (int64_t i = 0; i < dk * dv; ++i) S[i] *= std::exp(g);
      for (int64_t j = 0; j < dv; ++j) {
        double mem = 0;
        for (int64_t i = 0; i < dk; ++i) mem += S[i * dv + j] * kn[i];
        const double d = (v[j] - mem) * beta;
        for (int64_t i = 0; i < dk; ++i) S[i * dv + j] += kn[i] * d;
      }
      for (int64_t j = 0; j < dv; ++j) {
        double o = 0;
        for (int64_t i = 0; i < dk; ++i) o += S[i * dv + j] * qn[i];
        out[(t * Hv + h) * dv + j] = o;
      }
    }
  return out;
}

}  // namespace strata::ref
