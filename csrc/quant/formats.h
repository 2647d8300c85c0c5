// Each quant block format, described once for host and device code: the blocks exactly as ggml
// lays them out (ggml-common.h; halves are raw IEEE fp16 bits), where element i, its bits and its
// scales live, and how they decode. Every kernel reads a format only through this header.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/half.h"
#include "core/host_device.h"
#include "quant/iq1s_grid.h"
#include "quant/iq2s_grid.h"
#include "quant/iq2xs_grid.h"
#include "quant/iq2xxs_grid.h"
#include "quant/iq3s_grid.h"
#include "quant/iq3xxs_grid.h"

namespace strata {

constexpr int64_t kQK_K = 256;  // elements per k-quant / i-quant super-block
constexpr int64_t kQK8_0 = 32;  // elements per q8_0 block

// ---- Q8_0: x[i] = d * qs[i]. Also the layout of quantized activations (quantize_row_q8_0). ----

struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK8_0];
};
static_assert(sizeof(BlockQ8_0) == 34);
constexpr int64_t kQ8_0Bytes = sizeof(BlockQ8_0);

// ---- Q4_K: eight 32-element sub-blocks j; x = (d * sc_j) * q - dmin * m_j with q in [0, 15] and
// 6-bit sc_j, m_j packed in scales (gguf rounds d * sc_j and dmin * m_j to float32 first). ----

struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];  // 8 six-bit scales and 8 six-bit mins, packed
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);

// Sub-block j's 32 quants are the bits [shift, shift + 4) of qs[qs], ..., qs[qs + 31].
struct Q4_KSub {
  int qs, shift;
};
STRATA_HD constexpr Q4_KSub q4_k_sub(int j) { return {(j / 2) * 32, (j % 2) * 4}; }
constexpr int kQ4_KMask = 0xF;

// Element l of sub-block j, in [0, 15].
STRATA_HD constexpr int q4_k_q(const BlockQ4_K& b, int j, int l) {
  const Q4_KSub s = q4_k_sub(j);
  return (b.qs[s.qs + l] >> s.shift) & kQ4_KMask;
}

// ggml's get_scale_min_k4: sub-block j's 6-bit scale and min.
STRATA_HD constexpr void q4_k_scale_min(const uint8_t* scales, int j, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = scales[j] & 63;
    m = scales[j + 4] & 63;
  } else {
    sc = (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4);
    m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}

// All eight at once, with ggml's word-wide bit trick: sc[j], m[j] as q4_k_scale_min gives them.
STRATA_HD inline void q4_k_scales_mins(const uint8_t* scales, uint8_t sc[8], uint8_t m[8]) {
  uint32_t u[4];
  std::memcpy(u, scales, 12);
  constexpr uint32_t k1 = 0x3f3f3f3f, k2 = 0x0f0f0f0f, k3 = 0x03030303;
  u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
  const uint32_t mins_lo = u[1] & k1;
  u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
  u[2] = mins_lo;
  u[0] &= k1;
  std::memcpy(sc, u, 8);
  std::memcpy(m, u + 2, 8);
}

// ---- Q6_K: x[i] = (d * scales[i / 16]) * q[i] with 6-bit q[i] - 32 in [-32, 31]: its low 4 bits
// in ql, its high 2 bits in qh. ----

struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];  // low 4 bits
  uint8_t qh[kQK_K / 4];  // high 2 bits
  int8_t scales[kQK_K / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

// 32-element group p (0..7): element l's low 4 bits are the bits [ql_shift, ql_shift + 4) of
// ql[ql + l], its high 2 bits the bits [qh_shift, qh_shift + 2) of qh[qh + l]; elements 0-15
// take scales[scale], elements 16-31 scales[scale + 1].
struct Q6_KGroup {
  int ql, ql_shift, qh, qh_shift, scale;
};
STRATA_HD constexpr Q6_KGroup q6_k_group(int p) {
  return {(p / 4) * 64 + (p % 2) * 32, ((p % 4) / 2) * 4, (p / 4) * 32, (p % 4) * 2, 2 * p};
}
constexpr int kQ6_KLowMask = 0xF, kQ6_KHighMask = 3, kQ6_KBias = 32;

// Element l of group p, in [-32, 31].
STRATA_HD constexpr int q6_k_q(const BlockQ6_K& b, int p, int l) {
  const Q6_KGroup g = q6_k_group(p);
  return (((b.ql[g.ql + l] >> g.ql_shift) & kQ6_KLowMask) |
          (((b.qh[g.qh + l] >> g.qh_shift) & kQ6_KHighMask) << 4)) -
         kQ6_KBias;
}

// ---- IQ2_XS: eight 32-element blocks j, each two 16-element halves h with a 4-bit scale sc;
// qs[i / 8] codes the eight elements 8 (i / 8) + e as a 9-bit index into kIq2xsGrid (eight
// magnitudes, one per byte) and a 7-bit index into iq2_xs_signs.
// x = (d * (0.5 + sc) * 0.25) * magnitude * (+1 or -1). ----

struct BlockIQ2_XS {
  uint16_t d;
  uint16_t qs[kQK_K / 8];      // 9-bit grid index | 7-bit sign index, per 8 elements
  uint8_t scales[kQK_K / 32];  // two 4-bit scales per byte, each for 16 elements
};
static_assert(sizeof(BlockIQ2_XS) == 74);

// The scale of half h of 32-element block j: nibble h of scales[j].
STRATA_HD constexpr int iq2_xs_scale(const BlockIQ2_XS& b, int j, int h) {
  return (b.scales[j] >> (4 * h)) & 0xF;
}
// (0.5 + sc) * 0.25 == (2 sc + 1) * 0.125 exactly: the integer kernels' form of the scale.
STRATA_HD constexpr int iq2_xs_scale_odd(const BlockIQ2_XS& b, int j, int h) {
  return 2 * iq2_xs_scale(b, j, h) + 1;
}
constexpr float kIq2xsOddScaleUnit = 0.125f;
// gguf's group scale, one float32 rounding after each operation.
STRATA_HD inline float iq2_xs_group_scale(float d, int sc) {
  return d * (0.5f + static_cast<float>(sc)) * 0.25f;
}

STRATA_HD constexpr int iq2_xs_grid_index(uint16_t q) { return q & 511; }
STRATA_HD constexpr int iq2_xs_sign_index(uint16_t q) { return q >> 9; }
// Magnitude e (0..7) of a grid entry.
STRATA_HD constexpr int iq2_xs_grid_value(uint64_t entry, int e) {
  return static_cast<int>((entry >> (8 * e)) & 0xFF);
}
// ggml's ksigns_iq2xs[k]: bit e set means element e is negative; 7 bits from k plus an 8th that
// makes the count of negatives even.
STRATA_HD constexpr uint8_t iq2_xs_signs(int k) {
  unsigned p = static_cast<unsigned>(k);
  p ^= p >> 4;
  p ^= p >> 2;
  p ^= p >> 1;
  return static_cast<uint8_t>(k | ((p & 1u) << 7));
}
STRATA_HD constexpr bool iq2_xs_negative(uint8_t signs, int e) { return (signs >> e) & 1; }

// iq2_xs_signs as a table, for host kernels (device code computes it, or copies this table).
inline constexpr std::array<uint8_t, 128> kIq2xsSigns = [] {
  std::array<uint8_t, 128> t{};
  for (int k = 0; k < 128; ++k) t[k] = iq2_xs_signs(k);
  return t;
}();

// The largest grid magnitude: integer kernels bias signed grid values by it to make them unsigned.
constexpr int kIq2xsGridMax = 43;
static_assert([] {
  int m = 0;
  for (uint64_t entry : kIq2xsGrid)
    for (int e = 0; e < 8; ++e) m = iq2_xs_grid_value(entry, e) > m ? iq2_xs_grid_value(entry, e) : m;
  return m;
}() == kIq2xsGridMax);

// ---- Q2_K: sixteen 16-element groups g with a 4-bit scale (low nibble of scales[g]) and a 4-bit
// min (high nibble); 2-bit q. x = (d * sc_g) * q - dmin * m_g (gguf rounds d * sc_g and dmin * m_g
// to float32 first). ----

struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];  // scale | min << 4, per 16 elements
  uint8_t qs[kQK_K / 4];       // four 2-bit quants per byte
  uint16_t d;
  uint16_t dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// 32-element block j (0..7): its quants are the bits [shift, shift + 2) of qs[qs], ..., qs[qs + 31];
// elements 0-15 take group 2j, elements 16-31 group 2j + 1.
struct Q2_KSub {
  int qs, shift;
};
STRATA_HD constexpr Q2_KSub q2_k_sub(int j) { return {(j / 4) * 32, (j % 4) * 2}; }
constexpr int kQ2_KMask = 3;

// Element l of 32-element block j, in [0, 3].
STRATA_HD constexpr int q2_k_q(const BlockQ2_K& b, int j, int l) {
  const Q2_KSub s = q2_k_sub(j);
  return (b.qs[s.qs + l] >> s.shift) & kQ2_KMask;
}
STRATA_HD constexpr int q2_k_scale(const BlockQ2_K& b, int g) { return b.scales[g] & 0xF; }
STRATA_HD constexpr int q2_k_min(const BlockQ2_K& b, int g) { return b.scales[g] >> 4; }

// ---- IQ2_XXS: eight 32-element blocks j, each two 32-bit words: the first holds four 8-bit
// indices k into kIq2xxsGrid (eight magnitudes each, for elements 8k..8k+7), the second four 7-bit
// sign indices (bits 7k..7k+6, into iq2_xs_signs) and a 4-bit scale sc (bits 28..31).
// x = (d * (0.5 + sc) * 0.25) * magnitude * (+1 or -1), as IQ2_XS. ----

struct BlockIQ2_XXS {
  uint16_t d;
  uint16_t qs[kQK_K / 8];  // per 32-block: grid word (low, high half), sign/scale word (low, high)
};
static_assert(sizeof(BlockIQ2_XXS) == 66);

// Word w (0: grid indices, 1: signs and scale) of 32-element block j.
STRATA_HD constexpr uint32_t iq2_xxs_word(const BlockIQ2_XXS& b, int j, int w) {
  return static_cast<uint32_t>(b.qs[4 * j + 2 * w]) | (static_cast<uint32_t>(b.qs[4 * j + 2 * w + 1]) << 16);
}
STRATA_HD constexpr int iq2_xxs_grid_index(uint32_t grid_word, int k) {
  return (grid_word >> (8 * k)) & 0xFF;
}
STRATA_HD constexpr int iq2_xxs_sign_index(uint32_t sign_word, int k) { return (sign_word >> (7 * k)) & 127; }
STRATA_HD constexpr int iq2_xxs_scale(uint32_t sign_word) { return static_cast<int>(sign_word >> 28); }

// ---- The 32-element formats. Element l of a block is nibble l / 16 of qs[l % 16]; Q5_0 and Q5_1 add
// bit l of the little-endian word qh as its fifth bit. Q4_0: x = d * (q - 8); Q4_1: x = (d * q) + m;
// Q5_0: x = d * (q - 16); Q5_1: x = (d * q) + m; IQ4_NL: x = d * kIq4nlValues[q]; MXFP4: x = e *
// kMxfp4Values[q] with e an E8M0 power of two (halved: the values are doubled e2m1). ----

constexpr int64_t kQK4 = 32;  // elements per block of the 32-element formats

struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK4 / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);
struct BlockQ4_1 {
  uint16_t d, m;
  uint8_t qs[kQK4 / 2];
};
static_assert(sizeof(BlockQ4_1) == 20);
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK4 / 2];
};
static_assert(sizeof(BlockQ5_0) == 22);
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[kQK4 / 2];
};
static_assert(sizeof(BlockQ5_1) == 24);
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[kQK4 / 2];
};
static_assert(sizeof(BlockIQ4_NL) == 18);
struct BlockMXFP4 {  // 17 bytes: blocks sit at any byte
  uint8_t e;
  uint8_t qs[kQK4 / 2];
};
static_assert(sizeof(BlockMXFP4) == 17);

// The 4-bit code of element l (0..31) of a 32-element block's qs.
STRATA_HD constexpr int nibble_q(const uint8_t* qs, int l) { return (qs[l % 16] >> (4 * (l / 16))) & 0xF; }
// The fifth bit of element l from the 4 bytes of qh.
STRATA_HD constexpr int q5_high(const uint8_t* qh, int l) { return (qh[l / 8] >> (l % 8)) & 1; }
constexpr int kQ4_0Bias = 8, kQ5_0Bias = 16;

// The non-linear codebooks, eight signed bytes to a word (device code reads them as constants).
constexpr uint64_t kIq4nlLo = 0xF6EADDCFBFAD9881ull, kIq4nlHi = 0x7159453526190D01ull;
constexpr uint64_t kMxfp4Lo = 0x0C08060403020100ull, kMxfp4Hi = 0xF4F8FAFCFDFEFF00ull;
STRATA_HD constexpr int codebook(uint64_t lo, uint64_t hi, int k) {
  return static_cast<int8_t>(static_cast<uint8_t>((k < 8 ? lo : hi) >> (8 * (k & 7))));
}
STRATA_HD constexpr int iq4_nl_value(int k) { return codebook(kIq4nlLo, kIq4nlHi, k); }
STRATA_HD constexpr int mxfp4_value(int k) { return codebook(kMxfp4Lo, kMxfp4Hi, k); }
// ggml's kvalues_iq4nl and kvalues_mxfp4 (e2m1 doubled).
static_assert(iq4_nl_value(0) == -127 && iq4_nl_value(1) == -104 && iq4_nl_value(2) == -83 &&
              iq4_nl_value(3) == -65 && iq4_nl_value(4) == -49 && iq4_nl_value(5) == -35 &&
              iq4_nl_value(6) == -22 && iq4_nl_value(7) == -10 && iq4_nl_value(8) == 1 &&
              iq4_nl_value(9) == 13 && iq4_nl_value(10) == 25 && iq4_nl_value(11) == 38 &&
              iq4_nl_value(12) == 53 && iq4_nl_value(13) == 69 && iq4_nl_value(14) == 89 &&
              iq4_nl_value(15) == 113);
static_assert(mxfp4_value(0) == 0 && mxfp4_value(1) == 1 && mxfp4_value(2) == 2 && mxfp4_value(3) == 3 &&
              mxfp4_value(4) == 4 && mxfp4_value(5) == 6 && mxfp4_value(6) == 8 && mxfp4_value(7) == 12 &&
              mxfp4_value(8) == 0 && mxfp4_value(9) == -1 && mxfp4_value(10) == -2 && mxfp4_value(11) == -3 &&
              mxfp4_value(12) == -4 && mxfp4_value(13) == -6 && mxfp4_value(14) == -8 &&
              mxfp4_value(15) == -12);
// ggml_e8m0_to_fp32_half: 2^(e - 128) as float bits, subnormal for e < 2.
STRATA_HD constexpr uint32_t e8m0_half_bits(uint32_t e) { return e < 2 ? 0x00200000u << e : (e - 1) << 23; }

// ---- Q5_K: Q4_K's sub-blocks, scales and mins, with a fifth bit: bit j of qh[l] for element l of
// sub-block j. x = (d * sc_j) * q - dmin * m_j with q in [0, 31] (d * sc_j, dmin * m_j rounded first). ----

struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];  // as Q4_K's
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];  // as Q4_K's
};
static_assert(sizeof(BlockQ5_K) == 176);

STRATA_HD constexpr int q5_k_q(const BlockQ5_K& b, int j, int l) {
  const Q4_KSub s = q4_k_sub(j);
  return ((b.qs[s.qs + l] >> s.shift) & kQ4_KMask) | (((b.qh[l] >> j) & 1) << 4);
}

// ---- Q3_K: eight 32-element blocks j; element l of block j has its low 2 bits at bits
// [2 (j % 4), +2) of qs[32 (j / 4) + l] and its high bit at bit j of hmask[l]; q = low - (high ? 0 : 4)
// in [-4, 3]. Sixteen 6-bit scales, one per 16 elements, minus 32. x = (d * sc_g) * q. ----

struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];  // low 4 bits: bytes 0-7 (g < 8 low nibble, else high); high 2 bits: bytes 8-11
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);

struct Q3_KSub {
  int qs, shift;
};
STRATA_HD constexpr Q3_KSub q3_k_sub(int j) { return {(j / 4) * 32, (j % 4) * 2}; }
constexpr int kQ3_KBias = 4;
STRATA_HD constexpr int q3_k_q(const BlockQ3_K& b, int j, int l) {
  const Q3_KSub s = q3_k_sub(j);
  return ((b.qs[s.qs + l] >> s.shift) & 3) - (((b.hmask[l] >> j) & 1) ? 0 : kQ3_KBias);
}
// The scale of 16-element group g (0..15), in [-32, 31].
STRATA_HD constexpr int q3_k_scale(const uint8_t* scales, int g) {
  const int lo = g < 8 ? scales[g] & 0xF : scales[g - 8] >> 4;
  const int hi = (scales[8 + g % 4] >> (2 * (g / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

// ---- IQ4_XS: eight 32-element blocks j with a 6-bit scale (low 4 bits: nibble j % 2 of scales_l[j / 2],
// high 2: bits 2j, 2j + 1 of scales_h) minus 32; element l of block j is kIq4nl[nibble_q(qs + 16 j, l)].
// x = (d * sc_j) * value. ----

struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[kQK_K / 64];
  uint8_t qs[kQK_K / 2];
};
static_assert(sizeof(BlockIQ4_XS) == 136);

STRATA_HD constexpr int iq4_xs_scale(const BlockIQ4_XS& b, int j) {
  return (((b.scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((b.scales_h >> (2 * j)) & 3) << 4)) - 32;
}

// ---- The grid i-quants. Each 32-element block j of a super-block has an integer scale and 32 grid
// values (magnitude times sign); `..._value(b, j, l)` is element l's, `..._scale(b, j, h)` the scale of
// its half h, and the float value is (db * magnitude) * sign as gguf computes it (IQ1: dl * (g + delta)).
// The accessors that read a grid are host-only: device code reads its copies (unit_decode.h). ----

// IQ3_XXS: qs[8 j + k] indexes kIq3xxsGrid (four magnitudes) for elements 4k..4k+3; the word at sas + 4 j
// holds four 7-bit sign indices (into iq2_xs_signs, one per 8 elements) and a 4-bit scale s (bits 28-31).
// db = d * (0.5 + s) * 0.5.
struct BlockIQ3_XXS {
  uint16_t d;
  uint8_t qs[kQK_K / 4];
  uint8_t sas[kQK_K / 8];
};
static_assert(sizeof(BlockIQ3_XXS) == 98);
STRATA_HD constexpr uint32_t iq3_xxs_word(const BlockIQ3_XXS& b, int j) {
  return static_cast<uint32_t>(b.sas[4 * j]) | (static_cast<uint32_t>(b.sas[4 * j + 1]) << 8) |
         (static_cast<uint32_t>(b.sas[4 * j + 2]) << 16) | (static_cast<uint32_t>(b.sas[4 * j + 3]) << 24);
}
STRATA_HD constexpr int iq3_xxs_scale(const BlockIQ3_XXS& b, int j) {
  return static_cast<int>(iq3_xxs_word(b, j) >> 28);
}
constexpr int iq3_xxs_magnitude(const BlockIQ3_XXS& b, int j, int l) {
  return static_cast<int>((kIq3xxsGrid[b.qs[8 * j + l / 4]] >> (8 * (l % 4))) & 0xFF);
}
STRATA_HD constexpr bool iq3_xxs_negative(const BlockIQ3_XXS& b, int j, int l) {
  return iq2_xs_negative(iq2_xs_signs(static_cast<int>((iq3_xxs_word(b, j) >> (7 * (l / 8))) & 127)), l % 8);
}

// IQ3_S: grid index i (0..63) = qs[i] | bit i % 8 of qh[i / 8] << 8, into kIq3sGrid (four magnitudes) for
// elements 4i..4i+3; element n's sign is bit n % 8 of signs[n / 8]; block j's 4-bit scale s is nibble
// j % 2 of scales[j / 2]. db = d * (1 + 2 s).
struct BlockIQ3_S {
  uint16_t d;
  uint8_t qs[kQK_K / 4];
  uint8_t qh[kQK_K / 32];
  uint8_t signs[kQK_K / 8];
  uint8_t scales[kQK_K / 64];
};
static_assert(sizeof(BlockIQ3_S) == 110);
STRATA_HD constexpr int iq3_s_scale(const BlockIQ3_S& b, int j) {
  return (b.scales[j / 2] >> (4 * (j % 2))) & 0xF;
}
constexpr int iq3_s_magnitude(const BlockIQ3_S& b, int j, int l) {
  const int i = 8 * j + l / 4;
  const int index = b.qs[i] | (((b.qh[i / 8] >> (i % 8)) & 1) << 8);
  return static_cast<int>((kIq3sGrid[index] >> (8 * (l % 4))) & 0xFF);
}
STRATA_HD constexpr bool bit_sign(const uint8_t* signs, int n) { return (signs[n / 8] >> (n % 8)) & 1; }

// IQ2_S: grid index i (0..31) = qs[i] | bits 2 (i % 4) of qh[i / 4] << 8, into kIq2sGrid (eight magnitudes)
// for elements 8i..8i+7; element n's sign is bit n % 8 of signs[n / 8]; 16-element group g's 4-bit scale is
// nibble g % 2 of scales[g / 2]. db = d * (0.5 + s) * 0.25, as IQ2_XS.
struct BlockIQ2_S {
  uint16_t d;
  uint8_t qs[kQK_K / 8];
  uint8_t signs[kQK_K / 8];
  uint8_t qh[kQK_K / 32];
  uint8_t scales[kQK_K / 32];
};
static_assert(sizeof(BlockIQ2_S) == 82);
STRATA_HD constexpr int iq2_s_scale(const BlockIQ2_S& b, int g) {
  return (b.scales[g / 2] >> (4 * (g % 2))) & 0xF;
}
constexpr int iq2_s_magnitude(const BlockIQ2_S& b, int n) {
  const int i = n / 8;
  const int index = b.qs[i] | (((b.qh[i / 4] >> (2 * (i % 4))) & 3) << 8);
  return static_cast<int>((kIq2sGrid[index] >> (8 * (n % 8))) & 0xFF);
}

// IQ1_S: 32-element block j's 16-bit qh[j] holds four 3-bit high parts of its grid indices (bits 3k..3k+2,
// for elements 8k..8k+7: index qs[4 j + k] | high << 8, into kIq1sGrid: eight values in {-1, 0, 1}), a 3-bit
// scale s (bits 12-14) and the sign of delta (bit 15). x = (d * (2 s + 1)) * (g + delta), delta = +-1/8;
// the integer kernels use 8 g + 8 delta in [-9, 9].
struct BlockIQ1_S {
  uint16_t d;
  uint8_t qs[kQK_K / 8];
  uint16_t qh[kQK_K / 32];
};
static_assert(sizeof(BlockIQ1_S) == 50);
constexpr float kIq1Delta = 0.125f;
constexpr int iq1_grid_value(int index, int e) {
  return static_cast<int8_t>(static_cast<uint8_t>((kIq1sGrid[index] >> (8 * e)) & 0xFF));
}
STRATA_HD constexpr int iq1_s_scale(const BlockIQ1_S& b, int j) { return (b.qh[j] >> 12) & 7; }
STRATA_HD constexpr bool iq1_s_delta_negative(const BlockIQ1_S& b, int j) { return (b.qh[j] >> 15) & 1; }
// 8 (g + delta) of element l of block j, in [-9, 9].
constexpr int iq1_s_value8(const BlockIQ1_S& b, int j, int l) {
  const int k = l / 8, index = b.qs[4 * j + k] | (((b.qh[j] >> (3 * k)) & 7) << 8);
  return 8 * iq1_grid_value(index, l % 8) + (iq1_s_delta_negative(b, j) ? -1 : 1);
}

// IQ1_M: no d field: its 16 bits are the top nibbles of the four 16-bit words of scales, which also hold
// sixteen 3-bit scales s (word w bits 3f..3f+2: elements 16 (4 w + f)..). Grid index i (0..31) = qs[i] |
// bits 0-2 of nibble i % 2 of qh[i / 2] << 8, for elements 8i..8i+7; bit 3 of that nibble is the sign of
// its delta. x = (d * (2 s + 1)) * (g + delta).
struct BlockIQ1_M {
  uint8_t qs[kQK_K / 8];
  uint8_t qh[kQK_K / 16];
  uint8_t scales[kQK_K / 32];
};
static_assert(sizeof(BlockIQ1_M) == 56);
STRATA_HD constexpr uint32_t iq1_m_word(const BlockIQ1_M& b, int w) {
  return static_cast<uint32_t>(b.scales[2 * w]) | (static_cast<uint32_t>(b.scales[2 * w + 1]) << 8);
}
STRATA_HD constexpr uint16_t iq1_m_d(const BlockIQ1_M& b) {
  return static_cast<uint16_t>((iq1_m_word(b, 0) >> 12) | ((iq1_m_word(b, 1) >> 8) & 0xF0) |
                               ((iq1_m_word(b, 2) >> 4) & 0xF00) | (iq1_m_word(b, 3) & 0xF000));
}
STRATA_HD constexpr int iq1_m_scale(const BlockIQ1_M& b, int g) {
  return (iq1_m_word(b, g / 4) >> (3 * (g % 4))) & 7;
}
constexpr int iq1_m_value8(const BlockIQ1_M& b, int n) {
  const int i = n / 8, nib = (b.qh[i / 2] >> (4 * (i % 2))) & 0xF;
  return 8 * iq1_grid_value(b.qs[i] | ((nib & 7) << 8), n % 8) + ((nib & 8) ? -1 : 1);
}

}  // namespace strata
