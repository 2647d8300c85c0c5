// Plain scalar references for the Backend ops, each the obvious loop from its doc comment in
// backend/backend.h, in double precision; test_backend_ops.cpp checks every backend against them.
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "core/half.h"
#include "quant/iq2xs_grid.h"
#include "quant/iq2xxs_grid.h"
#include "quant/quant.h"

namespace strata::ref {

// A value and the sum of the magnitudes of the terms that made it: the scale of its rounding error.
struct Val {
  double v = 0, mag = 0;
};

// n rows of D elements of type t, row_bytes apart, dequantized (bit-identical to gguf's numpy).
inline std::vector<float> dequant_rows(QType t, const uint8_t* src, size_t row_bytes, int64_t D, int64_t n) {
  std::vector<float> out(n * D);
  for (int64_t i = 0; i < n; ++i) dequantize(t, src + i * row_bytes, out.data() + i * D, D);
  return out;
}

// grs[t] = 1 / sqrt(mean(x[t]^2) + eps).
inline std::vector<double> rms_scale(const std::vector<float>& x, int64_t T, int64_t D, float eps) {
  std::vector<double> grs(T);
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) ss += (double)x[t * D + i] * x[t * D + i];
    grs[t] = 1.0 / std::sqrt(ss / D + eps);
  }
  return grs;
}

// The source row of output row i: rows ? rows[i] / div : i.
inline int64_t src_row(const int32_t* rows, int64_t div, int64_t i) { return rows ? rows[i] / div : i; }

// The q8_0 rule of the docs: d = max|x| / 127, q = round(x / d), d stored as fp16 (34-byte blocks).
inline void quantize_q8_0(const float* x, uint8_t* out, int64_t D) {
  for (int64_t b = 0; b < D / 32; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const float d = amax / 127.f;
    const uint16_t dh = f32_to_fp16(d);
    std::memcpy(out + b * 34, &dh, 2);
    for (int i = 0; i < 32; ++i)
      out[b * 34 + 2 + i] = (uint8_t)(int8_t)(d == 0 ? 0 : std::lround((double)x[b * 32 + i] / d));
  }
}

// ---- the integer weights of matmul_q8, block of 32 by block of 32, as quant/quant.h documents ----

// ggml's get_scale_min_k4: sub-block j's 6-bit scale and min of a Q4_K super-block.
inline void q4k_scale_min(int j, const uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_f32(h);
}

// One weight row's 32-element block b, written as coef[0] * sum(wq[i] * x[i]) over i < 16 plus
// coef[1] * (the same over i >= 16) plus coef[2] * sum(x[i]) over i < 16 plus coef[3] * (the same
// over i >= 16), with wq integers.
struct IntBlock {
  int wq[32];
  double coef[4];
};

inline IntBlock int_block(QType t, const uint8_t* row, int64_t b) {
  IntBlock r{};
  if (t == QType::Q8_0) {
    const uint8_t* blk = row + b * 34;
    for (int i = 0; i < 32; ++i) r.wq[i] = (int8_t)blk[2 + i];
    r.coef[0] = r.coef[1] = half_at(blk);
    return r;
  }
  const int64_t sb = b / 8, j = b % 8;  // super-block of 256, and its 32-block
  if (t == QType::Q4_K) {
    const uint8_t* blk = row + sb * 144;
    int sc, m;
    q4k_scale_min((int)j, blk + 4, sc, m);
    for (int i = 0; i < 32; ++i) r.wq[i] = (blk[16 + (j / 2) * 32 + i] >> (4 * (j % 2))) & 0xF;
    r.coef[0] = r.coef[1] = (double)half_at(blk) * sc;
    r.coef[2] = r.coef[3] = -(double)half_at(blk + 2) * m;
  } else if (t == QType::Q6_K) {
    const uint8_t* blk = row + sb * 210;
    const int64_t h = j / 4, k = j % 4;  // half of 128, group of 32 in it
    const uint8_t* ql = blk + h * 64 + (k % 2) * 32;
    const uint8_t* qh = blk + 128 + h * 32;
    for (int i = 0; i < 32; ++i)
      r.wq[i] = (((ql[i] >> (4 * (k / 2))) & 0xF) | (((qh[i] >> (2 * k)) & 3) << 4)) - 32;
    const int8_t* scales = reinterpret_cast<const int8_t*>(blk + 192);
    r.coef[0] = (double)half_at(blk + 208) * scales[h * 8 + k * 2];
    r.coef[1] = (double)half_at(blk + 208) * scales[h * 8 + k * 2 + 1];
  } else if (t == QType::IQ2_XS) {
    const uint8_t* blk = row + sb * 74;
    for (int g = 0; g < 4; ++g) {  // four groups of 8: a 9-bit grid index and a 7-bit sign index each
      uint16_t q;
      std::memcpy(&q, blk + 2 + (j * 4 + g) * 2, 2);
      const unsigned s7 = q >> 9, signs = s7 | ((std::popcount(s7) & 1u) << 7);  // even count of minuses
      for (int i = 0; i < 8; ++i)
        r.wq[g * 8 + i] = (int)((kIq2xsGrid[q & 511] >> (8 * i)) & 0xFF) * ((signs >> i) & 1 ? -1 : 1);
    }
    const uint8_t s = blk[66 + j];
    r.coef[0] = half_at(blk) * 0.125 * (2 * (s & 0xF) + 1);
    r.coef[1] = half_at(blk) * 0.125 * (2 * (s >> 4) + 1);
  } else if (t == QType::Q2_K) {  // scales[16], qs[64], d, dmin
    const uint8_t* blk = row + sb * 84;
    for (int i = 0; i < 32; ++i) r.wq[i] = (blk[16 + (j / 4) * 32 + i] >> (2 * (j % 4))) & 3;
    for (int h = 0; h < 2; ++h) {
      const uint8_t sm = blk[2 * j + h];
      r.coef[h] = (double)half_at(blk + 80) * (sm & 0xF);
      r.coef[2 + h] = -(double)half_at(blk + 82) * (sm >> 4);
    }
  } else if (t == QType::IQ2_XXS) {  // d, then per 32-block a grid word and a sign/scale word
    const uint8_t* blk = row + sb * 66 + 2 + j * 8;
    uint32_t gw, sw;
    std::memcpy(&gw, blk, 4);
    std::memcpy(&sw, blk + 4, 4);
    for (int g = 0; g < 4; ++g) {
      const unsigned s7 = (sw >> (7 * g)) & 127, signs = s7 | ((std::popcount(s7) & 1u) << 7);
      for (int i = 0; i < 8; ++i)
        r.wq[g * 8 + i] =
            (int)((kIq2xxsGrid[(gw >> (8 * g)) & 0xFF] >> (8 * i)) & 0xFF) * ((signs >> i) & 1 ? -1 : 1);
    }
    r.coef[0] = r.coef[1] = half_at(row + sb * 66) * 0.125 * (2 * (sw >> 28) + 1);
  }
  return r;
}

// W[r, :] . Xq[t, :] with q8_0 activations, from the integer sums.
inline Val dot_q8(QType t, const uint8_t* wrow, const uint8_t* xrow, int64_t cols) {
  Val out;
  if (t != QType::Q8_0 && t != QType::Q4_K && t != QType::Q6_K && t != QType::IQ2_XS && t != QType::Q2_K &&
      t != QType::IQ2_XXS) {
    // The types with no hand-written block above: the weights as dequantize gives them (bit-identical
    // to gguf.quants.dequantize, tests/python/test_quant.py), times the q8_0 activations, in double.
    std::vector<float> w(cols);
    dequantize(t, wrow, w.data(), cols);
    for (int64_t b = 0; b < cols / 32; ++b) {
      const double dx = half_at(xrow + b * 34);
      const int8_t* xq = reinterpret_cast<const int8_t*>(xrow + b * 34 + 2);
      for (int i = 0; i < 32; ++i) {
        const double p = (double)w[b * 32 + i] * dx * xq[i];
        out.v += p;
        out.mag += std::fabs(p);
      }
    }
    return out;
  }
  for (int64_t b = 0; b < cols / 32; ++b) {
    const IntBlock w = int_block(t, wrow, b);
    const double dx = half_at(xrow + b * 34);
    const int8_t* xq = reinterpret_cast<const int8_t*>(xrow + b * 34 + 2);
    int64_t s[4] = {0, 0, 0, 0};
    for (int i = 0; i < 32; ++i) {
      s[i / 16] += w.wq[i] * xq[i];
      s[2 + i / 16] += xq[i];
    }
    for (int c = 0; c < 4; ++c) {
      out.v += w.coef[c] * dx * s[c];
      out.mag += std::fabs(w.coef[c] * dx * s[c]);
    }
  }
  return out;
}

inline Val dot(const float* a, const float* b, int64_t n) {
  Val out;
  for (int64_t i = 0; i < n; ++i) {
    out.v += (double)a[i] * b[i];
    out.mag += std::fabs((double)a[i] * b[i]);
  }
  return out;
}

// In place per head: rmsnorm times w (if w), then NEOX rotation of pairs (i, i + n_dims/2) at pos0 + t.
inline std::vector<double> head_norm_rope(const std::vector<float>& x, int64_t T, int64_t H, int64_t hd,
                                          const float* w, float eps, int64_t pos0, const RopeParams& rope) {
  std::vector<double> y(x.begin(), x.end());
  const int64_t half = rope.n_dims / 2;
  for (int64_t th = 0; th < T * H; ++th) {
    double* h = y.data() + th * hd;
    if (w) {
      double ss = 0;
      for (int64_t i = 0; i < hd; ++i) ss += h[i] * h[i];
      const double g = 1.0 / std::sqrt(ss / hd + eps);
      for (int64_t i = 0; i < hd; ++i) h[i] = h[i] * g * w[i];
    }
    const double pos = (double)(pos0 + th / H);
    for (int64_t i = 0; i < half; ++i) {
      const double theta = pos * std::pow((double)rope.freq_base, -2.0 * i / rope.n_dims);
      const double x0 = h[i], x1 = h[i + half];
      h[i] = x0 * std::cos(theta) - x1 * std::sin(theta);
      h[i + half] = x1 * std::cos(theta) + x0 * std::sin(theta);
    }
  }
  return y;
}

// Naive causal GQA attention: query head h of token t reads kv head h / (H / KV), keys [0, pos0 + t].
inline std::vector<double> attention(const std::vector<float>& q, const std::vector<float>& kc,
                                     const std::vector<float>& vc, int64_t T, int64_t pos0, int64_t H,
                                     int64_t KV, int64_t hd, float scale) {
  std::vector<double> out(T * H * hd, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kvh = h / (H / KV), n = pos0 + t + 1;
      std::vector<double> s(n);
      for (int64_t j = 0; j < n; ++j)
        s[j] = dot(&q[(t * H + h) * hd], &kc[(j * KV + kvh) * hd], hd).v * scale;
      const double mx = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double& v : s) sum += (v = std::exp(v - mx));
      for (int64_t j = 0; j < n; ++j)
        for (int64_t i = 0; i < hd; ++i)
          out[(t * H + h) * hd + i] += s[j] / sum * vc[(j * KV + kvh) * hd + i];
    }
  return out;
}

// Softmax over E logits, the K largest (ties to the lower id), weights renormalized over them if norm.
inline void router_topk(const std::vector<float>& logits, int64_t T, int64_t E, int64_t K, bool norm,
                        std::vector<int32_t>* ids, std::vector<double>* weights) {
  ids->assign(T * K, 0);
  weights->assign(T * K, 0);
  for (int64_t t = 0; t < T; ++t) {
    const float* lg = &logits[t * E];
    const double mx = *std::max_element(lg, lg + E);
    std::vector<double> p(E);
    double sum = 0, top = 0;
    for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(lg[e] - mx));
    std::vector<int32_t> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
    for (int64_t k = 0; k < K; ++k) top += p[order[k]];
    for (int64_t k = 0; k < K; ++k) {
      (*ids)[t * K + k] = order[k];
      (*weights)[t * K + k] = p[order[k]] / (norm ? top : sum);
    }
  }
}

// off[e] = pairs routed to experts below e; rows = the pairs t * K + k ordered by (expert, t).
inline void group_by_expert(const std::vector<int32_t>& ids, int64_t T, int64_t K, int64_t E,
                            std::vector<int32_t>* off, std::vector<int32_t>* rows) {
  off->assign(E + 1, 0);
  rows->clear();
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < K; ++k)
        if (ids[t * K + k] == e) rows->push_back((int32_t)(t * K + k));
    (*off)[e + 1] = (int32_t)rows->size();
  }
}

}  // namespace strata::ref
