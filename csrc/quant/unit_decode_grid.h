// unit_decode.h's register decoders for the grid i-quants (IQ3_XXS, IQ3_S, IQ2_S, IQ1_S, IQ1_M): units as
// dequant_row's values, 32-blocks as int8 lanes with matmul_q8's sums and float steps. Included by
// unit_decode.h (after unit_decode_32.h); layouts from formats.h, codebooks from the quant/*_grid.h headers.
#pragma once
#include <cstddef>
#include <cstdint>

#include "quant/unit_decode_32.h"  // its shared helpers (spread4, minus_bias, lookup4, add)

namespace strata::unit {

// The codebooks where the code runs (STRATA_GRID and GridCopy: unit_decode.h).
#if defined(__CUDACC__)
__device__ const GridCopy<uint32_t, 256> kIq3xxsGridOnDevice = grid_copy(kIq3xxsGrid);
__device__ const GridCopy<uint32_t, 512> kIq3sGridOnDevice = grid_copy(kIq3sGrid);
__device__ const GridCopy<uint64_t, 1024> kIq2sGridOnDevice = grid_copy(kIq2sGrid);
__device__ const GridCopy<uint64_t, 2048> kIq1sGridOnDevice = grid_copy(kIq1sGrid);
#endif
STRATA_HD inline uint32_t iq3xxs_grid(int i) { return STRATA_GRID(kIq3xxsGrid, i); }
STRATA_HD inline uint32_t iq3s_grid(int i) { return STRATA_GRID(kIq3sGrid, i); }
STRATA_HD inline uint64_t iq2s_grid(int i) { return STRATA_GRID(kIq2sGrid, i); }
STRATA_HD inline uint64_t iq1s_grid(int i) { return STRATA_GRID(kIq1sGrid, i); }
#undef STRATA_GRID

// The integer kernels negate magnitudes byte by byte as (m ^ 0xFF) + 1, which carries into the next byte
// only for m = 0: no magnitude of these grids is 0.
template <class T, int N>
constexpr bool no_zero_byte(const T (&g)[N]) {
  for (int i = 0; i < N; ++i)
    for (int e = 0; e < static_cast<int>(sizeof(T)); ++e)
      if (((g[i] >> (8 * e)) & 0xFF) == 0) return false;
  return true;
}
static_assert(no_zero_byte(kIq3xxsGrid) && no_zero_byte(kIq3sGrid) && no_zero_byte(kIq2sGrid));

// Four magnitudes negated where bits 0-3 of `signs` are set, as int8 lanes.
STRATA_HD inline uint32_t signed4(uint32_t mag, uint32_t signs) {
  const uint32_t neg = spread4(signs) * 0xFFu;
  return (mag ^ neg) + (neg & kOnes);
}
// Bits [n, n + 4) of the bytes at p (n a multiple of 4).
STRATA_HD inline uint32_t sign_nibble(const uint8_t* p, int n) { return (ld8(p + n / 8) >> (n % 8)) & 0xF; }
// 8 g + delta for four IQ1 grid values g (signed bytes), as int8 lanes.
STRATA_HD inline uint32_t iq1_lanes(uint32_t g, int delta) {
  uint32_t r = 0;
  STRATA_UNROLL
  for (int k = 0; k < 4; ++k)
    r |= static_cast<uint32_t>(static_cast<uint8_t>(8 * static_cast<int8_t>(g >> (8 * k)) + delta))
         << (8 * k);
  return r;
}
// The sixteen values of a unit from four magnitude words and their signs (bit e of `signs`): (db * m) *
// (+-1).
STRATA_HD inline void signed_unit(const uint32_t mag[4], uint32_t signs, float db, float v[kUnit]) {
  STRATA_UNROLL
  for (int i = 0; i < 4; ++i) STRATA_UNROLL
  for (int k = 0; k < 4; ++k) {
    const float x = mul(db, u8_float(mag[i], k));
    v[4 * i + k] = (signs >> (4 * i + k)) & 1 ? -x : x;  // gguf multiplies by -1: the same value
  }
}

// Shared integer steps: one scale (k0) or two (k0, k1 for the halves) on the signed sums, then
// a = fma(d * dx, sum, a) with d carrying the format's power-of-two unit.
template <bool Halves>
struct GridQ8 {
  static constexpr int kPairs = 1;
  static constexpr bool kWholeSums = !Halves;
  static constexpr bool kNeedsXSum = false;
  STRATA_HD static void q8_ints(const Q8Weights& w, const Q8Act& x, int* iv) {
    int lo = 0, hi = 0;
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) {
      lo = dp4a(w.q[i], x.q[i], lo);
      hi = dp4a(w.q[i + 4], x.q[i + 4], hi);
    }
    iv[0] = Halves ? w.k0 * lo + w.k1 * hi : w.k0 * (lo + hi);
  }
  STRATA_HD static void q8_iv(const Q8Weights& w, int lo, int hi, int, int, int* iv) {
    iv[0] = Halves ? w.k0 * lo + w.k1 * hi : w.k0 * (lo + hi);
  }
  STRATA_HD static float q8_fma(const Q8Weights& w, float dx, const int* iv, float a) {
    return fma_rn(mul(w.d, dx), static_cast<float>(iv[0]), a);
  }
};

// gguf: db = d * (0.5 + s) * 0.5, then (db * magnitude) * (+-1). Integer: (d * 0.25) * dx, (2 s + 1) S.
struct IQ3_XXS : GridQ8<false> {
  static constexpr QType kType = QType::IQ3_XXS;
  static constexpr int kBlock = kQK_K, kBytes = sizeof(BlockIQ3_XXS);
  static constexpr int kD = offsetof(BlockIQ3_XXS, d), kQs = offsetof(BlockIQ3_XXS, qs),
                       kSas = offsetof(BlockIQ3_XXS, sas);
  STRATA_HD static uint32_t word(const uint8_t* b, int j) {
    return ld16(b + kSas + 4 * j) | (ld16(b + kSas + 4 * j + 2) << 16);
  }
  // Signs of elements 8k..8k+7 of block j (bit e: element 8k + e).
  STRATA_HD static uint32_t signs(uint32_t w, int k) {
    return iq2_xs_signs(static_cast<int>((w >> (7 * k)) & 127));
  }
  STRATA_HD static void decode(const uint8_t* b, int u, float v[kUnit]) {
    const int j = u / 2, h = u % 2;
    const uint32_t w = word(b, j);
    const float db = mul(mul(half_float(ld16(b + kD)), add(0.5f, static_cast<float>(w >> 28))), 0.5f);
    uint32_t mag[4];
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) mag[i] = iq3xxs_grid(static_cast<int>(ld8(b + kQs + 8 * j + 4 * h + i)));
    signed_unit(mag, signs(w, 2 * h) | (signs(w, 2 * h + 1) << 8), db, v);
  }
  STRATA_HD static void q8_weights(const uint8_t* b, int j, Q8Weights& w) {
    const uint32_t sw = word(b, j);
    w.d = mul(half_float(ld16(b + kD)), 0.25f);
    w.k0 = 2 * static_cast<int>(sw >> 28) + 1;
    STRATA_UNROLL
    for (int i = 0; i < 8; ++i)
      w.q[i] =
          signed4(iq3xxs_grid(static_cast<int>(ld8(b + kQs + 8 * j + i))), signs(sw, i / 2) >> (4 * (i % 2)));
  }
};

// gguf: db = d * (1 + 2 s), then (db * magnitude) * (+-1). Integer: d * dx, (1 + 2 s) S.
struct IQ3_S : GridQ8<false> {
  static constexpr QType kType = QType::IQ3_S;
  static constexpr int kBlock = kQK_K, kBytes = sizeof(BlockIQ3_S);
  static constexpr int kD = offsetof(BlockIQ3_S, d), kQs = offsetof(BlockIQ3_S, qs),
                       kQh = offsetof(BlockIQ3_S, qh), kSigns = offsetof(BlockIQ3_S, signs),
                       kScales = offsetof(BlockIQ3_S, scales);
  STRATA_HD static uint32_t magnitudes(const uint8_t* b, int i) {  // grid entry i (0..63)
    return iq3s_grid(static_cast<int>(ld8(b + kQs + i) | (((ld8(b + kQh + i / 8) >> (i % 8)) & 1) << 8)));
  }
  STRATA_HD static int scale(const uint8_t* b, int j) {
    return (ld8(b + kScales + j / 2) >> (4 * (j % 2))) & 0xF;
  }
  STRATA_HD static void decode(const uint8_t* b, int u, float v[kUnit]) {
    const float db = mul(half_float(ld16(b + kD)), static_cast<float>(1 + 2 * scale(b, u / 2)));
    uint32_t mag[4];
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) mag[i] = magnitudes(b, 4 * u + i);
    signed_unit(mag, ld8(b + kSigns + 2 * u) | (ld8(b + kSigns + 2 * u + 1) << 8), db, v);
  }
  STRATA_HD static void q8_weights(const uint8_t* b, int j, Q8Weights& w) {
    w.d = half_float(ld16(b + kD));
    w.k0 = 1 + 2 * scale(b, j);
    STRATA_UNROLL
    for (int i = 0; i < 8; ++i)
      w.q[i] = signed4(magnitudes(b, 8 * j + i), sign_nibble(b + kSigns, 32 * j + 4 * i));
  }
};

// gguf: db = d * (0.5 + s) * 0.25 per 16 elements, then (db * magnitude) * (+-1). Integer: (d * 0.125) * dx,
// (2 s_lo + 1) S_lo + (2 s_hi + 1) S_hi.
struct IQ2_S : GridQ8<true> {
  static constexpr QType kType = QType::IQ2_S;
  static constexpr int kBlock = kQK_K, kBytes = sizeof(BlockIQ2_S);
  static constexpr int kD = offsetof(BlockIQ2_S, d), kQs = offsetof(BlockIQ2_S, qs),
                       kQh = offsetof(BlockIQ2_S, qh), kSigns = offsetof(BlockIQ2_S, signs),
                       kScales = offsetof(BlockIQ2_S, scales);
  STRATA_HD static uint64_t magnitudes(const uint8_t* b, int i) {  // grid entry i (0..31)
    return iq2s_grid(
        static_cast<int>(ld8(b + kQs + i) | (((ld8(b + kQh + i / 4) >> (2 * (i % 4))) & 3) << 8)));
  }
  STRATA_HD static int scale(const uint8_t* b, int g) {
    return (ld8(b + kScales + g / 2) >> (4 * (g % 2))) & 0xF;
  }
  STRATA_HD static void decode(const uint8_t* b, int u, float v[kUnit]) {
    const float db = iq2_xs_group_scale(half_float(ld16(b + kD)), scale(b, u));
    const uint64_t g0 = magnitudes(b, 2 * u), g1 = magnitudes(b, 2 * u + 1);
    const uint32_t mag[4] = {static_cast<uint32_t>(g0), static_cast<uint32_t>(g0 >> 32),
                             static_cast<uint32_t>(g1), static_cast<uint32_t>(g1 >> 32)};
    signed_unit(mag, ld8(b + kSigns + 2 * u) | (ld8(b + kSigns + 2 * u + 1) << 8), db, v);
  }
  STRATA_HD static void q8_weights(const uint8_t* b, int j, Q8Weights& w) {
    w.d = mul(half_float(ld16(b + kD)), 0.125f);
    w.k0 = 2 * scale(b, 2 * j) + 1;
    w.k1 = 2 * scale(b, 2 * j + 1) + 1;
    STRATA_UNROLL
    for (int i = 0; i < 8; ++i)
      w.q[i] = signed4(static_cast<uint32_t>(magnitudes(b, 4 * j + i / 2) >> (32 * (i % 2))),
                       sign_nibble(b + kSigns, 32 * j + 4 * i));
  }
};

// gguf: dl = d * (2 s + 1), then dl * (g + delta) with g + delta = (8 g + 8 delta) / 8 exactly.
// Integer: (d * 0.125) * dx, (2 s + 1) S(8 g + 8 delta) (halves with their own s for IQ1_M).
template <class Self, bool Halves>
struct Iq1 : GridQ8<Halves> {
  static constexpr int kBlock = kQK_K;
  // Grid entry i's eight values as two words of 8 g + delta.
  STRATA_HD static void lanes(const uint8_t* b, int i, uint32_t q[2]) {
    const uint64_t g = iq1s_grid(Self::index(b, i));
    const int delta = Self::delta_negative(b, i) ? -1 : 1;
    q[0] = iq1_lanes(static_cast<uint32_t>(g), delta);
    q[1] = iq1_lanes(static_cast<uint32_t>(g >> 32), delta);
  }
  STRATA_HD static void decode(const uint8_t* b, int u, float v[kUnit]) {
    const float dl = mul(Self::d(b), static_cast<float>(2 * Self::scale16(b, u) + 1));
    uint32_t q[4];
    lanes(b, 2 * u, q);
    lanes(b, 2 * u + 1, q + 2);
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) STRATA_UNROLL
    for (int k = 0; k < 4; ++k) v[4 * i + k] = mul(dl, mul(s8_float(q[i] ^ 0x80808080u, k), kIq1Delta));
  }
  STRATA_HD static void q8_weights(const uint8_t* b, int j, Q8Weights& w) {
    w.d = mul(Self::d(b), 0.125f);
    w.k0 = 2 * Self::scale16(b, 2 * j) + 1;
    w.k1 = 2 * Self::scale16(b, 2 * j + 1) + 1;
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) lanes(b, 4 * j + i, w.q + 2 * i);
  }
};

struct IQ1_S : Iq1<IQ1_S, false> {
  static constexpr QType kType = QType::IQ1_S;
  static constexpr int kBytes = sizeof(BlockIQ1_S);
  static constexpr int kD = offsetof(BlockIQ1_S, d), kQs = offsetof(BlockIQ1_S, qs),
                       kQh = offsetof(BlockIQ1_S, qh);
  STRATA_HD static float d(const uint8_t* b) { return half_float(ld16(b + kD)); }
  STRATA_HD static uint32_t qh(const uint8_t* b, int j) { return ld16(b + kQh + 2 * j); }
  STRATA_HD static int index(const uint8_t* b, int i) {  // grid entry i (0..31): block i / 4, group i % 4
    return static_cast<int>(ld8(b + kQs + i) | (((qh(b, i / 4) >> (3 * (i % 4))) & 7) << 8));
  }
  STRATA_HD static bool delta_negative(const uint8_t* b, int i) { return (qh(b, i / 4) >> 15) & 1; }
  STRATA_HD static int scale16(const uint8_t* b, int g) { return static_cast<int>((qh(b, g / 2) >> 12) & 7); }
};

struct IQ1_M : Iq1<IQ1_M, true> {
  static constexpr QType kType = QType::IQ1_M;
  static constexpr int kBytes = sizeof(BlockIQ1_M);
  static constexpr int kQs = offsetof(BlockIQ1_M, qs), kQh = offsetof(BlockIQ1_M, qh),
                       kScales = offsetof(BlockIQ1_M, scales);
  STRATA_HD static uint32_t word(const uint8_t* b, int w) { return ld16(b + kScales + 2 * w); }
  STRATA_HD static float d(const uint8_t* b) {
    return half_float((word(b, 0) >> 12) | ((word(b, 1) >> 8) & 0xF0) | ((word(b, 2) >> 4) & 0xF00) |
                      (word(b, 3) & 0xF000));
  }
  STRATA_HD static uint32_t nibble(const uint8_t* b, int i) {
    return (ld8(b + kQh + i / 2) >> (4 * (i % 2))) & 0xF;
  }
  STRATA_HD static int index(const uint8_t* b, int i) {
    return static_cast<int>(ld8(b + kQs + i) | ((nibble(b, i) & 7) << 8));
  }
  STRATA_HD static bool delta_negative(const uint8_t* b, int i) { return nibble(b, i) & 8; }
  STRATA_HD static int scale16(const uint8_t* b, int g) {
    return static_cast<int>((word(b, g / 4) >> (3 * (g % 4))) & 7);
  }
};

}  // namespace strata::unit
