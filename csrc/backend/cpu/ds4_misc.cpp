// CPU row norms (contiguous or strided rows), DeepSeek V4's interleaved tail RoPE, the cache rings,
// sqrt-softplus routing (biased top-K or hash table) and the clamped SwiGLU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/cpu/deepseek2_ops.h"
#include "backend/cpu/ds4_ops.h"
#include "core/thread_pool.h"

namespace strata {

void cpu_rms_norm_rows(float* x, int64_t rows, int64_t D, int64_t stride, const float* w, float eps,
                       ThreadPool& pool) {
  pool.parallel_for(rows, 8, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) {
      float* v = x + r * stride;
      float ss = 0.f;
      for (int64_t i = 0; i < D; ++i) ss += v[i] * v[i];
      const float g = 1.0f / std::sqrt(ss / (float)D + eps);
      if (w) {
        for (int64_t i = 0; i < D; ++i) v[i] = (v[i] * g) * w[i];
      } else {
        for (int64_t i = 0; i < D; ++i) v[i] = v[i] * g;
      }
    }
  });
}

void cpu_rms_norm(float* x, int64_t rows, int64_t D, const float* w, float eps, ThreadPool& pool) {
  cpu_rms_norm_rows(x, rows, D, D, w, eps, pool);
}

void cpu_rope_tail(float* x, int64_t rows, int64_t n_heads, int64_t hd, int64_t n_pairs,
                   const float* inv_freq, float mscale, int64_t pos0, int64_t pos_step, bool inverse,
                   ThreadPool& pool) {
  pool.parallel_for(rows, 4, [&](int64_t b, int64_t e, int) {
    std::vector<float> cs(n_pairs), sn(n_pairs);
    for (int64_t r = b; r < e; ++r) {
      const float pos = (float)(pos0 + r * pos_step);
      for (int64_t i = 0; i < n_pairs; ++i) {
        const float theta = pos * inv_freq[i];
        cs[i] = std::cos(theta) * mscale;
        sn[i] = std::sin(theta) * mscale * (inverse ? -1.0f : 1.0f);
      }
      for (int64_t h = 0; h < n_heads; ++h) {
        float* v = x + (r * n_heads + h) * hd + hd - 2 * n_pairs;
        for (int64_t i = 0; i < n_pairs; ++i) {
          const float x0 = v[2 * i], x1 = v[2 * i + 1];
          v[2 * i] = x0 * cs[i] - x1 * sn[i];
          v[2 * i + 1] = x1 * cs[i] + x0 * sn[i];
        }
      }
    }
  });
}

void cpu_ring_store(float* ring, int64_t slots, int64_t width, int64_t pos0, int64_t T, const float* src) {
  for (int64_t p = std::max(pos0, pos0 + T - slots); p < pos0 + T; ++p)
    std::memcpy(ring + (p % slots) * width, src + (p - pos0) * width, width * sizeof(float));
}

void cpu_router_v4(const float* logits, int64_t T, int64_t E, int64_t K, const float* bias,
                   const int32_t* table, const int32_t* tokens, bool norm, float scale, int32_t* ids,
                   float* weights, ThreadPool& pool) {
  pool.parallel_for(T, 8, [&](int64_t b, int64_t e, int) {
    std::vector<float> s(E), sel(E);
    std::vector<int32_t> idx(E);
    for (int64_t t = b; t < e; ++t) {
      const float* lg = logits + t * E;
      for (int64_t i = 0; i < E; ++i) {
        // softplus as torch computes it: the identity above 20
        const float sp = lg[i] > 20.0f ? lg[i] : std::log1p(std::exp(lg[i]));
        s[i] = std::sqrt(sp);
      }
      int32_t* id = ids + t * K;
      if (table) {
        for (int64_t k = 0; k < K; ++k) id[k] = table[(int64_t)tokens[t] * K + k];
      } else {
        for (int64_t i = 0; i < E; ++i) sel[i] = bias ? s[i] + bias[i] : s[i];
        std::iota(idx.begin(), idx.end(), 0);
        std::partial_sort(idx.begin(), idx.begin() + K, idx.end(), [&](int32_t a, int32_t c) {
          return sel[a] > sel[c] || (sel[a] == sel[c] && a < c);
        });
        for (int64_t k = 0; k < K; ++k) id[k] = idx[k];
      }
      float sum = 0.f;
      for (int64_t k = 0; k < K; ++k) sum += s[id[k]];
      for (int64_t k = 0; k < K; ++k)
        weights[t * K + k] = (norm ? s[id[k]] / (sum + 1e-20f) : s[id[k]]) * scale;
    }
  });
}

}  // namespace strata
