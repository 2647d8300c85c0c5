// Quant formats and matmul: block layouts, dequantization of hand-made blocks, matmul against a
// double-precision reference, and bit-exactness across T, threads, row subsets and ISAs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "quant/quant.h"
#include "quant/quantize.h"

using namespace strata;

namespace {

const QType kAll[] = {QType::F32,     QType::F16,   QType::BF16,    QType::Q8_0,  QType::Q4_K, QType::Q6_K,
                      QType::IQ2_XS,  QType::Q2_K,  QType::IQ2_XXS, QType::Q5_K,  QType::Q3_K, QType::IQ4_XS,
                      QType::MXFP4,   QType::Q5_0,  QType::Q4_0,    QType::Q4_1,  QType::Q5_1, QType::IQ4_NL,
                      QType::IQ3_XXS, QType::IQ3_S, QType::IQ2_S,   QType::IQ1_S, QType::IQ1_M};

// Byte offsets of each block's fp16 fields, which random bytes must not turn into inf/nan.
std::vector<size_t> half_fields(QType t) {
  switch (t) {
    case QType::F16:
      return {0};
    case QType::Q8_0:
      return {0};
    case QType::Q4_K:
      return {0, 2};
    case QType::Q6_K:
      return {208};
    case QType::IQ2_XS:
      return {0};
    case QType::IQ2_XXS:
      return {0};
    case QType::Q2_K:
      return {80, 82};
    case QType::Q5_K:
    case QType::Q4_1:
    case QType::Q5_1:
      return {0, 2};
    case QType::Q3_K:
      return {108};
    case QType::IQ4_XS:
    case QType::Q5_0:
    case QType::Q4_0:
    case QType::IQ4_NL:
    case QType::IQ3_XXS:
    case QType::IQ3_S:
    case QType::IQ2_S:
    case QType::IQ1_S:
      return {0};
    default:
      return {};
  }
}

// IQ1_M's fp16 scale lives in the top nibbles of the four 16-bit words at bytes 48-55.
void set_iq1_m_d(uint8_t* blk, uint16_t h) {
  for (int w = 0; w < 4; ++w)
    blk[48 + 2 * w + 1] = static_cast<uint8_t>((blk[48 + 2 * w + 1] & 0x0F) | (((h >> (4 * w)) & 0xF) << 4));
}

// Random valid weights: random bytes, float fields finite and of moderate magnitude.
std::vector<uint8_t> random_weights(QType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  const QuantTraits& q = quant_traits(t);
  std::vector<uint8_t> w(rows * row_bytes(t, cols));
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (size_t off = 0; off < w.size(); off += q.type_size) {
    if (t == QType::F32) {
      const float v = u(rng);
      std::memcpy(&w[off], &v, 4);
    } else if (t == QType::BF16) {
      const uint16_t h = static_cast<uint16_t>(bits_from_f32(u(rng)) >> 16);
      std::memcpy(&w[off], &h, 2);
    }
    for (size_t f : half_fields(t)) {
      const uint16_t h = f32_to_fp16(u(rng) * 0.05f);
      std::memcpy(&w[off + f], &h, 2);
    }
    if (t == QType::MXFP4) w[off] = static_cast<uint8_t>(116 + rng() % 9);  // E8M0 scale 2^-12 .. 2^-4
    if (t == QType::IQ1_M) set_iq1_m_d(&w[off], f32_to_fp16(u(rng) * 0.05f));
  }
  return w;
}

std::vector<float> dequant(QType t, const void* src, int64_t n) {
  std::vector<float> y(n);
  dequantize(t, src, y.data(), n);
  return y;
}

// STRATA_OPS_REPORT=1 prints the worst error each bound was set from.
void report(const char* what, double worst, double bound) {
  if (std::getenv("STRATA_OPS_REPORT")) std::printf("  %-28s %.3g (bound %.3g)\n", what, worst, bound);
}

// The smallest column count that has whole blocks, and a tail for the 8-lane kernels.
int64_t test_cols(QType t, int mult) {
  const int64_t bs = quant_traits(t).block_size;
  return bs == 1 ? 37 * mult : bs * (bs == 32 ? 3 : 1) * mult;
}

}  // namespace

TEST(Quant, BlockLayouts) {
  EXPECT_EQ(quant_traits(QType::Q8_0).type_size, 34u);
  EXPECT_EQ(quant_traits(QType::Q4_K).type_size, 144u);
  EXPECT_EQ(quant_traits(QType::Q6_K).type_size, 210u);
  EXPECT_EQ(quant_traits(QType::IQ2_XS).type_size, 74u);
  EXPECT_EQ(quant_traits(QType::Q4_K).block_size, 256);
  EXPECT_EQ(row_bytes(QType::Q4_K, 768), 3u * 144);
  EXPECT_EQ(row_bytes(QType::F16, 5), 10u);
  EXPECT_THROW(row_bytes(QType::Q8_0, 33), ConfigError);
  for (QType t : kAll) EXPECT_EQ(find_quant(static_cast<uint32_t>(t))->type, t);
  EXPECT_EQ(find_quant(34), nullptr);  // TQ1_0
}

TEST(Quant, UnsupportedTypeNamesItAndTheFix) {
  try {
    quant_traits(34, "blk.0.ffn_down_exps.weight");
    FAIL() << "no throw";
  } catch (const UnsupportedError& e) {
    EXPECT_STREQ(
        e.what(),
        "blk.0.ffn_down_exps.weight: quant type TQ1_0 (34) is not supported by strata; "
        "supported: F32, F16, BF16, Q8_0, Q4_K, Q6_K, IQ2_XS, Q2_K, IQ2_XXS, Q5_K, Q3_K, IQ4_XS, MXFP4, "
        "Q5_0, Q4_0, Q4_1, Q5_1, IQ4_NL, IQ3_XXS, IQ3_S, IQ2_S, IQ1_S, IQ1_M. Re-quantize the model with "
        "one of them.");
  }
  EXPECT_THROW(quant_traits(99, "x"), UnsupportedError);
}

TEST(Quant, DequantFloatTypes) {
  const uint16_t f16[2] = {0x3c00, 0xc500};  // 1, -5
  EXPECT_EQ(dequant(QType::F16, f16, 2), (std::vector<float>{1.0f, -5.0f}));
  const uint16_t bf16[2] = {0x3f80, 0xc040};  // 1, -3
  EXPECT_EQ(dequant(QType::BF16, bf16, 2), (std::vector<float>{1.0f, -3.0f}));
  const float f32[2] = {0.25f, -7.0f};
  EXPECT_EQ(dequant(QType::F32, f32, 2), (std::vector<float>{0.25f, -7.0f}));
}

TEST(Quant, DequantQ8_0) {
  BlockQ8_0 b;
  b.d = f32_to_fp16(0.5f);
  for (int l = 0; l < 32; ++l) b.qs[l] = static_cast<int8_t>(l * 8 - 128);
  const auto y = dequant(QType::Q8_0, &b, 32);
  for (int l = 0; l < 32; ++l) EXPECT_EQ(y[l], 0.5f * (l * 8 - 128)) << l;
}

TEST(Quant, DequantQ4_K) {
  // Pack 6-bit scales and mins the way ggml's make_qkx2_quants stores them.
  const uint8_t sc[8] = {1, 2, 3, 63, 17, 33, 48, 5}, mn[8] = {0, 1, 62, 4, 40, 7, 18, 63};
  BlockQ4_K b{};
  b.d = f32_to_fp16(0.5f);
  b.dmin = f32_to_fp16(0.25f);
  for (int j = 0; j < 4; ++j) {
    b.scales[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
    b.scales[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
    b.scales[j + 8] = (sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4);
  }
  int q[256];
  for (int i = 0; i < 256; ++i) q[i] = (i * 7 + 3) % 16;
  for (int j = 0; j < 8; j += 2)
    for (int l = 0; l < 32; ++l) b.qs[j / 2 * 32 + l] = q[j * 32 + l] | (q[(j + 1) * 32 + l] << 4);
  const auto y = dequant(QType::Q4_K, &b, 256);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], 0.5f * sc[i / 32] * q[i] - 0.25f * mn[i / 32]) << i;
}

TEST(Quant, DequantQ6_K) {
  BlockQ6_K b{};
  b.d = f32_to_fp16(0.125f);
  for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<int8_t>(s * 9 - 70);
  int q[256];
  for (int i = 0; i < 256; ++i) q[i] = (i * 13 + 5) % 64;
  // ggml's layout: per half of 128, element l + 32k takes ql nibble (k / 2) of ql[l + 32 (k % 2)]
  // and the 2 bits at 2k of qh[l].
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l)
      for (int k = 0; k < 4; ++k) {
        const int v = q[h * 128 + k * 32 + l];
        b.ql[h * 64 + (k % 2) * 32 + l] |= (v & 0xF) << ((k / 2) * 4);
        b.qh[h * 32 + l] |= (v >> 4) << (2 * k);
      }
  const auto y = dequant(QType::Q6_K, &b, 256);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], 0.125f * b.scales[i / 16] * (q[i] - 32)) << i;
}

TEST(Quant, DequantIQ2_XS) {
  BlockIQ2_XS b{};
  b.d = f32_to_fp16(2.0f);
  for (int i = 0; i < 8; ++i) b.scales[i] = static_cast<uint8_t>(i | ((15 - i) << 4));
  for (int i = 0; i < 32; ++i) b.qs[i] = static_cast<uint16_t>((i % 2) | ((i % 4 == 0 ? 1 : 0) << 9));
  const auto y = dequant(QType::IQ2_XS, &b, 256);
  for (int i = 0; i < 256; ++i) {
    const int g = i / 16, j = i % 8, qi = i / 8;
    const int sc = g % 2 ? 15 - g / 2 : g / 2;
    // grid entry 0 is all 0x08; entry 1 is 0x2b then seven 0x08. Sign index 1 is 0b10000001.
    const float mag = (qi % 2 == 1 && j == 0) ? 43.0f : 8.0f;
    const bool neg = qi % 4 == 0 && (j == 0 || j == 7);
    EXPECT_EQ(y[i], 2.0f * (0.5f + sc) * 0.25f * mag * (neg ? -1.0f : 1.0f)) << i;
  }
}

TEST(Quant, DequantMXFP4) {
  // E8M0 byte e: the block's scale is 2^(e - 127), applied to doubled e2m1 codes as 2^(e - 128).
  const int kv[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  for (int e : {0, 1, 2, 100, 127, 128, 200, 254}) {
    BlockMXFP4 b{};
    b.e = static_cast<uint8_t>(e);
    for (int l = 0; l < 16; ++l) b.qs[l] = static_cast<uint8_t>(l | ((15 - l) << 4));
    const auto y = dequant(QType::MXFP4, &b, 32);
    const float d = std::ldexp(1.0f, e - 128);
    for (int l = 0; l < 32; ++l) EXPECT_EQ(y[l], d * kv[l < 16 ? l : 31 - l]) << "e=" << e << " l=" << l;
  }
}

TEST(Quant, DequantQ3_K) {
  // ggml's packing: scale g's low 4 bits in nibble g / 8 of scales[g % 8], its high 2 bits at bits
  // 2 (g / 4) of scales[8 + g % 4]; element 32 j + l: bits 2 (j % 4) of qs[32 (j / 4) + l], bit j of
  // hmask[l].
  BlockQ3_K b{};
  b.d = f32_to_fp16(0.25f);
  int sc[16], q[256];
  for (int g = 0; g < 16; ++g) {
    sc[g] = (g * 23 + 5) % 64;
    b.scales[g % 8] |= static_cast<uint8_t>((sc[g] & 0xF) << (4 * (g / 8)));
    b.scales[8 + g % 4] |= static_cast<uint8_t>((sc[g] >> 4) << (2 * (g / 4)));
  }
  for (int i = 0; i < 256; ++i) {
    q[i] = (i * 7 + 3) % 8 - 4;  // in [-4, 3]
    const int j = i / 32, l = i % 32, u = q[i] + 4;
    b.qs[32 * (j / 4) + l] |= static_cast<uint8_t>((u & 3) << (2 * (j % 4)));
    if (u & 4) b.hmask[l] |= static_cast<uint8_t>(1 << j);
  }
  const auto y = dequant(QType::Q3_K, &b, 256);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], 0.25f * (sc[i / 16] - 32) * q[i]) << i;
}

TEST(Quant, DequantIQ1_M) {
  // No d field: its fp16 bits are the top nibbles of the four scale words. Scales 2 s + 1 per 16 elements,
  // delta -1/8 where bit 3 of a grid index's high nibble is set. Grid entry 0 is eight -1s.
  BlockIQ1_M b{};
  const uint16_t d = f32_to_fp16(0.5f);
  for (int w = 0; w < 4; ++w) {
    const int s0 = w, s1 = 7 - w, s2 = (w + 2) % 8, s3 = (3 * w) % 8;
    const uint16_t word =
        static_cast<uint16_t>(s0 | (s1 << 3) | (s2 << 6) | (s3 << 9) | (((d >> (4 * w)) & 0xF) << 12));
    std::memcpy(b.scales + 2 * w, &word, 2);
  }
  for (int i = 0; i < 16; ++i)
    b.qh[i] = static_cast<uint8_t>(i % 2 ? 0x80 : 0x00);  // odd bytes: second group's delta negative
  const auto y = dequant(QType::IQ1_M, &b, 256);
  for (int n = 0; n < 256; ++n) {
    const int g = n / 16, w = g / 4, f = g % 4;
    const int s = f == 0 ? w : f == 1 ? 7 - w : f == 2 ? (w + 2) % 8 : (3 * w) % 8;
    const int i = n / 8;                              // grid index i: qs[i] = 0, entry 0
    const bool neg = (i / 2) % 2 == 1 && i % 2 == 1;  // qh[i / 2] = 0x80 for odd i / 2: high nibble
    EXPECT_EQ(y[n], 0.5f * (2 * s + 1) * (-1.0f + (neg ? -0.125f : 0.125f))) << n;
  }
}

TEST(Quant, SimdDequantMatchesPortable) {
  std::mt19937 rng(7);
  for (QType t : kAll) {
    const QuantTraits& q = quant_traits(t);
    const int64_t n = q.block_size * 37;
    const auto w = random_weights(t, 1, n, rng);
    std::vector<float> a(n), b(n);
    q.dequant_row(w.data(), a.data(), n);
    q.dequant_row_simd(w.data(), b.data(), n);
    ASSERT_EQ(std::memcmp(a.data(), b.data(), n * 4), 0) << q.name;
  }
}

TEST(Quant, MatmulMatchesDoubleReference) {
  // |y - ref| / sum |w x|: float32 sums of cols products in a fixed order. Measured 6.5e-8.
  constexpr double kBound = 6e-7;
  double worst = 0;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (QType t : kAll) {
    const int64_t cols = test_cols(t, 2);
    for (int64_t rows : {1, 7, 33}) {
      const auto w = random_weights(t, rows, cols, rng);
      const auto wf = dequant(t, w.data(), rows * cols);
      for (int64_t T : {1, 3, 17}) {
        std::vector<float> x(T * cols), y(T * rows);
        for (auto& v : x) v = u(rng);
        for (int threads : {1, 3}) {
          ThreadPool pool(threads);
          matmul(t, w.data(), rows, cols, x.data(), cols, T, y.data(), rows, pool);
          for (int64_t tt = 0; tt < T; ++tt)
            for (int64_t r = 0; r < rows; ++r) {
              double ref = 0, mag = 0;
              for (int64_t c = 0; c < cols; ++c) {
                ref += static_cast<double>(wf[r * cols + c]) * x[tt * cols + c];
                mag += std::fabs(static_cast<double>(wf[r * cols + c]) * x[tt * cols + c]);
              }
              worst = std::max(worst, std::fabs(y[tt * rows + r] - ref) / mag);
              ASSERT_NEAR(y[tt * rows + r], ref, kBound * mag + 1e-30)
                  << quant_traits(t).name << " rows=" << rows << " T=" << T << " r=" << r << " t=" << tt;
            }
        }
      }
    }
  }
  report("matmul vs float64", worst, kBound);
}

// The invariant the MoE engine relies on: Y[t, r] does not depend on T, the thread count, which
// rows a call covers, the padding of X/Y or the kernel set.
TEST(Quant, MatmulIsBitIdenticalAcrossShapesThreadsAndIsa) {
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<Isa> isas = {Isa::Scalar};
  if (best_isa() >= Isa::Avx2) isas.push_back(Isa::Avx2);
  if (best_isa() >= Isa::Avx512Vnni) isas.push_back(Isa::Avx512Vnni);
  for (QType t : kAll) {
    const int64_t rows = 33, cols = test_cols(t, 3), T = 37;
    const size_t rb = row_bytes(t, cols);
    const auto w = random_weights(t, rows, cols, rng);
    std::vector<float> x(T * cols);
    for (auto& v : x) v = u(rng);
    ThreadPool one(1), three(3);
    std::vector<float> ref(T * rows);
    matmul(Isa::Scalar, t, w.data(), rows, cols, x.data(), cols, T, ref.data(), rows, one);
    for (Isa isa : isas) {
      for (ThreadPool* pool : {&one, &three}) {
        std::vector<float> y(T * rows);
        matmul(isa, t, w.data(), rows, cols, x.data(), cols, T, y.data(), rows, *pool);
        ASSERT_EQ(std::memcmp(y.data(), ref.data(), y.size() * 4), 0) << quant_traits(t).name << " T=37";
        // One token per call, as in decode.
        for (int64_t tt = 0; tt < T; ++tt) {
          std::vector<float> y1(rows);
          matmul(isa, t, w.data(), rows, cols, x.data() + tt * cols, cols, 1, y1.data(), rows, *pool);
          ASSERT_EQ(std::memcmp(y1.data(), ref.data() + tt * rows, rows * 4), 0)
              << quant_traits(t).name << " t=" << tt;
        }
        // Rows 5..24 of W, through an offset pointer, into a padded Y; 17 tokens from a padded X.
        const int64_t r0 = 5, nr = 20, T2 = 17, ldx = cols + 3, ldy = nr + 2;
        std::vector<float> xp(T2 * ldx), yp(T2 * ldy);
        for (int64_t tt = 0; tt < T2; ++tt) std::memcpy(&xp[tt * ldx], &x[(tt + 2) * cols], cols * 4);
        matmul(isa, t, w.data() + r0 * rb, nr, cols, xp.data(), ldx, T2, yp.data(), ldy, *pool);
        for (int64_t tt = 0; tt < T2; ++tt)
          ASSERT_EQ(std::memcmp(&yp[tt * ldy], &ref[(tt + 2) * rows + r0], nr * 4), 0)
              << quant_traits(t).name << " subset t=" << tt;
      }
    }
  }
}

TEST(Quant, MatmulRejectsBadShapes) {
  ThreadPool pool(1);
  std::vector<uint8_t> w(34);
  std::vector<float> x(32), y(1);
  EXPECT_THROW(matmul(QType::Q8_0, w.data(), 1, 31, x.data(), 32, 1, y.data(), 1, pool), ConfigError);
  EXPECT_THROW(matmul(QType::Q8_0, w.data(), 1, 32, x.data(), 16, 1, y.data(), 1, pool), ConfigError);
}

namespace {

const QType kQ8Types[] = {QType::Q8_0,    QType::Q4_K,  QType::Q6_K,  QType::IQ2_XS, QType::Q2_K,
                          QType::IQ2_XXS, QType::Q5_K,  QType::Q3_K,  QType::IQ4_XS, QType::MXFP4,
                          QType::Q5_0,    QType::Q4_0,  QType::Q4_1,  QType::Q5_1,   QType::IQ4_NL,
                          QType::IQ3_XXS, QType::IQ3_S, QType::IQ2_S, QType::IQ1_S,  QType::IQ1_M};

// T rows of q8_0 blocks of x (cols wide), xrb bytes apart, and their dequantized values.
std::vector<uint8_t> quantize_x(const std::vector<float>& x, int64_t T, int64_t cols, int64_t xrb,
                                std::vector<float>* xd) {
  std::vector<uint8_t> xq(T * xrb);
  for (int64_t t = 0; t < T; ++t) quantize_row_q8_0(&x[t * cols], &xq[t * xrb], cols);
  if (xd) {
    xd->resize(T * cols);
    for (int64_t t = 0; t < T; ++t) dequantize(QType::Q8_0, &xq[t * xrb], &(*xd)[t * cols], cols);
  }
  return xq;
}

}  // namespace

TEST(QuantQ8, HasKernelsForTheMoeTypes) {
  for (QType t : kQ8Types) EXPECT_TRUE(has_matmul_q8(t)) << quant_traits(t).name;
  for (QType t : {QType::F32, QType::F16, QType::BF16}) EXPECT_FALSE(has_matmul_q8(t));
  ThreadPool pool(1);
  std::vector<float> w(32), y(1);
  std::vector<uint8_t> xq(34);
  EXPECT_THROW(matmul_q8(QType::F32, w.data(), 1, 32, xq.data(), 34, 1, y.data(), 1, pool), UnsupportedError);
  EXPECT_THROW(matmul_q8(QType::Q8_0, w.data(), 1, 32, xq.data(), 33, 1, y.data(), 1, pool), ConfigError);
}

// Against float64 over the dequantized weights and dequantized q8_0 activations: only float
// rounding of the per-block scale products differs.
TEST(QuantQ8, MatchesDoubleReferenceOfDequantizedOperands) {
  // |y - ref| / sum |w x|: float rounding of the per-block scale products and their sum. Measured 4.3e-8.
  constexpr double kBound = 4e-7;
  double worst = 0;
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (QType t : kQ8Types) {
    for (int64_t cols : {256, 512, 2048}) {
      for (int64_t rows : {1, 7, 33}) {
        const auto w = random_weights(t, rows, cols, rng);
        const auto wf = dequant(t, w.data(), rows * cols);
        for (int64_t T : {1, 3, 17}) {
          const int64_t xrb = cols / 32 * 34 + 6;  // padded rows
          std::vector<float> x(T * cols), xd, y(T * rows);
          for (auto& v : x) v = u(rng);
          const auto xq = quantize_x(x, T, cols, xrb, &xd);
          for (int threads : {1, 3}) {
            ThreadPool pool(threads);
            matmul_q8(t, w.data(), rows, cols, xq.data(), xrb, T, y.data(), rows, pool);
            for (int64_t tt = 0; tt < T; ++tt)
              for (int64_t r = 0; r < rows; ++r) {
                double ref = 0, mag = 0;
                for (int64_t c = 0; c < cols; ++c) {
                  const double p = static_cast<double>(wf[r * cols + c]) * xd[tt * cols + c];
                  ref += p;
                  mag += std::fabs(p);
                }
                worst = std::max(worst, std::fabs(y[tt * rows + r] - ref) / mag);
                ASSERT_NEAR(y[tt * rows + r], ref, kBound * mag + 1e-30)
                    << quant_traits(t).name << " cols=" << cols << " rows=" << rows << " T=" << T
                    << " r=" << r << " t=" << tt;
              }
          }
        }
      }
    }
  }
  report("matmul_q8 vs float64", worst, kBound);
}

TEST(QuantQ8, IsBitIdenticalAcrossShapesThreadsAndIsa) {
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<Isa> isas = {Isa::Scalar};
  if (best_isa() >= Isa::Avx2) isas.push_back(Isa::Avx2);
  if (best_isa() >= Isa::Avx512Vnni) isas.push_back(Isa::Avx512Vnni);
  for (QType t : kQ8Types) {
    const int64_t rows = 33, cols = 512, T = 37, xrb = cols / 32 * 34;
    const size_t rb = row_bytes(t, cols);
    const auto w = random_weights(t, rows, cols, rng);
    std::vector<float> x(T * cols);
    for (auto& v : x) v = u(rng);
    const auto xq = quantize_x(x, T, cols, xrb, nullptr);
    ThreadPool one(1), three(3);
    std::vector<float> ref(T * rows);
    matmul_q8(Isa::Scalar, t, w.data(), rows, cols, xq.data(), xrb, T, ref.data(), rows, one);
    for (Isa isa : isas) {
      for (ThreadPool* pool : {&one, &three}) {
        const char* name = quant_traits(t).name;
        std::vector<float> y(T * rows);
        matmul_q8(isa, t, w.data(), rows, cols, xq.data(), xrb, T, y.data(), rows, *pool);
        ASSERT_EQ(std::memcmp(y.data(), ref.data(), y.size() * 4), 0) << name << " T=37";
        for (int64_t T1 :
             {1, 2, 3, 5, 8, 12, 16, 20}) {  // every tile shape and token tail, from every offset
          for (int64_t t0 = 0; t0 + T1 <= T; t0 += 7) {
            std::vector<float> y1(T1 * rows);
            matmul_q8(isa, t, w.data(), rows, cols, xq.data() + t0 * xrb, xrb, T1, y1.data(), rows, *pool);
            ASSERT_EQ(std::memcmp(y1.data(), ref.data() + t0 * rows, T1 * rows * 4), 0)
                << name << " T=" << T1 << " t0=" << t0;
          }
        }
        // Rows 5..24 through an offset pointer into a padded Y.
        const int64_t r0 = 5, nr = 20, ldy = nr + 2;
        std::vector<float> yp(T * ldy);
        matmul_q8(isa, t, w.data() + r0 * rb, nr, cols, xq.data(), xrb, T, yp.data(), ldy, *pool);
        for (int64_t tt = 0; tt < T; ++tt)
          ASSERT_EQ(std::memcmp(&yp[tt * ldy], &ref[tt * rows + r0], nr * 4), 0)
              << name << " subset t=" << tt;
      }
    }
  }
}

// Each AVX-512 VNNI kernel against its scalar kernel, called through the traits table: bit for bit at every
// tile shape (T = 1..20), 19 rows from two offsets (row tails), 256, 768 and 2048 columns, and activations at
// the extremes of q8_0 (+-127 everywhere: the int16 partial bounds the kernels rely on).
TEST(QuantQ8, VnniKernelsAreBitIdenticalToScalar) {
  if (best_isa() < Isa::Avx512Vnni)
    GTEST_SKIP()
        << "this CPU lacks AVX-512 F/BW/VL/VNNI (or STRATA_CPU_ISA caps it): the VNNI kernels do not run";
  std::mt19937 rng(29);
  std::uniform_int_distribution<int> q(-127, 127);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  int kernels = 0;
  for (QType t : kQ8Types) {
    const QuantTraits& qt = quant_traits(t);
    if (!qt.matmul_q8_vnni) continue;
    ++kernels;
    for (int64_t cols : {256, 768, 2048}) {
      const int64_t rows = 19, T = 20, xrb = cols / 32 * 34 + 3;  // padded, odd: unaligned activation rows
      const size_t rb = row_bytes(t, cols);
      auto w = random_weights(t, rows, cols, rng);
      if (t == QType::MXFP4)  // every kind of E8M0 scale: the two below 2^-126 too
        for (size_t off = 0, i = 0; off < w.size(); off += qt.type_size, ++i)
          if (i % 3 == 0) w[off] = static_cast<uint8_t>(i / 3 % 4);
      for (int extreme = 0; extreme < 3; ++extreme) {
        std::vector<uint8_t> xq(T * xrb);
        for (int64_t i = 0; i < T; ++i)
          for (int64_t b = 0; b < cols / 32; ++b) {
            uint8_t* blk = &xq[i * xrb + b * 34];
            const uint16_t d = f32_to_fp16(u(rng) * 0.02f);
            std::memcpy(blk, &d, 2);
            for (int l = 0; l < 32; ++l)
              blk[2 + l] = static_cast<uint8_t>(extreme == 0   ? q(rng)
                                                : extreme == 1 ? 127
                                                               : (l % 2 ? 127 : -127));
          }
        for (int64_t T1 = 1; T1 <= T; ++T1)
          for (int64_t r0 : {0, 3}) {
            const int64_t nr = rows - r0;
            std::vector<float> want(T1 * nr), got(T1 * nr, -1.0f);
            qt.matmul_q8(w.data() + r0 * rb, rb, nr, cols, xq.data(), xrb, T1, want.data(), nr);
            qt.matmul_q8_vnni(w.data() + r0 * rb, rb, nr, cols, xq.data(), xrb, T1, got.data(), nr);
            ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
                << qt.name << " cols=" << cols << " T=" << T1 << " r0=" << r0 << " extreme=" << extreme;
          }
      }
    }
  }
  EXPECT_GT(kernels, 0);
}
