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
#include "quant/iq2xs_grid.h"

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

}  // namespace strata
