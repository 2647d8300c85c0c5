// The quant traits table and each format's dequantization, mirroring gguf.quants' numpy float32
// operation order so results are bit-identical to it.
#include "quant/formats.h"

#include <cstring>

#include "core/error.h"
#include "core/ggml_types.h"
#include "core/half.h"
#include "quant/decode_avx2.h"
#include "quant/kernels.h"
#include "quant/quant.h"

namespace strata {
namespace {

using namespace quant_detail;

// The portable block functions are the reference: they mirror gguf's numpy expressions one
// float32 operation at a time (the build passes -ffp-contract=off, so none gets fused).

template <class B, int64_t QK, void (*Block)(const B&, float*)>
inline void blocks(const void* src, float* dst, int64_t n) {
  const B* b = static_cast<const B*>(src);
  for (int64_t i = 0; i < n / QK; ++i) Block(b[i], dst + i * QK);
}

// gguf: (x * d), float32.
inline void block_q8_0(const BlockQ8_0& b, float* y) {
  const float d = fp16_to_f32(b.d);
  for (int l = 0; l < kQK8_0; ++l) y[l] = static_cast<float>(b.qs[l]) * d;
}

// gguf: d*sc and dmin*m rounded to float32 first, then (d*sc)*q - dmin*m.
inline void block_q4_k(const BlockQ4_K& b, float* y) {
  const float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    q4_k_scale_min(b.scales, j, sc, m);
    const float ds = d * static_cast<float>(sc), dm = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) y[j * 32 + l] = ds * static_cast<float>(q4_k_q(b, j, l)) - dm;
  }
}

// gguf: (d * scale) rounded to float32, then times q in [-32, 31].
inline void block_q6_k(const BlockQ6_K& b, float* y) {
  const float d = fp16_to_f32(b.d);
  for (int p = 0; p < 8; ++p) {
    for (int s = 0; s < 2; ++s) {  // a scale covers 16 elements
      const float ds = d * static_cast<float>(b.scales[q6_k_group(p).scale + s]);
      for (int l = s * 16; l < s * 16 + 16; ++l) y[p * 32 + l] = ds * static_cast<float>(q6_k_q(b, p, l));
    }
  }
}

constexpr float kPlusMinus[2] = {1.0f, -1.0f};

// gguf: db = d * (0.5 + scale) * 0.25, then (db * grid) * (+-1).
inline void block_iq2_xs(const BlockIQ2_XS& b, float* y) {
  const float d = fp16_to_f32(b.d);
  for (int g = 0; g < 16; ++g) {
    const float db = iq2_xs_group_scale(d, iq2_xs_scale(b, g / 2, g % 2));
    for (int k = 0; k < 2; ++k) {
      const uint16_t q = b.qs[g * 2 + k];
      const uint64_t grid = kIq2xsGrid[iq2_xs_grid_index(q)];
      const uint8_t signs = kIq2xsSigns[iq2_xs_sign_index(q)];
      float* out = y + g * 16 + k * 8;
      for (int e = 0; e < 8; ++e) {  // a multiply by +-1, as numpy does, and no branch
        const float v = db * static_cast<float>(iq2_xs_grid_value(grid, e));
        out[e] = v * kPlusMinus[iq2_xs_negative(signs, e)];
      }
    }
  }
}

// gguf: d*sc and dmin*m rounded to float32 per 16-element group, then (d*sc)*q - dmin*m.
inline void block_q2_k(const BlockQ2_K& b, float* y) {
  const float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
  for (int j = 0; j < 8; ++j) {
    for (int h = 0; h < 2; ++h) {
      const int g = 2 * j + h;
      const float dl = d * static_cast<float>(q2_k_scale(b, g)),
                  ml = dmin * static_cast<float>(q2_k_min(b, g));
      for (int l = 16 * h; l < 16 * h + 16; ++l)
        y[j * 32 + l] = dl * static_cast<float>(q2_k_q(b, j, l)) - ml;
    }
  }
}

// gguf: db = d * (0.5 + scale) * 0.25, then (db * grid) * (+-1), as IQ2_XS.
inline void block_iq2_xxs(const BlockIQ2_XXS& b, float* y) {
  const float d = fp16_to_f32(b.d);
  for (int j = 0; j < 8; ++j) {
    const uint32_t grid_word = iq2_xxs_word(b, j, 0), sign_word = iq2_xxs_word(b, j, 1);
    const float db = iq2_xs_group_scale(d, iq2_xxs_scale(sign_word));
    for (int k = 0; k < 4; ++k) {
      const uint64_t grid = kIq2xxsGrid[iq2_xxs_grid_index(grid_word, k)];
      const uint8_t signs = kIq2xsSigns[iq2_xxs_sign_index(sign_word, k)];
      float* out = y + j * 32 + k * 8;
      for (int e = 0; e < 8; ++e) {
        const float v = db * static_cast<float>(iq2_xs_grid_value(grid, e));
        out[e] = v * kPlusMinus[iq2_xs_negative(signs, e)];
      }
    }
  }
}

// gguf: d * (q - 8) (Q4_0), d * (q - 16) (Q5_0), (d * q) + m (Q4_1, Q5_1), d * value (IQ4_NL),
// e * value (MXFP4), each one float32 operation per step.
inline void block_q4_0(const BlockQ4_0& b, float* y) {
  const float d = fp16_to_f32(b.d);
  for (int l = 0; l < kQK4; ++l) y[l] = d * static_cast<float>(nibble_q(b.qs, l) - kQ4_0Bias);
}
inline void block_q4_1(const BlockQ4_1& b, float* y) {
  const float d = fp16_to_f32(b.d), m = fp16_to_f32(b.m);
  for (int l = 0; l < kQK4; ++l) y[l] = d * static_cast<float>(nibble_q(b.qs, l)) + m;
}
inline void block_q5_0(const BlockQ5_0& b, float* y) {
  const float d = fp16_to_f32(b.d);
  for (int l = 0; l < kQK4; ++l)
    y[l] = d * static_cast<float>((nibble_q(b.qs, l) | (q5_high(b.qh, l) << 4)) - kQ5_0Bias);
}
inline void block_q5_1(const BlockQ5_1& b, float* y) {
  const float d = fp16_to_f32(b.d), m = fp16_to_f32(b.m);
  for (int l = 0; l < kQK4; ++l)
    y[l] = d * static_cast<float>(nibble_q(b.qs, l) | (q5_high(b.qh, l) << 4)) + m;
}
inline void block_iq4_nl(const BlockIQ4_NL& b, float* y) {
  const float d = fp16_to_f32(b.d);
  for (int l = 0; l < kQK4; ++l) y[l] = d * static_cast<float>(iq4_nl_value(nibble_q(b.qs, l)));
}
inline void block_mxfp4(const BlockMXFP4& b, float* y) {
  const float d = f32_from_bits(e8m0_half_bits(b.e));
  for (int l = 0; l < kQK4; ++l) y[l] = d * static_cast<float>(mxfp4_value(nibble_q(b.qs, l)));
}

// gguf: d*sc and dmin*m rounded to float32 first, then (d*sc)*q - dmin*m, as Q4_K.
inline void block_q5_k(const BlockQ5_K& b, float* y) {
  const float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    q4_k_scale_min(b.scales, j, sc, m);
    const float ds = d * static_cast<float>(sc), dm = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) y[j * 32 + l] = ds * static_cast<float>(q5_k_q(b, j, l)) - dm;
  }
}

// gguf: d * (sc - 32) rounded to float32 per 16 elements, then times q in [-4, 3].
inline void block_q3_k(const BlockQ3_K& b, float* y) {
  const float d = fp16_to_f32(b.d);
  for (int j = 0; j < 8; ++j)
    for (int h = 0; h < 2; ++h) {
      const float dl = d * static_cast<float>(q3_k_scale(b.scales, 2 * j + h));
      for (int l = 16 * h; l < 16 * h + 16; ++l) y[j * 32 + l] = dl * static_cast<float>(q3_k_q(b, j, l));
    }
}

// gguf: d * (sc - 32) rounded to float32 per 32 elements, then times the codebook value.
inline void block_iq4_xs(const BlockIQ4_XS& b, float* y) {
  const float d = fp16_to_f32(b.d);
  for (int j = 0; j < 8; ++j) {
    const float dl = d * static_cast<float>(iq4_xs_scale(b, j));
    for (int l = 0; l < 32; ++l)
      y[j * 32 + l] = dl * static_cast<float>(iq4_nl_value(nibble_q(b.qs + 16 * j, l)));
  }
}

// gguf: db = d * (0.5 + s) * 0.5 per 32 elements, then (db * magnitude) * (+-1).
inline void block_iq3_xxs(const BlockIQ3_XXS& b, float* y) {
  const float d = fp16_to_f32(b.d);
  for (int j = 0; j < 8; ++j) {
    const float db = d * (0.5f + static_cast<float>(iq3_xxs_scale(b, j))) * 0.5f;
    for (int l = 0; l < 32; ++l)
      y[32 * j + l] =
          db * static_cast<float>(iq3_xxs_magnitude(b, j, l)) * kPlusMinus[iq3_xxs_negative(b, j, l)];
  }
}

// gguf: db = d * (1 + 2 s) per 32 elements, then (db * magnitude) * (+-1).
inline void block_iq3_s(const BlockIQ3_S& b, float* y) {
  const float d = fp16_to_f32(b.d);
  for (int j = 0; j < 8; ++j) {
    const float db = d * static_cast<float>(1 + 2 * iq3_s_scale(b, j));
    for (int l = 0; l < 32; ++l)
      y[32 * j + l] =
          db * static_cast<float>(iq3_s_magnitude(b, j, l)) * kPlusMinus[bit_sign(b.signs, 32 * j + l)];
  }
}

// gguf: db = d * (0.5 + s) * 0.25 per 16 elements, then (db * magnitude) * (+-1).
inline void block_iq2_s(const BlockIQ2_S& b, float* y) {
  const float d = fp16_to_f32(b.d);
  for (int g = 0; g < 16; ++g) {
    const float db = iq2_xs_group_scale(d, iq2_s_scale(b, g));
    for (int n = 16 * g; n < 16 * g + 16; ++n)
      y[n] = db * static_cast<float>(iq2_s_magnitude(b, n)) * kPlusMinus[bit_sign(b.signs, n)];
  }
}

// gguf: dl = d * (2 s + 1), then dl * (g + delta); g + delta = v8 / 8 exactly.
inline void block_iq1_s(const BlockIQ1_S& b, float* y) {
  const float d = fp16_to_f32(b.d);
  for (int j = 0; j < 8; ++j) {
    const float dl = d * static_cast<float>(2 * iq1_s_scale(b, j) + 1);
    for (int l = 0; l < 32; ++l) y[32 * j + l] = dl * (static_cast<float>(iq1_s_value8(b, j, l)) * kIq1Delta);
  }
}
inline void block_iq1_m(const BlockIQ1_M& b, float* y) {
  const float d = fp16_to_f32(iq1_m_d(b));
  for (int g = 0; g < 16; ++g) {
    const float dl = d * static_cast<float>(2 * iq1_m_scale(b, g) + 1);
    for (int n = 16 * g; n < 16 * g + 16; ++n)
      y[n] = dl * (static_cast<float>(iq1_m_value8(b, n)) * kIq1Delta);
  }
}

inline void block_f16(const uint16_t& h, float* y) { *y = fp16_to_f32(h); }
inline void block_bf16(const uint16_t& h, float* y) { *y = bf16_to_f32(h); }

void row_f32(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }
void row_f16(const void* src, float* dst, int64_t n) { blocks<uint16_t, 1, block_f16>(src, dst, n); }
void row_bf16(const void* src, float* dst, int64_t n) { blocks<uint16_t, 1, block_bf16>(src, dst, n); }
void row_q8_0(const void* src, float* dst, int64_t n) { blocks<BlockQ8_0, kQK8_0, block_q8_0>(src, dst, n); }
void row_q4_k(const void* src, float* dst, int64_t n) { blocks<BlockQ4_K, kQK_K, block_q4_k>(src, dst, n); }
void row_q6_k(const void* src, float* dst, int64_t n) { blocks<BlockQ6_K, kQK_K, block_q6_k>(src, dst, n); }
void row_q2_k(const void* src, float* dst, int64_t n) { blocks<BlockQ2_K, kQK_K, block_q2_k>(src, dst, n); }
void row_iq2_xxs(const void* src, float* dst, int64_t n) {
  blocks<BlockIQ2_XXS, kQK_K, block_iq2_xxs>(src, dst, n);
}
void row_iq2_xs(const void* src, float* dst, int64_t n) {
  blocks<BlockIQ2_XS, kQK_K, block_iq2_xs>(src, dst, n);
}
void row_q4_0(const void* src, float* dst, int64_t n) { blocks<BlockQ4_0, kQK4, block_q4_0>(src, dst, n); }
void row_q4_1(const void* src, float* dst, int64_t n) { blocks<BlockQ4_1, kQK4, block_q4_1>(src, dst, n); }
void row_q5_0(const void* src, float* dst, int64_t n) { blocks<BlockQ5_0, kQK4, block_q5_0>(src, dst, n); }
void row_q5_1(const void* src, float* dst, int64_t n) { blocks<BlockQ5_1, kQK4, block_q5_1>(src, dst, n); }
void row_iq4_nl(const void* src, float* dst, int64_t n) {
  blocks<BlockIQ4_NL, kQK4, block_iq4_nl>(src, dst, n);
}
void row_mxfp4(const void* src, float* dst, int64_t n) { blocks<BlockMXFP4, kQK4, block_mxfp4>(src, dst, n); }
void row_q5_k(const void* src, float* dst, int64_t n) { blocks<BlockQ5_K, kQK_K, block_q5_k>(src, dst, n); }
void row_q3_k(const void* src, float* dst, int64_t n) { blocks<BlockQ3_K, kQK_K, block_q3_k>(src, dst, n); }
#define STRATA_ROW_FN(name, B) \
  void row_##name(const void* src, float* dst, int64_t n) { blocks<B, kQK_K, block_##name>(src, dst, n); }
STRATA_ROW_FN(iq3_xxs, BlockIQ3_XXS)
STRATA_ROW_FN(iq3_s, BlockIQ3_S)
STRATA_ROW_FN(iq2_s, BlockIQ2_S)
STRATA_ROW_FN(iq1_s, BlockIQ1_S)
STRATA_ROW_FN(iq1_m, BlockIQ1_M)
#undef STRATA_ROW_FN
void row_iq4_xs(const void* src, float* dst, int64_t n) {
  blocks<BlockIQ4_XS, kQK_K, block_iq4_xs>(src, dst, n);
}

// The AVX2 rows store decode_avx2.h's vectors: the same float32 operations in the same order as
// the block functions above (tests check them bit for bit against each other).
#if defined(__x86_64__)
#define SIMD(f, D) dequant_row_avx2<D>
#define AVX2(f) f##_avx2
#define AVX2_OR_SCALAR(f) f##_avx2
#define VNNI(f) f##_vnni
#else
#define SIMD(f, D) f
#define AVX2(f) nullptr
#define AVX2_OR_SCALAR(f) f##_scalar
#define VNNI(f) nullptr
#endif

// The one place that knows the formats; order is the order of the "supported" list in errors.
constexpr QuantTraits kTraits[] = {
    {QType::F32, "F32", 1, 4, row_f32, row_f32, true, nullptr, nullptr, nullptr, nullptr},
    {QType::F16, "F16", 1, 2, row_f16, SIMD(row_f16, DecF16), false, AVX2(gemv_f16), nullptr, nullptr,
     nullptr},
    {QType::BF16, "BF16", 1, 2, row_bf16, SIMD(row_bf16, DecBF16), false, AVX2(gemv_bf16), nullptr, nullptr,
     nullptr},
    {QType::Q8_0, "Q8_0", kQK8_0, sizeof(BlockQ8_0), row_q8_0, SIMD(row_q8_0, DecQ8_0), false,
     AVX2(gemv_q8_0), mmq_q8_0_scalar, AVX2(mmq_q8_0), VNNI(mmq_q8_0)},
    {QType::Q4_K, "Q4_K", kQK_K, sizeof(BlockQ4_K), row_q4_k, SIMD(row_q4_k, DecQ4_K), false, AVX2(gemv_q4_k),
     mmq_q4_k_scalar, AVX2(mmq_q4_k), VNNI(mmq_q4_k)},
    {QType::Q6_K, "Q6_K", kQK_K, sizeof(BlockQ6_K), row_q6_k, SIMD(row_q6_k, DecQ6_K), false, AVX2(gemv_q6_k),
     mmq_q6_k_scalar, AVX2(mmq_q6_k), VNNI(mmq_q6_k)},
    {QType::IQ2_XS, "IQ2_XS", kQK_K, sizeof(BlockIQ2_XS), row_iq2_xs, SIMD(row_iq2_xs, DecIQ2_XS), false,
     AVX2(gemv_iq2_xs), mmq_iq2_xs_scalar, AVX2(mmq_iq2_xs), VNNI(mmq_iq2_xs)},
    {QType::Q2_K, "Q2_K", kQK_K, sizeof(BlockQ2_K), row_q2_k, SIMD(row_q2_k, DecQ2_K), false, AVX2(gemv_q2_k),
     mmq_q2_k_scalar, AVX2(mmq_q2_k), VNNI(mmq_q2_k)},
    {QType::IQ2_XXS, "IQ2_XXS", kQK_K, sizeof(BlockIQ2_XXS), row_iq2_xxs, SIMD(row_iq2_xxs, DecIQ2_XXS),
     false, AVX2(gemv_iq2_xxs), mmq_iq2_xxs_scalar, AVX2_OR_SCALAR(mmq_iq2_xxs), VNNI(mmq_iq2_xxs)},
#define STRATA_ROW(T, name, B, D, V) \
  {QType::T,                         \
   #T,                               \
   B,                                \
   sizeof(Block##T),                 \
   row_##name,                       \
   SIMD(row_##name, D),              \
   false,                            \
   AVX2(gemv_##name),                \
   mmq_##name##_scalar,              \
   AVX2(mmq_##name),                 \
   V}
    STRATA_ROW(Q5_K, q5_k, kQK_K, DecQ5_K, VNNI(mmq_q5_k)),
    STRATA_ROW(Q3_K, q3_k, kQK_K, DecQ3_K, VNNI(mmq_q3_k)),
    STRATA_ROW(IQ4_XS, iq4_xs, kQK_K, DecIQ4_XS, VNNI(mmq_iq4_xs)),
    STRATA_ROW(MXFP4, mxfp4, kQK4, DecMXFP4, VNNI(mmq_mxfp4)),
    STRATA_ROW(Q5_0, q5_0, kQK4, DecQ5_0, VNNI(mmq_q5_0)),
    STRATA_ROW(Q4_0, q4_0, kQK4, DecQ4_0, VNNI(mmq_q4_0)),
    STRATA_ROW(Q4_1, q4_1, kQK4, DecQ4_1, VNNI(mmq_q4_1)),
    STRATA_ROW(Q5_1, q5_1, kQK4, DecQ5_1, VNNI(mmq_q5_1)),
    STRATA_ROW(IQ4_NL, iq4_nl, kQK4, DecIQ4_NL, VNNI(mmq_iq4_nl)),
    STRATA_ROW(IQ3_XXS, iq3_xxs, kQK_K, DecIQ3_XXS, VNNI(mmq_iq3_xxs)),
    STRATA_ROW(IQ3_S, iq3_s, kQK_K, DecIQ3_S, VNNI(mmq_iq3_s)),
    STRATA_ROW(IQ2_S, iq2_s, kQK_K, DecIQ2_S, VNNI(mmq_iq2_s)),
    STRATA_ROW(IQ1_S, iq1_s, kQK_K, DecIQ1_S, VNNI(mmq_iq1_s)),
    STRATA_ROW(IQ1_M, iq1_m, kQK_K, DecIQ1_M, VNNI(mmq_iq1_m)),
#undef STRATA_ROW
};
#undef SIMD
#undef AVX2
#undef AVX2_OR_SCALAR
#undef VNNI

}  // namespace

const QuantTraits* find_quant(uint32_t ggml_type) {
  for (const QuantTraits& t : kTraits)
    if (static_cast<uint32_t>(t.type) == ggml_type) return &t;
  return nullptr;
}

const QuantTraits& quant_traits(uint32_t ggml_type, const std::string& what) {
  if (const QuantTraits* t = find_quant(ggml_type)) return *t;
  std::string supported;
  for (const QuantTraits& t : kTraits) supported += str(supported.empty() ? "" : ", ", t.name);
  const char* name = ggml_type_name(ggml_type);
  throw UnsupportedError(str(what, ": quant type ", name ? name : "unknown", " (", ggml_type,
                             ") is not supported by strata; supported: ", supported,
                             ". Re-quantize the model with one of them."));
}

size_t row_bytes(QType t, int64_t n) {
  const QuantTraits& q = quant_traits(t);
  STRATA_CHECK(n >= 0 && n % q.block_size == 0, ConfigError, "a row of ", n, " elements of ", q.name,
               " is not a whole number of ", q.block_size, "-element blocks");
  return static_cast<size_t>(n / q.block_size) * q.type_size;
}

void dequantize(QType t, const void* src, float* dst, int64_t n) {
  const QuantTraits& q = quant_traits(t);
  row_bytes(t, n);  // validates n
  (best_isa() == Isa::Scalar ? q.dequant_row : q.dequant_row_simd)(src, dst, n);
}

}  // namespace strata
