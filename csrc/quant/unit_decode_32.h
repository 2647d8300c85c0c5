// unit_decode.h's register decoders for the 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4):
// units as dequant_row's values, 32-blocks as int8 lanes with matmul_q8's sums and float steps.
// Included by unit_decode.h; layouts from formats.h.
#pragma once
#include <cstddef>
#include <cstdint>

namespace strata::unit {

using rn::add;

// Words of bytes [p, p + 4N) at any address (MXFP4's 17-byte blocks), from byte reads.
template <int N>
STRATA_HD inline void ld_words_any(const uint8_t* p, uint32_t w[N]) {
  STRATA_UNROLL
  for (int i = 0; i < N; ++i)
    w[i] =
        ld8(p + 4 * i) | (ld8(p + 4 * i + 1) << 8) | (ld8(p + 4 * i + 2) << 16) | (ld8(p + 4 * i + 3) << 24);
}
// Bits 4k..4k+3 of n spread to bit 0 of bytes 0..3 (the shifted copies do not overlap).
STRATA_HD inline uint32_t spread4(uint32_t n) { return ((n & 0xF) * 0x00204081u) & kOnes; }
// (q - bias) byte by byte without borrows, as int8 lanes, for q in [0, 127] and bias <= 128.
STRATA_HD inline uint32_t minus_bias(uint32_t q, uint32_t bias) {
  return ((q | 0x80808080u) - bias * kOnes) ^ 0x80808080u;
}
// Codebook values of the 4 codes of a word, as int8 lanes.
STRATA_HD inline uint32_t lookup4(uint32_t codes, uint64_t lo, uint64_t hi) {
  uint32_t r = 0;
  STRATA_UNROLL
  for (int k = 0; k < 4; ++k)
    r |= static_cast<uint32_t>(static_cast<uint8_t>(codebook(lo, hi, (codes >> (8 * k)) & 0xF))) << (8 * k);
  return r;
}

// The common shape: kQs the offset of the 16 code bytes, kQh that of the fifth bits (or -1); the format
// gives kBias (subtracted from q), kCode (a codebook or none), the scale d, the min (or none).
template <class Self>
struct Legacy32 {
  static constexpr bool kWholeSums = true;  // q8_iv reads only lo + hi and xlo + xhi
  static constexpr int kBlock = kQK4;
  // Unit u's sixteen 5-bit (or 4-bit) codes, four to a word.
  STRATA_HD static void codes(const uint8_t* b, int u, uint32_t q[4]) {
    if constexpr (Self::kAnyAddress)
      ld_words_any<4>(b + Self::kQs, q);
    else
      ld_words<4>(b + Self::kQs, q);
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) q[i] = (q[i] >> (4 * u)) & 0x0F0F0F0Fu;
    if constexpr (Self::kQh >= 0) {
      const uint32_t qh = ld16(b + Self::kQh) | (ld16(b + Self::kQh + 2) << 16);
      STRATA_UNROLL
      for (int i = 0; i < 4; ++i) q[i] |= spread4(qh >> (16 * u + 4 * i)) << 4;
    }
  }
  // The 32-block's codes as int8 lanes: the signed values Self multiplies.
  STRATA_HD static void lanes(const uint8_t* b, uint32_t q[8]) {
    codes(b, 0, q);
    codes(b, 1, q + 4);
    STRATA_UNROLL
    for (int i = 0; i < 8; ++i) q[i] = Self::lane_values(q[i]);
  }

  // (Self defines kPairs: 2 with a min, else 1, and kNeedsXSum: whether it has a min.)
  STRATA_HD static void q8_weights(const uint8_t* b, int, Q8Weights& w) {
    w.d = Self::scale(b);
    if constexpr (Self::kHasMin) w.dmin = half_float(ld16(b + Self::kM));
    lanes(b, w.q);
  }
  STRATA_HD static void q8_ints(const Q8Weights& w, const Q8Act& x, int* iv) {
    int s = 0;
    STRATA_UNROLL
    for (int i = 0; i < 8; ++i) s = dp4a(w.q[i], x.q[i], s);
    iv[0] = s;
    if constexpr (Self::kHasMin) iv[1] = x.sum;
  }
  STRATA_HD static void q8_iv(const Q8Weights&, int lo, int hi, [[maybe_unused]] int xlo,
                              [[maybe_unused]] int xhi, int* iv) {
    iv[0] = lo + hi;
    if constexpr (Self::kHasMin) iv[1] = xlo + xhi;
  }
  // a = fma(d * dx, S(v), a) (and a = fma(m * dx, S(1), a) with a min)
  STRATA_HD static float q8_fma(const Q8Weights& w, float dx, const int* iv, float a) {
    a = fma_rn(mul(w.d, dx), static_cast<float>(iv[0]), a);
    if constexpr (Self::kHasMin) a = fma_rn(mul(w.dmin, dx), static_cast<float>(iv[1]), a);
    return a;
  }
};

// gguf: d * (q - 8).
struct Q4_0 : Legacy32<Q4_0> {
  static constexpr QType kType = QType::Q4_0;
  static constexpr int kBytes = sizeof(BlockQ4_0), kQs = offsetof(BlockQ4_0, qs), kQh = -1;
  static constexpr bool kAnyAddress = false, kHasMin = false, kNeedsXSum = false;
  static constexpr int kM = 0, kPairs = 1;
  STRATA_HD static float scale(const uint8_t* b) { return half_float(ld16(b)); }
  STRATA_HD static uint32_t lane_values(uint32_t q) { return minus_bias(q, kQ4_0Bias); }
  STRATA_HD static void decode(const uint8_t* b, int u, float v[kUnit]) {
    const float d = scale(b);
    uint32_t q[4];
    codes(b, u, q);
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) STRATA_UNROLL
    for (int k = 0; k < 4; ++k) v[4 * i + k] = mul(d, u8_float(q[i], k) - static_cast<float>(kQ4_0Bias));
  }
};

// gguf: d * (q - 16).
struct Q5_0 : Legacy32<Q5_0> {
  static constexpr QType kType = QType::Q5_0;
  static constexpr int kBytes = sizeof(BlockQ5_0), kQs = offsetof(BlockQ5_0, qs),
                       kQh = offsetof(BlockQ5_0, qh);
  static constexpr bool kAnyAddress = false, kHasMin = false, kNeedsXSum = false;
  static constexpr int kM = 0, kPairs = 1;
  STRATA_HD static float scale(const uint8_t* b) { return half_float(ld16(b)); }
  STRATA_HD static uint32_t lane_values(uint32_t q) { return minus_bias(q, kQ5_0Bias); }
  STRATA_HD static void decode(const uint8_t* b, int u, float v[kUnit]) {
    const float d = scale(b);
    uint32_t q[4];
    codes(b, u, q);
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) STRATA_UNROLL
    for (int k = 0; k < 4; ++k) v[4 * i + k] = mul(d, u8_float(q[i], k) - static_cast<float>(kQ5_0Bias));
  }
};

// gguf: (d * q) + m.
template <class B, int Qh, QType T>
struct WithMin : Legacy32<WithMin<B, Qh, T>> {
  static constexpr QType kType = T;
  static constexpr int kBytes = sizeof(B), kQs = offsetof(B, qs), kQh = Qh;
  static constexpr bool kAnyAddress = false, kHasMin = true, kNeedsXSum = true;
  static constexpr int kM = offsetof(B, m), kPairs = 2;
  STRATA_HD static float scale(const uint8_t* b) { return half_float(ld16(b)); }
  STRATA_HD static uint32_t lane_values(uint32_t q) { return q; }
  STRATA_HD static void decode(const uint8_t* b, int u, float v[kUnit]) {
    const float d = scale(b), m = half_float(ld16(b + kM));
    uint32_t q[4];
    WithMin::codes(b, u, q);
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) STRATA_UNROLL
    for (int k = 0; k < 4; ++k) v[4 * i + k] = add(mul(d, u8_float(q[i], k)), m);
  }
};
using Q4_1 = WithMin<BlockQ4_1, -1, QType::Q4_1>;
using Q5_1 = WithMin<BlockQ5_1, static_cast<int>(offsetof(BlockQ5_1, qh)), QType::Q5_1>;

// gguf: d * codebook value, d an fp16 (IQ4_NL) or the halved E8M0 power of two (MXFP4).
template <class B, QType T, uint64_t Lo, uint64_t Hi, bool E8M0>
struct Codebook32 : Legacy32<Codebook32<B, T, Lo, Hi, E8M0>> {
  static constexpr QType kType = T;
  static constexpr int kBytes = sizeof(B), kQs = offsetof(B, qs), kQh = -1;
  static constexpr bool kAnyAddress = E8M0, kHasMin = false, kNeedsXSum = false;
  static constexpr int kM = 0, kPairs = 1;
  STRATA_HD static float scale(const uint8_t* b) {
    if constexpr (E8M0) return as_float(e8m0_half_bits(ld8(b)));
    return half_float(ld16(b));
  }
  STRATA_HD static uint32_t lane_values(uint32_t q) { return lookup4(q, Lo, Hi); }
  STRATA_HD static void decode(const uint8_t* b, int u, float v[kUnit]) {
    const float d = scale(b);
    uint32_t q[4];
    Codebook32::codes(b, u, q);
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) STRATA_UNROLL
    for (int k = 0; k < 4; ++k)
      v[4 * i + k] = mul(d, static_cast<float>(codebook(Lo, Hi, (q[i] >> (8 * k)) & 0xF)));
  }
};
using IQ4_NL = Codebook32<BlockIQ4_NL, QType::IQ4_NL, kIq4nlLo, kIq4nlHi, false>;
using MXFP4 = Codebook32<BlockMXFP4, QType::MXFP4, kMxfp4Lo, kMxfp4Hi, true>;

}  // namespace strata::unit
