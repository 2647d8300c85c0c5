// Plain references for gpt-oss's backend ops (backend/gptoss_ops.h documents each), in double
// precision; test_backend_ops_gptoss.cpp checks every backend that has the ops against them.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace strata::ref {

// NEOX RoPE of T x n_heads x hd at positions pos0.., cos and sin times mscale.
inline std::vector<double> rope_neox(const std::vector<float>& x, int64_t T, int64_t n_heads, int64_t hd,
                                     const std::vector<float>& inv_freq, double mscale, int64_t pos0) {
  std::vector<double> out(x.begin(), x.end());
  const int64_t half = hd / 2;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < n_heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const double a = (double)(pos0 + t) * inv_freq[i];
        const double c = std::cos(a) * mscale, s = std::sin(a) * mscale;
        const int64_t o = (t * n_heads + h) * hd;
        out[o + i] = x[o + i] * c - x[o + i + half] * s;
        out[o + i + half] = x[o + i + half] * c + x[o + i] * s;
      }
  return out;
}

// Attention of one query over keys/values (rows of hd at stride `ld`) j0..p with the sink logit in
// the softmax's denominator.
inline std::vector<double> attend_sinks(const float* q, const float* k, const float* v, int64_t ld,
                                        int64_t j0, int64_t p, double sink, int64_t hd, double scale) {
  std::vector<double> s;
  double m = sink;
  for (int64_t j = j0; j <= p; ++j) {
    double d = 0;
    for (int64_t i = 0; i < hd; ++i) d += (double)q[i] * k[j * ld + i];
    s.push_back(d * scale);
    m = std::max(m, s.back());
  }
  double l = std::exp(sink - m);
  std::vector<double> o(hd, 0.0);
  for (int64_t j = j0; j <= p; ++j) {
    const double w = std::exp(s[j - j0] - m);
    l += w;
    for (int64_t i = 0; i < hd; ++i) o[i] += w * v[j * ld + i];
  }
  for (auto& x : o) x /= l;
  return o;
}

// transformers' GptOssExperts._apply_gate of one biased (gate, up) pair.
inline double swiglu_oai(double g, double u, double alpha, double limit) {
  g = std::min(g, limit);
  u = std::clamp(u, -limit, limit);
  return (u + 1) * g / (1 + std::exp(-alpha * g));
}

}  // namespace strata::ref
