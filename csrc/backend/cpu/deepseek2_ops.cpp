// deepseek2's ops on the CPU (backend/deepseek2_ops.h): plain loops, each output element computed the
// same way whatever T is, so the logits do not depend on the prompt chunking. The strided RMSNorm is
// cpu_rms_norm_rows (ds4_misc.cpp, which V4's row norm shares).
#include "backend/cpu/deepseek2_ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/thread_pool.h"

namespace strata {

void cpu_rope_pairs(const float* x, int64_t x_row, int64_t x_head, float* y, int64_t y_row, int64_t y_head,
                    int64_t T, int64_t n_heads, int64_t n_pairs, const float* inv_freq, int64_t pos0,
                    ThreadPool& pool) {
  pool.parallel_for(T, 1, [&](int64_t b, int64_t e, int) {
    std::vector<float> cs(n_pairs), sn(n_pairs);
    for (int64_t t = b; t < e; ++t) {
      const float pos = (float)(pos0 + t);
      for (int64_t i = 0; i < n_pairs; ++i) {
        const float a = pos * inv_freq[i];
        cs[i] = std::cos(a);
        sn[i] = std::sin(a);
      }
      for (int64_t h = 0; h < n_heads; ++h) {
        const float* xv = x + t * x_row + h * x_head;
        float* yv = y + t * y_row + h * y_head;
        for (int64_t i = 0; i < n_pairs; ++i) {
          const float x0 = xv[2 * i], x1 = xv[2 * i + 1];
          yv[2 * i] = x0 * cs[i] - x1 * sn[i];
          yv[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
        }
      }
    }
  });
}

void cpu_router_grouped(const float* logits, int64_t T, int64_t E, int64_t K, bool sigmoid, const float* bias,
                        int64_t groups, int64_t groups_used, bool norm, float scale, int32_t* ids,
                        float* weights, ThreadPool& pool) {
  const int64_t per = groups > 1 ? E / groups : E;
  pool.parallel_for(T, 8, [&](int64_t b, int64_t e, int) {
    std::vector<float> p(E), s(E), gscore(std::max<int64_t>(groups, 1));
    std::vector<int32_t> idx(E), gidx(std::max<int64_t>(groups, 1));
    std::vector<char> allowed(E, 1);
    for (int64_t t = b; t < e; ++t) {
      const float* lg = logits + t * E;
      if (sigmoid) {
        for (int64_t i = 0; i < E; ++i) p[i] = 1.0f / (1.0f + std::exp(-lg[i]));
      } else {
        float mx = lg[0];
        for (int64_t i = 1; i < E; ++i) mx = std::max(mx, lg[i]);
        float sum = 0.f;
        for (int64_t i = 0; i < E; ++i) sum += (p[i] = std::exp(lg[i] - mx));
        for (int64_t i = 0; i < E; ++i) p[i] /= sum;
      }
      for (int64_t i = 0; i < E; ++i) s[i] = bias ? p[i] + bias[i] : p[i];
      std::fill(allowed.begin(), allowed.end(), 1);
      if (groups > 1) {
        for (int64_t g = 0; g < groups; ++g) {
          // The two highest of the group, summed highest first.
          float a = -INFINITY, c = -INFINITY;
          for (int64_t i = g * per; i < (g + 1) * per; ++i) {
            if (s[i] > a) {
              c = a;
              a = s[i];
            } else if (s[i] > c) {
              c = s[i];
            }
          }
          gscore[g] = a + c;
        }
        std::iota(gidx.begin(), gidx.end(), 0);
        std::partial_sort(gidx.begin(), gidx.begin() + groups_used, gidx.end(), [&](int32_t x, int32_t y) {
          return gscore[x] > gscore[y] || (gscore[x] == gscore[y] && x < y);
        });
        std::fill(allowed.begin(), allowed.end(), 0);
        for (int64_t k = 0; k < groups_used; ++k)
          std::fill(allowed.begin() + gidx[k] * per, allowed.begin() + (gidx[k] + 1) * per, 1);
      }
      int64_t n = 0;
      for (int64_t i = 0; i < E; ++i)
        if (allowed[i]) idx[n++] = (int32_t)i;
      std::partial_sort(idx.begin(), idx.begin() + K, idx.begin() + n,
                        [&](int32_t x, int32_t y) { return s[x] > s[y] || (s[x] == s[y] && x < y); });
      int32_t* id = ids + t * K;
      float sum = 0.f;
      for (int64_t k = 0; k < K; ++k) {
        id[k] = idx[k];
        sum += p[idx[k]];
      }
      const float div = std::max(sum, 6.103515625e-5f);
      for (int64_t k = 0; k < K; ++k) weights[t * K + k] = (norm ? p[id[k]] / div : p[id[k]]) * scale;
    }
  });
}

}  // namespace strata
