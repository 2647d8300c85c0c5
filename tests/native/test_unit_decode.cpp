// The GPU matmul kernels' register decoders (quant/unit_decode.h), run on the host: units equal to
// dequant_row bit for bit, and matmul_q8 rebuilt from the integer blocks equal to the CPU's bit for
// bit, with blocks at both even alignments.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "quant/quant.h"
#include "quant/quantize.h"
#include "quant/unit_decode.h"

using namespace strata;

namespace {

// Random weights with finite fp16 scales of moderate size (as the op harness makes them).
std::vector<uint8_t> random_weights(QType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  const QuantTraits& q = quant_traits(t);
  std::vector<uint8_t> w(rows * row_bytes(t, cols));
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<size_t> halves;
  if (t == QType::F16 || t == QType::Q8_0 || t == QType::IQ2_XS || t == QType::IQ2_XXS) halves = {0};
  if (t == QType::Q2_K) halves = {80, 82};
  if (t == QType::Q4_K) halves = {0, 2};
  if (t == QType::Q6_K) halves = {208};
  if (t == QType::Q5_K || t == QType::Q4_1 || t == QType::Q5_1) halves = {0, 2};
  if (t == QType::Q3_K) halves = {108};
  if (t == QType::IQ4_XS || t == QType::Q5_0 || t == QType::Q4_0 || t == QType::IQ4_NL ||
      t == QType::IQ3_XXS || t == QType::IQ3_S || t == QType::IQ2_S || t == QType::IQ1_S)
    halves = {0};
  for (size_t off = 0; off < w.size(); off += q.type_size) {
    if (t == QType::F32) {
      const float v = u(rng);
      std::memcpy(&w[off], &v, 4);
    } else if (t == QType::BF16) {
      const uint16_t h = static_cast<uint16_t>(bits_from_f32(u(rng)) >> 16);
      std::memcpy(&w[off], &h, 2);
    }
    for (size_t f : halves) {
      const uint16_t h = f32_to_fp16(u(rng) * (t == QType::F16 ? 1.0f : 0.05f));
      std::memcpy(&w[off + f], &h, 2);
    }
    if (t == QType::MXFP4) w[off] = static_cast<uint8_t>(116 + rng() % 9);  // E8M0 scale 2^-12 .. 2^-4
    if (t == QType::IQ1_M) {  // the fp16 scale in the top nibbles of the words at bytes 48-55
      const uint16_t h = f32_to_fp16(u(rng) * 0.05f);
      for (int i = 0; i < 4; ++i)
        w[off + 49 + 2 * i] =
            static_cast<uint8_t>((w[off + 49 + 2 * i] & 0x0F) | (((h >> (4 * i)) & 0xF) << 4));
    }
  }
  return w;
}

// Copies bytes to `shift` bytes past a 16-byte boundary (0, 2, 4, ... as the format allows).
struct Shifted {
  std::vector<uint8_t> buf;
  const uint8_t* p;
  Shifted(const std::vector<uint8_t>& v, size_t shift) : buf(v.size() + 32) {
    uint8_t* base = buf.data();
    base += (16 - reinterpret_cast<uintptr_t>(base) % 16) % 16 + shift;
    std::memcpy(base, v.data(), v.size());
    p = base;
  }
};

template <class F>
void check_units(int64_t cols, std::mt19937& rng) {
  const int64_t rows = 5;
  const size_t rb = row_bytes(F::kType, cols);
  const auto w = random_weights(F::kType, rows, cols, rng);
  std::vector<float> want(rows * cols);
  dequantize(F::kType, w.data(), want.data(), rows * cols);
  for (size_t shift : {0, 1, 2, 3, 4, 6}) {
    if (F::kType == QType::F32 && shift % 4) continue;    // float rows are element-aligned
    if (F::kType != QType::MXFP4 && shift % 2) continue;  // MXFP4's 17-byte blocks sit at any byte
    const Shifted s(w, shift);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c0 = 0; c0 + unit::kUnit <= cols; c0 += unit::kUnit) {
        const uint8_t* b = s.p + r * rb + c0 / F::kBlock * F::kBytes;
        float v[unit::kUnit];
        F::decode(b, static_cast<int>(c0 % F::kBlock / unit::kUnit), v);
        for (int i = 0; i < unit::kUnit; ++i)
          ASSERT_EQ(bits_from_f32(v[i]), bits_from_f32(want[r * cols + c0 + i]))
              << quant_traits(F::kType).name << " shift " << shift << " row " << r << " element " << c0 + i;
      }
  }
}

TEST(UnitDecode, UnitsEqualDequantRow) {
  std::mt19937 rng(11);
  check_units<unit::F32>(160, rng);
  check_units<unit::F16>(160, rng);
  check_units<unit::BF16>(160, rng);
  check_units<unit::Q8_0>(7 * 32, rng);
  check_units<unit::Q4_K>(3 * 256, rng);
  check_units<unit::Q6_K>(3 * 256, rng);
  check_units<unit::IQ2_XS>(3 * 256, rng);
  check_units<unit::Q2_K>(3 * 256, rng);
  check_units<unit::IQ2_XXS>(3 * 256, rng);
  check_units<unit::Q5_K>(3 * 256, rng);
  check_units<unit::Q3_K>(3 * 256, rng);
  check_units<unit::IQ4_XS>(3 * 256, rng);
  check_units<unit::Q4_0>(7 * 32, rng);
  check_units<unit::Q4_1>(7 * 32, rng);
  check_units<unit::Q5_0>(7 * 32, rng);
  check_units<unit::Q5_1>(7 * 32, rng);
  check_units<unit::IQ4_NL>(7 * 32, rng);
  check_units<unit::MXFP4>(7 * 32, rng);
  check_units<unit::IQ3_XXS>(3 * 256, rng);
  check_units<unit::IQ3_S>(3 * 256, rng);
  check_units<unit::IQ2_S>(3 * 256, rng);
  check_units<unit::IQ1_S>(3 * 256, rng);
  check_units<unit::IQ1_M>(3 * 256, rng);
}

// Every byte pattern of the Q4_K and Q6_K fields at once: the quants decoded from random bytes above
// cover the nibbles and 2-bit groups; this covers the extremes of the float conversion.
TEST(UnitDecode, ByteFloatsAreExact) {
  for (uint32_t b = 0; b < 256; ++b) {
    const uint32_t w = b * unit::kOnes;
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(unit::u8_float(w, k), static_cast<float>(b));
      EXPECT_EQ(unit::s8_float(w ^ 0x80808080u, k), static_cast<float>(static_cast<int8_t>(b)));
    }
  }
}

// matmul_q8 rebuilt from q8_weights / q8_act / q8_ints / q8_fma in block order, as the GPU kernel
// runs it, against the CPU kernel.
template <class F>
void check_q8(int64_t cols, std::mt19937& rng) {
  const int64_t rows = 6, T = 3;
  const size_t rb = row_bytes(F::kType, cols), xrb = cols / 32 * kQ8_0Bytes + 2;
  const auto w = random_weights(F::kType, rows, cols, rng);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> x(T * cols);
  for (auto& v : x) v = u(rng);
  std::vector<uint8_t> xq(T * xrb, 0);
  for (int64_t t = 0; t < T; ++t) quantize_row_q8_0(&x[t * cols], &xq[t * xrb], cols);
  std::vector<float> want(T * rows);
  ThreadPool pool(1);
  matmul_q8(Isa::Scalar, F::kType, w.data(), rows, cols, xq.data(), xrb, T, want.data(), rows, pool);
  for (size_t shift : {0, 1, 2}) {
    if (F::kType != QType::MXFP4 && shift % 2) continue;
    const Shifted sw(w, shift), sx(xq, shift == 0 ? 2 : 0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t t = 0; t < T; ++t) {
        float a = 0.0f;
        for (int64_t blk = 0; blk < cols / 32; ++blk) {
          unit::Q8Weights wq;
          F::q8_weights(sw.p + r * rb + blk * 32 / F::kBlock * F::kBytes,
                        static_cast<int>(blk * 32 % F::kBlock / 32), wq);
          unit::Q8Act xa;
          const float dx = unit::q8_act<F>(sx.p + t * xrb + blk * kQ8_0Bytes, xa);
          int iv[F::kPairs];
          F::q8_ints(wq, xa, iv);
          // The same sums from the halves' dot products (as the tensor-core kernel forms them).
          int half[2] = {0, 0}, xhalf[2] = {0, 0};
          for (int i = 0; i < 8; ++i)
            for (int k = 0; k < 4; ++k) {
              const int wv = static_cast<int8_t>(wq.q[i] >> (8 * k)),
                        xv = static_cast<int8_t>(xa.q[i] >> (8 * k));
              half[i / 4] += wv * xv;
              xhalf[i / 4] += xv;
            }
          int iv2[F::kPairs];
          F::q8_iv(wq, half[0], half[1], xhalf[0], xhalf[1], iv2);
          for (int p = 0; p < F::kPairs; ++p)
            ASSERT_EQ(iv2[p], iv[p]) << quant_traits(F::kType).name << " q8_iv pair " << p << " block "
                                     << blk;
          // A format of whole sums gets them from one 32-lane product (the k32 tensor-core form).
          if constexpr (F::kWholeSums) {
            F::q8_iv(wq, half[0] + half[1], 0, xhalf[0] + xhalf[1], 0, iv2);
            for (int p = 0; p < F::kPairs; ++p)
              ASSERT_EQ(iv2[p], iv[p]) << quant_traits(F::kType).name << " whole-sum q8_iv pair " << p;
          }
          a = F::q8_fma(wq, dx, iv, a);
        }
        ASSERT_EQ(bits_from_f32(a), bits_from_f32(want[t * rows + r]))
            << quant_traits(F::kType).name << " shift " << shift << " row " << r << " token " << t;
      }
  }
}

TEST(UnitDecode, IntegerBlocksRebuildMatmulQ8) {
  std::mt19937 rng(12);
  check_q8<unit::Q8_0>(7 * 32, rng);
  check_q8<unit::Q4_K>(3 * 256, rng);
  check_q8<unit::Q6_K>(3 * 256, rng);
  check_q8<unit::IQ2_XS>(3 * 256, rng);
  check_q8<unit::Q2_K>(3 * 256, rng);
  check_q8<unit::IQ2_XXS>(3 * 256, rng);
  check_q8<unit::Q5_K>(3 * 256, rng);
  check_q8<unit::Q3_K>(3 * 256, rng);
  check_q8<unit::IQ4_XS>(3 * 256, rng);
  check_q8<unit::Q4_0>(7 * 32, rng);
  check_q8<unit::Q4_1>(7 * 32, rng);
  check_q8<unit::Q5_0>(7 * 32, rng);
  check_q8<unit::Q5_1>(7 * 32, rng);
  check_q8<unit::IQ4_NL>(7 * 32, rng);
  check_q8<unit::MXFP4>(7 * 32, rng);
  check_q8<unit::IQ3_XXS>(3 * 256, rng);
  check_q8<unit::IQ3_S>(3 * 256, rng);
  check_q8<unit::IQ2_S>(3 * 256, rng);
  check_q8<unit::IQ1_S>(3 * 256, rng);
  check_q8<unit::IQ1_M>(3 * 256, rng);
}

}  // namespace
