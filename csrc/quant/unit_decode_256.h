// unit_decode.h's register decoders for the newer 256-element formats (Q5_K, Q3_K, IQ4_XS): units as
// dequant_row's values, 32-blocks as int8 lanes with matmul_q8's sums and float steps. Included by
// unit_decode.h (after unit_decode_32.h, whose helpers it uses); layouts from formats.h.
#pragma once
#include <cstddef>
#include <cstdint>

#include "quant/unit_decode_32.h"  // its shared helpers (spread4, minus_bias, lookup4, add)

namespace strata::unit {

// gguf: d*sc and dmin*m rounded to float32 first, then (d*sc)*q - dmin*m, q in [0, 31].
struct Q5_K {
  static constexpr QType kType = QType::Q5_K;
  static constexpr int kBlock = kQK_K, kBytes = sizeof(BlockQ5_K);
  static constexpr int kD = offsetof(BlockQ5_K, d), kDmin = offsetof(BlockQ5_K, dmin),
                       kScales = offsetof(BlockQ5_K, scales), kQh = offsetof(BlockQ5_K, qh),
                       kQs = offsetof(BlockQ5_K, qs);
  // Elements 16 h .. 16 h + 15 (h < 2 words of 4, or all 32 for n = 8) of sub-block j, in [0, 31].
  template <int N>
  STRATA_HD static void codes(const uint8_t* b, int j, int h, uint32_t q[N]) {
    const Q4_KSub s = q4_k_sub(j);
    uint32_t hi[N];
    ld_words<N>(b + kQs + s.qs + kUnit * h, q);
    ld_words<N>(b + kQh + kUnit * h, hi);
    STRATA_UNROLL
    for (int i = 0; i < N; ++i)
      q[i] = ((q[i] >> s.shift) & (kQ4_KMask * kOnes)) | (((hi[i] >> j) & kOnes) << 4);
  }
  STRATA_HD static void decode(const uint8_t* b, int u, float v[kUnit]) {
    const int j = u / 2;
    uint8_t sc, m;
    q4_k_scale_min(b + kScales, j, sc, m);
    const float ds = mul(half_float(ld16(b + kD)), static_cast<float>(sc));
    const float dm = mul(half_float(ld16(b + kDmin)), static_cast<float>(m));
    uint32_t q[4];
    codes<4>(b, j, u % 2, q);
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) STRATA_UNROLL
    for (int k = 0; k < 4; ++k) v[4 * i + k] = sub(mul(ds, u8_float(q[i], k)), dm);
  }

  static constexpr int kPairs = 2;
  static constexpr bool kWholeSums = true;
  static constexpr bool kNeedsXSum = true;
  STRATA_HD static void q8_weights(const uint8_t* b, int j, Q8Weights& w) {
    w.d = half_float(ld16(b + kD));
    w.dmin = half_float(ld16(b + kDmin));
    uint8_t sc, m;
    q4_k_scale_min(b + kScales, j, sc, m);
    w.k0 = sc;
    w.m = m;
    codes<8>(b, j, 0, w.q);
  }
  STRATA_HD static void q8_ints(const Q8Weights& w, const Q8Act& x, int* iv) {
    int s = 0;
    STRATA_UNROLL
    for (int i = 0; i < 8; ++i) s = dp4a(w.q[i], x.q[i], s);
    iv[0] = w.k0 * s;
    iv[1] = w.m * x.sum;
  }
  STRATA_HD static void q8_iv(const Q8Weights& w, int lo, int hi, int xlo, int xhi, int* iv) {
    iv[0] = w.k0 * (lo + hi);
    iv[1] = w.m * (xlo + xhi);
  }
  // a = fma(d * dx, sc * S(q5), a); a = fma(-(dmin * dx), m * S(1), a)
  STRATA_HD static float q8_fma(const Q8Weights& w, float dx, const int* iv, float a) {
    a = fma_rn(mul(w.d, dx), static_cast<float>(iv[0]), a);
    return fma_rn(-mul(w.dmin, dx), static_cast<float>(iv[1]), a);
  }
};

// gguf: d * (sc - 32) rounded to float32 per 16 elements, then times q in [-4, 3].
struct Q3_K {
  static constexpr QType kType = QType::Q3_K;
  static constexpr int kBlock = kQK_K, kBytes = sizeof(BlockQ3_K);
  static constexpr int kHmask = offsetof(BlockQ3_K, hmask), kQs = offsetof(BlockQ3_K, qs),
                       kScales = offsetof(BlockQ3_K, scales), kD = offsetof(BlockQ3_K, d);
  // Elements 16 h .. of 32-block j as q + 4 in [0, 7], N words.
  template <int N>
  STRATA_HD static void codes(const uint8_t* b, int j, int h, uint32_t q[N]) {
    const Q3_KSub s = q3_k_sub(j);
    uint32_t hi[N];
    ld_words<N>(b + kQs + s.qs + kUnit * h, q);
    ld_words<N>(b + kHmask + kUnit * h, hi);
    STRATA_UNROLL
    for (int i = 0; i < N; ++i) q[i] = ((q[i] >> s.shift) & (3 * kOnes)) | (((hi[i] >> j) & kOnes) << 2);
  }
  STRATA_HD static int scale(const uint8_t* b, int g) {
    uint8_t sc[12];
    STRATA_UNROLL
    for (int i = 0; i < 12; ++i) sc[i] = static_cast<uint8_t>(ld8(b + kScales + i));
    return q3_k_scale(sc, g);
  }
  STRATA_HD static void decode(const uint8_t* b, int u, float v[kUnit]) {
    const float dl = mul(half_float(ld16(b + kD)), static_cast<float>(scale(b, u)));
    uint32_t q[4];
    codes<4>(b, u / 2, u % 2, q);
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) STRATA_UNROLL
    for (int k = 0; k < 4; ++k) v[4 * i + k] = mul(dl, u8_float(q[i], k) - static_cast<float>(kQ3_KBias));
  }

  static constexpr int kPairs = 1;
  static constexpr bool kWholeSums = false;
  static constexpr bool kNeedsXSum = false;
  STRATA_HD static void q8_weights(const uint8_t* b, int j, Q8Weights& w) {
    w.d = half_float(ld16(b + kD));
    w.k0 = scale(b, 2 * j);
    w.k1 = scale(b, 2 * j + 1);
    codes<8>(b, j, 0, w.q);
    STRATA_UNROLL
    for (int i = 0; i < 8; ++i) w.q[i] = minus_bias(w.q[i], kQ3_KBias);
  }
  STRATA_HD static void q8_ints(const Q8Weights& w, const Q8Act& x, int* iv) {
    int lo = 0, hi = 0;
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) {
      lo = dp4a(w.q[i], x.q[i], lo);
      hi = dp4a(w.q[i + 4], x.q[i + 4], hi);
    }
    iv[0] = w.k0 * lo + w.k1 * hi;
  }
  STRATA_HD static void q8_iv(const Q8Weights& w, int lo, int hi, int, int, int* iv) {
    iv[0] = w.k0 * lo + w.k1 * hi;
  }
  // a = fma(d * dx, sc_lo * S_lo(q3) + sc_hi * S_hi(q3), a)
  STRATA_HD static float q8_fma(const Q8Weights& w, float dx, const int* iv, float a) {
    return fma_rn(mul(w.d, dx), static_cast<float>(iv[0]), a);
  }
};

// gguf: d * (sc - 32) rounded to float32 per 32 elements, then times the codebook value.
struct IQ4_XS {
  static constexpr QType kType = QType::IQ4_XS;
  static constexpr int kBlock = kQK_K, kBytes = sizeof(BlockIQ4_XS);
  static constexpr int kD = offsetof(BlockIQ4_XS, d), kQs = offsetof(BlockIQ4_XS, qs);
  STRATA_HD static int scale(const uint8_t* b, int j) {
    return iq4_xs_scale(*reinterpret_cast<const BlockIQ4_XS*>(b), j);
  }
  // Half h of 32-block j's codes, four to a word.
  STRATA_HD static void codes(const uint8_t* b, int j, int h, uint32_t q[4]) {
    ld_words<4>(b + kQs + 16 * j, q);
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) q[i] = (q[i] >> (4 * h)) & 0x0F0F0F0Fu;
  }
  STRATA_HD static void decode(const uint8_t* b, int u, float v[kUnit]) {
    const float dl = mul(half_float(ld16(b + kD)), static_cast<float>(scale(b, u / 2)));
    uint32_t q[4];
    codes(b, u / 2, u % 2, q);
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) STRATA_UNROLL
    for (int k = 0; k < 4; ++k)
      v[4 * i + k] = mul(dl, static_cast<float>(iq4_nl_value((q[i] >> (8 * k)) & 0xF)));
  }

  static constexpr int kPairs = 1;
  static constexpr bool kWholeSums = true;
  static constexpr bool kNeedsXSum = false;
  STRATA_HD static void q8_weights(const uint8_t* b, int j, Q8Weights& w) {
    w.d = half_float(ld16(b + kD));
    w.k0 = scale(b, j);
    codes(b, j, 0, w.q);
    codes(b, j, 1, w.q + 4);
    STRATA_UNROLL
    for (int i = 0; i < 8; ++i) w.q[i] = lookup4(w.q[i], kIq4nlLo, kIq4nlHi);
  }
  STRATA_HD static void q8_ints(const Q8Weights& w, const Q8Act& x, int* iv) {
    int s = 0;
    STRATA_UNROLL
    for (int i = 0; i < 8; ++i) s = dp4a(w.q[i], x.q[i], s);
    iv[0] = w.k0 * s;
  }
  STRATA_HD static void q8_iv(const Q8Weights& w, int lo, int hi, int, int, int* iv) {
    iv[0] = w.k0 * (lo + hi);
  }
  // a = fma(d * dx, sc * S(v), a)
  STRATA_HD static float q8_fma(const Q8Weights& w, float dx, const int* iv, float a) {
    return fma_rn(mul(w.d, dx), static_cast<float>(iv[0]), a);
  }
};

}  // namespace strata::unit
