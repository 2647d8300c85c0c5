// exp_portable (core/exp_portable.h) and the CPU's activations built on it (backend/cpu/activation.h):
// its accuracy over the whole finite range, its edges, and the CPU's eight-lane forms against the scalar
// one bit for bit. (The op harness holds every GPU's activation kernels to the same bits.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/activation.h"
#include "core/exp_portable.h"
#include "core/thread_pool.h"

namespace strata {
namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// |got - e^x| in units of the last place of e^x as a float (the subnormals' spacing below 2^-126).
double ulp_error(float x, float got) {
  const double want = std::exp(static_cast<double>(x));
  int e;
  std::frexp(want, &e);
  const double ulp = std::ldexp(1.0, std::max(e - 24, -149));
  return std::fabs(static_cast<double>(got) - want) / ulp;
}

// Every 97th float of the finite range whose e^x is neither 0 nor inf (~25 million), both signs.
TEST(ExpPortable, WithinOneUlpOverTheFiniteRange) {
  double worst = 0;
  float at = 0;
  for (uint32_t b = 0; b < 0x42B17218u; b += 97)  // up to ln(FLT_MAX)
    for (const float x : {from_bits(b), -from_bits(b)}) {
      if (x < -103.9f) continue;  // e^x below half the smallest subnormal is rounded to 0 (tested below)
      const double err = ulp_error(x, exp_portable(x));
      if (err > worst) worst = err, at = x;
    }
  // The steps' errors: r's rounding (<= 2^-25 absolute), the polynomial's truncation (< 5.3e-9
  // relative), six Horner roundings, the last one half an ulp; the result is the same bits on every
  // IEEE machine, so the measured worst (0.92 ulp, every 7th float) is a property of the function, not of
  // this CPU.
  EXPECT_LE(worst, 1.0) << "at x = " << at;
}

TEST(ExpPortable, Edges) {
  EXPECT_EQ(exp_portable(0.0f), 1.0f);
  EXPECT_EQ(exp_portable(-0.0f), 1.0f);
  EXPECT_EQ(exp_portable(1e-10f), 1.0f);
  EXPECT_TRUE(std::isnan(exp_portable(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(exp_portable(INFINITY), INFINITY);
  EXPECT_EQ(exp_portable(-INFINITY), 0.0f);
  EXPECT_EQ(exp_portable(89.5f), INFINITY);
  EXPECT_EQ(exp_portable(-200.0f), 0.0f);
  // The last float whose e^x is finite, and the next one.
  EXPECT_EQ(exp_portable(from_bits(0x42B17217u)), std::exp(from_bits(0x42B17217u)));
  EXPECT_EQ(exp_portable(from_bits(0x42B17218u)), INFINITY);
  // Subnormal results: rounded once, within one subnormal step; e^-104 rounds to 0.
  for (const float x : {-88.0f, -90.0f, -95.5f, -100.0f, -103.0f, -103.9f})
    EXPECT_LE(ulp_error(x, exp_portable(x)), 1.0) << x;
  EXPECT_EQ(exp_portable(-104.0f), 0.0f);
  // Monotonic across the subnormal range, where the scaling is split in two.
  float prev = 0;
  for (float x = -103.97f; x < -85.0f; x += 0.01f) {
    const float y = exp_portable(x);
    EXPECT_GE(y, prev) << x;
    prev = y;
  }
}

bool has_simd() { return best_isa() >= Isa::Avx2; }

// Random floats of every exponent and sign, NaNs and infinities among them, then every 1,009th float.
std::vector<float> every_kind_of_float() {
  std::mt19937 rng(71);
  std::vector<float> x;
  for (int i = 0; i < 200000; ++i) x.push_back(from_bits(static_cast<uint32_t>(rng())));
  for (uint64_t b = 0; b <= 0xFFFFFFFFu; b += 1009) x.push_back(from_bits(static_cast<uint32_t>(b)));
  for (float v : {0.0f, -0.0f, INFINITY, -INFINITY, 88.72f, 89.0f, 89.0001f, -104.0f, -104.0001f, -103.97f})
    x.push_back(v);
  return x;
}

TEST(ExpPortable, EightLanesAreTheScalarBits) {
  if (!has_simd()) GTEST_SKIP() << "this CPU has no AVX2 and FMA";
  const auto x = every_kind_of_float();
  std::vector<float> got(x.size());
  exp_portable_n(Isa::Avx2, x.data(), got.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = exp_portable(x[i]);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got[i])) << "x bits " << std::hex << bits_of(x[i]);
      continue;
    }
    ASSERT_EQ(bits_of(got[i]), bits_of(want))
        << "x = " << x[i] << " (bits " << std::hex << bits_of(x[i]) << ")";
  }
}

// The three activations, eight lanes against scalar, over lengths that leave every tail.
TEST(ExpPortable, ActivationsAreTheSameBitsOnEveryPath) {
  if (!has_simd()) GTEST_SKIP() << "this CPU has no AVX2 and FMA";
  ThreadPool pool(2);
  std::mt19937 rng(72);
  std::uniform_real_distribution<float> wide(-110.f, 110.f), mid(-12.f, 12.f);
  for (const int64_t n : {1, 7, 8, 9, 31, 4099, 10007}) {
    std::vector<float> g(n), u(n);
    for (int64_t i = 0; i < n; ++i) g[i] = i % 3 ? mid(rng) : wide(rng), u[i] = mid(rng);
    auto a = g, b = g;
    cpu_swiglu(Isa::Scalar, a.data(), u.data(), n, pool);
    cpu_swiglu(Isa::Avx2, b.data(), u.data(), n, pool);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(bits_of(a[i]), bits_of(b[i])) << "swiglu n=" << n << " i=" << i;
      ASSERT_EQ(bits_of(a[i]), bits_of(swiglu_portable(g[i], u[i]))) << "swiglu n=" << n << " i=" << i;
    }
    for (const float limit : {0.f, 0.7f, 7.f}) {
      a = g, b = g;
      cpu_swiglu_clamp(Isa::Scalar, a.data(), u.data(), n, limit, pool);
      cpu_swiglu_clamp(Isa::Avx2, b.data(), u.data(), n, limit, pool);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(bits_of(a[i]), bits_of(b[i])) << "swiglu_clamp limit=" << limit << " n=" << n << " i=" << i;
    }
  }
  const int64_t E = 3, F = 37, rows_n = 11;  // F: four lanes of eight and a tail of five
  std::vector<float> g(rows_n * F), u(rows_n * F), gb(E * F), ub(E * F);
  for (auto* v : {&g, &u})
    for (float& f : *v) f = mid(rng);
  for (auto* v : {&gb, &ub})
    for (float& f : *v) f = mid(rng) / 10;
  std::vector<int32_t> ids(rows_n), rows(rows_n);
  for (int64_t i = 0; i < rows_n; ++i)
    ids[i] = static_cast<int32_t>(rng() % E), rows[i] = static_cast<int32_t>((i * 4) % rows_n);
  auto a = g, b = g;
  cpu_swiglu_oai(Isa::Scalar, a.data(), u.data(), ids.data(), rows.data(), rows_n, F, gb.data(), ub.data(),
                 1.702f, 7.f, pool);
  cpu_swiglu_oai(Isa::Avx2, b.data(), u.data(), ids.data(), rows.data(), rows_n, F, gb.data(), ub.data(),
                 1.702f, 7.f, pool);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(bits_of(a[i]), bits_of(b[i])) << "swiglu_oai element " << i;
}

}  // namespace
}  // namespace strata
