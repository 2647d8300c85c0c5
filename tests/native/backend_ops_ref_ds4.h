// Plain references for DeepSeek V4's backend ops (backend.h documents each), in double precision;
// test_backend_ops_ds4.cpp checks every backend against them.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

namespace strata::ref {

inline double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// out[i, c] = (sum_j x[s, j, c] grs[s, j]) w[c]; scale = the sum of the terms' magnitudes.
inline void apply_norm_hc(const std::vector<float>& x, const std::vector<float>& grs,
                          const std::vector<float>& w, int64_t D, int64_t HC, const int32_t* rows,
                          int64_t div, int64_t n, std::vector<double>& out, std::vector<double>& scale) {
  out.assign(n * D, 0);
  scale.assign(n * D, 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = rows ? rows[i] / div : i;
    for (int64_t c = 0; c < D; ++c)
      for (int64_t j = 0; j < HC; ++j) {
        const double v = (double)x[(s * HC + j) * D + c] * grs[s * HC + j] * w[c];
        out[i * D + c] += v;
        scale[i * D + c] += std::fabs(v);
      }
  }
}

// hc_pre of one token: grs (HC), post (HC), comb (HC x HC) as backend.h defines them.
inline void hc_pre(const float* mix, const float* x, int64_t HC, int64_t D, double eps, const float* scale,
                   const float* base, double hc_eps, int64_t iters, bool head, std::vector<double>& grs,
                   std::vector<double>& post, std::vector<double>& comb) {
  double ss = 0;
  for (int64_t i = 0; i < HC * D; ++i) ss += (double)x[i] * x[i];
  const double r = 1.0 / std::sqrt(ss / (HC * D) + eps);
  grs.assign(HC, 0);
  for (int64_t j = 0; j < HC; ++j) grs[j] = sigmoid(mix[j] * r * scale[0] + base[j]) + hc_eps;
  post.assign(HC, 0);
  comb.assign(HC * HC, 0);
  if (!head) {
    for (int64_t j = 0; j < HC; ++j) post[j] = 2 * sigmoid(mix[HC + j] * r * scale[1] + base[HC + j]);
    for (int64_t j = 0; j < HC; ++j) {
      double mx = -INFINITY, sum = 0;
      for (int64_t k = 0; k < HC; ++k) {
        comb[j * HC + k] = mix[2 * HC + j * HC + k] * r * scale[2] + base[2 * HC + j * HC + k];
        mx = std::max(mx, comb[j * HC + k]);
      }
      for (int64_t k = 0; k < HC; ++k) sum += (comb[j * HC + k] = std::exp(comb[j * HC + k] - mx));
      for (int64_t k = 0; k < HC; ++k) comb[j * HC + k] = comb[j * HC + k] / sum + hc_eps;
    }
    auto cols = [&] {
      for (int64_t k = 0; k < HC; ++k) {
        double s = 0;
        for (int64_t j = 0; j < HC; ++j) s += comb[j * HC + k];
        for (int64_t j = 0; j < HC; ++j) comb[j * HC + k] /= s + hc_eps;
      }
    };
    auto rows = [&] {
      for (int64_t j = 0; j < HC; ++j) {
        double s = 0;
        for (int64_t k = 0; k < HC; ++k) s += comb[j * HC + k];
        for (int64_t k = 0; k < HC; ++k) comb[j * HC + k] /= s + hc_eps;
      }
    };
    cols();
    for (int64_t i = 1; i < iters; ++i) {
      rows();
      cols();
    }
  }
  double cs = 0;
  for (int64_t d = 0; d < D; ++d) {
    double v = 0;
    for (int64_t j = 0; j < HC; ++j) v += grs[j] * x[j * D + d];
    cs += v * v;
  }
  const double rr = 1.0 / std::sqrt(cs / D + eps);
  for (auto& g : grs) g *= rr;
}

// The softmax-pooled row of window w (backend.h's compress_pool), from all positions' rows.
inline std::vector<double> compress_window(const std::vector<float>& kv, const std::vector<float>& score,
                                           const std::vector<float>& ape, int64_t w, int64_t ratio,
                                           int64_t lanes, int64_t hd) {
  const int64_t width = lanes * hd;
  std::vector<double> out(hd);
  for (int64_t d = 0; d < hd; ++d) {
    std::vector<std::pair<double, double>> sl;  // (logit, value)
    if (lanes == 2 && w > 0)
      for (int64_t i = 0; i < ratio; ++i) {
        const int64_t q = (w - 1) * ratio + i;
        sl.push_back({(double)score[q * width + d] + ape[i * width + d], kv[q * width + d]});
      }
    const int64_t col = lanes == 2 ? hd : 0;
    for (int64_t i = 0; i < ratio; ++i) {
      const int64_t q = w * ratio + i;
      sl.push_back({(double)score[q * width + col + d] + ape[i * width + col + d], kv[q * width + col + d]});
    }
    double mx = -INFINITY, sum = 0, acc = 0;
    for (auto& [l, v] : sl) mx = std::max(mx, l);
    for (auto& [l, v] : sl) {
      const double p = std::exp(l - mx);
      sum += p;
      acc += p * v;
    }
    out[d] = acc / sum;
  }
  return out;
}

// One query head over the listed key rows with the sink (backend.h's attention_sink).
inline std::vector<double> attend_sink(const float* q, const std::vector<const float*>& keys, double sink,
                                       int64_t hd, double scale) {
  std::vector<double> lg(keys.size());
  double m = sink;
  for (size_t k = 0; k < keys.size(); ++k) {
    double s = 0;
    for (int64_t d = 0; d < hd; ++d) s += (double)q[d] * keys[k][d];
    m = std::max(m, lg[k] = s * scale);
  }
  double den = std::exp(sink - m);
  for (auto& l : lg) den += (l = std::exp(l - m));
  std::vector<double> out(hd, 0);
  for (size_t k = 0; k < keys.size(); ++k)
    for (int64_t d = 0; d < hd; ++d) out[d] += lg[k] / den * keys[k][d];
  return out;
}

}  // namespace strata::ref
