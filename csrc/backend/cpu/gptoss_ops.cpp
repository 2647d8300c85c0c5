// gpt-oss's ops on the CPU (backend/gptoss_ops.h): plain loops, each output element computed the same
// way whatever T is, so the logits do not depend on the prompt chunking. Its attention is the shared
// CPU attention's (attention.cpp) with sinks and a window.
#include "backend/cpu/gptoss_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/thread_pool.h"

namespace strata {

void cpu_add_bias(float* y, const float* bias, int64_t T, int64_t n, ThreadPool& pool) {
  pool.parallel_for(T, 1, [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; ++t)
      for (int64_t i = 0; i < n; ++i) y[t * n + i] += bias[i];
  });
}

void cpu_rope_neox(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* inv_freq, float mscale,
                   int64_t pos0, ThreadPool& pool) {
  const int64_t half = hd / 2;
  pool.parallel_for(T, 1, [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; ++t) {
      const float pos = (float)(pos0 + t);
      for (int64_t i = 0; i < half; ++i) {
        const float a = pos * inv_freq[i];
        const float c = std::cos(a) * mscale, s = std::sin(a) * mscale;
        for (int64_t h = 0; h < n_heads; ++h) {
          float* v = x + (t * n_heads + h) * hd;
          const float x0 = v[i], x1 = v[i + half];
          v[i] = x0 * c - x1 * s;
          v[i + half] = x1 * c + x0 * s;
        }
      }
    }
  });
}

void cpu_expert_bias(float* y, const int32_t* ids, const float* w, const float* bias, int64_t T, int64_t K,
                     int64_t D, ThreadPool& pool) {
  pool.parallel_for(T, 1, [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; ++t)
      for (int64_t k = 0; k < K; ++k) {
        const float wk = w[t * K + k];
        const float* br = bias + (int64_t)ids[t * K + k] * D;
        for (int64_t c = 0; c < D; ++c) y[t * D + c] += wk * br[c];
      }
  });
}

}  // namespace strata
