#include "backend/cpu/activation.h"

#include <algorithm>

#include "core/exp_portable.h"
#include "core/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace strata {

namespace {

float swiglu_clamp_one(float x, float y, float limit) {
  if (limit > 0) {
    x = std::min(x, limit);
    y = std::clamp(y, -limit, limit);
  }
  return swiglu_portable(x, y);
}

float swiglu_oai_one(float x, float y, float alpha, float limit) {
  x = std::min(x, limit);
  y = std::clamp(y, -limit, limit);
  return (y + 1.0f) * (x / (1.0f + exp_portable(-(alpha * x))));
}

#if defined(__x86_64__)
#define STRATA_ACT_SIMD __attribute__((target("avx2,fma")))

// exp_portable on eight lanes: its steps one for one (the out-of-range lanes computed on a clamped x and
// replaced, as the scalar form returns early for them).
STRATA_ACT_SIMD __m256 exp8(__m256 x) {
  using namespace exp_detail;
  const __m256 hi = _mm256_set1_ps(kHigh), lo = _mm256_set1_ps(kLow);
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  const __m256 shift = _mm256_set1_ps(kShift);
  const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(xc, _mm256_set1_ps(kLog2e), shift), shift);
  const __m256 r =
      _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), xc));
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(kC7), r, _mm256_set1_ps(kC6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC5));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_cvtps_epi32(n);  // n is an integer: exact
  const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

// (x / (1 + e^-x)) * u.
STRATA_ACT_SIMD __m256 swiglu8(__m256 x, __m256 u) {
  const __m256 neg = _mm256_xor_ps(x, _mm256_set1_ps(-0.0f));
  return _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(neg))), u);
}

// std::min(x, limit) and std::clamp(y, -limit, limit), NaN included: min_ps / max_ps return their second
// operand when either is NaN.
STRATA_ACT_SIMD __m256 min_limit(__m256 x, __m256 limit) { return _mm256_min_ps(limit, x); }
STRATA_ACT_SIMD __m256 clamp_limit(__m256 y, __m256 limit) {
  const __m256 neg = _mm256_xor_ps(limit, _mm256_set1_ps(-0.0f));
  return _mm256_min_ps(limit, _mm256_max_ps(neg, y));
}

STRATA_ACT_SIMD int64_t exp_avx2(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp8(_mm256_loadu_ps(x + i)));
  return i;
}

STRATA_ACT_SIMD int64_t swiglu_avx2(float* g, const float* u, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(g + i, swiglu8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  return i;
}

STRATA_ACT_SIMD int64_t swiglu_clamp_avx2(float* g, const float* u, int64_t n, float limit) {
  const __m256 vl = _mm256_set1_ps(limit);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(g + i,
                     swiglu8(min_limit(_mm256_loadu_ps(g + i), vl), clamp_limit(_mm256_loadu_ps(u + i), vl)));
  return i;
}

STRATA_ACT_SIMD int64_t swiglu_oai_avx2(float* g, const float* u, const float* gb, const float* ub, int64_t n,
                                        float alpha, float limit) {
  const __m256 vl = _mm256_set1_ps(limit), va = _mm256_set1_ps(alpha), one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = min_limit(_mm256_add_ps(_mm256_loadu_ps(g + i), _mm256_loadu_ps(gb + i)), vl);
    const __m256 y = clamp_limit(_mm256_add_ps(_mm256_loadu_ps(u + i), _mm256_loadu_ps(ub + i)), vl);
    const __m256 ax = _mm256_xor_ps(_mm256_mul_ps(va, x), _mm256_set1_ps(-0.0f));
    const __m256 sig = _mm256_div_ps(x, _mm256_add_ps(one, exp8(ax)));
    _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_add_ps(y, one), sig));
  }
  return i;
}
#undef STRATA_ACT_SIMD
#endif

bool simd(Isa isa) {
#if defined(__x86_64__)
  return isa >= Isa::Avx2;
#else
  (void)isa;
  return false;
#endif
}

// Elementwise ops split into runs of 4,096 across the pool.
constexpr int64_t kGrain = 1 << 12;

}  // namespace

void exp_portable_n(Isa isa, const float* x, float* y, int64_t n) {
  int64_t i = 0;
#if defined(__x86_64__)
  if (simd(isa)) i = exp_avx2(x, y, n);
#endif
  for (; i < n; ++i) y[i] = exp_portable(x[i]);
}

void cpu_swiglu(Isa isa, float* g, const float* u, int64_t n, ThreadPool& pool) {
  pool.parallel_for(n, kGrain, [&](int64_t b, int64_t e, int) {
    int64_t i = b;
#if defined(__x86_64__)
    if (simd(isa)) i += swiglu_avx2(g + b, u + b, e - b);
#endif
    for (; i < e; ++i) g[i] = swiglu_portable(g[i], u[i]);
  });
}

void cpu_swiglu_clamp(Isa isa, float* g, const float* u, int64_t n, float limit, ThreadPool& pool) {
  if (limit <= 0) return cpu_swiglu(isa, g, u, n, pool);
  pool.parallel_for(n, kGrain, [&](int64_t b, int64_t e, int) {
    int64_t i = b;
#if defined(__x86_64__)
    if (simd(isa)) i += swiglu_clamp_avx2(g + b, u + b, e - b, limit);
#endif
    for (; i < e; ++i) g[i] = swiglu_clamp_one(g[i], u[i], limit);
  });
}

void cpu_swiglu_oai(Isa isa, float* g, const float* u, const int32_t* ids, const int32_t* rows, int64_t n,
                    int64_t F, const float* gate_b, const float* up_b, float alpha, float limit,
                    ThreadPool& pool) {
  pool.parallel_for(n, 1, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t ex = ids[rows[r]];
      float* gi = g + r * F;
      const float* ui = u + r * F;
      const float *gb = gate_b + ex * F, *ub = up_b + ex * F;
      int64_t c = 0;
#if defined(__x86_64__)
      if (simd(isa)) c = swiglu_oai_avx2(gi, ui, gb, ub, F, alpha, limit);
#endif
      for (; c < F; ++c) gi[c] = swiglu_oai_one(gi[c] + gb[c], ui[c] + ub[c], alpha, limit);
    }
  });
}

}  // namespace strata
