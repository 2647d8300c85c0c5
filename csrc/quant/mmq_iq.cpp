// matmul_q8 for the i-quants: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M and IQ4_XS.
#include "quant/mmq.h"

namespace strata {
namespace quant_detail {

void mmq_iq2_xs_scalar(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                       int64_t T, float* Y, int64_t ldy) {
  for_outputs(W, rb, rows, cols, Xq, xrb, T, Y, ldy,
              [](float acc, const uint8_t* w, int64_t b, const int8_t* x, float dx) {
                const BlockIQ2_XS& blk = reinterpret_cast<const BlockIQ2_XS*>(w)[b / kBlocksK];
                const int j = static_cast<int>(b % kBlocksK);
                int32_t s = 0;
                for (int h = 0; h < 2; ++h) {  // the 32-block's two 16-element halves
                  int32_t sh = 0;
                  for (int k = 0; k < 2; ++k) {
                    const uint16_t q = blk.qs[(32 * j + 16 * h + 8 * k) / 8];
                    const uint64_t grid = kIq2xsGrid[iq2_xs_grid_index(q)];
                    const uint8_t signs = kIq2xsSigns[iq2_xs_sign_index(q)];
                    for (int e = 0; e < 8; ++e) {
                      const int v = iq2_xs_grid_value(grid, e);
                      sh += (iq2_xs_negative(signs, e) ? -v : v) * x[16 * h + 8 * k + e];
                    }
                  }
                  s += iq2_xs_scale_odd(blk, j, h) * sh;
                }
                return std::fma((fp16_to_f32(blk.d) * dx) * kIq2xsOddScaleUnit, static_cast<float>(s), acc);
              });
}

void mmq_iq2_xxs_scalar(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                        int64_t T, float* Y, int64_t ldy) {
  for_outputs(W, rb, rows, cols, Xq, xrb, T, Y, ldy,
              [](float acc, const uint8_t* w, int64_t b, const int8_t* x, float dx) {
                const BlockIQ2_XXS& blk = reinterpret_cast<const BlockIQ2_XXS*>(w)[b / kBlocksK];
                const int j = static_cast<int>(b % kBlocksK);
                const uint32_t grid_word = iq2_xxs_word(blk, j, 0), sign_word = iq2_xxs_word(blk, j, 1);
                int32_t s = 0;
                for (int k = 0; k < 4; ++k) {
                  const uint64_t grid = kIq2xxsGrid[iq2_xxs_grid_index(grid_word, k)];
                  const uint8_t signs = kIq2xsSigns[iq2_xxs_sign_index(sign_word, k)];
                  for (int e = 0; e < 8; ++e) {
                    const int v = iq2_xs_grid_value(grid, e);
                    s += (iq2_xs_negative(signs, e) ? -v : v) * x[8 * k + e];
                  }
                }
                const int odd = 2 * iq2_xxs_scale(sign_word) + 1;
                return std::fma((fp16_to_f32(blk.d) * dx) * kIq2xsOddScaleUnit, static_cast<float>(odd * s),
                                acc);
              });
}

void mmq_iq4_xs_scalar(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                       int64_t T, float* Y, int64_t ldy) {
  for_outputs(W, rb, rows, cols, Xq, xrb, T, Y, ldy,
              [](float acc, const uint8_t* w, int64_t b, const int8_t* x, float dx) {
                const BlockIQ4_XS& blk = reinterpret_cast<const BlockIQ4_XS*>(w)[b / kBlocksK];
                const int j = static_cast<int>(b % kBlocksK);
                int32_t s = 0;
                for (int l = 0; l < kQK8_0; ++l) s += iq4_nl_value(nibble_q(blk.qs + 16 * j, l)) * x[l];
                return std::fma(fp16_to_f32(blk.d) * dx, static_cast<float>(iq4_xs_scale(blk, j) * s), acc);
              });
}

// The grid i-quants: per 32-block the signed values' sums (per half where the scale is), times the
// integer scales, then one fma with the block's float scale.
#define STRATA_IQ_SCALAR(name, B, D, EXPR)                                                               \
  void mmq_##name##_scalar(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq,      \
                           int64_t xrb, int64_t T, float* Y, int64_t ldy) {                              \
    for_outputs(W, rb, rows, cols, Xq, xrb, T, Y, ldy,                                                   \
                [](float acc, const uint8_t* w, int64_t b, const int8_t* x, float dx) {                  \
                  const B& blk = reinterpret_cast<const B*>(w)[b / kBlocksK];                            \
                  const int j = static_cast<int>(b % kBlocksK);                                          \
                  int32_t half[2] = {0, 0};                                                              \
                  for (int l = 0; l < kQK8_0; ++l) half[l / 16] += (EXPR) * x[l];                        \
                  int sc[2];                                                                             \
                  scales_##name(blk, j, sc);                                                             \
                  return std::fma((D) * dx, static_cast<float>(sc[0] * half[0] + sc[1] * half[1]), acc); \
                });                                                                                      \
  }
inline void scales_iq3_xxs(const BlockIQ3_XXS& b, int j, int sc[2]) {
  sc[0] = sc[1] = 2 * iq3_xxs_scale(b, j) + 1;
}
inline void scales_iq3_s(const BlockIQ3_S& b, int j, int sc[2]) { sc[0] = sc[1] = 1 + 2 * iq3_s_scale(b, j); }
inline void scales_iq2_s(const BlockIQ2_S& b, int j, int sc[2]) {
  sc[0] = 2 * iq2_s_scale(b, 2 * j) + 1;
  sc[1] = 2 * iq2_s_scale(b, 2 * j + 1) + 1;
}
inline void scales_iq1_s(const BlockIQ1_S& b, int j, int sc[2]) { sc[0] = sc[1] = 2 * iq1_s_scale(b, j) + 1; }
inline void scales_iq1_m(const BlockIQ1_M& b, int j, int sc[2]) {
  sc[0] = 2 * iq1_m_scale(b, 2 * j) + 1;
  sc[1] = 2 * iq1_m_scale(b, 2 * j + 1) + 1;
}
STRATA_IQ_SCALAR(iq3_xxs, BlockIQ3_XXS, fp16_to_f32(blk.d) * 0.25f,
                 iq3_xxs_negative(blk, j, l) ? -iq3_xxs_magnitude(blk, j, l) : iq3_xxs_magnitude(blk, j, l))
STRATA_IQ_SCALAR(iq3_s, BlockIQ3_S, fp16_to_f32(blk.d),
                 bit_sign(blk.signs, 32 * j + l) ? -iq3_s_magnitude(blk, j, l) : iq3_s_magnitude(blk, j, l))
STRATA_IQ_SCALAR(iq2_s, BlockIQ2_S, fp16_to_f32(blk.d) * 0.125f,
                 bit_sign(blk.signs, 32 * j + l) ? -iq2_s_magnitude(blk, 32 * j + l)
                                                 : iq2_s_magnitude(blk, 32 * j + l))
STRATA_IQ_SCALAR(iq1_s, BlockIQ1_S, fp16_to_f32(blk.d) * 0.125f, iq1_s_value8(blk, j, l))
STRATA_IQ_SCALAR(iq1_m, BlockIQ1_M, fp16_to_f32(iq1_m_d(blk)) * 0.125f, iq1_m_value8(blk, 32 * j + l))
#undef STRATA_IQ_SCALAR

#if defined(__x86_64__)
namespace {

// Grid magnitudes in [0, kIq2xsGridMax], and their signs as +1 / -1 bytes.
STRATA_SIMD inline __m256i iq2_xs_grid_bytes(const BlockIQ2_XS& b, int j) {
  const uint16_t* q = b.qs + 4 * j;
  const auto e = [&](int k) { return static_cast<long long>(kIq2xsGrid[iq2_xs_grid_index(q[k])]); };
  return _mm256_set_epi64x(e(3), e(2), e(1), e(0));
}
STRATA_SIMD inline __m256i iq2_xs_sign_bytes(const BlockIQ2_XS& b, int j) {
  const uint16_t* q = b.qs + 4 * j;
  const auto e = [&](int k) { return static_cast<long long>(kIq2xsSignBytes[iq2_xs_sign_index(q[k])]); };
  return _mm256_set_epi64x(e(3), e(2), e(1), e(0));
}

// The same for IQ2_XXS's 32-block j (its grid shares IQ2_XS's largest magnitude).
static_assert([] {
  int m = 0;
  for (uint64_t entry : kIq2xxsGrid)
    for (int e = 0; e < 8; ++e) m = iq2_xs_grid_value(entry, e) > m ? iq2_xs_grid_value(entry, e) : m;
  return m;
}() == kIq2xsGridMax);
STRATA_SIMD inline __m256i iq2_xxs_grid_bytes(const BlockIQ2_XXS& b, int j) {
  const uint32_t w = iq2_xxs_word(b, j, 0);
  const auto e = [&](int k) { return static_cast<long long>(kIq2xxsGrid[iq2_xxs_grid_index(w, k)]); };
  return _mm256_set_epi64x(e(3), e(2), e(1), e(0));
}
STRATA_SIMD inline __m256i iq2_xxs_sign_bytes(const BlockIQ2_XXS& b, int j) {
  const uint32_t w = iq2_xxs_word(b, j, 1);
  const auto e = [&](int k) { return static_cast<long long>(kIq2xsSignBytes[iq2_xxs_sign_index(w, k)]); };
  return _mm256_set_epi64x(e(3), e(2), e(1), e(0));
}
inline int iq2_xxs_odd(const BlockIQ2_XXS& b, int j) { return 2 * iq2_xxs_scale(iq2_xxs_word(b, j, 1)) + 1; }

// 2 nibble + 1 for the 16 nibbles of 8 scale bytes (half h of 32-block j: nibble h of byte j) at byte
// 2j + h, in both lanes (spread8_pair): IQ2_XS's and IQ2_S's odd scales.
STRATA_SIMD inline __m256i odd_nibbles(const uint8_t* scales) {
  const __m128i s = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales)), m = _mm_set1_epi8(0xF);
  const __m128i v = _mm_unpacklo_epi8(_mm_and_si128(s, m), _mm_and_si128(_mm_srli_epi16(s, 4), m));
  return _mm256_broadcastsi128_si256(_mm_add_epi8(_mm_add_epi8(v, v), _mm_set1_epi8(1)));
}

struct KIQ2_XS {
  static constexpr int kSubs = kBlocksK;
  static constexpr size_t kBytes = sizeof(BlockIQ2_XS);
  struct Pre {
    float d;
    const BlockIQ2_XS* b;
    __m256i sc8;  // the 16 odd scales, half h of 32-block j at byte 2j + h, in both lanes (spread8_pair)
  };
  STRATA_SIMD static Pre pre(const uint8_t* blk) {
    const BlockIQ2_XS* b = reinterpret_cast<const BlockIQ2_XS*>(blk);
    return {h2f(b->d), b, odd_nibbles(b->scales)};
  }
  STRATA_SIMD static __m256i dot(const Pre& p, int j, __m256i x) {
    const __m256i p16 =
        _mm256_maddubs_epi16(iq2_xs_grid_bytes(*p.b, j), _mm256_sign_epi8(x, iq2_xs_sign_bytes(*p.b, j)));
    return _mm256_madd_epi16(p16, spread8_pair(p.sc8, j));
  }
  template <int MR, int NT>
  STRATA_SIMD static __m256 update(__m256 acc, __m256i isum, const Pre* p, int, __m256 dx, __m256i) {
    const __m256 d = row_lanes_ps<MR, NT>([&](int r) { return p[r].d; });
    const __m256 ddx = _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_set1_ps(kIq2xsOddScaleUnit));
    return _mm256_fmadd_ps(ddx, _mm256_cvtepi32_ps(isum), acc);
  }
};

struct KIQ2_XXS {
  static constexpr int kSubs = kBlocksK;
  static constexpr bool kPairs = true;  // mmq.h's tile: two 32-blocks a step
  static constexpr size_t kBytes = sizeof(BlockIQ2_XXS);
  struct Pre {
    float d;
    const BlockIQ2_XXS* b;
  };
  STRATA_SIMD static Pre pre(const uint8_t* blk) {
    const BlockIQ2_XXS* b = reinterpret_cast<const BlockIQ2_XXS*>(blk);
    return {h2f(b->d), b};
  }
  STRATA_SIMD static __m256i dot(const Pre& p, int j, __m256i x) {
    const __m256i p16 =
        _mm256_maddubs_epi16(iq2_xxs_grid_bytes(*p.b, j), _mm256_sign_epi8(x, iq2_xxs_sign_bytes(*p.b, j)));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(static_cast<int16_t>(iq2_xxs_odd(*p.b, j))));
  }
  template <int MR, int NT>
  STRATA_SIMD static __m256 update(__m256 acc, __m256i isum, const Pre* p, int, __m256 dx, __m256i) {
    const __m256 d = row_lanes_ps<MR, NT>([&](int r) { return p[r].d; });
    const __m256 ddx = _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_set1_ps(kIq2xsOddScaleUnit));
    return _mm256_fmadd_ps(ddx, _mm256_cvtepi32_ps(isum), acc);
  }
};

// scr = signed grid value + kIq2xsGridMax in [0, 86]; minus max * scale * half sums after.
struct IlIQ2_XS {
  STRATA_SIMD static void unpack(const uint8_t* w, int64_t nb, uint8_t* scr) {
    const BlockIQ2_XS* blk = reinterpret_cast<const BlockIQ2_XS*>(w);
    for (int64_t b = 0; b < nb; ++b) {
      const BlockIQ2_XS& wb = blk[b / kBlocksK];
      const int j = static_cast<int>(b % kBlocksK);
      const __m256i v = _mm256_sign_epi8(iq2_xs_grid_bytes(wb, j), iq2_xs_sign_bytes(wb, j));
      store32(scr + b * 32, _mm256_add_epi8(v, _mm256_set1_epi8(kIq2xsGridMax)));
    }
  }
  template <int MR, int NV>
  STRATA_SIMD static void dots(const KIQ2_XS::Pre* p, int j, const uint8_t* const* a, const int8_t* const* xv,
                               const __m256i* hs, __m256i* isum) {
    int sc[MR][2];
    for (int r = 0; r < MR; ++r) {
      sc[r][0] = iq2_xs_scale_odd(*p[r].b, j, 0);
      sc[r][1] = iq2_xs_scale_odd(*p[r].b, j, 1);
      const __m256i c = _mm256_set1_epi32(pair16(kIq2xsGridMax * sc[r][0], kIq2xsGridMax * sc[r][1]));
      for (int v = 0; v < NV; ++v)
        isum[r * NV + v] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_madd_epi16(hs[v], c));
    }
    for (int hf = 0; hf < 2; ++hf)
      for (int k = 0; k < 4; ++k) {
        __m256i x[NV];
        for (int v = 0; v < NV; ++v) x[v] = xload(xv[v] + (hf * 4 + k) * 32);
        for (int r = 0; r < MR; ++r) {
          const __m256i aw = bcast4(a[r] + 4 * (hf * 4 + k)), scv = _mm256_set1_epi16(sc[r][hf]);
          for (int v = 0; v < NV; ++v)
            isum[r * NV + v] =
                _mm256_add_epi32(isum[r * NV + v], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, x[v]), scv));
        }
      }
  }
};

// scr = signed grid value + kIq2xsGridMax in [0, 86]; one scale per 32-block.
struct IlIQ2_XXS {
  STRATA_SIMD static void unpack(const uint8_t* w, int64_t nb, uint8_t* scr) {
    const BlockIQ2_XXS* blk = reinterpret_cast<const BlockIQ2_XXS*>(w);
    for (int64_t b = 0; b < nb; ++b) {
      const BlockIQ2_XXS& wb = blk[b / kBlocksK];
      const int j = static_cast<int>(b % kBlocksK);
      const __m256i v = _mm256_sign_epi8(iq2_xxs_grid_bytes(wb, j), iq2_xxs_sign_bytes(wb, j));
      store32(scr + b * 32, _mm256_add_epi8(v, _mm256_set1_epi8(kIq2xsGridMax)));
    }
  }
  template <int MR, int NV>
  STRATA_SIMD static void dots(const KIQ2_XXS::Pre* p, int j, const uint8_t* const* a,
                               const int8_t* const* xv, const __m256i* hs, __m256i* isum) {
    int odd[MR];
    for (int r = 0; r < MR; ++r) {
      odd[r] = iq2_xxs_odd(*p[r].b, j);
      const __m256i c = _mm256_set1_epi32(pair16(kIq2xsGridMax * odd[r], kIq2xsGridMax * odd[r]));
      for (int v = 0; v < NV; ++v)
        isum[r * NV + v] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_madd_epi16(hs[v], c));
    }
    for (int k = 0; k < 8; ++k) {
      __m256i x[NV];
      for (int v = 0; v < NV; ++v) x[v] = xload(xv[v] + k * 32);
      for (int r = 0; r < MR; ++r) {
        const __m256i aw = bcast4(a[r] + 4 * k), scv = _mm256_set1_epi16(static_cast<int16_t>(odd[r]));
        for (int v = 0; v < NV; ++v)
          isum[r * NV + v] =
              _mm256_add_epi32(isum[r * NV + v], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, x[v]), scv));
      }
    }
  }
};

// IQ4_XS through decode_avx2.h's bytes: the codebook values, one scale per 32-block.
struct KIQ4 {
  using Bytes = IQ4_XSBytes;
  static constexpr int kSubs = kBlocksK, kMin = 0;
  static constexpr bool kUnsigned = false;
  struct Pre {
    float d, m;
    const BlockIQ4_XS* b;
    __m256i sc16;
  };
  STRATA_SIMD static Pre pre(const uint8_t* blk) {
    const BlockIQ4_XS* b = reinterpret_cast<const BlockIQ4_XS*>(blk);
    // ls_j = (4 bits of scales_l, nibble j) | (2 bits of scales_h, pair j) << 4, minus 32, as int32 lanes j
    uint32_t lo;
    std::memcpy(&lo, b->scales_l, 4);
    const __m256i l = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int32_t>(lo)),
                                        _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    const __m256i h =
        _mm256_srlv_epi32(_mm256_set1_epi32(b->scales_h), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
    const __m256i ls =
        _mm256_sub_epi32(_mm256_or_si256(_mm256_and_si256(l, _mm256_set1_epi32(0xF)),
                                         _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(3)), 4)),
                         _mm256_set1_epi32(32));
    const __m256i pk = _mm256_packs_epi32(ls, ls);  // [0..3, 0..3 | 4..7, 4..7]
    return {h2f(b->d), 0.0f, b, _mm256_permute4x64_epi64(pk, 0x88)};
  }
  STRATA_SIMD static __m256i bytes(const Pre& p, int j) { return IQ4_XSBytes::q(*p.b, j); }
  static void scales(const Pre& p, int j, int sc[2]) { sc[0] = sc[1] = iq4_xs_scale(*p.b, j); }
  static int min(const Pre&, int) { return 0; }
};

// VNNI, T > 4: the AVX2 unpack (g + 43, unsigned), the step sums by vpdpbusd from -43 times the half sums,
// then scaled.
template <int MR, int NV>
STRATA_VNNI inline void iq2_vnni_halves(const uint8_t* const* a, const int8_t* const* xv, const __m256i* hs,
                                        const int (*sc)[2], __m256i* isum) {
  __m256i s0[MR * NV], s1[MR * NV];
  for (int v = 0; v < NV; ++v) {
    const __m256i c0 = _mm256_mullo_epi32(half_lo(hs[v]), _mm256_set1_epi32(-kIq2xsGridMax));
    const __m256i c1 = _mm256_mullo_epi32(half_hi(hs[v]), _mm256_set1_epi32(-kIq2xsGridMax));
    for (int r = 0; r < MR; ++r) s0[r * NV + v] = c0, s1[r * NV + v] = c1;
  }
  vstep_sums<MR, NV>(a, xv, 0, 4, s0);
  vstep_sums<MR, NV>(a, xv, 4, 8, s1);
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v)
      isum[r * NV + v] = _mm256_add_epi32(_mm256_mullo_epi32(s0[r * NV + v], _mm256_set1_epi32(sc[r][0])),
                                          _mm256_mullo_epi32(s1[r * NV + v], _mm256_set1_epi32(sc[r][1])));
}
struct VIlIQ2_XS : IlIQ2_XS {
  template <int MR, int NV>
  STRATA_VNNI static void dots(const KIQ2_XS::Pre* p, int j, const uint8_t* const* a, const int8_t* const* xv,
                               const __m256i* hs, const __m256i*, __m256i* isum) {
    int sc[MR][2];
    for (int r = 0; r < MR; ++r)
      sc[r][0] = iq2_xs_scale_odd(*p[r].b, j, 0), sc[r][1] = iq2_xs_scale_odd(*p[r].b, j, 1);
    iq2_vnni_halves<MR, NV>(a, xv, hs, sc, isum);
  }
};
struct VIlIQ2_XXS : IlIQ2_XXS {
  template <int MR, int NV>
  STRATA_VNNI static void dots(const KIQ2_XXS::Pre* p, int j, const uint8_t* const* a,
                               const int8_t* const* xv, const __m256i*, const __m256i* xs, __m256i* isum) {
    for (int v = 0; v < NV; ++v) {
      const __m256i c = _mm256_mullo_epi32(xs[v], _mm256_set1_epi32(-kIq2xsGridMax));
      for (int r = 0; r < MR; ++r) isum[r * NV + v] = c;
    }
    vstep_sums<MR, NV>(a, xv, 0, 8, isum);
    for (int r = 0; r < MR; ++r) {
      const __m256i odd = _mm256_set1_epi32(iq2_xxs_odd(*p[r].b, j));
      for (int v = 0; v < NV; ++v) isum[r * NV + v] = _mm256_mullo_epi32(isum[r * NV + v], odd);
    }
  }
};

// VNNI, T <= 4: the lanes' d and 6-bit scales decoded as vectors from gathers of the headers (d | scales_h,
// scales_l), the scale on the reduced sums; the codebook with 128 added gives the unsigned bytes.
struct IQ4_XSHead {
  __m256 d;
  __m256i dh, sl;  // d | scales_h << 16, scales_l
};
struct VIQ4_XS {
  static constexpr bool kVnni = true, kPairs = true, kLaneScale = true;
  static constexpr int kSubs = kBlocksK;
  static constexpr size_t kBytes = sizeof(BlockIQ4_XS);
  using Pre = const BlockIQ4_XS*;
  using Head = IQ4_XSHead;
  STRATA_VNNI static Pre pre(const uint8_t* blk) { return reinterpret_cast<const BlockIQ4_XS*>(blk); }
  STRATA_VNNI static Head head(const uint8_t* blk0, __m256i off) {
    static_assert(offsetof(BlockIQ4_XS, d) == 0 && offsetof(BlockIQ4_XS, scales_h) == 2);
    const __m256i dh = gather_at(blk0, 0, off);
    return {fp16_lanes(dh), dh, gather_at(blk0, offsetof(BlockIQ4_XS, scales_l), off)};
  }
  STRATA_VNNI static __m256i xcorr(__m256i x) { return neg_sums(x, static_cast<char>(0x80)); }
  STRATA_VNNI static __m256i vdot(const Pre& p, int j, __m256i x, __m256i xc) {
    return dpbusd(xc, _mm256_shuffle_epi8(codebook32_u(kIq4nlLo, kIq4nlHi), nibbles32(p->qs + 16 * j)), x);
  }
  // iq4_xs_scale: nibble j of scales_l, bits 2j..2j+1 of scales_h above it, minus 32.
  STRATA_VNNI static __m256i scale_lanes(const Head& h, int j) {
    const __m256i lo =
        _mm256_and_si256(_mm256_srl_epi32(h.sl, _mm_cvtsi32_si128(4 * j)), _mm256_set1_epi32(0xF));
    const __m256i hi =
        _mm256_and_si256(_mm256_srl_epi32(h.dh, _mm_cvtsi32_si128(16 + 2 * j)), _mm256_set1_epi32(3));
    return _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
  }
  STRATA_VNNI static __m256 vupdate(__m256 acc, __m256i isum, const Head& h, int, __m256 dx, __m256i) {
    return update_d(acc, isum, h.d, dx);
  }
};

// The grid i-quants through decode_avx2.h's bytes; Pre::d carries the format's power-of-two unit.
template <class B, class By, void (*Scales)(const B&, int, int*), float (*D)(const B&)>
struct KGrid {
  using Bytes = By;
  static constexpr int kSubs = kBlocksK, kMin = 0;
  static constexpr bool kUnsigned = false;
  struct Pre {
    float d, m;
    const B* b;
  };
  STRATA_SIMD static Pre pre(const uint8_t* blk) {
    const B* b = reinterpret_cast<const B*>(blk);
    return {D(*b), 0.0f, b};
  }
  STRATA_SIMD static __m256i bytes(const Pre& p, int j) { return Bytes::q(*p.b, j); }
  static void scales(const Pre& p, int j, int sc[2]) { Scales(*p.b, j, sc); }
  static int min(const Pre&, int) { return 0; }
};
inline float d_iq3_xxs(const BlockIQ3_XXS& b) { return h2f(b.d) * 0.25f; }
inline float d_iq3_s(const BlockIQ3_S& b) { return h2f(b.d); }
inline float d_iq2_s(const BlockIQ2_S& b) { return h2f(b.d) * 0.125f; }
inline float d_iq1_s(const BlockIQ1_S& b) { return h2f(b.d) * 0.125f; }
inline float d_iq1_m(const BlockIQ1_M& b) { return h2f(iq1_m_d(b)) * 0.125f; }
#define STRATA_KGRID(name, B, By) using KG_##name = KGrid<B, By, scales_##name, d_##name>;
STRATA_KGRID(iq3_xxs, BlockIQ3_XXS, IQ3_XXSBytes)
STRATA_KGRID(iq3_s, BlockIQ3_S, IQ3_SBytes)
STRATA_KGRID(iq2_s, BlockIQ2_S, IQ2_SBytes)
STRATA_KGRID(iq1_s, BlockIQ1_S, IQ1_SBytes)
STRATA_KGRID(iq1_m, BlockIQ1_M, IQ1_MBytes)
#undef STRATA_KGRID
// IQ2_S with its scale vector laid out once per super-block (KBytes' spread8_pair).
struct KIQ2S : KG_iq2_s {
  struct Pre : KG_iq2_s::Pre {
    __m256i sc8;
  };
  STRATA_SIMD static Pre pre(const uint8_t* blk) {
    Pre p;
    static_cast<KG_iq2_s::Pre&>(p) = KG_iq2_s::pre(blk);
    p.sc8 = odd_nibbles(p.b->scales);
    return p;
  }
};

}  // namespace

void mmq_iq2_xs_avx2(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                     int64_t T, float* Y, int64_t ldy) {
  mmq_avx2<KIQ2_XS, IlIQ2_XS>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);
}
void mmq_iq2_xxs_avx2(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                      int64_t T, float* Y, int64_t ldy) {
  mmq_avx2<KIQ2_XXS, IlIQ2_XXS>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);
}
void mmq_iq2_s_avx2(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                    int64_t T, float* Y, int64_t ldy) {
  mmq_avx2<KBytes<KIQ2S>, IlBytes<KIQ2S>>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);
}
void mmq_iq4_xs_avx2(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                     int64_t T, float* Y, int64_t ldy) {
  mmq_avx2<KBytes<KIQ4>, IlBytes<KIQ4>>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);
}
void mmq_iq4_xs_vnni(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                     int64_t T, float* Y, int64_t ldy) {
  mmq_vnni<VIQ4_XS, KBytes<KIQ4>, VIlBytes<KIQ4>>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);
}
#define STRATA_GRID_AVX2(name)                                                                    \
  void mmq_##name##_avx2(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, \
                         int64_t xrb, int64_t T, float* Y, int64_t ldy) {                         \
    mmq_avx2<KBytes<KG_##name>, IlBytes<KG_##name>>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);       \
  }
STRATA_GRID_AVX2(iq3_xxs)
STRATA_GRID_AVX2(iq3_s)
STRATA_GRID_AVX2(iq1_s)
STRATA_GRID_AVX2(iq1_m)
#undef STRATA_GRID_AVX2
// IQ2_XS and IQ2_XXS: VNNI from T = 5 (T = 8 1.4-1.6x; at T = 3 the VNNI tile measured 0.9-1.0x).
void mmq_iq2_xs_vnni(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                     int64_t T, float* Y, int64_t ldy) {
  mmq_vnni<KIQ2_XS, KIQ2_XS, VIlIQ2_XS, 4>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);
}
void mmq_iq2_xxs_vnni(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                      int64_t T, float* Y, int64_t ldy) {
  mmq_vnni<KIQ2_XXS, KIQ2_XXS, VIlIQ2_XXS, 4>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);
}
// The grid i-quants: VNNI from T = 3 (1.1-1.8x); at T <= 2 their AVX2 tile (the VNNI one measured 0.75-1.04x:
// the grid decode dominates there).
#define STRATA_GRID_VNNI(name, K)                                                                 \
  void mmq_##name##_vnni(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, \
                         int64_t xrb, int64_t T, float* Y, int64_t ldy) {                         \
    mmq_vnni<KBytes<K>, KBytes<K>, VIlBytes<K>>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);           \
  }
STRATA_GRID_VNNI(iq3_xxs, KG_iq3_xxs)
STRATA_GRID_VNNI(iq3_s, KG_iq3_s)
STRATA_GRID_VNNI(iq1_s, KG_iq1_s)
STRATA_GRID_VNNI(iq1_m, KG_iq1_m)
STRATA_GRID_VNNI(iq2_s, KIQ2S)
#undef STRATA_GRID_VNNI
#endif

}  // namespace quant_detail
}  // namespace strata
