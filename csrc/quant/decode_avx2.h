// AVX2 decoders: per format, a row's elements eight at a time as float32 vectors, with exactly
// the float32 operations of the scalar dequantization. The AVX2 dequantization rows store them;
// matmul's T = 1 kernels multiply them in place.
#pragma once
#if defined(__x86_64__)
#include <cstdint>

#include "quant/formats.h"
#include "quant/simd.h"

namespace strata::quant_detail {

// A decoder walks a block of kBlock elements as kSubs parts (their scales decoded once into a
// Sub) of kGroups groups of 8 elements; tail gives element c of a row past its last whole block.

struct DecF16 {
  static constexpr int64_t kBlock = 8, kSubs = 1, kGroups = 1;
  struct Sub {
    const uint16_t* h;
  };
  STRATA_SIMD static Sub sub(const uint8_t* row, int64_t blk, int) {
    return {reinterpret_cast<const uint16_t*>(row) + blk * 8};
  }
  STRATA_SIMD static __m256 group(const Sub& s, int) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s.h)));  // exact, as fp16_to_f32
  }
  static float tail(const uint8_t* row, int64_t c) {
    return fp16_to_f32(reinterpret_cast<const uint16_t*>(row)[c]);
  }
};

struct DecBF16 {
  static constexpr int64_t kBlock = 8, kSubs = 1, kGroups = 1;
  struct Sub {
    const uint16_t* h;
  };
  STRATA_SIMD static Sub sub(const uint8_t* row, int64_t blk, int) {
    return {reinterpret_cast<const uint16_t*>(row) + blk * 8};
  }
  STRATA_SIMD static __m256 group(const Sub& s, int) {  // bf16_to_f32: the bits shifted up by 16
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s.h)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
  static float tail(const uint8_t* row, int64_t c) {
    return bf16_to_f32(reinterpret_cast<const uint16_t*>(row)[c]);
  }
};

struct DecQ8_0 {
  static constexpr int64_t kBlock = kQK8_0, kSubs = 1, kGroups = kQK8_0 / 8;
  struct Sub {
    __m256 d;
    const int8_t* qs;
  };
  STRATA_SIMD static Sub sub(const uint8_t* row, int64_t blk, int) {
    const BlockQ8_0& b = reinterpret_cast<const BlockQ8_0*>(row)[blk];
    return {_mm256_set1_ps(h2f(b.d)), b.qs};
  }
  STRATA_SIMD static __m256 group(const Sub& s, int g) {
    return _mm256_mul_ps(_mm256_cvtepi32_ps(i8x8(s.qs + 8 * g)), s.d);
  }
  static float tail(const uint8_t*, int64_t) { return 0.0f; }  // rows are whole blocks
};

struct DecQ4_K {  // parts: the eight 32-element sub-blocks
  static constexpr int64_t kBlock = kQK_K, kSubs = 8, kGroups = 4;
  struct Sub {
    __m256 ds, dm;
    const uint8_t* q;
    __m128i shift;
  };
  STRATA_SIMD static Sub sub(const uint8_t* row, int64_t blk, int j) {
    const BlockQ4_K& b = reinterpret_cast<const BlockQ4_K*>(row)[blk];
    uint8_t sc, m;
    q4_k_scale_min(b.scales, j, sc, m);
    const Q4_KSub s = q4_k_sub(j);
    return {_mm256_set1_ps(h2f(b.d) * static_cast<float>(sc)),
            _mm256_set1_ps(h2f(b.dmin) * static_cast<float>(m)), b.qs + s.qs, _mm_cvtsi32_si128(s.shift)};
  }
  STRATA_SIMD static __m256 group(const Sub& s, int g) {
    const __m256i q =
        _mm256_and_si256(_mm256_srl_epi32(u8x8(s.q + 8 * g), s.shift), _mm256_set1_epi32(kQ4_KMask));
    return _mm256_sub_ps(_mm256_mul_ps(s.ds, _mm256_cvtepi32_ps(q)), s.dm);
  }
  static float tail(const uint8_t*, int64_t) { return 0.0f; }
};

struct DecQ6_K {  // parts: the eight 32-element groups
  static constexpr int64_t kBlock = kQK_K, kSubs = 8, kGroups = 4;
  struct Sub {
    __m256 ds0, ds1;  // the scales of the group's two 16-element halves
    const uint8_t *ql, *qh;
    __m128i ql_shift, qh_shift;
  };
  STRATA_SIMD static Sub sub(const uint8_t* row, int64_t blk, int p) {
    const BlockQ6_K& b = reinterpret_cast<const BlockQ6_K*>(row)[blk];
    const Q6_KGroup g = q6_k_group(p);
    const float d = h2f(b.d);
    return {_mm256_set1_ps(d * static_cast<float>(b.scales[g.scale])),
            _mm256_set1_ps(d * static_cast<float>(b.scales[g.scale + 1])),
            b.ql + g.ql,
            b.qh + g.qh,
            _mm_cvtsi32_si128(g.ql_shift),
            _mm_cvtsi32_si128(g.qh_shift)};
  }
  STRATA_SIMD static __m256 group(const Sub& s, int g) {
    const __m256i lo =
        _mm256_and_si256(_mm256_srl_epi32(u8x8(s.ql + 8 * g), s.ql_shift), _mm256_set1_epi32(kQ6_KLowMask));
    const __m256i hi =
        _mm256_and_si256(_mm256_srl_epi32(u8x8(s.qh + 8 * g), s.qh_shift), _mm256_set1_epi32(kQ6_KHighMask));
    const __m256i q =
        _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(kQ6_KBias));
    return _mm256_mul_ps(g < 2 ? s.ds0 : s.ds1, _mm256_cvtepi32_ps(q));
  }
  static float tail(const uint8_t*, int64_t) { return 0.0f; }
};

struct DecIQ2_XS {  // parts: the sixteen 16-element groups, each two grid entries
  static constexpr int64_t kBlock = kQK_K, kSubs = 16, kGroups = 2;
  struct Sub {
    __m256 db;
    const uint16_t* qs;
  };
  STRATA_SIMD static Sub sub(const uint8_t* row, int64_t blk, int g) {
    const BlockIQ2_XS& b = reinterpret_cast<const BlockIQ2_XS*>(row)[blk];
    return {_mm256_set1_ps(iq2_xs_group_scale(h2f(b.d), iq2_xs_scale(b, g / 2, g % 2))), b.qs + 2 * g};
  }
  STRATA_SIMD static __m256 group(const Sub& s, int k) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);  // element e: sign bit e
    const uint16_t q = s.qs[k];
    const __m256i grid =
        _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(kIq2xsGrid[iq2_xs_grid_index(q)])));
    const __m256i sb = _mm256_and_si256(_mm256_set1_epi32(kIq2xsSigns[iq2_xs_sign_index(q)]), bit);
    const __m256 sign = _mm256_blendv_ps(_mm256_set1_ps(1.0f), _mm256_set1_ps(-1.0f),
                                         _mm256_castsi256_ps(_mm256_cmpeq_epi32(sb, bit)));
    return _mm256_mul_ps(_mm256_mul_ps(s.db, _mm256_cvtepi32_ps(grid)), sign);  // multiplies, as numpy
  }
  static float tail(const uint8_t*, int64_t) { return 0.0f; }
};

// dequant_row for AVX2: the decoder's vectors stored in order.
template <class D>
STRATA_SIMD void dequant_row_avx2(const void* src, float* dst, int64_t n) {
  const uint8_t* row = static_cast<const uint8_t*>(src);
  const int64_t nblk = n / D::kBlock;
  for (int64_t blk = 0; blk < nblk; ++blk)
    for (int s = 0; s < D::kSubs; ++s) {
      const typename D::Sub sub = D::sub(row, blk, s);
      for (int g = 0; g < D::kGroups; ++g, dst += 8) _mm256_storeu_ps(dst, D::group(sub, g));
    }
  for (int64_t c = nblk * D::kBlock; c < n; ++c) *dst++ = D::tail(row, c);
}

}  // namespace strata::quant_detail
#endif
