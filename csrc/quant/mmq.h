// The machinery matmul_q8's kernels share (the integer path, llama.cpp's CPU path, in the one float
// order quant.h defines): the scalar driver and, on x86-64, the AVX2 tiles that a format's K (T <= 4)
// and Il (T > 4) structs plug into. Included only by the mmq_*.cpp files, one per format family.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "quant/formats.h"
#include "quant/kernels.h"
#include "quant/quant.h"
#include "quant/simd.h"
#if defined(__x86_64__)
#include "quant/decode_avx2.h"
#endif

namespace strata {
namespace quant_detail {
namespace {

// Activations are BlockQ8_0 blocks, kQ8_0Bytes apart; a row may start at any byte, so kernels
// read a block's fields at their offsets instead of through a BlockQ8_0 reference.
constexpr size_t kXd = offsetof(BlockQ8_0, d), kXqs = offsetof(BlockQ8_0, qs);
// 32-blocks (one activation block each) per weight super-block.
constexpr int kBlocksK = kQK_K / kQK8_0;

inline float x_d(const uint8_t* xb) {
  uint16_t h;
  std::memcpy(&h, xb + kXd, 2);
  return fp16_to_f32(h);
}

// ---- Scalar kernels: the definition, one output element at a time. ----

// Calls block(acc, w_row, b, xq_block, dx) for every 32-block b of every (row, token).
template <class F>
void for_outputs(const void* W, size_t rbytes, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                 int64_t T, float* Y, int64_t ldy, F block) {
  const uint8_t* w = static_cast<const uint8_t*>(W);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < T; ++t) {
      float acc = 0.0f;
      for (int64_t b = 0; b < cols / kQK8_0; ++b) {
        const uint8_t* xb = Xq + t * xrb + b * kQ8_0Bytes;
        acc = block(acc, w + r * rbytes, b, reinterpret_cast<const int8_t*>(xb + kXqs), x_d(xb));
      }
      Y[t * ldy + r] = acc;
    }
}

#if defined(__x86_64__)

// ---- AVX2 kernels: 8 outputs (MR rows x NT tokens, lane i = r * NT + t) at a time. Each output
// has its own float lane; per block the eight integer sums are formed with maddubs/madd, reduced
// to one vector by hadd, and then the lane does exactly the scalar kernel's float operations. ----

// Lane i of the result is the sum of v[i]'s eight int32 lanes (exact).
STRATA_SIMD inline __m256i reduce8(const __m256i* v) {
  const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

STRATA_SIMD inline __m256i madd1(__m256i p16) { return _mm256_madd_epi16(p16, _mm256_set1_epi16(1)); }

// Scale vectors for madd_epi16 from a weight block's scales laid out once per block (in Pre), one shuffle
// a 32-block instead of a broadcast from a scalar per half. sc16 holds eight int16 scales in both 128-bit
// lanes: every lane gets scale j.
STRATA_SIMD inline __m256i spread16(__m256i sc16, int j) {
  return _mm256_shuffle_epi8(sc16, _mm256_set1_epi16(static_cast<int16_t>(2 * j | (2 * j + 1) << 8)));
}
// sc8 holds sixteen int8 scales in both lanes: the low half's lanes get scale 2j, the high half's 2j + 1
// (sign-extended: the byte lands in an int16's high byte, and an arithmetic shift brings it down).
STRATA_SIMD inline __m256i spread8_pair(__m256i sc8, int j) {
  const __m256i ctl = _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(0x80 | (2 * j + 1) << 8)),
                                       _mm_set1_epi16(static_cast<int16_t>(0x80 | (2 * j) << 8)));
  return _mm256_srai_epi16(_mm256_shuffle_epi8(sc8, ctl), 8);
}

// Per call, each token's block scales, int8 sums and two 16-element half sums (int16 pair: low =
// first half), block-major ([b][t], tokens padded to a multiple of 8 with zeros), so a tile loads
// its NT tokens' values with one instruction. For the interleaved kernels (T > 4) also xt: the int8
// activations regrouped [group of 8 tokens][b][step k][token][4 elements], so one load gives elements
// 4k..4k+3 of block b for eight tokens.
struct XInfo {
  const float* dx;
  const int32_t* sum;
  const int32_t* hsum;
  const int8_t* xt;
  int64_t tpad;
};

// Per-thread scratch for XInfo; grows to the largest call and is reused.
STRATA_SIMD inline XInfo x_info(const uint8_t* Xq, int64_t xrb, int64_t T, int64_t nb,
                                bool interleave = false) {
  thread_local std::vector<float> dx;
  thread_local std::vector<int32_t> sum, hsum;
  thread_local std::vector<int8_t> xt;
  const int64_t tpad = (T + 7) / 8 * 8;
  dx.assign(static_cast<size_t>(nb * tpad), 0.0f);
  sum.assign(static_cast<size_t>(nb * tpad), 0);
  hsum.assign(static_cast<size_t>(nb * tpad), 0);
  if (interleave) xt.assign(static_cast<size_t>(nb * tpad * 32), 0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* xb = Xq + t * xrb + b * kQ8_0Bytes;
      dx[b * tpad + t] = h2f_at(xb + kXd);
      const __m256i x = load256(xb + kXqs);
      const __m256i s8 =
          _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), x), _mm256_set1_epi16(1));
      const __m128i lo = _mm256_castsi256_si128(s8), hi = _mm256_extracti128_si256(s8, 1);
      sum[b * tpad + t] = hsum_epi32(_mm_add_epi32(lo, hi));
      const uint32_t h0 = static_cast<uint16_t>(hsum_epi32(lo)), h1 = static_cast<uint16_t>(hsum_epi32(hi));
      hsum[b * tpad + t] = static_cast<int32_t>(h0 | (h1 << 16));
      if (interleave) {
        int8_t* dst = xt.data() + (((t / 8) * nb + b) * 8) * 32 + (t % 8) * 4;
        for (int k = 0; k < 8; ++k) std::memcpy(dst + k * 32, xb + kXqs + k * 4, 4);
      }
    }
  return {dx.data(), sum.data(), hsum.data(), xt.data(), tpad};
}

// Lane i = p[i % NT]: NT consecutive tokens' values, repeated for the MR rows.
template <int NT>
STRATA_SIMD inline __m256 token_lanes(const float* p) {
  if constexpr (NT == 8) return _mm256_loadu_ps(p);
  if constexpr (NT == 4) return _mm256_broadcast_ps(reinterpret_cast<const __m128*>(p));
  if constexpr (NT == 2) return _mm256_castpd_ps(_mm256_broadcast_sd(reinterpret_cast<const double*>(p)));
  if constexpr (NT == 1) return _mm256_broadcast_ss(p);
}

// Lane i = f(i / NT): one value per row, repeated for the NT tokens.
template <int MR, int NT, class F>
STRATA_SIMD inline __m256 row_lanes_ps(F f) {
  if constexpr (MR == 1) return _mm256_set1_ps(f(0));
  alignas(32) float v[8];
  for (int i = 0; i < 8; ++i) v[i] = f(i / NT);
  return _mm256_load_ps(v);
}
template <int MR, int NT, class F>
STRATA_SIMD inline __m256i row_lanes_epi32(F f) {
  if constexpr (MR == 1) return _mm256_set1_epi32(f(0));
  alignas(32) int32_t v[8];
  for (int i = 0; i < 8; ++i) v[i] = f(i / NT);
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(v));
}

template <class K>
constexpr bool takes_pairs() {
  if constexpr (requires { K::kPairs; })
    return K::kPairs;
  else
    return false;
}

// The reduced integer sums of 32-block b (sub-block j of the weight blocks p) for the tile's 8 lanes.
template <class K, int MR, int NT>
STRATA_SIMD inline __m256i block_sums(const typename K::Pre* p, int j, const uint8_t* const* x, int64_t b) {
  __m256i xv[NT];
  for (int t = 0; t < NT; ++t) xv[t] = load256(x[t] + b * kQ8_0Bytes + kXqs);
  __m256i s[8];
  for (int r = 0; r < MR; ++r)
    for (int t = 0; t < NT; ++t) s[r * NT + t] = K::dot(p[r], j, xv[t]);
  return reduce8(s);
}
// acc plus 32-block b's float steps, as the scalar kernel takes them.
template <class K, int MR, int NT>
STRATA_SIMD inline __m256 block_update(__m256 acc, __m256i isum, const typename K::Pre* p, int j,
                                       const XInfo& xi, int64_t t0, int64_t b) {
  const __m256 dx = token_lanes<NT>(xi.dx + b * xi.tpad + t0);
  const __m256i xsum =
      _mm256_castps_si256(token_lanes<NT>(reinterpret_cast<const float*>(xi.sum + b * xi.tpad + t0)));
  if constexpr (requires { K::kHalfMins; }) {  // a min per 16 elements: the half sums too
    const __m256i hsum =
        _mm256_castps_si256(token_lanes<NT>(reinterpret_cast<const float*>(xi.hsum + b * xi.tpad + t0)));
    return K::template update<MR, NT>(acc, isum, p, j, dx, xsum, hsum);
  } else {
    return K::template update<MR, NT>(acc, isum, p, j, dx, xsum);
  }
}

// out[r * NT + t] = row w[r] . token x[t] over nwb weight blocks; xi covers tokens t0.. of x. A K with
// kPairs takes two 32-blocks a step: their loads and integer sums are independent and overlap (the float
// steps stay in block order, each lane the scalar kernel's chain); measured slower for the 32-element
// formats, Q2_K, Q6_K and IQ2_XS, which leave it out.
template <class K, int MR, int NT>
STRATA_SIMD void tile(const uint8_t* const* w, const uint8_t* const* x, const XInfo& xi, int64_t t0,
                      int64_t nwb, float* out) {
  static_assert(MR * NT == 8);
  __m256 acc = _mm256_setzero_ps();
  using Pre = typename K::Pre;
  if constexpr (takes_pairs<K>()) {
    static_assert(K::kSubs % 2 == 0);
    for (int64_t wb = 0; wb < nwb; ++wb) {
      Pre p[MR];
      for (int r = 0; r < MR; ++r) p[r] = K::pre(w[r] + wb * K::kBytes);
      for (int j = 0; j < K::kSubs; j += 2) {
        const int64_t b = wb * K::kSubs + j;
        const __m256i s0 = block_sums<K, MR, NT>(p, j, x, b), s1 = block_sums<K, MR, NT>(p, j + 1, x, b + 1);
        acc = block_update<K, MR, NT>(acc, s0, p, j, xi, t0, b);
        acc = block_update<K, MR, NT>(acc, s1, p, j + 1, xi, t0, b + 1);
      }
    }
  } else {
    for (int64_t wb = 0; wb < nwb; ++wb) {
      Pre p[MR];
      for (int r = 0; r < MR; ++r) p[r] = K::pre(w[r] + wb * K::kBytes);
      for (int j = 0; j < K::kSubs; ++j) {
        const int64_t b = wb * K::kSubs + j;
        __m256i xv[NT];
        for (int t = 0; t < NT; ++t) xv[t] = load256(x[t] + b * kQ8_0Bytes + kXqs);
        __m256i s[8];
        for (int r = 0; r < MR; ++r)
          for (int t = 0; t < NT; ++t) s[r * NT + t] = K::dot(p[r], j, xv[t]);
        acc = block_update<K, MR, NT>(acc, reduce8(s), p, j, xi, t0, b);
      }
    }
  }
  _mm256_storeu_ps(out, acc);
}

template <class K, int MR, int NT>
STRATA_VNNI void vtile(const uint8_t* const* w, const uint8_t* const* x, const XInfo& xi, int64_t t0,
                       int64_t nwb, float* out);

// Rows outer, tokens inner: MR weight rows stay in L1 while every token passes over them. V: the VNNI tile.
template <class K, int MR, int NT, bool V = false>
void rows_tokens(const uint8_t* W, size_t rbytes, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                 int64_t T, float* Y, int64_t ldy) {
  const int64_t nwb = cols / kQK8_0 / K::kSubs;
  const XInfo xi = x_info(Xq, xrb, T, cols / kQK8_0);
  for (int64_t r0 = 0; r0 < rows; r0 += MR) {
    const int64_t mr = std::min<int64_t>(MR, rows - r0);
    const uint8_t* w[MR];
    for (int r = 0; r < MR; ++r) w[r] = W + (r0 + std::min<int64_t>(r, mr - 1)) * rbytes;  // pad: repeat
    for (int64_t t0 = 0; t0 < T; t0 += NT) {
      const int64_t nt = std::min<int64_t>(NT, T - t0);
      const uint8_t* x[NT];
      for (int t = 0; t < NT; ++t) x[t] = Xq + (t0 + std::min<int64_t>(t, nt - 1)) * xrb;
      alignas(32) float out[8];
      if constexpr (V)
        vtile<K, MR, NT>(w, x, xi, t0, nwb, out);
      else
        tile<K, MR, NT>(w, x, xi, t0, nwb, out);
      for (int64_t t = 0; t < nt; ++t)
        for (int64_t r = 0; r < mr; ++r) Y[(t0 + t) * ldy + r0 + r] = out[r * NT + t];
    }
  }
}

// ---- T > 4: token-interleaved kernels. A tile is MR rows x NV groups of 8 tokens; each row's blocks are
// first unpacked to 32 unsigned bytes per 32-block (scr), then per step k the row's four bytes
// 4k..4k+3 are broadcast and multiplied (maddubs) with xt's eight tokens' four bytes, so lane t
// collects token t's block sum with no horizontal reduction. Integer sums are exact, so they equal
// the scalar kernel's whatever the order; the float update per block is update<1, 8>. ----

STRATA_SIMD inline __m256i bcast4(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}
STRATA_SIMD inline __m256i xload(const int8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
// s16[r * NV + v] = the int16 sum over steps k in [k0, k1) of maddubs(row r's unsigned bytes 4k..4k+3,
// token group v's activations of step k); the caller bounds the steps so that no lane overflows.
template <int MR, int NV>
STRATA_SIMD inline void step_sums(const uint8_t* const* a, const int8_t* const* xv, int k0, int k1,
                                  __m256i* s16) {
  for (int i = 0; i < MR * NV; ++i) s16[i] = _mm256_setzero_si256();
  for (int k = k0; k < k1; ++k) {
    __m256i x[NV];
    for (int v = 0; v < NV; ++v) x[v] = xload(xv[v] + k * 32);
    for (int r = 0; r < MR; ++r) {
      const __m256i aw = bcast4(a[r] + 4 * k);
      for (int v = 0; v < NV; ++v)
        s16[r * NV + v] = _mm256_add_epi16(s16[r * NV + v], _mm256_maddubs_epi16(aw, x[v]));
    }
  }
}
STRATA_SIMD inline void store32(uint8_t* p, __m256i v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
}
// Two int16 (low, high) as one int32 lane pattern, for madd_epi16 against hsum.
inline int32_t pair16(int a, int b) {
  return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(a)) |
                              (static_cast<uint32_t>(static_cast<uint16_t>(b)) << 16));
}

// out[(r * NV + v) * 8 + t] = row r . token 8(g + v) + t over nwb weight blocks.
template <class K, class IL, int MR, int NV>
STRATA_SIMD void tile_il(const uint8_t* const* w, const uint8_t* scr, int64_t cols, const XInfo& xi,
                         int64_t g, int64_t nwb, float* out) {
  const int64_t nb = nwb * K::kSubs;
  __m256 acc[MR * NV];
  for (int i = 0; i < MR * NV; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t wb = 0; wb < nwb; ++wb) {
    typename K::Pre p[MR];
    for (int r = 0; r < MR; ++r) p[r] = K::pre(w[r] + wb * K::kBytes);
    for (int j = 0; j < K::kSubs; ++j) {
      const int64_t b = wb * K::kSubs + j;
      const uint8_t* a[MR];
      for (int r = 0; r < MR; ++r) a[r] = scr + r * cols + b * 32;
      const int8_t* xv[NV];
      __m256i hs[NV];
      for (int v = 0; v < NV; ++v) {
        xv[v] = xi.xt + ((g + v) * nb + b) * 256;
        hs[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xi.hsum + b * xi.tpad + (g + v) * 8));
      }
      __m256i isum[MR * NV];
      IL::template dots<MR, NV>(p, j, a, xv, hs, isum);
      for (int v = 0; v < NV; ++v) {
        const __m256 dx = _mm256_loadu_ps(xi.dx + b * xi.tpad + (g + v) * 8);
        const __m256i xsum =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xi.sum + b * xi.tpad + (g + v) * 8));
        for (int r = 0; r < MR; ++r) {
          if constexpr (requires { K::kHalfMins; })
            acc[r * NV + v] =
                K::template update<1, 8>(acc[r * NV + v], isum[r * NV + v], &p[r], j, dx, xsum, hs[v]);
          else
            acc[r * NV + v] = K::template update<1, 8>(acc[r * NV + v], isum[r * NV + v], &p[r], j, dx, xsum);
        }
      }
    }
  }
  for (int i = 0; i < MR * NV; ++i) _mm256_storeu_ps(out + i * 8, acc[i]);
}

template <class K, class IL, int MR, int NV>
STRATA_VNNI void vtile_il(const uint8_t* const* w, const uint8_t* scr, int64_t cols, const XInfo& xi,
                          int64_t g, int64_t nwb, float* out);

template <class K, class IL, int MR, int NV, bool V = false>
void rows_groups(const uint8_t* W, size_t rbytes, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                 int64_t T, float* Y, int64_t ldy) {
  const int64_t nb = cols / kQK8_0, nwb = nb / K::kSubs;
  const XInfo xi = x_info(Xq, xrb, T, nb, true);
  thread_local std::vector<uint8_t> scr;
  scr.resize(static_cast<size_t>(MR * cols));
  for (int64_t r0 = 0; r0 < rows; r0 += MR) {
    const int64_t mr = std::min<int64_t>(MR, rows - r0);
    const uint8_t* w[MR];
    for (int r = 0; r < MR; ++r) {
      w[r] = W + (r0 + std::min<int64_t>(r, mr - 1)) * rbytes;  // pad: repeat
      IL::unpack(w[r], nb, scr.data() + r * cols);
    }
    for (int64_t g = 0; g * 8 < T;) {
      const int nv = T - g * 8 > 8 ? NV : 1;  // a last group of at most 8 tokens takes one vector
      alignas(32) float out[MR * NV * 8];
      if constexpr (V) {
        if (nv == NV)
          vtile_il<K, IL, MR, NV>(w, scr.data(), cols, xi, g, nwb, out);
        else
          vtile_il<K, IL, MR, 1>(w, scr.data(), cols, xi, g, nwb, out);
      } else {
        if (nv == NV)
          tile_il<K, IL, MR, NV>(w, scr.data(), cols, xi, g, nwb, out);
        else
          tile_il<K, IL, MR, 1>(w, scr.data(), cols, xi, g, nwb, out);
      }
      for (int v = 0; v < nv; ++v, ++g) {
        const int64_t nt = std::min<int64_t>(8, T - g * 8);
        for (int64_t t = 0; t < nt; ++t)
          for (int64_t r = 0; r < mr; ++r) Y[(g * 8 + t) * ldy + r0 + r] = out[(r * nv + v) * 8 + t];
      }
    }
  }
}

// A type's kernel: kSubs 32-blocks per weight block; Pre holds one row's decoded block header;
// dot() gives 8 int32 partials summing to the 32-block's integer term (scales that vary inside
// the weight block applied); update() adds the block to the lane accumulators.

// ---- One K and one Il for the formats whose 32-blocks decode_avx2.h gives as signed bytes (|v| <= 127).
// FQ gives: Pre (with float d and m, and optionally sc16 or sc8: the scales for spread16 or spread8_pair) and
// pre(block); bytes(pre, j); scales(pre, j, sc[2]) (the integer scales of the halves); kUnsigned: the bytes
// are in [0, 127]; kMin: 0 none, 1 a min added as m * dx * S(1) (Q4_1, Q5_1), -1 one subtracted as (dmin *
// dx) * (min(pre, j) * S(1)) (Q5_K). maddubs(|w|, sign(x, w)) keeps each int16 pair sum within 2 * 127 * 127.
// ----

template <class FQ>
struct KBytes {
  static constexpr int kSubs = FQ::kSubs;
  static constexpr bool kPairs = kSubs % 2 == 0;
  static constexpr size_t kBytes = FQ::Bytes::kSize;
  using Pre = typename FQ::Pre;
  STRATA_SIMD static Pre pre(const uint8_t* blk) { return FQ::pre(blk); }
  STRATA_SIMD static __m256i dot(const Pre& p, int j, __m256i x) {
    const __m256i w = FQ::bytes(p, j);
    if constexpr (requires { p.sc16; }) return _mm256_madd_epi16(products(w, x), spread16(p.sc16, j));
    if constexpr (requires { p.sc8; }) return _mm256_madd_epi16(products(w, x), spread8_pair(p.sc8, j));
    int sc[2];
    FQ::scales(p, j, sc);
    return _mm256_madd_epi16(products(w, x), _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(sc[1])),
                                                              _mm_set1_epi16(static_cast<int16_t>(sc[0]))));
  }
  // Pairwise products of the bytes w and x as int16: unsigned w (FQ::kUnsigned, in [0, 127]) directly.
  STRATA_SIMD static __m256i products(__m256i w, __m256i x) {
    if constexpr (FQ::kUnsigned) return _mm256_maddubs_epi16(w, x);
    return _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
  }
  template <int MR, int NT>
  STRATA_SIMD static __m256 update(__m256 acc, __m256i isum, const Pre* p, int j, __m256 dx, __m256i xsum) {
    const __m256 d = row_lanes_ps<MR, NT>([&](int r) { return p[r].d; });
    acc = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(isum), acc);
    if constexpr (FQ::kMin != 0) {
      const __m256 m = row_lanes_ps<MR, NT>([&](int r) { return p[r].m; });
      if constexpr (FQ::kMin > 0) return _mm256_fmadd_ps(_mm256_mul_ps(m, dx), _mm256_cvtepi32_ps(xsum), acc);
      const __m256i mj =
          row_lanes_epi32<MR, NT>([&](int r) { return static_cast<int32_t>(FQ::min(p[r], j)); });
      const __m256 mdx = _mm256_xor_ps(_mm256_mul_ps(m, dx), _mm256_set1_ps(-0.0f));
      return _mm256_fmadd_ps(mdx, _mm256_cvtepi32_ps(_mm256_mullo_epi32(mj, xsum)), acc);
    }
    return acc;
  }
};

// scr = the signed bytes; per step the sign moves onto x as in IlQ8_0.
template <class FQ>
struct IlBytes {
  STRATA_SIMD static void unpack(const uint8_t* w, int64_t nb, uint8_t* scr) {
    for (int64_t wb = 0; wb < nb / FQ::kSubs; ++wb) {
      const typename FQ::Pre p = FQ::pre(w + wb * FQ::Bytes::kSize);
      for (int j = 0; j < FQ::kSubs; ++j) store32(scr + (wb * FQ::kSubs + j) * 32, FQ::bytes(p, j));
    }
  }
  template <int MR, int NV>
  STRATA_SIMD static void dots(const typename FQ::Pre* p, int j, const uint8_t* const* a,
                               const int8_t* const* xv, const __m256i*, __m256i* isum) {
    __m256i sc[MR][2];
    for (int r = 0; r < MR; ++r) {
      int s[2];
      FQ::scales(p[r], j, s);
      sc[r][0] = _mm256_set1_epi16(static_cast<int16_t>(s[0]));
      sc[r][1] = _mm256_set1_epi16(static_cast<int16_t>(s[1]));
    }
    for (int i = 0; i < MR * NV; ++i) isum[i] = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      __m256i x[NV];
      for (int v = 0; v < NV; ++v) x[v] = xload(xv[v] + k * 32);
      for (int r = 0; r < MR; ++r) {
        const __m256i w = bcast4(a[r] + 4 * k), aw = _mm256_abs_epi8(w);
        for (int v = 0; v < NV; ++v)
          isum[r * NV + v] = _mm256_add_epi32(
              isum[r * NV + v],
              _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x[v], w)), sc[r][k / 4]));
      }
    }
  }
};

template <class K, class IL>
void mmq_avx2(const void* W, size_t rbytes, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
              int64_t T, float* Y, int64_t ldy) {
  const uint8_t* w = static_cast<const uint8_t*>(W);
  // T <= 4: fill the 8 lanes with as few padded tokens as possible; else 4 rows x 16 tokens.
  if (T == 1)
    rows_tokens<K, 8, 1>(w, rbytes, rows, cols, Xq, xrb, T, Y, ldy);
  else if (T == 2)
    rows_tokens<K, 4, 2>(w, rbytes, rows, cols, Xq, xrb, T, Y, ldy);
  else if (T <= 4)
    rows_tokens<K, 2, 4>(w, rbytes, rows, cols, Xq, xrb, T, Y, ldy);
  else
    rows_groups<K, IL, 4, 2>(w, rbytes, rows, cols, Xq, xrb, T, Y, ldy);
}

// ---- AVX-512 VNNI kernels (Isa::Avx512Vnni): the tiles above with vpdpbusd (unsigned bytes times signed
// bytes, four products summed into an int32 lane, exact) in place of maddubs + madd, on 256-bit vectors (the
// AVX512VL encodings, 32 registers). Signed weight bytes w go in as w + 128; the 128 x that adds is taken off
// per lane by the token's correction (K::xcorr, once per token and block) or per token (the interleaved
// tiles). The integer sums are exact and each lane takes the scalar kernel's float steps in its order, so
// every output is the scalar kernel's bit for bit. A VNNI K (kVnni) for the T <= 4 tile gives Pre/pre, xcorr
// and vdot (one row's 8 int32 partials of a 32-block) and either its AVX2 K's update or a Head: the eight
// lanes' block headers read by gathers at the lanes' row offsets and decoded as vectors (head), their float
// steps (vupdate). With kLaneScale the partials are unscaled and the reduced sums are multiplied by the
// lanes' scales (scale_lanes(head, j), or lane_scale(pre, j) laid out once per weight block); with
// kHalfLaneScale the sums of the two 16-element halves by scale_lanes(head, 2j) and (head, 2j + 1). ----

STRATA_VNNI inline __m256i dpbusd(__m256i acc, __m256i u8, __m256i s8) {
  return _mm256_dpbusd_epi32(acc, u8, s8);
}
// Lane i: -(c * the sum of x's bytes 4i..4i+3), the correction for weight bytes offset by c.
STRATA_VNNI inline __m256i neg_sums(__m256i x, char c) {
  return _mm256_sub_epi32(_mm256_setzero_si256(), dpbusd(_mm256_setzero_si256(), _mm256_set1_epi8(c), x));
}
STRATA_VNNI inline __m256i flip(__m256i w) {
  return _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));
}
// int16 scales (as spread16/spread8_pair give them) as int32 lanes' low halves with zero high halves: madd of
// int32 partials that fit int16 against them multiplies each partial by its scale.
STRATA_VNNI inline __m256i low16(__m256i sc) { return _mm256_and_si256(sc, _mm256_set1_epi32(0xFFFF)); }

template <class K>
constexpr bool has_head() {
  return requires { typename K::Head; };
}
struct NoHead {};
template <class K>
struct HeadOf {
  using type = NoHead;
};
template <class K>
  requires(has_head<K>())
struct HeadOf<K> {
  using type = typename K::Head;
};
template <class K>
using head_of = typename HeadOf<K>::type;

// Head helpers: the 4 bytes at blk0 + at of each lane's block, and the float step of a block with one scale d
// and no min, a = fma(d * dx, (float)S, a), as the AVX2 kernels' update.
STRATA_VNNI inline __m256i gather_at(const uint8_t* blk0, size_t at, __m256i off) {
  return _mm256_i32gather_epi32(reinterpret_cast<const int*>(blk0 + at), off, 1);
}
STRATA_VNNI inline __m256 fp16_lanes(__m256i v) { return _mm256_cvtph_ps(_mm256_cvtepi32_epi16(v)); }
STRATA_VNNI inline __m256 update_d(__m256 acc, __m256i isum, __m256 d, __m256 dx) {
  return _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(isum), acc);
}
// Byte j of a 64-bit field spread over two vectors (v[0]: bytes 0-3, v[1]: bytes 4-7), per int32 lane.
STRATA_VNNI inline __m256i byte_lanes(const __m256i* v, int j) {
  return _mm256_and_si256(_mm256_srl_epi32(v[j / 4], _mm_cvtsi32_si128(8 * (j % 4))),
                          _mm256_set1_epi32(0xFF));
}
// A 16-entry codebook of signed bytes with 128 added (for vpdpbusd's unsigned side), in both lanes.
STRATA_VNNI inline __m256i codebook32_u(uint64_t lo, uint64_t hi) {
  constexpr uint64_t kFlip = 0x8080808080808080ull;
  return codebook32(lo ^ kFlip, hi ^ kFlip);
}

template <class K>
constexpr bool lane_scaled() {
  if constexpr (requires { K::kLaneScale; })
    return K::kLaneScale;
  else
    return false;
}

template <class K, int MR, int NT>
STRATA_VNNI void vtile(const uint8_t* const* w, const uint8_t* const* x, const XInfo& xi, int64_t t0,
                       int64_t nwb, float* out) {
  static_assert(MR * NT == 8);
  constexpr int kStep = takes_pairs<K>() ? 2 : 1;
  static_assert(K::kSubs % kStep == 0);
  constexpr bool kHead = has_head<K>();
  __m256 acc = _mm256_setzero_ps();
  // A K with a Head reads its weight blocks' headers (scales, mins) for the eight lanes at once: gathers at
  // the lanes' row offsets, decoded as vectors, instead of a Pre per row and lanes assembled from scalars.
  [[maybe_unused]] __m256i off;
  if constexpr (kHead) {
    alignas(32) int32_t o[8];
    for (int i = 0; i < 8; ++i) o[i] = static_cast<int32_t>(w[i / NT] - w[0]);
    off = _mm256_load_si256(reinterpret_cast<const __m256i*>(o));
  }
  for (int64_t wb = 0; wb < nwb; ++wb) {
    typename K::Pre p[MR];
    for (int r = 0; r < MR; ++r) p[r] = K::pre(w[r] + wb * K::kBytes);
    [[maybe_unused]] head_of<K> hd;
    if constexpr (kHead) hd = K::head(w[0] + wb * K::kBytes, off);
    [[maybe_unused]] alignas(32) int32_t sct[lane_scaled<K>() && !kHead ? K::kSubs : 1][8];
    if constexpr (lane_scaled<K>() && !kHead)
      for (int j = 0; j < K::kSubs; ++j)
        for (int i = 0; i < 8; ++i) sct[j][i] = K::lane_scale(p[i / NT], j);
    for (int j0 = 0; j0 < K::kSubs; j0 += kStep) {
      __m256i isum[kStep];
      for (int h = 0; h < kStep; ++h) {
        const int64_t b = wb * K::kSubs + j0 + h;
        __m256i xv[NT], xc[NT];
        for (int t = 0; t < NT; ++t) {
          xv[t] = load256(x[t] + b * kQ8_0Bytes + kXqs);
          xc[t] = K::xcorr(xv[t]);
        }
        __m256i s[8];
        for (int r = 0; r < MR; ++r)
          for (int t = 0; t < NT; ++t) s[r * NT + t] = K::vdot(p[r], j0 + h, xv[t], xc[t]);
        if constexpr (requires { K::kHalfLaneScale; }) {
          // Two hadd levels leave each lane's half sums (the 128-bit halves of its partials); each half
          // scaled, then added: sc_lo * S_lo + sc_hi * S_hi, exact.
          const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
          const __m256i c = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
          const __m256i lo = _mm256_permute2x128_si256(a, c, 0x20),
                        hi = _mm256_permute2x128_si256(a, c, 0x31);
          isum[h] = _mm256_add_epi32(_mm256_mullo_epi32(lo, K::scale_lanes(hd, 2 * (j0 + h))),
                                     _mm256_mullo_epi32(hi, K::scale_lanes(hd, 2 * (j0 + h) + 1)));
        } else {
          isum[h] = reduce8(s);
        }
        if constexpr (lane_scaled<K>() && kHead)
          isum[h] = _mm256_mullo_epi32(isum[h], K::scale_lanes(hd, j0 + h));
        else if constexpr (lane_scaled<K>())
          isum[h] =
              _mm256_mullo_epi32(isum[h], _mm256_load_si256(reinterpret_cast<const __m256i*>(sct[j0 + h])));
      }
      for (int h = 0; h < kStep; ++h) {
        const int64_t b = wb * K::kSubs + j0 + h;
        if constexpr (kHead) {
          const __m256i xsum =
              _mm256_castps_si256(token_lanes<NT>(reinterpret_cast<const float*>(xi.sum + b * xi.tpad + t0)));
          acc = K::vupdate(acc, isum[h], hd, j0 + h, token_lanes<NT>(xi.dx + b * xi.tpad + t0), xsum);
        } else {
          acc = block_update<K, MR, NT>(acc, isum[h], p, j0 + h, xi, t0, b);
        }
      }
    }
  }
  _mm256_storeu_ps(out, acc);
}

// The interleaved tile with VNNI: IL::dots also gets the tokens' block sums xs (for the 128 x correction).
template <class K, class IL, int MR, int NV>
STRATA_VNNI void vtile_il(const uint8_t* const* w, const uint8_t* scr, int64_t cols, const XInfo& xi,
                          int64_t g, int64_t nwb, float* out) {
  const int64_t nb = nwb * K::kSubs;
  __m256 acc[MR * NV];
  for (int i = 0; i < MR * NV; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t wb = 0; wb < nwb; ++wb) {
    typename K::Pre p[MR];
    for (int r = 0; r < MR; ++r) p[r] = K::pre(w[r] + wb * K::kBytes);
    for (int j = 0; j < K::kSubs; ++j) {
      const int64_t b = wb * K::kSubs + j;
      const uint8_t* a[MR];
      for (int r = 0; r < MR; ++r) a[r] = scr + r * cols + b * 32;
      const int8_t* xv[NV];
      __m256i hs[NV], xs[NV];
      __m256 dx[NV];
      for (int v = 0; v < NV; ++v) {
        xv[v] = xi.xt + ((g + v) * nb + b) * 256;
        hs[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xi.hsum + b * xi.tpad + (g + v) * 8));
        xs[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xi.sum + b * xi.tpad + (g + v) * 8));
        dx[v] = _mm256_loadu_ps(xi.dx + b * xi.tpad + (g + v) * 8);
      }
      __m256i isum[MR * NV];
      IL::template dots<MR, NV>(p, j, a, xv, hs, xs, isum);
      for (int v = 0; v < NV; ++v)
        for (int r = 0; r < MR; ++r) {
          if constexpr (requires { K::kHalfMins; })
            acc[r * NV + v] =
                K::template update<1, 8>(acc[r * NV + v], isum[r * NV + v], &p[r], j, dx[v], xs[v], hs[v]);
          else
            acc[r * NV + v] =
                K::template update<1, 8>(acc[r * NV + v], isum[r * NV + v], &p[r], j, dx[v], xs[v]);
        }
    }
  }
  for (int i = 0; i < MR * NV; ++i) _mm256_storeu_ps(out + i * 8, acc[i]);
}

// The halves of hs (int16 pairs: low = the first 16 elements' sum) as int32 lanes.
STRATA_VNNI inline __m256i half_lo(__m256i hs) { return _mm256_srai_epi32(_mm256_slli_epi32(hs, 16), 16); }
STRATA_VNNI inline __m256i half_hi(__m256i hs) { return _mm256_srai_epi32(hs, 16); }

// isum[r * NV + v] (+)= the int32 sums over steps k in [k0, k1) of row r's unsigned bytes 4k..4k+3 times
// token group v's activations of step k.
template <int MR, int NV>
STRATA_VNNI inline void vstep_sums(const uint8_t* const* a, const int8_t* const* xv, int k0, int k1,
                                   __m256i* isum) {
  for (int k = k0; k < k1; ++k) {
    __m256i x[NV];
    for (int v = 0; v < NV; ++v) x[v] = xload(xv[v] + k * 32);
    for (int r = 0; r < MR; ++r) {
      const __m256i aw = bcast4(a[r] + 4 * k);
      for (int v = 0; v < NV; ++v) isum[r * NV + v] = dpbusd(isum[r * NV + v], aw, x[v]);
    }
  }
}

// KBytes and IlBytes with VNNI. Scales: none (the 32-element formats, kSubs = 1); one per 32-block (FQ's Pre
// has sc16): for signed bytes on the reduced sums (lane_scale), for unsigned ones (q <= 31: the partials fit
// int16) by madd per row; one per half (sc8 or FQ::scales: Q3_K's |q| <= 4, the grid i-quants' |g| <= 62, so
// the partials fit int16) by madd per row. T > 4 multiplies the exact step sums by the scales.
template <class FQ>
struct VBytes : KBytes<FQ> {
  static constexpr bool kVnni = true;
  using Pre = typename FQ::Pre;
  static constexpr bool kBlockScale = requires(Pre p) { p.sc16; };
  static constexpr bool kHalfScales = requires(Pre p) { p.sc8; } || (!kBlockScale && FQ::kSubs > 1);
  // Unsigned bytes (q <= 31) keep the partials within int16, so madd applies the scale per row instead.
  static constexpr bool kLaneScale = kBlockScale && !FQ::kUnsigned;
  STRATA_VNNI static __m256i xcorr(__m256i x) {
    if constexpr (FQ::kUnsigned) return _mm256_setzero_si256();
    return neg_sums(x, static_cast<char>(0x80));
  }
  STRATA_VNNI static __m256i wbytes(const Pre& p, int j) {
    if constexpr (FQ::kUnsigned) return FQ::bytes(p, j);
    return flip(FQ::bytes(p, j));
  }
  STRATA_VNNI static __m256i vdot(const Pre& p, int j, __m256i x, __m256i xc) {
    const __m256i s = dpbusd(xc, wbytes(p, j), x);
    if constexpr (kHalfScales) {
      static_assert(requires { p.sc8; }, "the T <= 2 VNNI tile takes half scales from sc8");
      return _mm256_madd_epi16(s, low16(spread8_pair(p.sc8, j)));
    }
    if constexpr (kBlockScale && !kLaneScale) return _mm256_madd_epi16(s, low16(spread16(p.sc16, j)));
    return s;
  }
  static int lane_scale(const Pre& p, int j) {
    int sc[2];
    FQ::scales(p, j, sc);
    return sc[0];
  }
};

template <class FQ>
struct VIlBytes {
  using V = VBytes<FQ>;
  STRATA_VNNI static void unpack(const uint8_t* w, int64_t nb, uint8_t* scr) {
    for (int64_t wb = 0; wb < nb / FQ::kSubs; ++wb) {
      const typename FQ::Pre p = FQ::pre(w + wb * FQ::Bytes::kSize);
      for (int j = 0; j < FQ::kSubs; ++j) store32(scr + (wb * FQ::kSubs + j) * 32, V::wbytes(p, j));
    }
  }
  template <int MR, int NV>
  STRATA_VNNI static void dots(const typename FQ::Pre* p, int j, const uint8_t* const* a,
                               const int8_t* const* xv, const __m256i* hs, const __m256i* xs, __m256i* isum) {
    if constexpr (V::kHalfScales) {
      __m256i s0[MR * NV], s1[MR * NV];
      for (int r = 0; r < MR; ++r)
        for (int v = 0; v < NV; ++v) {
          s0[r * NV + v] = FQ::kUnsigned ? _mm256_setzero_si256() : _mm256_slli_epi32(half_lo(hs[v]), 7);
          s1[r * NV + v] = FQ::kUnsigned ? _mm256_setzero_si256() : _mm256_slli_epi32(half_hi(hs[v]), 7);
          s0[r * NV + v] = _mm256_sub_epi32(_mm256_setzero_si256(), s0[r * NV + v]);
          s1[r * NV + v] = _mm256_sub_epi32(_mm256_setzero_si256(), s1[r * NV + v]);
        }
      vstep_sums<MR, NV>(a, xv, 0, 4, s0);
      vstep_sums<MR, NV>(a, xv, 4, 8, s1);
      for (int r = 0; r < MR; ++r) {
        int sc[2];
        FQ::scales(p[r], j, sc);
        for (int v = 0; v < NV; ++v)
          isum[r * NV + v] = _mm256_add_epi32(_mm256_mullo_epi32(s0[r * NV + v], _mm256_set1_epi32(sc[0])),
                                              _mm256_mullo_epi32(s1[r * NV + v], _mm256_set1_epi32(sc[1])));
      }
    } else {
      for (int r = 0; r < MR; ++r)
        for (int v = 0; v < NV; ++v)
          isum[r * NV + v] = FQ::kUnsigned
                                 ? _mm256_setzero_si256()
                                 : _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(xs[v], 7));
      vstep_sums<MR, NV>(a, xv, 0, 8, isum);
      if constexpr (V::kBlockScale)
        for (int r = 0; r < MR; ++r) {
          const __m256i sc = _mm256_set1_epi32(V::lane_scale(p[r], j));
          for (int v = 0; v < NV; ++v) isum[r * NV + v] = _mm256_mullo_epi32(isum[r * NV + v], sc);
        }
    }
  }
};

// A format's VNNI kernel: for T <= kSmallMax (2 or 4) the tiles of KS (a VNNI K, with kVnni, or the AVX2 K
// where VNNI lost there), above it the VNNI interleaved tile of K and IL (for most formats faster than the 2
// x 4 tile from T = 3, bench/NOTES.md 2026-12-05).
template <class KS, class K, class IL, int kSmallMax = 2>
void mmq_vnni(const void* W, size_t rbytes, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
              int64_t T, float* Y, int64_t ldy) {
  static_assert(kSmallMax == 2 || kSmallMax == 4);
  constexpr bool v = requires { KS::kVnni; };
  const uint8_t* w = static_cast<const uint8_t*>(W);
  if (T == 1)
    rows_tokens<KS, 8, 1, v>(w, rbytes, rows, cols, Xq, xrb, T, Y, ldy);
  else if (T == 2)
    rows_tokens<KS, 4, 2, v>(w, rbytes, rows, cols, Xq, xrb, T, Y, ldy);
  else if (T <= kSmallMax)
    rows_tokens<KS, 2, 4, v>(w, rbytes, rows, cols, Xq, xrb, T, Y, ldy);
  else
    rows_groups<K, IL, 4, 2, true>(w, rbytes, rows, cols, Xq, xrb, T, Y, ldy);
}

#endif  // __x86_64__

}  // namespace
}  // namespace quant_detail
}  // namespace strata
