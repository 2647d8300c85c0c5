// Register decoding of weight blocks for the GPU matmul kernels, written once for host and device so
// the host tests check it: 16-element units as the float32 values dequant_row gives (bit for bit),
// and 32-element blocks as int8 lanes with matmul_q8's integer sums and float steps (quant.h). Block
// layouts come from formats.h only.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/float_ops.h"
#include "core/half.h"
#include "core/host_device.h"
#include "quant/formats.h"
#include "quant/quant.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif
// Unrolled in device code, where arrays indexed by the loop stay in registers only so.
#if defined(__CUDA_ARCH__)
#define STRATA_UNROLL _Pragma("unroll")
#else
#define STRATA_UNROLL
#endif

namespace strata::unit {

using rn::as_float;
using rn::fma_rn;
using rn::mul;
using rn::sub;

// Elements decoded by one call of a format's decode().
constexpr int kUnit = 16;

// ---- reads. Blocks sit at any even address (blocks of 34, 74 and 210 bytes; rows any even number of
// bytes apart), so wide reads are assembled from aligned ones; none reads a byte it does not return. ----

STRATA_HD inline uint32_t ld8(const uint8_t* p) { return *p; }
STRATA_HD inline uint32_t ld16(const uint8_t* p) {  // p even
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint16_t*>(p);
#else
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
#endif
}
STRATA_HD inline uint32_t ld32(const uint8_t* p) {  // p a multiple of 4
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}
// The low 32 bits of (hi:lo) >> sh, for sh 0 or 16.
STRATA_HD inline uint32_t shr64(uint32_t lo, uint32_t hi, uint32_t sh) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_r(lo, hi, sh);
#else
  return static_cast<uint32_t>(((static_cast<uint64_t>(hi) << 32) | lo) >> sh);
#endif
}

// w[i] = bytes [p + 4i, p + 4i + 4) as a little-endian word, for p even: aligned words, the two
// halves at the ends read as 16-bit values where p is 2 past a multiple of 4.
template <int N>
STRATA_HD inline void ld_words(const uint8_t* p, uint32_t w[N]) {
  const bool odd = (reinterpret_cast<uintptr_t>(p) & 2) != 0;
  const uint32_t sh = odd ? 16u : 0u;
  const uint8_t* a = p - (odd ? 2 : 0);
  uint32_t v[N + 1];
  v[0] = odd ? ld16(p) << 16 : ld32(p);
  STRATA_UNROLL
  for (int i = 1; i < N; ++i) v[i] = ld32(a + 4 * i);
  v[N] = odd ? ld16(p + 4 * N - 2) : 0u;
  STRATA_UNROLL
  for (int i = 0; i < N; ++i) w[i] = shr64(v[i], v[i + 1], sh);
}

// ---- exact conversions and single-rounding float steps (never fused into an fma, whatever -fmad) ----

STRATA_HD inline uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, s);
#else
  const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return r;
#endif
}
// Byte k of w plus 2^23, exactly, as a float: one byte permute, where an int-to-float conversion runs
// at an eighth of the FMA rate on the GPU. Subtracting a constant then gives small integers exactly.
STRATA_HD inline float byte_plus_2p23(uint32_t w, int k) {
  return as_float(byte_perm(w, 0x4B000000u, 0x7650u | static_cast<uint32_t>(k)));
}
constexpr float k2p23 = 8388608.0f;
// Byte k of w as an unsigned value, and as a signed one when w was xor-ed with 0x80808080.
STRATA_HD inline float u8_float(uint32_t w, int k) { return byte_plus_2p23(w, k) - k2p23; }
STRATA_HD inline float s8_float(uint32_t w_xor80, int k) {
  return byte_plus_2p23(w_xor80, k) - (k2p23 + 128.0f);
}

STRATA_HD inline float half_float(uint32_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
#else
  return fp16_to_f32(static_cast<uint16_t>(h));
#endif
}
// c + the dot product of the four signed bytes of a and of b.
STRATA_HD inline int dp4a(uint32_t a, uint32_t b, int c) {
#if defined(__CUDA_ARCH__)
  return __dp4a(static_cast<int>(a), static_cast<int>(b), c);
#else
  for (int k = 0; k < 4; ++k) c += static_cast<int8_t>(a >> (8 * k)) * static_cast<int8_t>(b >> (8 * k));
  return c;
#endif
}
constexpr uint32_t kOnes = 0x01010101u;  // 1 in every byte

// The codebooks where the code runs: the quant/*_grid.h headers on the host, copies of them in device
// memory on the GPU (global rather than __constant__: lanes index them at random, which constant memory
// serializes). These copies are the device's only ones; every CUDA kernel decodes through them.
#if defined(__CUDACC__)
template <class T, int N>
struct GridCopy {
  T v[N];
};
template <class T, int N>
constexpr GridCopy<T, N> grid_copy(const T (&g)[N]) {
  GridCopy<T, N> c{};
  for (int i = 0; i < N; ++i) c.v[i] = g[i];
  return c;
}
__device__ const GridCopy<uint64_t, 512> kIq2xsGridOnDevice = grid_copy(kIq2xsGrid);
__device__ const GridCopy<uint64_t, 256> kIq2xxsGridOnDevice = grid_copy(kIq2xxsGrid);
#endif
#if defined(__CUDA_ARCH__)
#define STRATA_GRID(host, i) host##OnDevice.v[i]
#else
#define STRATA_GRID(host, i) host[i]
#endif
STRATA_HD inline uint64_t iq2_xs_grid(int i) { return STRATA_GRID(kIq2xsGrid, i); }
STRATA_HD inline uint64_t iq2_xxs_grid(int i) { return STRATA_GRID(kIq2xxsGrid, i); }
// The integer kernel negates magnitudes byte by byte as (m ^ 0xFF) + 1, which carries into the next
// byte only for m = 0: no grid magnitude is 0.
static_assert([] {
  for (uint64_t entry : kIq2xsGrid)
    for (int e = 0; e < 8; ++e)
      if (iq2_xs_grid_value(entry, e) == 0) return false;
  for (uint64_t entry : kIq2xxsGrid)
    for (int e = 0; e < 8; ++e)
      if (iq2_xs_grid_value(entry, e) == 0) return false;
  return true;
}());

// One 32-element block of a weight row as matmul_q8 sees it: int8 lanes, four to a word, and the
// scales that quant.h's formula applies to their sums.
struct Q8Weights {
  uint32_t q[8];
  float d = 0.0f, dmin = 0.0f;
  int k0 = 0, k1 = 0, m = 0;  // integer scales: of elements 0-15, of 16-31, of the min term
  int m1 = 0;                 // Q2_K: the min of elements 16-31 (m: of 0-15)
};
// One q8_0 activation block: its int8 lanes, four to a word, and (where the format needs it) their sum.
struct Q8Act {
  uint32_t q[8];
  int sum;
};

// ---- the formats (more in unit_decode_32.h and unit_decode_256.h). Each has kType, kBlock (elements per
// block), kBytes (bytes per block) and
//   decode(b, u, v): v[i] = element kUnit * u + i of the block at b (u < kBlock / kUnit), the value
//     dequant_row gives; for the float types (kBlock 1) b is the unit's first element and u is 0.
// The formats with an integer kernel (uses_matmul_q8) add kPairs, kNeedsXSum and
//   q8_weights(b, j, w): 32-element block j of the block at b;
//   q8_ints(w, x, iv): the block's integer sums against one activation block (exact);
//   q8_iv(w, lo, hi, xlo, xhi, iv): the same sums from the dot products of the block's halves (lo: lanes
//     0-15, hi: 16-31, as tensor cores form them) and the activation halves' lane sums;
//   kWholeSums: q8_iv reads only lo + hi and xlo + xhi (one scale for the whole block), so
//     q8_iv(w, lo + hi, 0, xlo + xhi, 0, iv) gives the same sums from one 32-lane product;
//   q8_fma(w, dx, iv, a): the block's float steps onto the accumulator a, quant.h's formula. ----

struct F32 {
  static constexpr QType kType = QType::F32;
  static constexpr int kBlock = 1, kBytes = 4;
  STRATA_HD static void decode(const uint8_t* b, int, float v[kUnit]) {
    STRATA_UNROLL
    for (int i = 0; i < kUnit; ++i) v[i] = as_float(ld32(b + 4 * i));
  }
};

struct F16 {
  static constexpr QType kType = QType::F16;
  static constexpr int kBlock = 1, kBytes = 2;
  STRATA_HD static void decode(const uint8_t* b, int, float v[kUnit]) {
    uint32_t w[kUnit / 2];
    ld_words<kUnit / 2>(b, w);
    STRATA_UNROLL
    for (int i = 0; i < kUnit / 2; ++i) {
      v[2 * i] = half_float(w[i] & 0xFFFF);
      v[2 * i + 1] = half_float(w[i] >> 16);
    }
  }
};

struct BF16 {
  static constexpr QType kType = QType::BF16;
  static constexpr int kBlock = 1, kBytes = 2;
  STRATA_HD static void decode(const uint8_t* b, int, float v[kUnit]) {
    uint32_t w[kUnit / 2];
    ld_words<kUnit / 2>(b, w);
    STRATA_UNROLL
    for (int i = 0; i < kUnit / 2; ++i) {
      v[2 * i] = as_float(w[i] << 16);
      v[2 * i + 1] = as_float(w[i] & 0xFFFF0000u);
    }
  }
};

// gguf: x * d.
struct Q8_0 {
  static constexpr QType kType = QType::Q8_0;
  static constexpr int kBlock = kQK8_0, kBytes = sizeof(BlockQ8_0);
  static constexpr int kD = offsetof(BlockQ8_0, d), kQs = offsetof(BlockQ8_0, qs);
  STRATA_HD static void decode(const uint8_t* b, int u, float v[kUnit]) {
    uint32_t w[4];
    ld_words<4>(b + kQs + kUnit * u, w);
    decode_words(ld16(b + kD), w, v);
  }
  // Unit u's values from its block's scale bits and the unit's four words of quants (decode's arithmetic:
  // the GEMV that loads a row's words before decoding any, gemv_row_q8raw_kernel, gets decode's values).
  STRATA_HD static void decode_words(uint32_t d_bits, const uint32_t w[4], float v[kUnit]) {
    const float d = half_float(d_bits);
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) STRATA_UNROLL
    for (int k = 0; k < 4; ++k) v[4 * i + k] = mul(s8_float(w[i] ^ 0x80808080u, k), d);
  }

  static constexpr int kPairs = 1;
  static constexpr bool kWholeSums = true;
  static constexpr bool kNeedsXSum = false;
  STRATA_HD static void q8_weights(const uint8_t* b, int, Q8Weights& w) {
    w.d = half_float(ld16(b + kD));
    ld_words<8>(b + kQs, w.q);
  }
  STRATA_HD static void q8_ints(const Q8Weights& w, const Q8Act& x, int iv[kPairs]) {
    int s = 0;
    STRATA_UNROLL
    for (int i = 0; i < 8; ++i) s = dp4a(w.q[i], x.q[i], s);
    iv[0] = s;
  }
  STRATA_HD static void q8_iv(const Q8Weights&, int lo, int hi, int, int, int* iv) { iv[0] = lo + hi; }
  // a = fma(d * dx, S(w_q), a)
  STRATA_HD static float q8_fma(const Q8Weights& w, float dx, const int iv[kPairs], float a) {
    return fma_rn(mul(w.d, dx), static_cast<float>(iv[0]), a);
  }
};

// gguf: d*sc and dmin*m rounded to float32 first, then (d*sc)*q - dmin*m.
struct Q4_K {
  static constexpr QType kType = QType::Q4_K;
  static constexpr int kBlock = kQK_K, kBytes = sizeof(BlockQ4_K);
  static constexpr int kD = offsetof(BlockQ4_K, d), kDmin = offsetof(BlockQ4_K, dmin),
                       kScales = offsetof(BlockQ4_K, scales), kQs = offsetof(BlockQ4_K, qs);
  static constexpr uint32_t kMask = kQ4_KMask * kOnes;
  STRATA_HD static void decode(const uint8_t* b, int u, float v[kUnit]) {
    const int j = u / 2;  // the 32-element sub-block; u % 2 is its half
    uint8_t sc, m;
    q4_k_scale_min(b + kScales, j, sc, m);
    const float ds = mul(half_float(ld16(b + kD)), static_cast<float>(sc));
    const float dm = mul(half_float(ld16(b + kDmin)), static_cast<float>(m));
    const Q4_KSub s = q4_k_sub(j);
    uint32_t w[4];
    ld_words<4>(b + kQs + s.qs + kUnit * (u % 2), w);
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) {
      const uint32_t q = (w[i] >> s.shift) & kMask;
      STRATA_UNROLL
      for (int k = 0; k < 4; ++k) v[4 * i + k] = sub(mul(ds, u8_float(q, k)), dm);
    }
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
    const Q4_KSub s = q4_k_sub(j);
    ld_words<8>(b + kQs + s.qs, w.q);
    STRATA_UNROLL
    for (int i = 0; i < 8; ++i) w.q[i] = (w.q[i] >> s.shift) & kMask;
  }
  STRATA_HD static void q8_ints(const Q8Weights& w, const Q8Act& x, int iv[kPairs]) {
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
  // a = fma(d * dx, sc * S(q4), a); a = fma(-(dmin * dx), m * S(1), a)
  STRATA_HD static float q8_fma(const Q8Weights& w, float dx, const int iv[kPairs], float a) {
    a = fma_rn(mul(w.d, dx), static_cast<float>(iv[0]), a);
    return fma_rn(-mul(w.dmin, dx), static_cast<float>(iv[1]), a);
  }
};

// gguf: (d * scale) rounded to float32, then times q in [-32, 31].
struct Q6_K {
  static constexpr QType kType = QType::Q6_K;
  static constexpr int kBlock = kQK_K, kBytes = sizeof(BlockQ6_K);
  static constexpr int kQl = offsetof(BlockQ6_K, ql), kQh = offsetof(BlockQ6_K, qh),
                       kScales = offsetof(BlockQ6_K, scales), kD = offsetof(BlockQ6_K, d);
  // Bytes n..n+3 of group g's 6-bit values q + 32, in [0, 63], four to a word.
  STRATA_HD static uint32_t q6(const Q6_KGroup& g, uint32_t lo, uint32_t hi) {
    return ((lo >> g.ql_shift) & (kQ6_KLowMask * kOnes)) |
           (((hi >> g.qh_shift) & (kQ6_KHighMask * kOnes)) << 4);
  }
  STRATA_HD static void decode(const uint8_t* b, int u, float v[kUnit]) {
    const Q6_KGroup g = q6_k_group(u / 2);  // the 32-element group; u % 2 is its half
    const int h = u % 2;
    uint32_t lo[4], hi[4];
    ld_words<4>(b + kQl + g.ql + kUnit * h, lo);
    ld_words<4>(b + kQh + g.qh + kUnit * h, hi);
    const int sc = static_cast<int8_t>(ld8(b + kScales + g.scale + h));
    const float ds = mul(half_float(ld16(b + kD)), static_cast<float>(sc));
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) {
      const uint32_t q = q6(g, lo[i], hi[i]);
      STRATA_UNROLL
      for (int k = 0; k < 4; ++k) v[4 * i + k] = mul(ds, byte_plus_2p23(q, k) - (k2p23 + kQ6_KBias));
    }
  }

  static constexpr int kPairs = 1;
  static constexpr bool kWholeSums = false;
  static constexpr bool kNeedsXSum = false;
  STRATA_HD static void q8_weights(const uint8_t* b, int p, Q8Weights& w) {
    const Q6_KGroup g = q6_k_group(p);
    uint32_t lo[8], hi[8];
    ld_words<8>(b + kQl + g.ql, lo);
    ld_words<8>(b + kQh + g.qh, hi);
    // q - 32 byte by byte without borrows: (q + 128 - 32) ^ 128, as int8 lanes.
    STRATA_UNROLL
    for (int i = 0; i < 8; ++i)
      w.q[i] = ((q6(g, lo[i], hi[i]) | 0x80808080u) - kQ6_KBias * kOnes) ^ 0x80808080u;
    w.k0 = static_cast<int8_t>(ld8(b + kScales + g.scale));
    w.k1 = static_cast<int8_t>(ld8(b + kScales + g.scale + 1));
    w.d = half_float(ld16(b + kD));
  }
  STRATA_HD static void q8_ints(const Q8Weights& w, const Q8Act& x, int iv[kPairs]) {
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
  // a = fma(d * dx, sc_lo * S_lo(q6 - 32) + sc_hi * S_hi(q6 - 32), a)
  STRATA_HD static float q8_fma(const Q8Weights& w, float dx, const int iv[kPairs], float a) {
    return fma_rn(mul(w.d, dx), static_cast<float>(iv[0]), a);
  }
};

// gguf: db = d * (0.5 + scale) * 0.25, then (db * grid) * (+-1).
struct IQ2_XS {
  static constexpr QType kType = QType::IQ2_XS;
  static constexpr int kBlock = kQK_K, kBytes = sizeof(BlockIQ2_XS);
  static constexpr int kD = offsetof(BlockIQ2_XS, d), kQs = offsetof(BlockIQ2_XS, qs);
  STRATA_HD static const BlockIQ2_XS& block(const uint8_t* b) {
    return *reinterpret_cast<const BlockIQ2_XS*>(b);
  }
  STRATA_HD static void decode(const uint8_t* b, int u, float v[kUnit]) {
    const float db = iq2_xs_group_scale(half_float(ld16(b + kD)), iq2_xs_scale(block(b), u / 2, u % 2));
    STRATA_UNROLL
    for (int c = 0; c < 2; ++c) {  // the unit's two codes of 8 elements
      const uint16_t q = static_cast<uint16_t>(ld16(b + kQs + 2 * (2 * u + c)));
      const uint64_t grid = iq2_xs_grid(iq2_xs_grid_index(q));
      const uint8_t signs = iq2_xs_signs(iq2_xs_sign_index(q));
      STRATA_UNROLL
      for (int e = 0; e < 8; ++e) {
        const float x = mul(db, u8_float(static_cast<uint32_t>(grid >> (e < 4 ? 0 : 32)), e % 4));
        v[8 * c + e] = iq2_xs_negative(signs, e) ? -x : x;  // gguf multiplies by -1: the same value
      }
    }
  }

  static constexpr int kPairs = 1;
  static constexpr bool kWholeSums = false;
  static constexpr bool kNeedsXSum = false;
  STRATA_HD static void q8_weights(const uint8_t* b, int j, Q8Weights& w) {
    w.d = half_float(ld16(b + kD));
    w.k0 = iq2_xs_scale_odd(block(b), j, 0);
    w.k1 = iq2_xs_scale_odd(block(b), j, 1);
    STRATA_UNROLL
    for (int g = 0; g < 4; ++g) {
      const uint16_t q = static_cast<uint16_t>(ld16(b + kQs + 2 * (4 * j + g)));
      const uint64_t grid = iq2_xs_grid(iq2_xs_grid_index(q));
      const uint32_t signs = iq2_xs_signs(iq2_xs_sign_index(q));
      STRATA_UNROLL
      for (int h = 0; h < 2; ++h) {
        // Sign bit k of the nibble spread to byte k (the four shifted copies do not overlap), then
        // 0xFF in the bytes to negate: -m = (m ^ 0xFF) + 1 per byte.
        const uint32_t neg = ((((signs >> (4 * h)) & 0xF) * 0x00204081u) & kOnes) * 0xFFu;
        const uint32_t mag = static_cast<uint32_t>(grid >> (32 * h));
        w.q[2 * g + h] = (mag ^ neg) + (neg & kOnes);
      }
    }
  }
  STRATA_HD static void q8_ints(const Q8Weights& w, const Q8Act& x, int iv[kPairs]) {
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
  // a = fma((d * dx) * 0.125f, (2 s_lo + 1) S_lo(g) + (2 s_hi + 1) S_hi(g), a)
  STRATA_HD static float q8_fma(const Q8Weights& w, float dx, const int iv[kPairs], float a) {
    return fma_rn(mul(mul(w.d, dx), kIq2xsOddScaleUnit), static_cast<float>(iv[0]), a);
  }
};

// gguf: d*sc and dmin*m rounded to float32 per 16-element group, then (d*sc)*q - dmin*m.
struct Q2_K {
  static constexpr QType kType = QType::Q2_K;
  static constexpr int kBlock = kQK_K, kBytes = sizeof(BlockQ2_K);
  static constexpr int kScales = offsetof(BlockQ2_K, scales), kQs = offsetof(BlockQ2_K, qs),
                       kD = offsetof(BlockQ2_K, d), kDmin = offsetof(BlockQ2_K, dmin);
  static constexpr uint32_t kMask = kQ2_KMask * kOnes;
  STRATA_HD static void decode(const uint8_t* b, int u, float v[kUnit]) {
    const Q2_KSub s = q2_k_sub(u / 2);  // the 32-element block; u % 2 is its half, u the group
    const uint32_t sm = ld8(b + kScales + u);
    const float ds = mul(half_float(ld16(b + kD)), static_cast<float>(sm & 0xF));
    const float dm = mul(half_float(ld16(b + kDmin)), static_cast<float>(sm >> 4));
    uint32_t w[4];
    ld_words<4>(b + kQs + s.qs + kUnit * (u % 2), w);
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) {
      const uint32_t q = (w[i] >> s.shift) & kMask;
      STRATA_UNROLL
      for (int k = 0; k < 4; ++k) v[4 * i + k] = sub(mul(ds, u8_float(q, k)), dm);
    }
  }

  static constexpr int kPairs = 2;
  static constexpr bool kWholeSums = false;
  static constexpr bool kNeedsXSum = false;  // the min term needs the sums of the halves: q8_ints
  STRATA_HD static void q8_weights(const uint8_t* b, int j, Q8Weights& w) {
    w.d = half_float(ld16(b + kD));
    w.dmin = half_float(ld16(b + kDmin));
    const uint32_t lo = ld8(b + kScales + 2 * j), hi = ld8(b + kScales + 2 * j + 1);
    w.k0 = static_cast<int>(lo & 0xF);
    w.m = static_cast<int>(lo >> 4);
    w.k1 = static_cast<int>(hi & 0xF);
    w.m1 = static_cast<int>(hi >> 4);
    const Q2_KSub s = q2_k_sub(j);
    ld_words<8>(b + kQs + s.qs, w.q);
    STRATA_UNROLL
    for (int i = 0; i < 8; ++i) w.q[i] = (w.q[i] >> s.shift) & kMask;
  }
  STRATA_HD static void q8_ints(const Q8Weights& w, const Q8Act& x, int iv[kPairs]) {
    int lo = 0, hi = 0, xlo = 0, xhi = 0;
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) {
      lo = dp4a(w.q[i], x.q[i], lo);
      hi = dp4a(w.q[i + 4], x.q[i + 4], hi);
      xlo = dp4a(kOnes, x.q[i], xlo);
      xhi = dp4a(kOnes, x.q[i + 4], xhi);
    }
    iv[0] = w.k0 * lo + w.k1 * hi;
    iv[1] = w.m * xlo + w.m1 * xhi;
  }
  STRATA_HD static void q8_iv(const Q8Weights& w, int lo, int hi, int xlo, int xhi, int* iv) {
    iv[0] = w.k0 * lo + w.k1 * hi;
    iv[1] = w.m * xlo + w.m1 * xhi;
  }
  // a = fma(d * dx, sc_lo S_lo(q2) + sc_hi S_hi(q2), a); a = fma(-(dmin * dx), m_lo S_lo(1) + m_hi S_hi(1),
  // a)
  STRATA_HD static float q8_fma(const Q8Weights& w, float dx, const int iv[kPairs], float a) {
    a = fma_rn(mul(w.d, dx), static_cast<float>(iv[0]), a);
    return fma_rn(-mul(w.dmin, dx), static_cast<float>(iv[1]), a);
  }
};

// gguf: db = d * (0.5 + scale) * 0.25 per 32-element block, then (db * grid) * (+-1), as IQ2_XS.
struct IQ2_XXS {
  static constexpr QType kType = QType::IQ2_XXS;
  static constexpr int kBlock = kQK_K, kBytes = sizeof(BlockIQ2_XXS);
  static constexpr int kD = offsetof(BlockIQ2_XXS, d), kQs = offsetof(BlockIQ2_XXS, qs);
  // Word w (0: grid indices, 1: signs and scale) of 32-element block j, from two 16-bit reads.
  STRATA_HD static uint32_t word(const uint8_t* b, int j, int w) {
    const uint8_t* p = b + kQs + 8 * j + 4 * w;
    return ld16(p) | (ld16(p + 2) << 16);
  }
  STRATA_HD static void decode(const uint8_t* b, int u, float v[kUnit]) {
    const int j = u / 2;
    const uint32_t grid_word = word(b, j, 0), sign_word = word(b, j, 1);
    const float db = iq2_xs_group_scale(half_float(ld16(b + kD)), iq2_xxs_scale(sign_word));
    STRATA_UNROLL
    for (int c = 0; c < 2; ++c) {  // the unit's two codes of 8 elements
      const int k = 2 * (u % 2) + c;
      const uint64_t grid = iq2_xxs_grid(iq2_xxs_grid_index(grid_word, k));
      const uint8_t signs = iq2_xs_signs(iq2_xxs_sign_index(sign_word, k));
      STRATA_UNROLL
      for (int e = 0; e < 8; ++e) {
        const float x = mul(db, u8_float(static_cast<uint32_t>(grid >> (e < 4 ? 0 : 32)), e % 4));
        v[8 * c + e] = iq2_xs_negative(signs, e) ? -x : x;  // gguf multiplies by -1: the same value
      }
    }
  }

  static constexpr int kPairs = 1;
  static constexpr bool kWholeSums = true;
  static constexpr bool kNeedsXSum = false;
  STRATA_HD static void q8_weights(const uint8_t* b, int j, Q8Weights& w) {
    w.d = half_float(ld16(b + kD));
    const uint32_t grid_word = word(b, j, 0), sign_word = word(b, j, 1);
    w.k0 = 2 * iq2_xxs_scale(sign_word) + 1;
    STRATA_UNROLL
    for (int k = 0; k < 4; ++k) {
      const uint64_t grid = iq2_xxs_grid(iq2_xxs_grid_index(grid_word, k));
      const uint32_t signs = iq2_xs_signs(iq2_xxs_sign_index(sign_word, k));
      STRATA_UNROLL
      for (int h = 0; h < 2; ++h) {
        // As IQ2_XS: the sign nibble spread to bytes, then -m = (m ^ 0xFF) + 1 per byte.
        const uint32_t neg = ((((signs >> (4 * h)) & 0xF) * 0x00204081u) & kOnes) * 0xFFu;
        const uint32_t mag = static_cast<uint32_t>(grid >> (32 * h));
        w.q[2 * k + h] = (mag ^ neg) + (neg & kOnes);
      }
    }
  }
  STRATA_HD static void q8_ints(const Q8Weights& w, const Q8Act& x, int iv[kPairs]) {
    int s = 0;
    STRATA_UNROLL
    for (int i = 0; i < 8; ++i) s = dp4a(w.q[i], x.q[i], s);
    iv[0] = w.k0 * s;
  }
  STRATA_HD static void q8_iv(const Q8Weights& w, int lo, int hi, int, int, int* iv) {
    iv[0] = w.k0 * (lo + hi);
  }
  // a = fma((d * dx) * 0.125f, (2 s + 1) S(g), a)
  STRATA_HD static float q8_fma(const Q8Weights& w, float dx, const int iv[kPairs], float a) {
    return fma_rn(mul(mul(w.d, dx), kIq2xsOddScaleUnit), static_cast<float>(iv[0]), a);
  }
};

// The address alignment a format's decoders need of its blocks, so of a row's start and of the distance
// between rows: a float type's element size (read element by element), 1 for a format read byte by byte
// (kAnyAddress: MXFP4's 17-byte blocks), else 2 (every block is read by its 16-bit fields).
template <class F>
constexpr int block_align() {
  if constexpr (F::kBlock == 1)
    return F::kBytes;
  else if constexpr (requires { F::kAnyAddress; })
    return F::kAnyAddress ? 1 : 2;
  else
    return 2;
}

// An activation block of a q8_0 row at p (any even address): its lanes, its scale dx and, where
// the format needs it, the sum of its lanes.
template <class F>
STRATA_HD inline float q8_act(const uint8_t* p, Q8Act& x) {
  ld_words<8>(p + offsetof(BlockQ8_0, qs), x.q);
  x.sum = 0;
  if constexpr (F::kNeedsXSum) {
    STRATA_UNROLL
    for (int i = 0; i < 8; ++i) x.sum = dp4a(kOnes, x.q[i], x.sum);
  }
  return half_float(ld16(p + offsetof(BlockQ8_0, d)));
}

}  // namespace strata::unit

// The formats added since, one header per family (they use the reads and steps above).
#include "quant/unit_decode_256.h"
#include "quant/unit_decode_32.h"
#include "quant/unit_decode_grid.h"
