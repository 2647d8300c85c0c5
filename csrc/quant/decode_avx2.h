// AVX2 decoders: per format, a row's elements eight at a time as float32 vectors, with exactly
// the float32 operations of the scalar dequantization. The AVX2 dequantization rows store them;
// matmul's T = 1 kernels multiply them in place.
#pragma once
#if defined(__x86_64__)
#include <cstdint>
#include <cstring>

#include "quant/formats.h"
#include "quant/simd.h"

namespace strata::quant_detail {

// A decoder walks a block of kBlock elements as kSubs parts (their scales decoded once into a
// Sub) of kGroups groups of 8 elements; tail gives element c of a row past its last whole block.

struct DecF16 {
  static constexpr int64_t kBlock = 8, kSubs = 1, kGroups = 1;
  struct Sub {
    const uint16_t* h;
  };
  STRATA_SIMD static Sub sub(const uint8_t* row, int64_t blk, int) {
    return {reinterpret_cast<const uint16_t*>(row) + blk * 8};
  }
  STRATA_SIMD static __m256 group(const Sub& s, int) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s.h)));  // exact, as fp16_to_f32
  }
  static float tail(const uint8_t* row, int64_t c) {
    return fp16_to_f32(reinterpret_cast<const uint16_t*>(row)[c]);
  }
};

struct DecBF16 {
  static constexpr int64_t kBlock = 8, kSubs = 1, kGroups = 1;
  struct Sub {
    const uint16_t* h;
  };
  STRATA_SIMD static Sub sub(const uint8_t* row, int64_t blk, int) {
    return {reinterpret_cast<const uint16_t*>(row) + blk * 8};
  }
  STRATA_SIMD static __m256 group(const Sub& s, int) {  // bf16_to_f32: the bits shifted up by 16
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s.h)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
  static float tail(const uint8_t* row, int64_t c) {
    return bf16_to_f32(reinterpret_cast<const uint16_t*>(row)[c]);
  }
};

struct DecQ8_0 {
  static constexpr int64_t kBlock = kQK8_0, kSubs = 1, kGroups = kQK8_0 / 8;
  struct Sub {
    __m256 d;
    const int8_t* qs;
  };
  STRATA_SIMD static Sub sub(const uint8_t* row, int64_t blk, int) {
    const BlockQ8_0& b = reinterpret_cast<const BlockQ8_0*>(row)[blk];
    return {_mm256_set1_ps(h2f(b.d)), b.qs};
  }
  STRATA_SIMD static __m256 group(const Sub& s, int g) {
    return _mm256_mul_ps(_mm256_cvtepi32_ps(i8x8(s.qs + 8 * g)), s.d);
  }
  static float tail(const uint8_t*, int64_t) { return 0.0f; }  // rows are whole blocks
};

struct DecQ4_K {  // parts: the eight 32-element sub-blocks
  static constexpr int64_t kBlock = kQK_K, kSubs = 8, kGroups = 4;
  struct Sub {
    __m256 ds, dm;
    const uint8_t* q;
    __m128i shift;
  };
  STRATA_SIMD static Sub sub(const uint8_t* row, int64_t blk, int j) {
    const BlockQ4_K& b = reinterpret_cast<const BlockQ4_K*>(row)[blk];
    uint8_t sc, m;
    q4_k_scale_min(b.scales, j, sc, m);
    const Q4_KSub s = q4_k_sub(j);
    return {_mm256_set1_ps(h2f(b.d) * static_cast<float>(sc)),
            _mm256_set1_ps(h2f(b.dmin) * static_cast<float>(m)), b.qs + s.qs, _mm_cvtsi32_si128(s.shift)};
  }
  STRATA_SIMD static __m256 group(const Sub& s, int g) {
    const __m256i q =
        _mm256_and_si256(_mm256_srl_epi32(u8x8(s.q + 8 * g), s.shift), _mm256_set1_epi32(kQ4_KMask));
    return _mm256_sub_ps(_mm256_mul_ps(s.ds, _mm256_cvtepi32_ps(q)), s.dm);
  }
  static float tail(const uint8_t*, int64_t) { return 0.0f; }
};

struct DecQ6_K {  // parts: the eight 32-element groups
  static constexpr int64_t kBlock = kQK_K, kSubs = 8, kGroups = 4;
  struct Sub {
    __m256 ds0, ds1;  // the scales of the group's two 16-element halves
    const uint8_t *ql, *qh;
    __m128i ql_shift, qh_shift;
  };
  STRATA_SIMD static Sub sub(const uint8_t* row, int64_t blk, int p) {
    const BlockQ6_K& b = reinterpret_cast<const BlockQ6_K*>(row)[blk];
    const Q6_KGroup g = q6_k_group(p);
    const float d = h2f(b.d);
    return {_mm256_set1_ps(d * static_cast<float>(b.scales[g.scale])),
            _mm256_set1_ps(d * static_cast<float>(b.scales[g.scale + 1])),
            b.ql + g.ql,
            b.qh + g.qh,
            _mm_cvtsi32_si128(g.ql_shift),
            _mm_cvtsi32_si128(g.qh_shift)};
  }
  STRATA_SIMD static __m256 group(const Sub& s, int g) {
    const __m256i lo =
        _mm256_and_si256(_mm256_srl_epi32(u8x8(s.ql + 8 * g), s.ql_shift), _mm256_set1_epi32(kQ6_KLowMask));
    const __m256i hi =
        _mm256_and_si256(_mm256_srl_epi32(u8x8(s.qh + 8 * g), s.qh_shift), _mm256_set1_epi32(kQ6_KHighMask));
    const __m256i q =
        _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(kQ6_KBias));
    return _mm256_mul_ps(g < 2 ? s.ds0 : s.ds1, _mm256_cvtepi32_ps(q));
  }
  static float tail(const uint8_t*, int64_t) { return 0.0f; }
};

struct DecIQ2_XS {  // parts: the sixteen 16-element groups, each two grid entries
  static constexpr int64_t kBlock = kQK_K, kSubs = 16, kGroups = 2;
  struct Sub {
    __m256 db;
    const uint16_t* qs;
  };
  STRATA_SIMD static Sub sub(const uint8_t* row, int64_t blk, int g) {
    const BlockIQ2_XS& b = reinterpret_cast<const BlockIQ2_XS*>(row)[blk];
    return {_mm256_set1_ps(iq2_xs_group_scale(h2f(b.d), iq2_xs_scale(b, g / 2, g % 2))), b.qs + 2 * g};
  }
  STRATA_SIMD static __m256 group(const Sub& s, int k) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);  // element e: sign bit e
    const uint16_t q = s.qs[k];
    const __m256i grid =
        _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(kIq2xsGrid[iq2_xs_grid_index(q)])));
    const __m256i sb = _mm256_and_si256(_mm256_set1_epi32(kIq2xsSigns[iq2_xs_sign_index(q)]), bit);
    const __m256 sign = _mm256_blendv_ps(_mm256_set1_ps(1.0f), _mm256_set1_ps(-1.0f),
                                         _mm256_castsi256_ps(_mm256_cmpeq_epi32(sb, bit)));
    return _mm256_mul_ps(_mm256_mul_ps(s.db, _mm256_cvtepi32_ps(grid)), sign);  // multiplies, as numpy
  }
  static float tail(const uint8_t*, int64_t) { return 0.0f; }
};

// ---- The newer formats through one decoder: each gives a 32-element block as 32 signed bytes (the
// same bytes the integer kernels multiply) and the float steps that turn a byte into dequant_row's
// value: v * s, (v * s) + o or (v * s) - o, with s and o per 16-element half. ----

// Bytes 0-15: the low nibbles of the 16 bytes at qs; bytes 16-31: their high nibbles.
STRATA_SIMD inline __m256i nibbles32(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m));
}
// Byte l: 0xFF where bit l of the 32-bit little-endian word at p is set, else 0.
STRATA_SIMD inline __m256i bit_mask32(const uint8_t* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(w)),
                                             _mm256_setr_epi64x(0x0000000000000000ll, 0x0101010101010101ll,
                                                                0x0202020202020202ll, 0x0303030303030303ll));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}
// Byte l: 0x10 where bit l of the word at qh is set, else 0.
STRATA_SIMD inline __m256i high_bits32(const uint8_t* qh) {
  return _mm256_and_si256(bit_mask32(qh), _mm256_set1_epi8(0x10));
}
// Bit `bit` of each of the 32 bytes at p, as 0 or 1.
STRATA_SIMD inline __m256i bit_of_bytes(const uint8_t* p, int bit) {
  return _mm256_and_si256(_mm256_srl_epi16(load256(p), _mm_cvtsi32_si128(bit)), _mm256_set1_epi8(1));
}
// A 16-entry codebook of signed bytes, in both 128-bit lanes, for _mm256_shuffle_epi8.
STRATA_SIMD inline __m256i codebook32(uint64_t lo, uint64_t hi) {
  return _mm256_set_epi64x(static_cast<long long>(hi), static_cast<long long>(lo), static_cast<long long>(hi),
                           static_cast<long long>(lo));
}

enum class Form { Mul, MulAdd, MulSub, MulEighth };  // MulEighth: v * s with v = byte * 0.125 (exact)

// A 32-element block's bytes and the float steps of its two halves.
struct Bytes32 {
  __m256i v;
  float s0, s1, o0 = 0.0f, o1 = 0.0f;
};

// The formats: kBlock elements per block, kSize bytes, kForm, at(block, j) for 32-block j.
struct Q4_0Bytes {
  static constexpr int64_t kBlock = kQK4;
  static constexpr size_t kSize = sizeof(BlockQ4_0);
  static constexpr Form kForm = Form::Mul;
  STRATA_SIMD static Bytes32 at(const uint8_t* blk, int) {
    const BlockQ4_0& b = *reinterpret_cast<const BlockQ4_0*>(blk);
    const float d = h2f(b.d);
    return {_mm256_sub_epi8(nibbles32(b.qs), _mm256_set1_epi8(kQ4_0Bias)), d, d};
  }
};
struct Q4_1Bytes {
  static constexpr int64_t kBlock = kQK4;
  static constexpr size_t kSize = sizeof(BlockQ4_1);
  static constexpr Form kForm = Form::MulAdd;
  STRATA_SIMD static Bytes32 at(const uint8_t* blk, int) {
    const BlockQ4_1& b = *reinterpret_cast<const BlockQ4_1*>(blk);
    const float d = h2f(b.d), m = h2f(b.m);
    return {nibbles32(b.qs), d, d, m, m};
  }
};
struct Q5_0Bytes {
  static constexpr int64_t kBlock = kQK4;
  static constexpr size_t kSize = sizeof(BlockQ5_0);
  static constexpr Form kForm = Form::Mul;
  STRATA_SIMD static Bytes32 at(const uint8_t* blk, int) {
    const BlockQ5_0& b = *reinterpret_cast<const BlockQ5_0*>(blk);
    const float d = h2f(b.d);
    const __m256i q = _mm256_or_si256(nibbles32(b.qs), high_bits32(b.qh));
    return {_mm256_sub_epi8(q, _mm256_set1_epi8(kQ5_0Bias)), d, d};
  }
};
struct Q5_1Bytes {
  static constexpr int64_t kBlock = kQK4;
  static constexpr size_t kSize = sizeof(BlockQ5_1);
  static constexpr Form kForm = Form::MulAdd;
  STRATA_SIMD static Bytes32 at(const uint8_t* blk, int) {
    const BlockQ5_1& b = *reinterpret_cast<const BlockQ5_1*>(blk);
    const float d = h2f(b.d), m = h2f(b.m);
    return {_mm256_or_si256(nibbles32(b.qs), high_bits32(b.qh)), d, d, m, m};
  }
};
struct IQ4_NLBytes {
  static constexpr int64_t kBlock = kQK4;
  static constexpr size_t kSize = sizeof(BlockIQ4_NL);
  static constexpr Form kForm = Form::Mul;
  STRATA_SIMD static Bytes32 at(const uint8_t* blk, int) {
    const BlockIQ4_NL& b = *reinterpret_cast<const BlockIQ4_NL*>(blk);
    const float d = h2f(b.d);
    return {_mm256_shuffle_epi8(codebook32(kIq4nlLo, kIq4nlHi), nibbles32(b.qs)), d, d};
  }
};
struct MXFP4Bytes {
  static constexpr int64_t kBlock = kQK4;
  static constexpr size_t kSize = sizeof(BlockMXFP4);
  static constexpr Form kForm = Form::Mul;
  STRATA_SIMD static Bytes32 at(const uint8_t* blk, int) {
    const BlockMXFP4& b = *reinterpret_cast<const BlockMXFP4*>(blk);
    const float d = f32_from_bits(e8m0_half_bits(b.e));
    return {_mm256_shuffle_epi8(codebook32(kMxfp4Lo, kMxfp4Hi), nibbles32(b.qs)), d, d};
  }
};
struct Q5_KBytes {  // q in [0, 31]; s = d * sc, o = dmin * m
  static constexpr int64_t kBlock = kQK_K;
  static constexpr size_t kSize = sizeof(BlockQ5_K);
  static constexpr Form kForm = Form::MulSub;
  STRATA_SIMD static __m256i q(const BlockQ5_K& b, int j) {
    const Q4_KSub s = q4_k_sub(j);
    const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(load256(b.qs + s.qs), _mm_cvtsi32_si128(s.shift)),
                                        _mm256_set1_epi8(0xF));
    return _mm256_or_si256(lo, _mm256_slli_epi16(bit_of_bytes(b.qh, j), 4));
  }
  STRATA_SIMD static Bytes32 at(const uint8_t* blk, int j) {
    const BlockQ5_K& b = *reinterpret_cast<const BlockQ5_K*>(blk);
    uint8_t sc, m;
    q4_k_scale_min(b.scales, j, sc, m);
    const float ds = h2f(b.d) * static_cast<float>(sc), dm = h2f(b.dmin) * static_cast<float>(m);
    return {q(b, j), ds, ds, dm, dm};
  }
};
struct Q3_KBytes {  // q in [-4, 3]; s = d * sc per half
  static constexpr int64_t kBlock = kQK_K;
  static constexpr size_t kSize = sizeof(BlockQ3_K);
  static constexpr Form kForm = Form::Mul;
  STRATA_SIMD static __m256i q(const BlockQ3_K& b, int j) {
    const Q3_KSub s = q3_k_sub(j);
    const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(load256(b.qs + s.qs), _mm_cvtsi32_si128(s.shift)),
                                        _mm256_set1_epi8(3));
    const __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(bit_of_bytes(b.hmask, j), 2));
    return _mm256_sub_epi8(q, _mm256_set1_epi8(kQ3_KBias));
  }
  STRATA_SIMD static Bytes32 at(const uint8_t* blk, int j) {
    const BlockQ3_K& b = *reinterpret_cast<const BlockQ3_K*>(blk);
    const float d = h2f(b.d);
    return {q(b, j), d * static_cast<float>(q3_k_scale(b.scales, 2 * j)),
            d * static_cast<float>(q3_k_scale(b.scales, 2 * j + 1))};
  }
};
struct IQ4_XSBytes {  // codebook values; s = d * (sc - 32)
  static constexpr int64_t kBlock = kQK_K;
  static constexpr size_t kSize = sizeof(BlockIQ4_XS);
  static constexpr Form kForm = Form::Mul;
  STRATA_SIMD static __m256i q(const BlockIQ4_XS& b, int j) {
    return _mm256_shuffle_epi8(codebook32(kIq4nlLo, kIq4nlHi), nibbles32(b.qs + 16 * j));
  }
  STRATA_SIMD static Bytes32 at(const uint8_t* blk, int j) {
    const BlockIQ4_XS& b = *reinterpret_cast<const BlockIQ4_XS*>(blk);
    const float dl = h2f(b.d) * static_cast<float>(iq4_xs_scale(b, j));
    return {q(b, j), dl, dl};
  }
};

// ---- The grid i-quants: bytes are the signed grid values (IQ1: 8 (g + delta)). ----

// 0xFF (-1) in byte l where bit l of the 32 bits at p is set, else 0x01: for _mm256_sign_epi8.
STRATA_SIMD inline __m256i sign_bits32(const uint8_t* p) {
  return _mm256_or_si256(bit_mask32(p), _mm256_set1_epi8(1));
}
inline long long grid_ll(uint64_t v) { return static_cast<long long>(v); }

struct IQ3_XXSBytes {
  static constexpr int64_t kBlock = kQK_K;
  static constexpr size_t kSize = sizeof(BlockIQ3_XXS);
  static constexpr Form kForm = Form::Mul;
  STRATA_SIMD static __m256i q(const BlockIQ3_XXS& b, int j) {
    const uint8_t* i = b.qs + 8 * j;
    const __m256i mag =
        _mm256_setr_epi32(static_cast<int>(kIq3xxsGrid[i[0]]), static_cast<int>(kIq3xxsGrid[i[1]]),
                          static_cast<int>(kIq3xxsGrid[i[2]]), static_cast<int>(kIq3xxsGrid[i[3]]),
                          static_cast<int>(kIq3xxsGrid[i[4]]), static_cast<int>(kIq3xxsGrid[i[5]]),
                          static_cast<int>(kIq3xxsGrid[i[6]]), static_cast<int>(kIq3xxsGrid[i[7]]));
    const uint32_t w = iq3_xxs_word(b, j);
    const auto sg = [&](int k) { return grid_ll(kIq2xsSignBytes[(w >> (7 * k)) & 127]); };
    return _mm256_sign_epi8(mag, _mm256_set_epi64x(sg(3), sg(2), sg(1), sg(0)));
  }
  STRATA_SIMD static Bytes32 at(const uint8_t* blk, int j) {
    const BlockIQ3_XXS& b = *reinterpret_cast<const BlockIQ3_XXS*>(blk);
    const float db = h2f(b.d) * (0.5f + static_cast<float>(iq3_xxs_scale(b, j))) * 0.5f;
    return {q(b, j), db, db};
  }
};
struct IQ3_SBytes {
  static constexpr int64_t kBlock = kQK_K;
  static constexpr size_t kSize = sizeof(BlockIQ3_S);
  static constexpr Form kForm = Form::Mul;
  STRATA_SIMD static __m256i q(const BlockIQ3_S& b, int j) {
    int g[8];
    for (int k = 0; k < 8; ++k) {
      const int i = 8 * j + k;
      g[k] = static_cast<int>(kIq3sGrid[b.qs[i] | (((b.qh[i / 8] >> (i % 8)) & 1) << 8)]);
    }
    const __m256i mag = _mm256_setr_epi32(g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]);
    return _mm256_sign_epi8(mag, sign_bits32(b.signs + 4 * j));
  }
  STRATA_SIMD static Bytes32 at(const uint8_t* blk, int j) {
    const BlockIQ3_S& b = *reinterpret_cast<const BlockIQ3_S*>(blk);
    const float db = h2f(b.d) * static_cast<float>(1 + 2 * iq3_s_scale(b, j));
    return {q(b, j), db, db};
  }
};
struct IQ2_SBytes {
  static constexpr int64_t kBlock = kQK_K;
  static constexpr size_t kSize = sizeof(BlockIQ2_S);
  static constexpr Form kForm = Form::Mul;
  STRATA_SIMD static __m256i q(const BlockIQ2_S& b, int j) {
    const auto g = [&](int k) {
      const int i = 4 * j + k;
      return grid_ll(kIq2sGrid[b.qs[i] | (((b.qh[i / 4] >> (2 * (i % 4))) & 3) << 8)]);
    };
    return _mm256_sign_epi8(_mm256_set_epi64x(g(3), g(2), g(1), g(0)), sign_bits32(b.signs + 4 * j));
  }
  STRATA_SIMD static Bytes32 at(const uint8_t* blk, int j) {
    const BlockIQ2_S& b = *reinterpret_cast<const BlockIQ2_S*>(blk);
    const float d = h2f(b.d);
    return {q(b, j), iq2_xs_group_scale(d, iq2_s_scale(b, 2 * j)),
            iq2_xs_group_scale(d, iq2_s_scale(b, 2 * j + 1))};
  }
};
// 8 g + delta byte by byte, g in {-1, 0, 1} from four grid entries, delta +-1 per 8 elements.
STRATA_SIMD inline __m256i iq1_bytes(const int index[4], const int delta[4]) {
  const auto g = [&](int k) { return grid_ll(kIq1sGrid[index[k]]); };
  const __m256i g8 = _mm256_sign_epi8(_mm256_set1_epi8(8), _mm256_set_epi64x(g(3), g(2), g(1), g(0)));
  const auto dl = [&](int k) {
    return grid_ll(static_cast<uint64_t>(static_cast<uint8_t>(delta[k])) * 0x0101010101010101ull);
  };
  return _mm256_add_epi8(g8, _mm256_set_epi64x(dl(3), dl(2), dl(1), dl(0)));
}
struct IQ1_SBytes {
  static constexpr int64_t kBlock = kQK_K;
  static constexpr size_t kSize = sizeof(BlockIQ1_S);
  static constexpr Form kForm = Form::MulEighth;
  STRATA_SIMD static __m256i q(const BlockIQ1_S& b, int j) {
    int index[4], delta[4];
    for (int k = 0; k < 4; ++k) {
      index[k] = b.qs[4 * j + k] | (((b.qh[j] >> (3 * k)) & 7) << 8);
      delta[k] = iq1_s_delta_negative(b, j) ? -1 : 1;
    }
    return iq1_bytes(index, delta);
  }
  STRATA_SIMD static Bytes32 at(const uint8_t* blk, int j) {
    const BlockIQ1_S& b = *reinterpret_cast<const BlockIQ1_S*>(blk);
    const float dl = h2f(b.d) * static_cast<float>(2 * iq1_s_scale(b, j) + 1);
    return {q(b, j), dl, dl};
  }
};
struct IQ1_MBytes {
  static constexpr int64_t kBlock = kQK_K;
  static constexpr size_t kSize = sizeof(BlockIQ1_M);
  static constexpr Form kForm = Form::MulEighth;
  STRATA_SIMD static __m256i q(const BlockIQ1_M& b, int j) {
    int index[4], delta[4];
    for (int k = 0; k < 4; ++k) {
      const int i = 4 * j + k, nib = (b.qh[i / 2] >> (4 * (i % 2))) & 0xF;
      index[k] = b.qs[i] | ((nib & 7) << 8);
      delta[k] = (nib & 8) ? -1 : 1;
    }
    return iq1_bytes(index, delta);
  }
  STRATA_SIMD static Bytes32 at(const uint8_t* blk, int j) {
    const BlockIQ1_M& b = *reinterpret_cast<const BlockIQ1_M*>(blk);
    const float d = h2f(iq1_m_d(b));
    return {q(b, j), d * static_cast<float>(2 * iq1_m_scale(b, 2 * j) + 1),
            d * static_cast<float>(2 * iq1_m_scale(b, 2 * j + 1) + 1)};
  }
};

// The two older types with no decoder of their own above.
struct Q2_KBytes {  // q in [0, 3]; s = d * sc, o = dmin * m per 16 elements
  static constexpr int64_t kBlock = kQK_K;
  static constexpr size_t kSize = sizeof(BlockQ2_K);
  static constexpr Form kForm = Form::MulSub;
  STRATA_SIMD static Bytes32 at(const uint8_t* blk, int j) {
    const BlockQ2_K& b = *reinterpret_cast<const BlockQ2_K*>(blk);
    const Q2_KSub s = q2_k_sub(j);
    const __m256i q = _mm256_and_si256(_mm256_srl_epi16(load256(b.qs + s.qs), _mm_cvtsi32_si128(s.shift)),
                                       _mm256_set1_epi8(3));
    const float d = h2f(b.d), dmin = h2f(b.dmin);
    return {q, d * static_cast<float>(q2_k_scale(b, 2 * j)), d * static_cast<float>(q2_k_scale(b, 2 * j + 1)),
            dmin * static_cast<float>(q2_k_min(b, 2 * j)), dmin * static_cast<float>(q2_k_min(b, 2 * j + 1))};
  }
};
struct IQ2_XXSBytes {  // signed grid values; s = d * (0.5 + sc) * 0.25
  static constexpr int64_t kBlock = kQK_K;
  static constexpr size_t kSize = sizeof(BlockIQ2_XXS);
  static constexpr Form kForm = Form::Mul;
  STRATA_SIMD static Bytes32 at(const uint8_t* blk, int j) {
    const BlockIQ2_XXS& b = *reinterpret_cast<const BlockIQ2_XXS*>(blk);
    const uint32_t gw = iq2_xxs_word(b, j, 0), sw = iq2_xxs_word(b, j, 1);
    const auto g = [&](int k) { return grid_ll(kIq2xxsGrid[iq2_xxs_grid_index(gw, k)]); };
    const auto sg = [&](int k) { return grid_ll(kIq2xsSignBytes[iq2_xxs_sign_index(sw, k)]); };
    const __m256i v = _mm256_sign_epi8(_mm256_set_epi64x(g(3), g(2), g(1), g(0)),
                                       _mm256_set_epi64x(sg(3), sg(2), sg(1), sg(0)));
    const float db = iq2_xs_group_scale(h2f(b.d), iq2_xxs_scale(sw));
    return {v, db, db};
  }
};

// The decoder over any of them: parts are the 32-element blocks.
template <class F>
struct DecBytes {
  static constexpr int64_t kBlock = F::kBlock, kSubs = F::kBlock / 32, kGroups = 4;
  struct Sub {
    __m256 s0, s1, o0, o1;
    alignas(32) int8_t v[32];
  };
  STRATA_SIMD static Sub sub(const uint8_t* row, int64_t blk, int j) {
    const Bytes32 b = F::at(row + blk * F::kSize, j);
    Sub s;
    s.s0 = _mm256_set1_ps(b.s0);
    s.s1 = _mm256_set1_ps(b.s1);
    s.o0 = _mm256_set1_ps(b.o0);
    s.o1 = _mm256_set1_ps(b.o1);
    _mm256_store_si256(reinterpret_cast<__m256i*>(s.v), b.v);
    return s;
  }
  STRATA_SIMD static __m256 group(const Sub& s, int g) {
    __m256 v = _mm256_cvtepi32_ps(i8x8(s.v + 8 * g));
    if constexpr (F::kForm == Form::MulEighth) v = _mm256_mul_ps(v, _mm256_set1_ps(0.125f));
    const __m256 y = _mm256_mul_ps(g < 2 ? s.s0 : s.s1, v);
    if constexpr (F::kForm == Form::MulAdd) return _mm256_add_ps(y, g < 2 ? s.o0 : s.o1);
    if constexpr (F::kForm == Form::MulSub) return _mm256_sub_ps(y, g < 2 ? s.o0 : s.o1);
    return y;
  }
  static float tail(const uint8_t*, int64_t) { return 0.0f; }
};
using DecQ4_0 = DecBytes<Q4_0Bytes>;
using DecQ4_1 = DecBytes<Q4_1Bytes>;
using DecQ5_0 = DecBytes<Q5_0Bytes>;
using DecQ5_1 = DecBytes<Q5_1Bytes>;
using DecIQ4_NL = DecBytes<IQ4_NLBytes>;
using DecMXFP4 = DecBytes<MXFP4Bytes>;
using DecQ5_K = DecBytes<Q5_KBytes>;
using DecQ3_K = DecBytes<Q3_KBytes>;
using DecIQ4_XS = DecBytes<IQ4_XSBytes>;
using DecIQ3_XXS = DecBytes<IQ3_XXSBytes>;
using DecIQ3_S = DecBytes<IQ3_SBytes>;
using DecIQ2_S = DecBytes<IQ2_SBytes>;
using DecIQ1_S = DecBytes<IQ1_SBytes>;
using DecIQ1_M = DecBytes<IQ1_MBytes>;
using DecQ2_K = DecBytes<Q2_KBytes>;
using DecIQ2_XXS = DecBytes<IQ2_XXSBytes>;

// dequant_row for AVX2: the decoder's vectors stored in order.
template <class D>
STRATA_SIMD void dequant_row_avx2(const void* src, float* dst, int64_t n) {
  const uint8_t* row = static_cast<const uint8_t*>(src);
  const int64_t nblk = n / D::kBlock;
  for (int64_t blk = 0; blk < nblk; ++blk)
    for (int s = 0; s < D::kSubs; ++s) {
      const typename D::Sub sub = D::sub(row, blk, s);
      for (int g = 0; g < D::kGroups; ++g, dst += 8) _mm256_storeu_ps(dst, D::group(sub, g));
    }
  for (int64_t c = nblk * D::kBlock; c < n; ++c) *dst++ = D::tail(row, c);
}

}  // namespace strata::quant_detail
#endif
