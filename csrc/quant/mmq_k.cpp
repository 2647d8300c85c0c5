// matmul_q8 for the k-quants: Q2_K, Q3_K, Q4_K, Q5_K and Q6_K.
#include <type_traits>

#include "quant/mmq.h"

namespace strata {
namespace quant_detail {

void mmq_q4_k_scalar(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                     int64_t T, float* Y, int64_t ldy) {
  for_outputs(W, rb, rows, cols, Xq, xrb, T, Y, ldy,
              [](float acc, const uint8_t* w, int64_t b, const int8_t* x, float dx) {
                const BlockQ4_K& blk = reinterpret_cast<const BlockQ4_K*>(w)[b / kBlocksK];
                const int j = static_cast<int>(b % kBlocksK);
                uint8_t sc, m;
                q4_k_scale_min(blk.scales, j, sc, m);
                int32_t s = 0, sx = 0;
                for (int l = 0; l < kQK8_0; ++l) {
                  s += q4_k_q(blk, j, l) * x[l];
                  sx += x[l];
                }
                acc = std::fma(fp16_to_f32(blk.d) * dx, static_cast<float>(sc * s), acc);
                return std::fma(-(fp16_to_f32(blk.dmin) * dx), static_cast<float>(m * sx), acc);
              });
}

void mmq_q6_k_scalar(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                     int64_t T, float* Y, int64_t ldy) {
  for_outputs(W, rb, rows, cols, Xq, xrb, T, Y, ldy,
              [](float acc, const uint8_t* w, int64_t b, const int8_t* x, float dx) {
                const BlockQ6_K& blk = reinterpret_cast<const BlockQ6_K*>(w)[b / kBlocksK];
                const int p = static_cast<int>(b % kBlocksK);
                int32_t half[2] = {0, 0};
                for (int l = 0; l < kQK8_0; ++l) half[l / 16] += q6_k_q(blk, p, l) * x[l];
                const int8_t* sc = blk.scales + q6_k_group(p).scale;
                return std::fma(fp16_to_f32(blk.d) * dx,
                                static_cast<float>(sc[0] * half[0] + sc[1] * half[1]), acc);
              });
}

void mmq_q2_k_scalar(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                     int64_t T, float* Y, int64_t ldy) {
  for_outputs(W, rb, rows, cols, Xq, xrb, T, Y, ldy,
              [](float acc, const uint8_t* w, int64_t b, const int8_t* x, float dx) {
                const BlockQ2_K& blk = reinterpret_cast<const BlockQ2_K*>(w)[b / kBlocksK];
                const int j = static_cast<int>(b % kBlocksK);
                int32_t s = 0, sm = 0;
                for (int h = 0; h < 2; ++h) {  // the 32-block's two 16-element groups
                  int32_t sq = 0, sx = 0;
                  for (int l = 16 * h; l < 16 * h + 16; ++l) {
                    sq += q2_k_q(blk, j, l) * x[l];
                    sx += x[l];
                  }
                  s += q2_k_scale(blk, 2 * j + h) * sq;
                  sm += q2_k_min(blk, 2 * j + h) * sx;
                }
                acc = std::fma(fp16_to_f32(blk.d) * dx, static_cast<float>(s), acc);
                return std::fma(-(fp16_to_f32(blk.dmin) * dx), static_cast<float>(sm), acc);
              });
}

void mmq_q5_k_scalar(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                     int64_t T, float* Y, int64_t ldy) {
  for_outputs(W, rb, rows, cols, Xq, xrb, T, Y, ldy,
              [](float acc, const uint8_t* w, int64_t b, const int8_t* x, float dx) {
                const BlockQ5_K& blk = reinterpret_cast<const BlockQ5_K*>(w)[b / kBlocksK];
                const int j = static_cast<int>(b % kBlocksK);
                uint8_t sc, m;
                q4_k_scale_min(blk.scales, j, sc, m);
                int32_t s = 0, sx = 0;
                for (int l = 0; l < kQK8_0; ++l) {
                  s += q5_k_q(blk, j, l) * x[l];
                  sx += x[l];
                }
                acc = std::fma(fp16_to_f32(blk.d) * dx, static_cast<float>(sc * s), acc);
                return std::fma(-(fp16_to_f32(blk.dmin) * dx), static_cast<float>(m * sx), acc);
              });
}

void mmq_q3_k_scalar(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                     int64_t T, float* Y, int64_t ldy) {
  for_outputs(W, rb, rows, cols, Xq, xrb, T, Y, ldy,
              [](float acc, const uint8_t* w, int64_t b, const int8_t* x, float dx) {
                const BlockQ3_K& blk = reinterpret_cast<const BlockQ3_K*>(w)[b / kBlocksK];
                const int j = static_cast<int>(b % kBlocksK);
                int32_t half[2] = {0, 0};
                for (int l = 0; l < kQK8_0; ++l) half[l / 16] += q3_k_q(blk, j, l) * x[l];
                const int s =
                    q3_k_scale(blk.scales, 2 * j) * half[0] + q3_k_scale(blk.scales, 2 * j + 1) * half[1];
                return std::fma(fp16_to_f32(blk.d) * dx, static_cast<float>(s), acc);
              });
}

#if defined(__x86_64__)
namespace {

// q in [0, 15].
STRATA_SIMD inline __m256i q4_k_bytes(const BlockQ4_K& b, int j) {
  const Q4_KSub s = q4_k_sub(j);
  return _mm256_and_si256(_mm256_srli_epi16(load256(b.qs + s.qs), s.shift), _mm256_set1_epi8(kQ4_KMask));
}

// q + kQ6_KBias, in [0, 63].
STRATA_SIMD inline __m256i q6_k_bytes(const BlockQ6_K& b, int j) {
  const Q6_KGroup g = q6_k_group(j);
  const __m256i lo =
      _mm256_and_si256(_mm256_srli_epi16(load256(b.ql + g.ql), g.ql_shift), _mm256_set1_epi8(kQ6_KLowMask));
  const __m256i hi =
      _mm256_and_si256(_mm256_srli_epi16(load256(b.qh + g.qh), g.qh_shift), _mm256_set1_epi8(kQ6_KHighMask));
  return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
}

struct KQ4_K {
  static constexpr int kSubs = kBlocksK;
  static constexpr bool kPairs = true;  // mmq.h's tile: two 32-blocks a step
  static constexpr size_t kBytes = sizeof(BlockQ4_K);
  struct Pre {
    float d, dmin;
    uint8_t sc[8], m[8];
    const BlockQ4_K* b;
  };
  STRATA_SIMD static Pre pre(const uint8_t* blk) {
    const BlockQ4_K* b = reinterpret_cast<const BlockQ4_K*>(blk);
    Pre p;
    p.d = h2f(b->d);
    p.dmin = h2f(b->dmin);
    q4_k_scales_mins(b->scales, p.sc, p.m);
    p.b = b;
    return p;
  }
  STRATA_SIMD static __m256i dot(const Pre& p, int j, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(q4_k_bytes(*p.b, j), x), _mm256_set1_epi16(p.sc[j]));
  }
  template <int MR, int NT>
  STRATA_SIMD static __m256 update(__m256 acc, __m256i isum, const Pre* p, int j, __m256 dx, __m256i xsum) {
    const __m256 d = row_lanes_ps<MR, NT>([&](int r) { return p[r].d; });
    const __m256 dmin = row_lanes_ps<MR, NT>([&](int r) { return p[r].dmin; });
    const __m256i m = row_lanes_epi32<MR, NT>([&](int r) { return static_cast<int32_t>(p[r].m[j]); });
    acc = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(isum), acc);
    const __m256 mdx = _mm256_xor_ps(_mm256_mul_ps(dmin, dx), _mm256_set1_ps(-0.0f));
    return _mm256_fmadd_ps(mdx, _mm256_cvtepi32_ps(_mm256_mullo_epi32(m, xsum)), acc);
  }
};

struct KQ6_K {
  static constexpr int kSubs = kBlocksK;
  static constexpr size_t kBytes = sizeof(BlockQ6_K);
  struct Pre {
    float d;
    const BlockQ6_K* b;
    __m256i sc8;  // the 16 scales in both lanes, for spread8_pair
  };
  STRATA_SIMD static Pre pre(const uint8_t* blk) {
    const BlockQ6_K* b = reinterpret_cast<const BlockQ6_K*>(blk);
    return {h2f(b->d), b,
            _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b->scales)))};
  }
  STRATA_SIMD static __m256i dot(const Pre& p, int j, __m256i x) {
    // (q + bias) . x - bias . x, each within int16.
    const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(q6_k_bytes(*p.b, j), x),
                                         _mm256_maddubs_epi16(_mm256_set1_epi8(kQ6_KBias), x));
    static_assert(q6_k_group(1).scale == 2);  // 32-block j's halves: scales 2j, 2j + 1
    return _mm256_madd_epi16(p16, spread8_pair(p.sc8, j));
  }
  template <int MR, int NT>
  STRATA_SIMD static __m256 update(__m256 acc, __m256i isum, const Pre* p, int, __m256 dx, __m256i) {
    const __m256 d = row_lanes_ps<MR, NT>([&](int r) { return p[r].d; });
    return _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(isum), acc);
  }
};

struct IlQ4_K {  // scr = nibbles 0..15; 8 steps of pairs stay below 2^15 in int16 (16 * 15 * 128)
  STRATA_SIMD static void unpack(const uint8_t* w, int64_t nb, uint8_t* scr) {
    const BlockQ4_K* blk = reinterpret_cast<const BlockQ4_K*>(w);
    for (int64_t b = 0; b < nb; ++b)
      store32(scr + b * 32, q4_k_bytes(blk[b / kBlocksK], static_cast<int>(b % kBlocksK)));
  }
  template <int MR, int NV>
  STRATA_SIMD static void dots(const KQ4_K::Pre* p, int j, const uint8_t* const* a, const int8_t* const* xv,
                               const __m256i*, __m256i* isum) {
    __m256i s16[MR * NV];
    step_sums<MR, NV>(a, xv, 0, 8, s16);
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v)
        isum[r * NV + v] = _mm256_madd_epi16(s16[r * NV + v], _mm256_set1_epi16(p[r].sc[j]));
  }
};

// scr = q + kQ6_KBias in [0, 63]; two steps per int16 (4 * 63 * 128); minus bias * scale * half sums after.
struct IlQ6_K {
  STRATA_SIMD static void unpack(const uint8_t* w, int64_t nb, uint8_t* scr) {
    const BlockQ6_K* blk = reinterpret_cast<const BlockQ6_K*>(w);
    for (int64_t b = 0; b < nb; ++b)
      store32(scr + b * 32, q6_k_bytes(blk[b / kBlocksK], static_cast<int>(b % kBlocksK)));
  }
  template <int MR, int NV>
  STRATA_SIMD static void dots(const KQ6_K::Pre* p, int j, const uint8_t* const* a, const int8_t* const* xv,
                               const __m256i* hs, __m256i* isum) {
    const int scale = q6_k_group(j).scale;  // halves: scales[scale], scales[scale + 1]
    for (int r = 0; r < MR; ++r) {
      const int8_t* sc = p[r].b->scales + scale;
      const __m256i c = _mm256_set1_epi32(pair16(kQ6_KBias * sc[0], kQ6_KBias * sc[1]));
      for (int v = 0; v < NV; ++v)
        isum[r * NV + v] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_madd_epi16(hs[v], c));
    }
    for (int hf = 0; hf < 2; ++hf)
      for (int kk = 0; kk < 4; kk += 2) {
        const int s0 = hf * 4 + kk;
        __m256i x0[NV], x1[NV];
        for (int v = 0; v < NV; ++v) x0[v] = xload(xv[v] + s0 * 32), x1[v] = xload(xv[v] + (s0 + 1) * 32);
        for (int r = 0; r < MR; ++r) {
          const __m256i a0 = bcast4(a[r] + 4 * s0), a1 = bcast4(a[r] + 4 * (s0 + 1));
          const __m256i sc = _mm256_set1_epi16(p[r].b->scales[scale + hf]);
          for (int v = 0; v < NV; ++v) {
            const __m256i s16 =
                _mm256_add_epi16(_mm256_maddubs_epi16(a0, x0[v]), _mm256_maddubs_epi16(a1, x1[v]));
            isum[r * NV + v] = _mm256_add_epi32(isum[r * NV + v], _mm256_madd_epi16(s16, sc));
          }
        }
      }
  }
};

// Q2_K: q in [0, 3], a scale and a min per 16 elements. The scaled sums go as KBytes' do (pairs of
// products stay within 2 * 3 * 128 in int16); the mins multiply the activation's half sums
// (madd of the int16 pairs), so both integer terms are the scalar kernel's exactly.
struct KQ2_K {
  static constexpr int kSubs = kBlocksK;
  static constexpr size_t kBytes = sizeof(BlockQ2_K);
  static constexpr bool kHalfMins = true;
  struct Pre {
    float d, dmin;
    const BlockQ2_K* b;
    __m256i sc8;  // the 16 scales (low nibbles) in both lanes, for spread8_pair
  };
  STRATA_SIMD static Pre pre(const uint8_t* blk) {
    const BlockQ2_K* b = reinterpret_cast<const BlockQ2_K*>(blk);
    const __m128i sc =
        _mm_and_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b->scales)), _mm_set1_epi8(0xF));
    return {h2f(b->d), h2f(b->dmin), b, _mm256_broadcastsi128_si256(sc)};
  }
  STRATA_SIMD static __m256i q(const BlockQ2_K& b, int j) {
    const Q2_KSub s = q2_k_sub(j);
    return _mm256_and_si256(_mm256_srl_epi16(load256(b.qs + s.qs), _mm_cvtsi32_si128(s.shift)),
                            _mm256_set1_epi8(3));
  }
  STRATA_SIMD static __m256i dot(const Pre& p, int j, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(q(*p.b, j), x), spread8_pair(p.sc8, j));
  }
  // a = fma(d * dx, s, a); a = fma(-(dmin * dx), m_lo * S_lo(x) + m_hi * S_hi(x), a)
  template <int MR, int NT>
  STRATA_SIMD static __m256 update(__m256 acc, __m256i isum, const Pre* p, int j, __m256 dx, __m256i,
                                   __m256i hsum) {
    const __m256 d = row_lanes_ps<MR, NT>([&](int r) { return p[r].d; });
    const __m256 dmin = row_lanes_ps<MR, NT>([&](int r) { return p[r].dmin; });
    const __m256i m = row_lanes_epi32<MR, NT>(
        [&](int r) { return pair16(q2_k_min(*p[r].b, 2 * j), q2_k_min(*p[r].b, 2 * j + 1)); });
    acc = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(isum), acc);
    const __m256 mdx = _mm256_xor_ps(_mm256_mul_ps(dmin, dx), _mm256_set1_ps(-0.0f));
    return _mm256_fmadd_ps(mdx, _mm256_cvtepi32_ps(_mm256_madd_epi16(hsum, m)), acc);
  }
};

// scr = q in [0, 3]; each half's four steps summed in int16 (4 * 2 * 3 * 128), then scaled.
struct IlQ2_K {
  STRATA_SIMD static void unpack(const uint8_t* w, int64_t nb, uint8_t* scr) {
    const BlockQ2_K* blk = reinterpret_cast<const BlockQ2_K*>(w);
    for (int64_t b = 0; b < nb; ++b)
      store32(scr + b * 32, KQ2_K::q(blk[b / kBlocksK], static_cast<int>(b % kBlocksK)));
  }
  template <int MR, int NV>
  STRATA_SIMD static void dots(const KQ2_K::Pre* p, int j, const uint8_t* const* a, const int8_t* const* xv,
                               const __m256i*, __m256i* isum) {
    for (int i = 0; i < MR * NV; ++i) isum[i] = _mm256_setzero_si256();
    for (int hf = 0; hf < 2; ++hf) {
      __m256i s16[MR * NV];
      step_sums<MR, NV>(a, xv, 4 * hf, 4 * hf + 4, s16);
      for (int r = 0; r < MR; ++r) {
        const __m256i sc = _mm256_set1_epi16(static_cast<int16_t>(q2_k_scale(*p[r].b, 2 * j + hf)));
        for (int v = 0; v < NV; ++v)
          isum[r * NV + v] = _mm256_add_epi32(isum[r * NV + v], _mm256_madd_epi16(s16[r * NV + v], sc));
      }
    }
  }
};

// Q5_K and Q3_K through decode_avx2.h's bytes.
struct KQ5 {
  using Bytes = Q5_KBytes;
  static constexpr int kSubs = kBlocksK, kMin = -1;
  static constexpr bool kUnsigned = true;  // q in [0, 31]
  struct Pre {
    float d, m;
    uint8_t sc[8], mn[8];
    const BlockQ5_K* b;
    __m256i sc16;
  };
  STRATA_SIMD static Pre pre(const uint8_t* blk) {
    Pre p;
    p.b = reinterpret_cast<const BlockQ5_K*>(blk);
    p.d = h2f(p.b->d);
    p.m = h2f(p.b->dmin);
    q4_k_scales_mins(p.b->scales, p.sc, p.mn);
    p.sc16 = _mm256_broadcastsi128_si256(
        _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p.sc))));
    return p;
  }
  STRATA_SIMD static __m256i bytes(const Pre& p, int j) { return Q5_KBytes::q(*p.b, j); }
  static void scales(const Pre& p, int j, int sc[2]) { sc[0] = sc[1] = p.sc[j]; }
  static int min(const Pre& p, int j) { return p.mn[j]; }
};
struct KQ3 {
  using Bytes = Q3_KBytes;
  static constexpr int kSubs = kBlocksK, kMin = 0;
  static constexpr bool kUnsigned = false;
  struct Pre {
    float d, m;
    int8_t sc[16];
    const BlockQ3_K* b;
    __m256i sc8;
  };
  STRATA_SIMD static Pre pre(const uint8_t* blk) {
    Pre p;
    p.b = reinterpret_cast<const BlockQ3_K*>(blk);
    p.d = h2f(p.b->d);
    p.m = 0.0f;
    // q3_k_scale for g = 0..15 at once: low 4 bits of scales[g % 8] (nibble g / 8), high 2 bits of
    // scales[8 + g % 4] (bits 2 (g / 4)), minus 32.
    const __m128i s = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p.b->scales)), m = _mm_set1_epi8(0xF);
    const __m128i lo = _mm_unpacklo_epi64(_mm_and_si128(s, m), _mm_and_si128(_mm_srli_epi16(s, 4), m));
    uint32_t h;
    std::memcpy(&h, p.b->scales + 8, 4);
    const __m128i hi =
        _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(static_cast<int32_t>(h)), _mm_setr_epi32(0, 2, 4, 6)),
                      _mm_set1_epi8(3));
    const __m128i sc = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p.sc), sc);
    p.sc8 = _mm256_broadcastsi128_si256(sc);
    return p;
  }
  STRATA_SIMD static __m256i bytes(const Pre& p, int j) { return Q3_KBytes::q(*p.b, j); }
  static void scales(const Pre& p, int j, int sc[2]) {
    sc[0] = p.sc[2 * j];
    sc[1] = p.sc[2 * j + 1];
  }
  static int min(const Pre&, int) { return 0; }
};

// VNNI, T <= 4, Q4_K and Q5_K (the same header: d, dmin, the 12 scale bytes): the lanes' d, dmin and 6-bit
// scales and mins decoded as vectors from gathers of the headers (q4_k_scales_mins' word trick, a row a
// lane), the scale on the reduced sums, the float steps KQ4_K::update's; the bytes are unsigned (no
// correction).
struct Q4_KHead {
  __m256 d, dmin;
  __m256i sc[2], m[2];  // byte j of each lane's eight scales (mins): sc[0] bytes 0-3, sc[1] bytes 4-7
};
template <class B>
struct VQ45_K {
  static constexpr bool kVnni = true, kPairs = true, kLaneScale = true;
  static constexpr int kSubs = kBlocksK;
  static constexpr size_t kBytes = sizeof(B);
  using Pre = const B*;
  using Head = Q4_KHead;
  STRATA_VNNI static Pre pre(const uint8_t* blk) { return reinterpret_cast<const B*>(blk); }
  STRATA_VNNI static Head head(const uint8_t* blk0, __m256i off) {
    static_assert(offsetof(B, d) == 0 && offsetof(B, dmin) == 2);
    const __m256i dm = gather_at(blk0, 0, off);
    const __m256i u0 = gather_at(blk0, offsetof(B, scales), off),
                  u1 = gather_at(blk0, offsetof(B, scales) + 4, off),
                  u2 = gather_at(blk0, offsetof(B, scales) + 8, off);
    const __m256i k1 = _mm256_set1_epi32(0x3f3f3f3f), k2 = _mm256_set1_epi32(0x0f0f0f0f),
                  k3 = _mm256_set1_epi32(0x03030303);
    Head h;
    h.d = fp16_lanes(dm);
    h.dmin = fp16_lanes(_mm256_srli_epi32(dm, 16));
    h.sc[0] = _mm256_and_si256(u0, k1);
    h.sc[1] = _mm256_or_si256(_mm256_and_si256(u2, k2),
                              _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), k3), 4));
    h.m[0] = _mm256_and_si256(u1, k1);
    h.m[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), k2),
                             _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), k3), 4));
    return h;
  }
  STRATA_VNNI static __m256i xcorr(__m256i) { return _mm256_setzero_si256(); }
  STRATA_VNNI static __m256i vdot(const Pre& p, int j, __m256i x, __m256i) {
    if constexpr (std::is_same_v<B, BlockQ4_K>)
      return dpbusd(_mm256_setzero_si256(), q4_k_bytes(*p, j), x);
    else
      return dpbusd(_mm256_setzero_si256(), Q5_KBytes::q(*p, j), x);
  }
  STRATA_VNNI static __m256i scale_lanes(const Head& h, int j) { return byte_lanes(h.sc, j); }
  STRATA_VNNI static __m256 vupdate(__m256 acc, __m256i isum, const Head& h, int j, __m256 dx, __m256i xsum) {
    acc = _mm256_fmadd_ps(_mm256_mul_ps(h.d, dx), _mm256_cvtepi32_ps(isum), acc);
    const __m256 mdx = _mm256_xor_ps(_mm256_mul_ps(h.dmin, dx), _mm256_set1_ps(-0.0f));
    return _mm256_fmadd_ps(mdx, _mm256_cvtepi32_ps(_mm256_mullo_epi32(byte_lanes(h.m, j), xsum)), acc);
  }
};
struct VIlQ4_K {
  // A super-block at a time: each 32-byte load gives two 32-blocks (low nibbles: j = 2i, high: 2i + 1, as
  // q4_k_sub), with the shifts known at compile time.
  STRATA_VNNI static void unpack(const uint8_t* w, int64_t nb, uint8_t* scr) {
    const BlockQ4_K* blk = reinterpret_cast<const BlockQ4_K*>(w);
    const __m256i m = _mm256_set1_epi8(kQ4_KMask);
    static_assert(q4_k_sub(3).qs == 32 && q4_k_sub(3).shift == 4);
    for (int64_t sb = 0; sb < nb / kBlocksK; ++sb, scr += kQK_K)
      for (int i = 0; i < 4; ++i) {
        const __m256i q = load256(blk[sb].qs + 32 * i);
        store32(scr + 64 * i, _mm256_and_si256(q, m));
        store32(scr + 64 * i + 32, _mm256_and_si256(_mm256_srli_epi16(q, 4), m));
      }
  }
  template <int MR, int NV>
  STRATA_VNNI static void dots(const KQ4_K::Pre* p, int j, const uint8_t* const* a, const int8_t* const* xv,
                               const __m256i*, const __m256i*, __m256i* isum) {
    for (int i = 0; i < MR * NV; ++i) isum[i] = _mm256_setzero_si256();
    vstep_sums<MR, NV>(a, xv, 0, 8, isum);
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v)
        isum[r * NV + v] = _mm256_mullo_epi32(isum[r * NV + v], _mm256_set1_epi32(p[r].sc[j]));
  }
};

// Q6_K: q + 32 in [0, 63] times x, less 32 x per lane. T <= 4: the lanes' d and sixteen int8 scales by
// gathers; the partials' two halves are reduced apart and scaled as lanes.
struct Q6_KHead {
  __m256 d;
  __m256i sc[4];  // scales[4k..4k+3] of each lane
};
struct VQ6_K {
  static constexpr bool kVnni = true, kHalfLaneScale = true;
  static constexpr int kSubs = kBlocksK;
  static constexpr size_t kBytes = sizeof(BlockQ6_K);
  using Pre = const BlockQ6_K*;
  using Head = Q6_KHead;
  STRATA_VNNI static Pre pre(const uint8_t* blk) { return reinterpret_cast<const BlockQ6_K*>(blk); }
  STRATA_VNNI static Head head(const uint8_t* blk0, __m256i off) {
    // d by the block's last 4 bytes (scales[14..15] and d: never past the block).
    static_assert(offsetof(BlockQ6_K, d) + 2 == sizeof(BlockQ6_K));
    Head h;
    h.d = fp16_lanes(_mm256_srli_epi32(gather_at(blk0, offsetof(BlockQ6_K, d) - 2, off), 16));
    for (int k = 0; k < 4; ++k) h.sc[k] = gather_at(blk0, offsetof(BlockQ6_K, scales) + 4 * k, off);
    return h;
  }
  STRATA_VNNI static __m256i xcorr(__m256i x) { return neg_sums(x, kQ6_KBias); }
  STRATA_VNNI static __m256i vdot(const Pre& p, int j, __m256i x, __m256i xc) {
    return dpbusd(xc, q6_k_bytes(*p, j), x);
  }
  // scales[g] of each lane, sign-extended (g = 2j, 2j + 1: q6_k_group(j).scale and the next).
  STRATA_VNNI static __m256i scale_lanes(const Head& h, int g) {
    static_assert(q6_k_group(1).scale == 2);
    return _mm256_srai_epi32(_mm256_sll_epi32(h.sc[g / 4], _mm_cvtsi32_si128(24 - 8 * (g % 4))), 24);
  }
  STRATA_VNNI static __m256 vupdate(__m256 acc, __m256i isum, const Head& h, int, __m256 dx, __m256i) {
    return update_d(acc, isum, h.d, dx);
  }
};
struct VIlQ6_K {
  // A super-block at a time, q6_k_group's layout with the shifts known at compile time: per half h, the low
  // bits of groups 4h..4h+3 from the low and high nibbles of two 32-byte ql loads, their high bits from one
  // qh.
  STRATA_VNNI static void unpack(const uint8_t* w, int64_t nb, uint8_t* scr) {
    const BlockQ6_K* blk = reinterpret_cast<const BlockQ6_K*>(w);
    const __m256i m4 = _mm256_set1_epi8(kQ6_KLowMask), m2 = _mm256_set1_epi8(kQ6_KHighMask);
    static_assert(q6_k_group(6).ql == 64 && q6_k_group(6).ql_shift == 4 && q6_k_group(6).qh == 32 &&
                  q6_k_group(6).qh_shift == 4 && q6_k_group(5).ql == 96);
    for (int64_t sb = 0; sb < nb / kBlocksK; ++sb, scr += kQK_K)
      for (int h = 0; h < 2; ++h) {
        const __m256i l0 = load256(blk[sb].ql + 64 * h), l1 = load256(blk[sb].ql + 64 * h + 32),
                      qh = load256(blk[sb].qh + 32 * h);
        const __m256i lo[4] = {_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4),
                               _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                               _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
        const __m256i hi[4] = {_mm256_and_si256(qh, m2), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2),
                               _mm256_and_si256(_mm256_srli_epi16(qh, 4), m2),
                               _mm256_and_si256(_mm256_srli_epi16(qh, 6), m2)};
        for (int g = 0; g < 4; ++g)
          store32(scr + (4 * h + g) * 32, _mm256_or_si256(lo[g], _mm256_slli_epi16(hi[g], 4)));
      }
  }
  template <int MR, int NV>
  STRATA_VNNI static void dots(const KQ6_K::Pre* p, int j, const uint8_t* const* a, const int8_t* const* xv,
                               const __m256i* hs, const __m256i*, __m256i* isum) {
    __m256i s0[MR * NV], s1[MR * NV];
    for (int v = 0; v < NV; ++v) {
      const __m256i c0 = _mm256_mullo_epi32(half_lo(hs[v]), _mm256_set1_epi32(-kQ6_KBias));
      const __m256i c1 = _mm256_mullo_epi32(half_hi(hs[v]), _mm256_set1_epi32(-kQ6_KBias));
      for (int r = 0; r < MR; ++r) s0[r * NV + v] = c0, s1[r * NV + v] = c1;
    }
    vstep_sums<MR, NV>(a, xv, 0, 4, s0);
    vstep_sums<MR, NV>(a, xv, 4, 8, s1);
    const int scale = q6_k_group(j).scale;
    for (int r = 0; r < MR; ++r) {
      const __m256i sc0 = _mm256_set1_epi32(p[r].b->scales[scale]),
                    sc1 = _mm256_set1_epi32(p[r].b->scales[scale + 1]);
      for (int v = 0; v < NV; ++v)
        isum[r * NV + v] = _mm256_add_epi32(_mm256_mullo_epi32(s0[r * NV + v], sc0),
                                            _mm256_mullo_epi32(s1[r * NV + v], sc1));
    }
  }
};

// Q2_K, T > 4 (T = 8 1.2x; at T = 3 the VNNI tile measured even): the AVX2 unpack (q in [0, 3], unsigned),
// each half's step sums by vpdpbusd, then scaled.
struct VIlQ2_K : IlQ2_K {
  template <int MR, int NV>
  STRATA_VNNI static void dots(const KQ2_K::Pre* p, int j, const uint8_t* const* a, const int8_t* const* xv,
                               const __m256i*, const __m256i*, __m256i* isum) {
    __m256i s0[MR * NV], s1[MR * NV];
    for (int i = 0; i < MR * NV; ++i) s0[i] = s1[i] = _mm256_setzero_si256();
    vstep_sums<MR, NV>(a, xv, 0, 4, s0);
    vstep_sums<MR, NV>(a, xv, 4, 8, s1);
    for (int r = 0; r < MR; ++r) {
      const __m256i sc0 = _mm256_set1_epi32(q2_k_scale(*p[r].b, 2 * j)),
                    sc1 = _mm256_set1_epi32(q2_k_scale(*p[r].b, 2 * j + 1));
      for (int v = 0; v < NV; ++v)
        isum[r * NV + v] = _mm256_add_epi32(_mm256_mullo_epi32(s0[r * NV + v], sc0),
                                            _mm256_mullo_epi32(s1[r * NV + v], sc1));
    }
  }
};

// Q5_K, T > 4: VIlBytes with the unpack a super-block at a time (Q5_KBytes::q's bytes, the fifth bits from
// one qh load, the shifts known at compile time).
struct VIlQ5_K : VIlBytes<KQ5> {
  STRATA_VNNI static void unpack(const uint8_t* w, int64_t nb, uint8_t* scr) {
    const BlockQ5_K* blk = reinterpret_cast<const BlockQ5_K*>(w);
    const __m256i m = _mm256_set1_epi8(0xF), one = _mm256_set1_epi8(1);
    static_assert(q4_k_sub(3).qs == 32 && q4_k_sub(3).shift == 4);
    for (int64_t sb = 0; sb < nb / kBlocksK; ++sb, scr += kQK_K) {
      const __m256i qh = load256(blk[sb].qh);
      for (int i = 0; i < 4; ++i) {
        const __m256i q = load256(blk[sb].qs + 32 * i);
        const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * i), one), 4);
        const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * i + 1), one), 4);
        store32(scr + 64 * i, _mm256_or_si256(_mm256_and_si256(q, m), h0));
        store32(scr + 64 * i + 32, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m), h1));
      }
    }
  }
};

// Q3_K: VBytes' halves, the lanes' d by one gather of the block's last 4 bytes.
struct VQ3_K : VBytes<KQ3> {
  using Head = __m256;
  STRATA_VNNI static Head head(const uint8_t* blk0, __m256i off) {
    static_assert(offsetof(BlockQ3_K, d) + 2 == sizeof(BlockQ3_K));
    return fp16_lanes(_mm256_srli_epi32(gather_at(blk0, offsetof(BlockQ3_K, d) - 2, off), 16));
  }
  STRATA_VNNI static __m256 vupdate(__m256 acc, __m256i isum, Head d, int, __m256 dx, __m256i) {
    return update_d(acc, isum, d, dx);
  }
};

}  // namespace

void mmq_q4_k_avx2(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                   int64_t T, float* Y, int64_t ldy) {
  mmq_avx2<KQ4_K, IlQ4_K>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);
}
void mmq_q6_k_avx2(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                   int64_t T, float* Y, int64_t ldy) {
  mmq_avx2<KQ6_K, IlQ6_K>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);
}
void mmq_q2_k_avx2(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                   int64_t T, float* Y, int64_t ldy) {
  mmq_avx2<KQ2_K, IlQ2_K>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);
}
void mmq_q5_k_avx2(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                   int64_t T, float* Y, int64_t ldy) {
  mmq_avx2<KBytes<KQ5>, IlBytes<KQ5>>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);
}
void mmq_q3_k_avx2(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                   int64_t T, float* Y, int64_t ldy) {
  mmq_avx2<KBytes<KQ3>, IlBytes<KQ3>>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);
}

void mmq_q2_k_vnni(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                   int64_t T, float* Y, int64_t ldy) {
  mmq_vnni<KQ2_K, KQ2_K, VIlQ2_K, 4>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);
}
void mmq_q4_k_vnni(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                   int64_t T, float* Y, int64_t ldy) {
  mmq_vnni<VQ45_K<BlockQ4_K>, KQ4_K, VIlQ4_K>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);
}
void mmq_q6_k_vnni(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                   int64_t T, float* Y, int64_t ldy) {
  mmq_vnni<VQ6_K, KQ6_K, VIlQ6_K>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);
}
void mmq_q5_k_vnni(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                   int64_t T, float* Y, int64_t ldy) {
  mmq_vnni<VQ45_K<BlockQ5_K>, KBytes<KQ5>, VIlQ5_K>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);
}
void mmq_q3_k_vnni(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                   int64_t T, float* Y, int64_t ldy) {
  mmq_vnni<VQ3_K, KBytes<KQ3>, VIlBytes<KQ3>>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);
}
#endif

}  // namespace quant_detail
}  // namespace strata
