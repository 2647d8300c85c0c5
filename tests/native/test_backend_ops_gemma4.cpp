// The op harness for gemma4's backend ops: per-head RMSNorm with and without a weight, NEOX RoPE from a
// frequency table with zeros (proportional RoPE) at pos0 and at per-row positions, causal attention over
// a sliding window, the GELU-tanh GLU, the scalar and per-expert scales, on every backend that has them
// against plain double references at awkward shapes.
#include <cmath>
#include <limits>

#include "backend/gemma4_ops.h"
#include "backend_ops_harness.h"
#include "core/half.h"
#include "forwarding_backend.h"
#include "model/arch.h"

namespace {

class Gemma4Op : public ArchOp<Gemma4Ops, gemma4_ops> {};

INSTANTIATE_TEST_SUITE_P(BackendOps, Gemma4Op, testing::ValuesIn(backends_under_test()),
                         [](const testing::TestParamInfo<BackendFactory>& i) { return i.param.name; });

TEST_P(Gemma4Op, HeadNormWithAndWithoutWeight) {
  std::mt19937 rng(71);
  const int64_t T = 5, n_heads = 3, hd = 22;
  const float eps = 3e-5f;
  for (bool weighted : {true, false}) {
    const auto x = randf(rng, T * n_heads * hd, -3.f, 3.f), w = randf(rng, hd, 0.5f, 1.5f);
    Dev<float> dx(be(), x, "x"), dw(be(), w, "w");
    ops().head_norm(dx.p(), T, n_heads, hd, weighted ? dw.p() : nullptr, eps);
    std::vector<double> want(x.size());
    for (int64_t r = 0; r < T * n_heads; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < hd; ++i) ss += (double)x[r * hd + i] * x[r * hd + i];
      const double g = 1.0 / std::sqrt(ss / hd + eps);
      for (int64_t i = 0; i < hd; ++i) want[r * hd + i] = x[r * hd + i] * g * (weighted ? w[i] : 1.0);
    }
    // outputs of magnitude ~1.5 from float32 sums of 22 squares: measured 3.0e-7
    expect_err(max_err(dx.get(), want, std::vector<double>(want.size(), 1.0)), 2e-6,
               str("head_norm weighted=", weighted));
  }
}

TEST_P(Gemma4Op, RopeFreqsWithZeroFrequencies) {
  std::mt19937 rng(73);
  const int64_t T = 5, n_heads = 3, hd = 26, half = hd / 2, rotated = 4;
  auto inv = randf(rng, half, 1e-4f, 1.f);
  for (int64_t i = rotated; i < half; ++i) inv[i] = 0.f;  // proportional RoPE: the rest stand still
  for (int64_t pos0 : {0, 1029}) {
    const auto x = randf(rng, T * n_heads * hd, -2.f, 2.f);
    Dev<float> dx(be(), x, "x"), di(be(), inv, "inv_freq");
    ops().rope_freqs(dx.p(), T, n_heads, hd, di.p(), pos0, nullptr);
    const auto got = dx.get();
    std::vector<double> want(x.begin(), x.end());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < n_heads; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const double a = (double)(pos0 + t) * inv[i], c = std::cos(a), s = std::sin(a);
          const int64_t o = (t * n_heads + h) * hd;
          want[o + i] = x[o + i] * c - x[o + i + half] * s;
          want[o + i + half] = x[o + i + half] * c + x[o + i] * s;
          if (i >= rotated) {  // a zero frequency leaves the pair's bits as they were
            EXPECT_EQ(got[o + i], x[o + i]);
            EXPECT_EQ(got[o + i + half], x[o + i + half]);
          }
        }
    // The angle is formed in float32 as the op says: at position ~1000 its rounding moves the rotation by
    // ~1e-4 rad. measured 1.4e-7 (pos0 0), 5.3e-5 (pos0 1029)
    expect_err(max_err(got, want, std::vector<double>(want.size(), 1.0)), pos0 ? 5e-4 : 2e-6,
               str("rope_freqs pos0=", pos0));
    // Per-row positions: row t at pos[t] is the single-row op at that position, bit for bit.
    const std::vector<int64_t> pos = {7, 0, 1029, 3, 300};
    Dev<float> dr(be(), x, "x");
    ops().rope_freqs(dr.p(), T, n_heads, hd, di.p(), 0, pos.data());
    const auto rows = dr.get();
    for (int64_t t = 0; t < T; ++t) {
      std::vector<float> xt(x.begin() + t * n_heads * hd, x.begin() + (t + 1) * n_heads * hd);
      Dev<float> d1(be(), xt, "row");
      ops().rope_freqs(d1.p(), 1, n_heads, hd, di.p(), pos[t], nullptr);
      expect_same(std::vector<float>(rows.begin() + t * n_heads * hd, rows.begin() + (t + 1) * n_heads * hd),
                  d1.get(), str("rope_freqs row ", t, " at ", pos[t]));
    }
  }
}

// With the backend's position source set (a recorded decode step), rope_freqs and attention_window add
// the device's position to pos0: bit for bit the host position's results.
TEST_P(Gemma4Op, RopeAndWindowReadThePositionSource) {
  if (!be().supports_graphs()) GTEST_SKIP() << "no position source without graphs";
  std::mt19937 rng(74);
  const int64_t H = 4, KV = 2, hd = 16, ctx = 64, window = 5;
  const auto inv = randf(rng, hd / 2, 1e-3f, 1.f);
  const auto kc = randf(rng, ctx * KV * hd, -1.f, 1.f), vc = randf(rng, ctx * KV * hd, -1.f, 1.f);
  Dev<float> di(be(), inv, "inv_freq"), dk(be(), kc, "k cache"), dv(be(), vc, "v cache");
  for (int32_t pos : {0, 3, 40, 63}) {
    const auto q = randf(rng, H * hd, -2.f, 2.f);
    Dev<float> qh(be(), q, "q host"), qd(be(), q, "q device"), oh(be(), H * hd, "out host"),
        od(be(), H * hd, "out device");
    Dev<int32_t> dp(be(), std::vector<int32_t>{pos}, "pos");
    ops().rope_freqs(qh.p(), 1, H, hd, di.p(), pos, nullptr);
    ops().attention_window(qh.p(), dk.p(), dv.p(), KvType::F32, 1, pos, H, KV, hd, 0.3f, window, oh.p());
    be().set_position_source(dp.p(), ctx);
    ops().rope_freqs(qd.p(), 1, H, hd, di.p(), 0, nullptr);
    ops().attention_window(qd.p(), dk.p(), dv.p(), KvType::F32, 1, 0, H, KV, hd, 0.3f, window, od.p());
    be().set_position_source(nullptr, 0);
    expect_same(qd.get(), qh.get(), str("rope_freqs at device position ", pos));
    expect_same(od.get(), oh.get(), str("attention_window at device position ", pos));
  }
}

TEST_P(Gemma4Op, AttentionWindowAndFull) {
  std::mt19937 rng(79);
  struct Case {
    int64_t N, pos0, window;
  };
  for (const KvType kt : {KvType::F32, KvType::F16})
    for (const Case c : {Case{37, 25, 0}, Case{37, 25, 1}, Case{37, 25, 5}, Case{301, 290, 0},
                         Case{301, 290, 150}, Case{301, 290, 6}}) {
      if (!be().supports_kv(kt)) continue;
      const int64_t H = 6, KV = 2, hd = 20, N = c.N, pos0 = c.pos0, T = N - pos0, window = c.window;
      auto k = randf(rng, N * KV * hd, -1.f, 1.f), v = randf(rng, N * KV * hd, -1.f, 1.f);
      const auto q = randf(rng, T * H * hd, -1.f, 1.f);
      Dev<float> dk(be(), k, "k"), dv(be(), v, "v"), dq(be(), q, "q");
      const size_t eb = kv_elem_bytes(kt);
      Dev<uint8_t> kc(be(), (size_t)N * KV * hd * eb, "k cache"),
          vc(be(), (size_t)N * KV * hd * eb, "v cache");
      be().kv_store(kc.p(), kt, 0, N, KV * hd, dk.p());
      be().kv_store(vc.p(), kt, 0, N, KV * hd, dv.p());
      if (kt == KvType::F16)  // the reference sees what the cache holds
        for (auto* a : {&k, &v})
          for (float& x : *a) x = fp16_to_f32(f32_to_fp16(x));
      const float scale = 1.0f;  // gemma4's: q and k are RMS-normalized per head instead
      Dev<float> out(be(), T * H * hd, "out");
      ops().attention_window(dq.p(), kc.p(), vc.p(), kt, T, pos0, H, KV, hd, scale, window, out.p());
      std::vector<double> want;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h) {
          const int64_t p = pos0 + t, kvh = h / (H / KV), ld = KV * hd;
          const int64_t j0 = window ? std::max<int64_t>(0, p - window + 1) : 0;
          std::vector<double> s;
          double m = -std::numeric_limits<double>::infinity(), z = 0;
          for (int64_t j = j0; j <= p; ++j) {
            double d = 0;
            for (int64_t i = 0; i < hd; ++i) d += (double)q[(t * H + h) * hd + i] * k[j * ld + kvh * hd + i];
            s.push_back(d * scale);
            m = std::max(m, d * scale);
          }
          std::vector<double> o(hd, 0.0);
          for (int64_t j = j0; j <= p; ++j) {
            const double e = std::exp(s[j - j0] - m);
            z += e;
            for (int64_t i = 0; i < hd; ++i) o[i] += e * v[j * ld + kvh * hd + i];
          }
          for (double& x : o) x /= z;
          want.insert(want.end(), o.begin(), o.end());
        }
      // float32 sums of <= 301 terms of magnitude <= 1 against double, measured 4.0e-7
      expect_err(max_err(out.get(), want, std::vector<double>(want.size(), 1.0)), 1e-6,
                 str("attention_window ", kv_type_name(kt), " N=", N, " window=", window));
    }
}

TEST_P(Gemma4Op, GeluTanhGlu) {
  std::mt19937 rng(83);
  for (int64_t n : {1, 37, 4099}) {
    const auto g = randf(rng, n, -9.f, 9.f), u = randf(rng, n, -3.f, 3.f);
    Dev<float> dg(be(), g, "g"), du(be(), u, "u");
    ops().geglu(dg.p(), du.p(), n);
    std::vector<double> want(n);
    for (int64_t i = 0; i < n; ++i) {
      const double x = g[i];
      want[i] = 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))) * u[i];
    }
    // |out| up to ~27: a few float32 ulps of the product. measured 5.8e-8 of 27
    expect_err(max_err(dg.get(), want, std::vector<double>(want.size(), 27.0)), 5e-7, str("geglu n=", n));
  }
}

TEST_P(Gemma4Op, ScaleAndExpertScale) {
  std::mt19937 rng(89);
  const int64_t n = 1031, E = 7;
  const auto x = randf(rng, n, -4.f, 4.f), s = randf(rng, 1, 0.3f, 2.f), es = randf(rng, E, 0.5f, 1.5f);
  const auto ids = randi(rng, n, (int32_t)E);
  Dev<float> dx(be(), x, "x"), ds(be(), s, "s"), dw(be(), x, "w"), des(be(), es, "scale");
  Dev<int32_t> di(be(), ids, "ids");
  ops().scale(dx.p(), n, ds.p());
  ops().expert_scale(dw.p(), di.p(), des.p(), n);
  std::vector<float> a(n), b(n);
  for (int64_t i = 0; i < n; ++i) {
    a[i] = x[i] * s[0];  // one float32 product each: exact expectations
    b[i] = x[i] * es[ids[i]];
  }
  expect_same(dx.get(), a, "scale");
  expect_same(dw.get(), b, "expert_scale");
}

// The final logit softcap, tanh(x / cap) * cap in float: within 4 ulp of the float64 value (a float tanh
// of a correctly rounded quotient is within a few ulp, times cap one rounding more), past +-cap never.
TEST_P(Gemma4Op, Softcap) {
  std::mt19937 rng(90);
  const int64_t n = 4099;
  auto x = randf(rng, n, -200.f, 200.f);
  x[0] = 0.f, x[1] = 1e-30f, x[2] = -3e4f;
  Dev<float> dx(be(), x, "x");
  ops().softcap(dx.p(), n, 30.f);
  const auto got = dx.get();
  for (int64_t i = 0; i < n; ++i) {
    const double want = std::tanh((double)x[i] / 30.0) * 30.0;
    ASSERT_LE(std::fabs(got[i] - want), 4 * std::ldexp(std::fabs(want) > 0 ? std::fabs(want) : 1e-38, -23))
        << "softcap of " << x[i];
    ASSERT_LE(std::fabs(got[i]), 30.f) << "softcap of " << x[i];
  }
}

// A backend without the ops refuses gemma4 files at load with UnsupportedError naming the file, the
// backend and the fix, in one line (the CUDA backend today). The CPU backend is accepted.
TEST(Gemma4Ops, BackendWithoutThemIsRefused) {
  class Bare final : public strata::testing_support::ForwardingBackend {
   public:
    const char* name() const override { return "bare"; }
  };
  Bare bare;
  EXPECT_EQ(gemma4_ops(bare), nullptr);
  const Architecture& g4 = find_architecture("gemma4", "g4.gguf");
  ASSERT_NE(g4.check_backend, nullptr);
  try {
    g4.check_backend(bare, "g4.gguf");
    ADD_FAILURE() << "a backend without the gemma4 ops was accepted";
  } catch (const UnsupportedError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("g4.gguf: gemma4 runs on the CPU and CUDA backends; the bare backend"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("--device cpu"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  const auto cpu = make_cpu_backend(1);
  EXPECT_NE(gemma4_ops(*cpu), nullptr);
  EXPECT_NO_THROW(g4.check_backend(*cpu, "g4.gguf"));
}

}  // namespace
