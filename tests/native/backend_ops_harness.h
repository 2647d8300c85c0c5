// The op harness's shared parts: the backends under test and their error bounds, device arrays with
// poisoned contents and guard tails, random inputs and weights, error measures, and the Op fixture
// every op test runs on.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend_ops_ref.h"
#include "core/error.h"
#include "core/exp_portable.h"
#include "core/half.h"
#include "quant/quant.h"

#if defined(STRATA_HAVE_CUDA)
#include "backend/cuda/cuda_backend.h"
#endif

using namespace strata;

namespace {

// Error bounds of the ops whose result depends on the order of a float sum or on the accuracy of
// exp/sin/cos. The defaults were measured on the CPU backend (STRATA_OPS_REPORT=1 prints every
// measured error); a backend that sums in another order gets its own.
struct Bounds {
  double rms_scale = 2e-6;  // measured 4.5e-7 (float sum of D squares)
  double matmul = 8e-7;     // measured 7.6e-8 (float sums of cols products)
  // matmul from this many tokens on, where a backend computes with fp16 inputs (tensor cores).
  int64_t matmul_tc_from_T = INT64_MAX;
  double matmul_tc = 8e-7;
  double matmul_q8 = 2e-6;         // measured 2.5e-7 (float scale products, sums)
  double head_norm_rope = 1.5e-6;  // measured 1.4e-7 at position 0; plus 3e-7 a position (see HeadNormRope)
  double attention = 1.5e-6;       // measured 1.7e-7
  // Attention over an f16 cache at head dims 64 and 128 rounds q and p to fp16 (tensor cores): the
  // test AttentionF16HeadDimsOfTheTensorCores derives its bound from those roundings.
  bool attention_f16_tc = false;
};

struct BackendFactory {
  std::string name;  // the test's parameter name
  std::function<std::unique_ptr<Backend>()> make;
  Bounds bounds = {};
};
void PrintTo(const BackendFactory& f, std::ostream* os) { *os << f.name; }

// Every backend the harness runs; each runs every check below.
std::vector<BackendFactory> backends_under_test() {
  std::vector<BackendFactory> v;
  v.push_back({"cpu1", [] { return make_cpu_backend(1); }});
  v.push_back({"cpu3", [] { return make_cpu_backend(3); }});  // splits no shape evenly
#if defined(STRATA_HAVE_CUDA)
  if (cuda_device_count() > 0) {
    // Measured on the H200 (STRATA_OPS_REPORT=1, 2026-12-03), bounds ~10x: the kernels sum in strided
    // lanes and warp trees rather than the CPU's eight lanes, with fma, and the device's
    // expf/sinf/cosf are within 2 ulp where glibc's are within 1. rms_scale 1.4e-7; matmul on GEMV
    // (fp32 products of the exact weights) 4.2e-8; on tensor cores (fp16 weights and activations,
    // 2^-11 each, fp32 sums; matmul_mma.cuh) 1.1e-4; matmul_q8 equals the CPU's bit for bit (checked
    // below), so the CPU's bound holds; head_norm_rope 2.6e-7 at position 0 (the position term is
    // the CPU's); attention 2.3e-7.
    Bounds gpu;
    gpu.rms_scale = 1.5e-6;
    gpu.matmul = 5e-7;
    gpu.matmul_tc_from_T = 9;
    gpu.matmul_tc = 1e-3;
    gpu.matmul_q8 = 2e-6;
    gpu.head_norm_rope = 2.6e-6;
    gpu.attention = 2.3e-6;
    gpu.attention_f16_tc = true;
    v.push_back({"cuda", [] { return make_cuda_backend(0); }, gpu});
  }
#endif
  return v;
}

const int64_t kTs[] = {1, 3, 8, 9, 257};
// Every type strata reads; every op that takes a weight type runs on all of them.
// An environment variable set for a scope: the CUDA backend reads its STRATA_CUDA_* switches at each launch
// (the CPU ignores them), so a test runs a GPU's kernels both ways in one process. The value it had before
// comes back at the scope's end, also when a failed assertion leaves the scope early.
class ScopedEnv {
 public:
  ScopedEnv(const char* key, const char* value) : key_(key) {
    if (const char* old = std::getenv(key)) {
      old_ = old;
      had_ = true;
    }
    setenv(key, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(key_, old_.c_str(), 1);
    else
      unsetenv(key_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* key_;
  std::string old_;
  bool had_ = false;
};

const QType kAllTypes[] = {QType::F32,   QType::F16,    QType::BF16,   QType::Q8_0,    QType::Q4_K,
                           QType::Q6_K,  QType::IQ2_XS, QType::Q2_K,   QType::IQ2_XXS, QType::Q5_K,
                           QType::Q3_K,  QType::IQ4_XS, QType::MXFP4,  QType::Q5_0,    QType::Q4_0,
                           QType::Q4_1,  QType::Q5_1,   QType::IQ4_NL, QType::IQ3_XXS, QType::IQ3_S,
                           QType::IQ2_S, QType::IQ1_S,  QType::IQ1_M};

// A row of type t: whole blocks, not a power of two (and for float types not a multiple of 8).
int64_t cols_of(QType t) {
  const int64_t bs = quant_traits(t).block_size;
  return bs == 1 ? 229 : bs == 32 ? 7 * 32 : 3 * 256;
}

constexpr size_t kGuard = 64;  // bytes after every array, which no op may touch
constexpr uint8_t kGuardByte = 0xA5;
constexpr uint8_t kPoison = 0xFF;  // NaN floats, -1 ints: an element an op fails to write fails

// n elements of T in the backend's memory, then a guard tail.
template <class T>
class Dev {
 public:
  Dev(Backend& be, size_t n, const char* what)
      : be_(be), n_(n), what_(what), buf_(be, n * sizeof(T) + kGuard, what) {
    poison();
  }
  Dev(Backend& be, const std::vector<T>& v, const char* what) : Dev(be, v.size(), what) { set(v); }

  T* p() const { return buf_.as<T>(); }
  size_t bytes() const { return n_ * sizeof(T); }
  void set(const std::vector<T>& v) {
    std::vector<uint8_t> h(bytes() + kGuard, kGuardByte);
    if (bytes()) std::memcpy(h.data(), v.data(), bytes());  // an empty vector's data() may be null
    be_.upload(buf_.get(), h.data(), h.size());
  }
  void poison() {
    std::vector<uint8_t> h(bytes() + kGuard, kGuardByte);
    std::memset(h.data(), kPoison, bytes());
    be_.upload(buf_.get(), h.data(), h.size());
  }
  // The contents once queued work is done; a failure if anything wrote into the guard.
  std::vector<T> get() const {
    be_.sync();
    std::vector<uint8_t> h(bytes() + kGuard);
    be_.download(h.data(), buf_.get(), h.size());
    for (size_t i = bytes(); i < h.size(); ++i)
      if (h[i] != kGuardByte) {
        ADD_FAILURE() << what_ << ": written past its end, at byte " << i - bytes() << " of the guard";
        break;
      }
    std::vector<T> v(n_);
    if (bytes()) std::memcpy(v.data(), h.data(), bytes());  // an empty vector's data() may be null
    return v;
  }

 private:
  Backend& be_;
  size_t n_;
  const char* what_;
  DeviceBuffer buf_;
};

std::vector<float> randf(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

std::vector<int32_t> randi(std::mt19937& rng, size_t n, int32_t below) {
  std::vector<int32_t> v(n);
  for (auto& x : v) x = (int32_t)(rng() % below);
  return v;
}

// Random valid weights: random bytes with the float fields finite (fp16 scales small).
std::vector<uint8_t> random_weights(QType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  const QuantTraits& q = quant_traits(t);
  std::vector<uint8_t> w(rows * row_bytes(t, cols));
  for (auto& b : w) b = (uint8_t)rng();
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<size_t> halves;  // byte offsets of a block's fp16 fields
  if (t == QType::F16 || t == QType::Q8_0 || t == QType::IQ2_XS || t == QType::IQ2_XXS ||
      t == QType::IQ4_XS || t == QType::Q5_0 || t == QType::Q4_0 || t == QType::IQ4_NL ||
      t == QType::IQ3_XXS || t == QType::IQ3_S || t == QType::IQ2_S || t == QType::IQ1_S)
    halves = {0};
  if (t == QType::Q2_K) halves = {80, 82};
  if (t == QType::Q4_K || t == QType::Q5_K || t == QType::Q4_1 || t == QType::Q5_1) halves = {0, 2};
  if (t == QType::Q6_K) halves = {208};
  if (t == QType::Q3_K) halves = {108};
  for (size_t off = 0; off < w.size(); off += q.type_size) {
    if (t == QType::F32) {
      const float v = u(rng);
      std::memcpy(&w[off], &v, 4);
    } else if (t == QType::BF16) {
      const uint16_t h = (uint16_t)(bits_from_f32(u(rng)) >> 16);
      std::memcpy(&w[off], &h, 2);
    }
    for (size_t f : halves) {
      const uint16_t h = f32_to_fp16(u(rng) * (t == QType::F16 ? 1.0f : 0.05f));
      std::memcpy(&w[off + f], &h, 2);
    }
    if (t == QType::MXFP4) w[off] = (uint8_t)(116 + rng() % 9);  // E8M0 scale 2^-12 .. 2^-4
    if (t == QType::IQ1_M) {  // the fp16 scale in the top nibbles of the words at bytes 48-55
      const uint16_t h = f32_to_fp16(u(rng) * 0.05f);
      for (int i = 0; i < 4; ++i)
        w[off + 49 + 2 * i] = (uint8_t)((w[off + 49 + 2 * i] & 0x0F) | (((h >> (4 * i)) & 0xF) << 4));
    }
  }
  return w;
}

// Bit-exact equality; names the first element that differs.
template <class T>
void expect_same(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " is " << +got[i] << ", want " << +want[i];
      return;
    }
}

// max |got - ref| / scale; infinite where got is not finite (poison the op never overwrote).
double max_err(const std::vector<float>& got, const std::vector<double>& ref,
               const std::vector<double>& scale) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    worst = std::max(worst, std::fabs(got[i] - ref[i]) / scale[i]);
  }
  return worst;
}

// |ref|: the scale of a relative error for ops without cancellation.
std::vector<double> abs_of(const std::vector<double>& ref) {
  std::vector<double> s(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) s[i] = std::max(std::fabs(ref[i]), 1e-30);
  return s;
}

// STRATA_OPS_REPORT=1 prints every measured error: how the bounds below were set, and how to
// re-measure them for a new backend.
void expect_err(double err, double bound, const std::string& what) {
  if (std::getenv("STRATA_OPS_REPORT")) std::printf("  %-44s %.3g (bound %.3g)\n", what.c_str(), err, bound);
  EXPECT_LE(err, bound) << what;
}

// A long row: many of the GPU kernels' chunks (512 columns), more than they keep in flight.
int64_t long_cols_of(QType t) {
  const int64_t bs = quant_traits(t).block_size;
  return bs == 1 ? 2819 : bs == 32 ? 89 * 32 : 11 * 256;
}

// The elements of a [T, ld] output past its first `used` columns: no op may write them.
void expect_gaps_untouched(const std::vector<float>& y, int64_t T, int64_t used, int64_t ld,
                           const std::string& what) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = used; c < ld; ++c)
      if (bits_from_f32(y[t * ld + c]) != 0xFFFFFFFFu) {
        ADD_FAILURE() << what << ": wrote Y[" << t << ", " << c << "] past its " << used << " columns";
        return;
      }
}

class Op : public testing::TestWithParam<BackendFactory> {
 protected:
  void SetUp() override {
    backend_ = GetParam().make();
    live_at_start_ = backend_->live_allocations();
  }
  // Every test frees what it allocated.
  void TearDown() override { EXPECT_EQ(backend_->live_allocations(), live_at_start_); }
  Backend& be() { return *backend_; }
  const Bounds& bounds() const { return GetParam().bounds; }

 private:
  std::unique_ptr<Backend> backend_;
  size_t live_at_start_ = 0;
};

// The harness for one architecture's own ops interface (Find: gptoss_ops, qwen35_ops, ...) on each
// backend that has it. A backend without it refuses that architecture's models at load (each file
// checks that), so the skip hides nothing.
template <class Ops, Ops* (*Find)(Backend&)>
class ArchOp : public Op {
 protected:
  void SetUp() override {
    Op::SetUp();
    if (!Find(be())) GTEST_SKIP() << "the " << be().name() << " backend has no ops of this architecture";
  }
  Ops& ops() { return *Find(be()); }
};

}  // namespace
