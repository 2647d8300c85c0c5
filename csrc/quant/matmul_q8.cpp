// matmul_q8: quantized weights times q8_0-quantized activations with integer dot products per
// 32-element block (llama.cpp's CPU path), in the one float order quant.h defines.
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

}  // namespace

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

#if defined(__x86_64__)
namespace {

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

// Per call, each token's block scales and int8 sums, block-major ([b][t], tokens padded to a
// multiple of 8 with zeros), so a tile loads its NT tokens' values with one instruction. For the
// interleaved kernels (T > 4) also each block's two 16-element half sums (int16 pair: low = first
// half) and xt: the int8 activations regrouped [group of 8 tokens][b][step k][token][4 elements],
// so one load gives elements 4k..4k+3 of block b for eight tokens.
struct XInfo {
  const float* dx;
  const int32_t* sum;
  const int32_t* hsum;
  const int8_t* xt;
  int64_t tpad;
};

// Per-thread scratch for XInfo; grows to the largest call and is reused.
STRATA_SIMD XInfo x_info(const uint8_t* Xq, int64_t xrb, int64_t T, int64_t nb, bool interleave = false) {
  thread_local std::vector<float> dx;
  thread_local std::vector<int32_t> sum, hsum;
  thread_local std::vector<int8_t> xt;
  const int64_t tpad = (T + 7) / 8 * 8;
  dx.assign(static_cast<size_t>(nb * tpad), 0.0f);
  sum.assign(static_cast<size_t>(nb * tpad), 0);
  if (interleave) {
    hsum.assign(static_cast<size_t>(nb * tpad), 0);
    xt.assign(static_cast<size_t>(nb * tpad * 32), 0);
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* xb = Xq + t * xrb + b * kQ8_0Bytes;
      dx[b * tpad + t] = h2f_at(xb + kXd);
      const __m256i x = load256(xb + kXqs);
      const __m256i s8 =
          _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), x), _mm256_set1_epi16(1));
      const __m128i lo = _mm256_castsi256_si128(s8), hi = _mm256_extracti128_si256(s8, 1);
      sum[b * tpad + t] = hsum_epi32(_mm_add_epi32(lo, hi));
      if (interleave) {
        const uint32_t h0 = static_cast<uint16_t>(hsum_epi32(lo)), h1 = static_cast<uint16_t>(hsum_epi32(hi));
        hsum[b * tpad + t] = static_cast<int32_t>(h0 | (h1 << 16));
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

// ---- Each format's 32-block j of a weight block as 32 bytes (byte l: element l), from the layout
// in formats.h; the K (T <= 4) and Il (T > 4) kernels below multiply them. ----

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

// A type's kernel: kSubs 32-blocks per weight block; Pre holds one row's decoded block header;
// dot() gives 8 int32 partials summing to the 32-block's integer term (scales that vary inside
// the weight block applied); update() adds the block to the lane accumulators.

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

struct KQ4_K {
  static constexpr int kSubs = kBlocksK;
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
  };
  STRATA_SIMD static Pre pre(const uint8_t* blk) {
    const BlockQ6_K* b = reinterpret_cast<const BlockQ6_K*>(blk);
    return {h2f(b->d), b};
  }
  STRATA_SIMD static __m256i dot(const Pre& p, int j, __m256i x) {
    // (q + bias) . x - bias . x, each within int16.
    const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(q6_k_bytes(*p.b, j), x),
                                         _mm256_maddubs_epi16(_mm256_set1_epi8(kQ6_KBias), x));
    const int8_t* sc = p.b->scales + q6_k_group(j).scale;
    return _mm256_madd_epi16(p16, _mm256_set_m128i(_mm_set1_epi16(sc[1]), _mm_set1_epi16(sc[0])));
  }
  template <int MR, int NT>
  STRATA_SIMD static __m256 update(__m256 acc, __m256i isum, const Pre* p, int, __m256 dx, __m256i) {
    const __m256 d = row_lanes_ps<MR, NT>([&](int r) { return p[r].d; });
    return _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(isum), acc);
  }
};

struct KIQ2_XS {
  static constexpr int kSubs = kBlocksK;
  static constexpr size_t kBytes = sizeof(BlockIQ2_XS);
  struct Pre {
    float d;
    const BlockIQ2_XS* b;
  };
  STRATA_SIMD static Pre pre(const uint8_t* blk) {
    const BlockIQ2_XS* b = reinterpret_cast<const BlockIQ2_XS*>(blk);
    return {h2f(b->d), b};
  }
  STRATA_SIMD static __m256i dot(const Pre& p, int j, __m256i x) {
    const __m256i p16 =
        _mm256_maddubs_epi16(iq2_xs_grid_bytes(*p.b, j), _mm256_sign_epi8(x, iq2_xs_sign_bytes(*p.b, j)));
    const __m256i sc = _mm256_set_m128i(_mm_set1_epi16(iq2_xs_scale_odd(*p.b, j, 1)),
                                        _mm_set1_epi16(iq2_xs_scale_odd(*p.b, j, 0)));
    return _mm256_madd_epi16(p16, sc);
  }
  template <int MR, int NT>
  STRATA_SIMD static __m256 update(__m256 acc, __m256i isum, const Pre* p, int, __m256 dx, __m256i) {
    const __m256 d = row_lanes_ps<MR, NT>([&](int r) { return p[r].d; });
    const __m256 ddx = _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_set1_ps(kIq2xsOddScaleUnit));
    return _mm256_fmadd_ps(ddx, _mm256_cvtepi32_ps(isum), acc);
  }
};

// out[r * NT + t] = row w[r] . token x[t] over nwb weight blocks; xi covers tokens t0.. of x.
template <class K, int MR, int NT>
STRATA_SIMD void tile(const uint8_t* const* w, const uint8_t* const* x, const XInfo& xi, int64_t t0,
                      int64_t nwb, float* out) {
  static_assert(MR * NT == 8);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t wb = 0; wb < nwb; ++wb) {
    typename K::Pre p[MR];
    for (int r = 0; r < MR; ++r) p[r] = K::pre(w[r] + wb * K::kBytes);
    for (int j = 0; j < K::kSubs; ++j) {
      const int64_t b = wb * K::kSubs + j;
      __m256i xv[NT];
      for (int t = 0; t < NT; ++t) xv[t] = load256(x[t] + b * kQ8_0Bytes + kXqs);
      __m256i s[8];
      for (int r = 0; r < MR; ++r)
        for (int t = 0; t < NT; ++t) s[r * NT + t] = K::dot(p[r], j, xv[t]);
      const __m256 dx = token_lanes<NT>(xi.dx + b * xi.tpad + t0);
      const __m256i xsum =
          _mm256_castps_si256(token_lanes<NT>(reinterpret_cast<const float*>(xi.sum + b * xi.tpad + t0)));
      acc = K::template update<MR, NT>(acc, reduce8(s), p, j, dx, xsum);
    }
  }
  _mm256_storeu_ps(out, acc);
}

// Rows outer, tokens inner: MR weight rows stay in L1 while every token passes over them.
template <class K, int MR, int NT>
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
STRATA_SIMD inline void store32(uint8_t* p, __m256i v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
}
// Two int16 (low, high) as one int32 lane pattern, for madd_epi16 against hsum.
inline int32_t pair16(int a, int b) {
  return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(a)) |
                              (static_cast<uint32_t>(static_cast<uint16_t>(b)) << 16));
}

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
    for (int i = 0; i < MR * NV; ++i) s16[i] = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      __m256i x[NV];
      for (int v = 0; v < NV; ++v) x[v] = xload(xv[v] + k * 32);
      for (int r = 0; r < MR; ++r) {
        const __m256i aw = bcast4(a[r] + 4 * k);
        for (int v = 0; v < NV; ++v)
          s16[r * NV + v] = _mm256_add_epi16(s16[r * NV + v], _mm256_maddubs_epi16(aw, x[v]));
      }
    }
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
        for (int r = 0; r < MR; ++r)
          acc[r * NV + v] = K::template update<1, 8>(acc[r * NV + v], isum[r * NV + v], &p[r], j, dx, xsum);
      }
    }
  }
  for (int i = 0; i < MR * NV; ++i) _mm256_storeu_ps(out + i * 8, acc[i]);
}

template <class K, class IL, int MR, int NV>
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
      if (nv == NV)
        tile_il<K, IL, MR, NV>(w, scr.data(), cols, xi, g, nwb, out);
      else
        tile_il<K, IL, MR, 1>(w, scr.data(), cols, xi, g, nwb, out);
      for (int v = 0; v < nv; ++v, ++g) {
        const int64_t nt = std::min<int64_t>(8, T - g * 8);
        for (int64_t t = 0; t < nt; ++t)
          for (int64_t r = 0; r < mr; ++r) Y[(g * 8 + t) * ldy + r0 + r] = out[(r * nv + v) * 8 + t];
      }
    }
  }
}

template <class K>
struct Il;
template <>
struct Il<KQ8_0> {
  using type = IlQ8_0;
};
template <>
struct Il<KQ4_K> {
  using type = IlQ4_K;
};
template <>
struct Il<KQ6_K> {
  using type = IlQ6_K;
};
template <>
struct Il<KIQ2_XS> {
  using type = IlIQ2_XS;
};

template <class K>
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
    rows_groups<K, typename Il<K>::type, 4, 2>(w, rbytes, rows, cols, Xq, xrb, T, Y, ldy);
}

}  // namespace

void mmq_q8_0_avx2(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                   int64_t T, float* Y, int64_t ldy) {
  mmq_avx2<KQ8_0>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);
}
void mmq_q4_k_avx2(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                   int64_t T, float* Y, int64_t ldy) {
  mmq_avx2<KQ4_K>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);
}
void mmq_q6_k_avx2(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                   int64_t T, float* Y, int64_t ldy) {
  mmq_avx2<KQ6_K>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);
}
void mmq_iq2_xs_avx2(const void* W, size_t rb, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrb,
                     int64_t T, float* Y, int64_t ldy) {
  mmq_avx2<KIQ2_XS>(W, rb, rows, cols, Xq, xrb, T, Y, ldy);
}
#endif

}  // namespace quant_detail

bool has_matmul_q8(QType t) { return quant_traits(t).matmul_q8 != nullptr; }

bool uses_matmul_q8(uint32_t ggml_type) {
  const QuantTraits* q = find_quant(ggml_type);
  return q && q->matmul_q8 != nullptr;
}

void matmul_q8(Isa isa, QType t, const void* W, int64_t rows, int64_t cols, const uint8_t* Xq,
               int64_t xrow_bytes, int64_t T, float* Y, int64_t ldy, ThreadPool& pool) {
  const QuantTraits& q = quant_traits(t);
  STRATA_CHECK(q.matmul_q8, UnsupportedError, "matmul_q8: no integer kernel for ", q.name,
               " weights; use matmul (float activations) for this type");
  const size_t rbytes = row_bytes(t, cols);
  STRATA_CHECK(cols % kQK8_0 == 0, ConfigError, "matmul_q8: cols=", cols, " is not a multiple of ", kQK8_0);
  STRATA_CHECK(rows >= 0 && T >= 0, ConfigError, "matmul_q8: negative shape rows=", rows, " T=", T);
  STRATA_CHECK(xrow_bytes >= cols / kQK8_0 * kQ8_0Bytes && ldy >= rows, ConfigError,
               "matmul_q8: xrow_bytes=", xrow_bytes, " or ldy=", ldy, " is smaller than a row (",
               cols / kQK8_0 * kQ8_0Bytes, " bytes, ", rows, " floats)");
  if (rows == 0 || T == 0) return;
  MatmulQ8Fn fn = q.matmul_q8;
  if (isa == Isa::Avx2) {
    STRATA_CHECK(best_isa() == Isa::Avx2 && q.matmul_q8_simd, UnsupportedError,
                 "matmul_q8: this CPU lacks AVX2/FMA/F16C");
    fn = q.matmul_q8_simd;
  }
  // About four chunks per thread, whole 8-row tiles for decode.
  const int64_t per = (rows + 4 * pool.size() - 1) / (4 * pool.size());
  const int64_t grain = std::max<int64_t>(8, (per + 7) / 8 * 8);
  const uint8_t* w = static_cast<const uint8_t*>(W);
  pool.parallel_for(rows, grain, [&](int64_t r0, int64_t r1, int) {
    fn(w + r0 * rbytes, rbytes, r1 - r0, cols, Xq, xrow_bytes, T, Y + r0, ldy);
  });
}

void matmul_q8(QType t, const void* W, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrow_bytes,
               int64_t T, float* Y, int64_t ldy, ThreadPool& pool) {
  matmul_q8(best_isa(), t, W, rows, cols, Xq, xrow_bytes, T, Y, ldy, pool);
}

}  // namespace strata
