// matmul_q8 for the 32-element formats: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4.
#include "quant/mmq.h"

namespace strata {
namespace quant_detail {

void mmq_q8_0_scalar(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                     int64_t T, float* Y, int64_t ldy) {
  for_outputs(W, rb, rows, cols, Xq, xrb, T, Y, ldy,
              [](float acc, const uint8_t* w, int64_t b, const int8_t* x, float dx) {
                const BlockQ8_0& blk = reinterpret_cast<const BlockQ8_0*>(w)[b];
                int32_t s = 0;
                for (int l = 0; l < kQK8_0; ++l) s += blk.qs[l] * x[l];
                return std::fma(fp16_to_f32(blk.d) * dx, static_cast<float>(s), acc);
              });
}

// S(v) over a 32-element block whose element l is value(blk, l); d the block's float scale.
template <class B, class V>
inline float legacy_block(float acc, float d, float dx, const int8_t* x, const B& blk, V value) {
  int32_t s = 0;
  for (int l = 0; l < kQK4; ++l) s += value(blk, l) * x[l];
  return std::fma(d * dx, static_cast<float>(s), acc);
}
// The same with a min: S(q), then m * S(1).
template <class B, class V>
inline float legacy_min_block(float acc, float d, float m, float dx, const int8_t* x, const B& blk, V value) {
  int32_t s = 0, sx = 0;
  for (int l = 0; l < kQK4; ++l) {
    s += value(blk, l) * x[l];
    sx += x[l];
  }
  acc = std::fma(d * dx, static_cast<float>(s), acc);
  return std::fma(m * dx, static_cast<float>(sx), acc);
}

#define STRATA_LEGACY_SCALAR(name, B, EXPR)                                                         \
  void mmq_##name##_scalar(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, \
                           int64_t xrb, int64_t T, float* Y, int64_t ldy) {                         \
    for_outputs(W, rb, rows, cols, Xq, xrb, T, Y, ldy,                                              \
                [](float acc, const uint8_t* w, int64_t b, const int8_t* x, float dx) {             \
                  const B& blk = reinterpret_cast<const B*>(w)[b];                                  \
                  return EXPR;                                                                      \
                });                                                                                 \
  }
STRATA_LEGACY_SCALAR(q4_0, BlockQ4_0,
                     legacy_block(acc, fp16_to_f32(blk.d), dx, x, blk,
                                  [](const BlockQ4_0& q, int l) { return nibble_q(q.qs, l) - kQ4_0Bias; }))
STRATA_LEGACY_SCALAR(q5_0, BlockQ5_0,
                     legacy_block(acc, fp16_to_f32(blk.d), dx, x, blk, [](const BlockQ5_0& q, int l) {
                       return (nibble_q(q.qs, l) | (q5_high(q.qh, l) << 4)) - kQ5_0Bias;
                     }))
STRATA_LEGACY_SCALAR(iq4_nl, BlockIQ4_NL,
                     legacy_block(acc, fp16_to_f32(blk.d), dx, x, blk, [](const BlockIQ4_NL& q, int l) {
                       return iq4_nl_value(nibble_q(q.qs, l));
                     }))
STRATA_LEGACY_SCALAR(mxfp4, BlockMXFP4,
                     legacy_block(acc, f32_from_bits(e8m0_half_bits(blk.e)), dx, x, blk,
                                  [](const BlockMXFP4& q, int l) { return mxfp4_value(nibble_q(q.qs, l)); }))
STRATA_LEGACY_SCALAR(q4_1, BlockQ4_1,
                     legacy_min_block(acc, fp16_to_f32(blk.d), fp16_to_f32(blk.m), dx, x, blk,
                                      [](const BlockQ4_1& q, int l) { return nibble_q(q.qs, l); }))
STRATA_LEGACY_SCALAR(q5_1, BlockQ5_1,
                     legacy_min_block(acc, fp16_to_f32(blk.d), fp16_to_f32(blk.m), dx, x, blk,
                                      [](const BlockQ5_1& q, int l) {
                                        return nibble_q(q.qs, l) | (q5_high(q.qh, l) << 4);
                                      }))
#undef STRATA_LEGACY_SCALAR

#if defined(__x86_64__)
namespace {

struct KQ8_0 {
  static constexpr int kSubs = 1;
  static constexpr size_t kBytes = sizeof(BlockQ8_0);
  struct Pre {
    float d;
    const int8_t* qs;
  };
  STRATA_SIMD static Pre pre(const uint8_t* blk) {
    const BlockQ8_0& b = *reinterpret_cast<const BlockQ8_0*>(blk);
    return {h2f(b.d), b.qs};
  }
  STRATA_SIMD static __m256i dot(const Pre& p, int, __m256i x) {
    const __m256i w = load256(p.qs);
    return madd1(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)));
  }
  template <int MR, int NT>
  STRATA_SIMD static __m256 update(__m256 acc, __m256i isum, const Pre* p, int, __m256 dx, __m256i) {
    const __m256 d = row_lanes_ps<MR, NT>([&](int r) { return p[r].d; });
    return _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(isum), acc);
  }
};

struct IlQ8_0 {  // scr = |w| (unsigned; 128 for -128); sign(x, w) carries the sign
  STRATA_SIMD static void unpack(const uint8_t* w, int64_t nb, uint8_t* scr) {
    const BlockQ8_0* blk = reinterpret_cast<const BlockQ8_0*>(w);
    for (int64_t b = 0; b < nb; ++b) store32(scr + b * 32, _mm256_abs_epi8(load256(blk[b].qs)));
  }
  template <int MR, int NV>
  STRATA_SIMD static void dots(const KQ8_0::Pre* p, int, const uint8_t* const* a, const int8_t* const* xv,
                               const __m256i*, __m256i* isum) {
    for (int i = 0; i < MR * NV; ++i) isum[i] = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      __m256i x[NV];
      for (int v = 0; v < NV; ++v) x[v] = xload(xv[v] + k * 32);
      for (int r = 0; r < MR; ++r) {
        const __m256i w = bcast4(reinterpret_cast<const uint8_t*>(p[r].qs) + 4 * k),
                      aw = bcast4(a[r] + 4 * k);
        for (int v = 0; v < NV; ++v)
          isum[r * NV + v] =
              _mm256_add_epi32(isum[r * NV + v], madd1(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x[v], w))));
      }
    }
  }
};

// The other 32-element formats: decode_avx2.h's bytes, one scale d per block (and a min m).
template <class F, int Min>
struct Legacy {
  using Bytes = F;
  static constexpr int kSubs = 1, kMin = Min;
  static constexpr bool kUnsigned = Min > 0;  // Q4_1, Q5_1: q in [0, 31]
  struct Pre {
    float d, m;
    const uint8_t* b;
  };
  STRATA_SIMD static Pre pre(const uint8_t* blk) {
    const Bytes32 v = F::at(blk, 0);
    return {v.s0, v.o0, blk};
  }
  STRATA_SIMD static __m256i bytes(const Pre& p, int) { return F::at(p.b, 0).v; }
  static void scales(const Pre&, int, int sc[2]) { sc[0] = sc[1] = 1; }
  static int min(const Pre&, int) { return 1; }
};

// VNNI: w + 128 times x, less 128 x per lane (T <= 4) or per token (T > 4).
struct VQ8_0 : KQ8_0 {
  static constexpr bool kVnni = true;
  // The lanes' fp16 scales by one gather (4 bytes from d: d and qs[0..1], inside the block), converted as h2f
  // converts them.
  using Head = __m256;
  STRATA_VNNI static Pre pre(const uint8_t* blk) {
    return {0.0f, reinterpret_cast<const BlockQ8_0*>(blk)->qs};
  }
  STRATA_VNNI static Head head(const uint8_t* blk0, __m256i off) {
    return fp16_lanes(gather_at(blk0, offsetof(BlockQ8_0, d), off));
  }
  STRATA_VNNI static __m256 vupdate(__m256 acc, __m256i isum, Head d, int, __m256 dx, __m256i) {
    return update_d(acc, isum, d, dx);
  }
  STRATA_VNNI static __m256i xcorr(__m256i x) { return neg_sums(x, static_cast<char>(0x80)); }
  STRATA_VNNI static __m256i vdot(const Pre& p, int, __m256i x, __m256i xc) {
    return dpbusd(xc, flip(load256(p.qs)), x);
  }
};
struct VIlQ8_0 {  // scr = w + 128 (w ^ 0x80, unsigned)
  STRATA_VNNI static void unpack(const uint8_t* w, int64_t nb, uint8_t* scr) {
    const BlockQ8_0* blk = reinterpret_cast<const BlockQ8_0*>(w);
    for (int64_t b = 0; b < nb; ++b) store32(scr + b * 32, flip(load256(blk[b].qs)));
  }
  template <int MR, int NV>
  STRATA_VNNI static void dots(const KQ8_0::Pre*, int, const uint8_t* const* a, const int8_t* const* xv,
                               const __m256i*, const __m256i* xs, __m256i* isum) {
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v)
        isum[r * NV + v] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(xs[v], 7));
    vstep_sums<MR, NV>(a, xv, 0, 8, isum);
  }
};

// MXFP4: the lanes' E8M0 bytes by one gather (4 bytes from e, inside the block), made e8m0_half_bits' floats;
// the codebook with 128 added gives the unsigned bytes directly.
struct VMXFP4 : VBytes<Legacy<MXFP4Bytes, 0>> {
  using Head = __m256;
  STRATA_VNNI static Head head(const uint8_t* blk0, __m256i off) {
    const __m256i e =
        _mm256_and_si256(gather_at(blk0, offsetof(BlockMXFP4, e), off), _mm256_set1_epi32(0xFF));
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);  // e < 2
    const __m256i norm = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __mmask8 small = _mm256_cmplt_epi32_mask(e, _mm256_set1_epi32(2));
    return _mm256_castsi256_ps(_mm256_mask_blend_epi32(small, norm, sub));
  }
  STRATA_VNNI static __m256 vupdate(__m256 acc, __m256i isum, Head d, int, __m256 dx, __m256i) {
    return update_d(acc, isum, d, dx);
  }
  STRATA_VNNI static __m256i vdot(const Pre& p, int, __m256i x, __m256i xc) {
    const BlockMXFP4& b = *reinterpret_cast<const BlockMXFP4*>(p.b);
    return dpbusd(xc, _mm256_shuffle_epi8(codebook32_u(kMxfp4Lo, kMxfp4Hi), nibbles32(b.qs)), x);
  }
};

// The other 32-element formats: the lanes' d (and m) by one gather of the block's first 4 bytes.
template <class F, int Min>
struct VLegacy : VBytes<Legacy<F, Min>> {
  struct Head {
    __m256 d, m;
  };
  STRATA_VNNI static Head head(const uint8_t* blk0, __m256i off) {
    const __m256i v = gather_at(blk0, 0, off);  // d | m << 16 (Q4_1, Q5_1)
    return {fp16_lanes(v), Min > 0 ? fp16_lanes(_mm256_srli_epi32(v, 16)) : _mm256_setzero_ps()};
  }
  STRATA_VNNI static __m256 vupdate(__m256 acc, __m256i isum, const Head& h, int, __m256 dx, __m256i xsum) {
    acc = update_d(acc, isum, h.d, dx);
    if constexpr (Min > 0) return _mm256_fmadd_ps(_mm256_mul_ps(h.m, dx), _mm256_cvtepi32_ps(xsum), acc);
    return acc;
  }
};
static_assert(offsetof(BlockQ4_0, d) == 0 && offsetof(BlockQ5_0, d) == 0 && offsetof(BlockIQ4_NL, d) == 0 &&
              offsetof(BlockQ4_1, d) == 0 && offsetof(BlockQ4_1, m) == 2 && offsetof(BlockQ5_1, d) == 0 &&
              offsetof(BlockQ5_1, m) == 2);

}  // namespace

#define STRATA_LEGACY_AVX2(name, F, MIN)                                                              \
  void mmq_##name##_avx2(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq,     \
                         int64_t xrb, int64_t T, float* Y, int64_t ldy) {                             \
    mmq_avx2<KBytes<Legacy<F, MIN>>, IlBytes<Legacy<F, MIN>>>(W, rb, rows, cols, Xq, xrb, T, Y, ldy); \
  }
STRATA_LEGACY_AVX2(q4_0, Q4_0Bytes, 0)
STRATA_LEGACY_AVX2(q5_0, Q5_0Bytes, 0)
STRATA_LEGACY_AVX2(iq4_nl, IQ4_NLBytes, 0)
STRATA_LEGACY_AVX2(mxfp4, MXFP4Bytes, 0)
STRATA_LEGACY_AVX2(q4_1, Q4_1Bytes, 1)
STRATA_LEGACY_AVX2(q5_1, Q5_1Bytes, 1)
#undef STRATA_LEGACY_AVX2

void mmq_q8_0_avx2(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                   int64_t T, float* Y, int64_t ldy) {
  mmq_avx2<KQ8_0, IlQ8_0>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);
}

#define STRATA_LEGACY_VNNI(name, F, MIN)                                                                    \
  void mmq_##name##_vnni(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq,           \
                         int64_t xrb, int64_t T, float* Y, int64_t ldy) {                                   \
    mmq_vnni<VLegacy<F, MIN>, KBytes<Legacy<F, MIN>>, VIlBytes<Legacy<F, MIN>>>(W, rb, rows, cols, Xq, xrb, \
                                                                                T, Y, ldy);                 \
  }
STRATA_LEGACY_VNNI(q4_0, Q4_0Bytes, 0)
STRATA_LEGACY_VNNI(q5_0, Q5_0Bytes, 0)
STRATA_LEGACY_VNNI(iq4_nl, IQ4_NLBytes, 0)
STRATA_LEGACY_VNNI(q4_1, Q4_1Bytes, 1)
STRATA_LEGACY_VNNI(q5_1, Q5_1Bytes, 1)
#undef STRATA_LEGACY_VNNI
void mmq_mxfp4_vnni(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                    int64_t T, float* Y, int64_t ldy) {
  mmq_vnni<VMXFP4, KBytes<Legacy<MXFP4Bytes, 0>>, VIlBytes<Legacy<MXFP4Bytes, 0>>>(W, rb, rows, cols, Xq, xrb,
                                                                                   T, Y, ldy);
}

void mmq_q8_0_vnni(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                   int64_t T, float* Y, int64_t ldy) {
  mmq_vnni<VQ8_0, KQ8_0, VIlQ8_0>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);
}
#endif

}  // namespace quant_detail
}  // namespace strata
