// CPU attention: one task per (token, kv head) so the group's query heads share each K/V row read.
#include "backend/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/thread_pool.h"

namespace strata {
namespace {

constexpr int64_t kBlock = 128;  // keys per online-softmax block, fixed by absolute position

// Dot product in a fixed order: four 8-lane accumulators over 32-column steps, then 8-column
// steps into the first, a fixed reduction, and a scalar tail.
float dot_scalar(const float* a, const float* b, int64_t n) {
  float acc[4][8] = {};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int r = 0; r < 4; ++r)
      for (int j = 0; j < 8; ++j) acc[r][j] = std::fma(a[i + 8 * r + j], b[i + 8 * r + j], acc[r][j]);
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[0][j] = std::fma(a[i + j], b[i + j], acc[0][j]);
  float v[8];
  for (int j = 0; j < 8; ++j) v[j] = (acc[0][j] + acc[1][j]) + (acc[2][j] + acc[3][j]);
  float s = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
  for (; i < n; ++i) s = std::fma(a[i], b[i], s);
  return s;
}

void axpy_scalar(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    c0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), c0);
    c1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), c1);
    c2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), c2);
    c3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), c3);
  }
  for (; i + 8 <= n; i += 8) c0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), c0);
  const __m256 v = _mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3));
  alignas(32) float w[8];
  _mm256_store_ps(w, v);
  float s = ((w[0] + w[4]) + (w[2] + w[6])) + ((w[1] + w[5]) + (w[3] + w[7]));
  for (; i < n; ++i) s = std::fma(a[i], b[i], s);
  return s;
}

__attribute__((target("avx2,fma"))) void axpy_avx2(float* y, float a, const float* x, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);
}

bool has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#endif

struct Kernels {
  float (*dot)(const float*, const float*, int64_t);
  void (*axpy)(float*, float, const float*, int64_t);
};

Kernels pick() {
#if defined(__x86_64__)
  if (has_avx2()) return {dot_avx2, axpy_avx2};
#endif
  return {dot_scalar, axpy_scalar};
}

}  // namespace

void cpu_attention(const float* q, const float* kc, const float* vc, int64_t T, int64_t pos0, int64_t H,
                   int64_t KV, int64_t hd, float scale, float* out, ThreadPool& pool, const float* sinks,
                   int64_t window) {
  static const Kernels k = pick();
  const int64_t group = H / KV;
  pool.parallel_for(T * KV, 1, [&](int64_t b, int64_t e, int) {
    std::vector<float> s(group * kBlock), acc(group * hd), m(group), l(group);
    for (int64_t tk = b; tk < e; ++tk) {
      const int64_t t = tk / KV, kvh = tk % KV;
      const int64_t n_keys = pos0 + t + 1;
      const int64_t first = window > 0 ? std::max<int64_t>(0, n_keys - window) : 0;
      const float* qg = q + (t * H + kvh * group) * hd;
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(m.begin(), m.end(), -INFINITY);
      std::fill(l.begin(), l.end(), 0.f);
      // A sink is a key of logit sinks[h] and no value: the softmax starts from it.
      if (sinks)
        for (int64_t g = 0; g < group; ++g) {
          m[g] = sinks[kvh * group + g];
          l[g] = 1.f;
        }
      for (int64_t blk = first / kBlock * kBlock; blk < n_keys; blk += kBlock) {
        const int64_t j0 = std::max(blk, first);
        const int64_t nb = std::min(blk + kBlock, n_keys) - j0;
        for (int64_t j = 0; j < nb; ++j) {
          const float* kr = kc + ((j0 + j) * KV + kvh) * hd;
          for (int64_t g = 0; g < group; ++g) s[g * kBlock + j] = k.dot(qg + g * hd, kr, hd) * scale;
        }
        for (int64_t g = 0; g < group; ++g) {
          float* sg = s.data() + g * kBlock;
          const float m_new = std::max(m[g], *std::max_element(sg, sg + nb));
          const float corr = std::exp(m[g] - m_new);
          l[g] *= corr;
          float* ag = acc.data() + g * hd;
          for (int64_t i = 0; i < hd; ++i) ag[i] *= corr;
          for (int64_t j = 0; j < nb; ++j) {
            sg[j] = std::exp(sg[j] - m_new);
            l[g] += sg[j];
          }
          m[g] = m_new;
        }
        for (int64_t j = 0; j < nb; ++j) {
          const float* vr = vc + ((j0 + j) * KV + kvh) * hd;
          for (int64_t g = 0; g < group; ++g) k.axpy(acc.data() + g * hd, s[g * kBlock + j], vr, hd);
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        float* o = out + (t * H + kvh * group + g) * hd;
        const float inv = 1.0f / l[g];
        for (int64_t i = 0; i < hd; ++i) o[i] = acc[g * hd + i] * inv;
      }
    }
  });
}

}  // namespace strata
