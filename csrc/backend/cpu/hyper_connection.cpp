// CPU hyper-connections: the GR read over HC streams, the mixing weights (pre, post, Sinkhorn-normalized
// combination) and the residual update. Each token's values are computed the same way whatever T is.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/ds4_ops.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/quantize.h"

namespace strata {

namespace {

// out[c] = (sum over j in order of x[j * D + c] * g[j]) * w[c]
inline void collapse_row(const float* x, const float* g, const float* w, int64_t D, int64_t HC, float* out) {
  for (int64_t c = 0; c < D; ++c) {
    float acc = x[c] * g[0];
    for (int64_t j = 1; j < HC; ++j) acc = acc + x[j * D + c] * g[j];
    out[c] = acc * w[c];
  }
}

inline float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

}  // namespace

void cpu_apply_norm_hc(const float* x, const float* grs, const float* w, int64_t D, int64_t HC,
                       const int32_t* rows, int64_t div, int64_t n, float* out, ThreadPool& pool) {
  pool.parallel_for(n, 16, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t s = rows ? rows[i] / div : i;
      collapse_row(x + s * HC * D, grs + s * HC, w, D, HC, out + i * D);
    }
  });
}

void cpu_quantize_q8_0_hc(const float* x, const float* grs, const float* w, int64_t D, int64_t HC,
                          const int32_t* rows, int64_t div, int64_t n, uint8_t* out, size_t out_row_bytes,
                          ThreadPool& pool) {
  pool.parallel_for(n, 4, [&](int64_t b, int64_t e, int) {
    std::vector<float> tmp(D);
    for (int64_t i = b; i < e; ++i) {
      const int64_t s = rows ? rows[i] / div : i;
      collapse_row(x + s * HC * D, grs + s * HC, w, D, HC, tmp.data());
      quantize_row_q8_0(tmp.data(), out + i * out_row_bytes, D);
    }
  });
}

void cpu_hc_pre(const float* mix, const float* x, int64_t T, int64_t HC, int64_t D, float eps,
                const float* scale, const float* base, float hc_eps, int64_t iters, float* grs, float* post,
                float* comb, ThreadPool& pool) {
  const int64_t M = comb ? (2 + HC) * HC : HC;
  pool.parallel_for(T, 4, [&](int64_t b, int64_t e, int) {
    std::vector<float> c(HC * HC);
    for (int64_t t = b; t < e; ++t) {
      const float* xt = x + t * HC * D;
      const float* mt = mix + t * M;
      float ss = 0.f;
      for (int64_t i = 0; i < HC * D; ++i) ss += xt[i] * xt[i];
      const float r = 1.0f / std::sqrt(ss / (float)(HC * D) + eps);
      float* g = grs + t * HC;
      for (int64_t j = 0; j < HC; ++j) g[j] = sigmoid(mt[j] * r * scale[0] + base[j]) + hc_eps;
      if (post) {
        for (int64_t j = 0; j < HC; ++j)
          post[t * HC + j] = 2.0f * sigmoid(mt[HC + j] * r * scale[1] + base[HC + j]);
      }
      if (comb) {
        for (int64_t j = 0; j < HC; ++j) {
          float* row = c.data() + j * HC;
          float mx = -INFINITY;
          for (int64_t k = 0; k < HC; ++k) {
            row[k] = mt[2 * HC + j * HC + k] * r * scale[2] + base[2 * HC + j * HC + k];
            mx = std::max(mx, row[k]);
          }
          float sum = 0.f;
          for (int64_t k = 0; k < HC; ++k) sum += (row[k] = std::exp(row[k] - mx));
          for (int64_t k = 0; k < HC; ++k) row[k] = row[k] / sum + hc_eps;
        }
        auto norm_cols = [&] {
          for (int64_t k = 0; k < HC; ++k) {
            float s = 0.f;
            for (int64_t j = 0; j < HC; ++j) s += c[j * HC + k];
            for (int64_t j = 0; j < HC; ++j) c[j * HC + k] /= (s + hc_eps);
          }
        };
        auto norm_rows = [&] {
          for (int64_t j = 0; j < HC; ++j) {
            float s = 0.f;
            for (int64_t k = 0; k < HC; ++k) s += c[j * HC + k];
            for (int64_t k = 0; k < HC; ++k) c[j * HC + k] /= (s + hc_eps);
          }
        };
        norm_cols();
        for (int64_t it = 1; it < iters; ++it) {
          norm_rows();
          norm_cols();
        }
        std::memcpy(comb + t * HC * HC, c.data(), HC * HC * sizeof(float));
      }
      // The RMS scale of the collapsed input, folded into the collapse weights.
      float cs = 0.f;
      for (int64_t d = 0; d < D; ++d) {
        float v = xt[d] * g[0];
        for (int64_t j = 1; j < HC; ++j) v = v + xt[j * D + d] * g[j];
        cs += v * v;
      }
      const float rr = 1.0f / std::sqrt(cs / (float)D + eps);
      for (int64_t j = 0; j < HC; ++j) g[j] *= rr;
    }
  });
}

void cpu_hc_post(float* x, const float* y, const float* post, const float* comb, int64_t T, int64_t HC,
                 int64_t D, ThreadPool& pool) {
  STRATA_CHECK(HC <= 16, UnsupportedError, "hc_post: at most 16 streams, got ", HC);
  pool.parallel_for(T, 1, [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; ++t) {
      float* xt = x + t * HC * D;
      const float* yt = y + t * D;
      const float* p = post + t * HC;
      const float* cm = comb + t * HC * HC;
      for (int64_t d = 0; d < D; ++d) {
        float old[16];
        for (int64_t j = 0; j < HC; ++j) old[j] = xt[j * D + d];
        for (int64_t k = 0; k < HC; ++k) {
          float v = yt[d] * p[k];
          for (int64_t j = 0; j < HC; ++j) v = v + old[j] * cm[j * HC + k];
          xt[k * D + d] = v;
        }
      }
    }
  });
}

void cpu_hc_expand(const float* y, int64_t T, int64_t HC, int64_t D, float* x, ThreadPool& pool) {
  pool.parallel_for(T, 16, [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; ++t)
      for (int64_t j = 0; j < HC; ++j) std::memcpy(x + (t * HC + j) * D, y + t * D, D * sizeof(float));
  });
}

}  // namespace strata
