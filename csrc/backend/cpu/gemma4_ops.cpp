// gemma4's ops on the CPU (backend/gemma4_ops.h): plain loops, each output element computed the same
// way whatever T is, so the logits do not depend on the prompt chunking.
#include "backend/cpu/gemma4_ops.h"

#include <cmath>
#include <numbers>

#include "core/thread_pool.h"

namespace strata {

void cpu_head_norm(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* w, float eps,
                   ThreadPool& pool) {
  pool.parallel_for(T * n_heads, 16, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) {
      float* v = x + r * hd;
      float ss = 0.f;
      for (int64_t i = 0; i < hd; ++i) ss += v[i] * v[i];
      const float g = 1.0f / std::sqrt(ss / (float)hd + eps);
      if (w)
        for (int64_t i = 0; i < hd; ++i) v[i] = (v[i] * g) * w[i];
      else
        for (int64_t i = 0; i < hd; ++i) v[i] = v[i] * g;
    }
  });
}

void cpu_rope_freqs(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* inv_freq, int64_t pos0,
                    const int64_t* pos, ThreadPool& pool) {
  const int64_t half = hd / 2;
  pool.parallel_for(T, 1, [&](int64_t b, int64_t e, int) {
    for (int64_t t = b; t < e; ++t) {
      const float p = (float)(pos ? pos[t] : pos0 + t);
      for (int64_t i = 0; i < half; ++i) {
        const float a = p * inv_freq[i];
        const float c = std::cos(a), s = std::sin(a);
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

void cpu_geglu(float* g, const float* u, int64_t n, ThreadPool& pool) {
  // PyTorch's gelu(approximate="tanh") constants and order of operations.
  const float beta = (float)(std::numbers::sqrt2 * (2.0 / std::sqrt(std::numbers::pi)) * 0.5),
              kappa = 0.044715f;
  pool.parallel_for(n, 4096, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) {
      const float x = g[i];
      const float inner = beta * (x + kappa * (x * x * x));
      g[i] = (0.5f * x * (1.0f + std::tanh(inner))) * u[i];
    }
  });
}

void cpu_scale(float* x, int64_t n, const float* s, ThreadPool& pool) {
  const float v = s[0];
  pool.parallel_for(n, 4096, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) x[i] *= v;
  });
}

void cpu_softcap(float* x, int64_t n, float cap, ThreadPool& pool) {
  pool.parallel_for(n, 4096, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) x[i] = std::tanh(x[i] / cap) * cap;
  });
}

void cpu_expert_scale(float* w, const int32_t* ids, const float* scale, int64_t n) {
  for (int64_t i = 0; i < n; ++i) w[i] *= scale[ids[i]];
}

}  // namespace strata
