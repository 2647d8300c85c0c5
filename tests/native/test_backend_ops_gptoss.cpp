// The op harness for gpt-oss's backend ops: bias rows, NEOX RoPE with given frequencies, attention with
// sinks over a sliding window, the experts' biased clamped SwiGLU and down biases, on every backend
// that has them against backend_ops_ref_gptoss.h at awkward shapes, outputs poisoned.
#include "backend/gptoss_ops.h"
#include "backend_ops_harness.h"
#include "backend_ops_ref_gptoss.h"
#include "core/half.h"
#include "forwarding_backend.h"
#include "model/arch.h"

namespace {

class OssOp : public ArchOp<GptOssOps, gptoss_ops> {};

INSTANTIATE_TEST_SUITE_P(BackendOps, OssOp, testing::ValuesIn(backends_under_test()),
                         [](const testing::TestParamInfo<BackendFactory>& i) { return i.param.name; });

TEST_P(OssOp, AddBias) {
  std::mt19937 rng(41);
  for (int64_t T : {1, 7}) {
    const int64_t n = 37;
    const auto y = randf(rng, T * n, -2.f, 2.f), bias = randf(rng, n, -1.f, 1.f);
    Dev<float> dy(be(), y, "y"), db(be(), bias, "bias");
    ops().add_bias(dy.p(), db.p(), T, n);
    std::vector<float> want(y);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < n; ++i) want[t * n + i] = y[t * n + i] + bias[i];
    expect_same(dy.get(), want, str("add_bias T=", T));
  }
}

TEST_P(OssOp, RopeNeox) {
  std::mt19937 rng(43);
  for (int64_t pos0 : {0, 1029}) {
    const int64_t T = 5, n_heads = 3, hd = 22;
    const auto x = randf(rng, T * n_heads * hd, -2.f, 2.f), inv = randf(rng, hd / 2, 1e-4f, 1.f);
    Dev<float> dx(be(), x, "x"), di(be(), inv, "inv_freq");
    ops().rope_neox(dx.p(), T, n_heads, hd, di.p(), 1.3f, pos0);
    const auto want = ref::rope_neox(x, T, n_heads, hd, inv, 1.3, pos0);
    // The angle is formed in float32 as backend.h says: at position ~1000 its rounding moves the
    // rotation by ~1e-4 rad. measured 4.2e-7 (pos0 0), 8.7e-5 (pos0 1029)
    expect_err(max_err(dx.get(), want, std::vector<double>(want.size(), 1.0)), pos0 ? 5e-4 : 2e-6,
               str("rope_neox pos0=", pos0));
  }
}

TEST_P(OssOp, AttentionSinksWindowAndFull) {
  std::mt19937 rng(47);
  // Windows inside one 128-key block of the CPU's online softmax, and across blocks from an
  // unaligned first key.
  struct Case {
    int64_t N, pos0, window;
  };
  for (const KvType kt : {KvType::F32, KvType::F16})
    for (const Case c : {Case{37, 25, 0}, Case{37, 25, 1}, Case{37, 25, 6}, Case{301, 290, 0},
                         Case{301, 290, 150}, Case{301, 290, 6}}) {
      if (!be().supports_kv(kt)) continue;
      const int64_t H = 6, KV = 2, hd = 20, N = c.N, pos0 = c.pos0, T = N - pos0, window = c.window;
      auto k = randf(rng, N * KV * hd, -1.f, 1.f), v = randf(rng, N * KV * hd, -1.f, 1.f);
      const auto q = randf(rng, T * H * hd, -1.f, 1.f), sinks = randf(rng, H, -1.f, 3.f);
      Dev<float> dk(be(), k, "k"), dv(be(), v, "v"), dq(be(), q, "q"), ds(be(), sinks, "sinks");
      const size_t eb = kv_elem_bytes(kt);
      Dev<uint8_t> kc(be(), (size_t)N * KV * hd * eb, "k cache"),
          vc(be(), (size_t)N * KV * hd * eb, "v cache");
      be().kv_store(kc.p(), kt, 0, N, KV * hd, dk.p());
      be().kv_store(vc.p(), kt, 0, N, KV * hd, dv.p());
      if (kt == KvType::F16)  // the reference sees what the cache holds
        for (auto* a : {&k, &v})
          for (float& x : *a) x = fp16_to_f32(f32_to_fp16(x));
      const float scale = 1.0f / std::sqrt((float)hd);
      Dev<float> out(be(), T * H * hd, "out");
      ops().attention_sinks(dq.p(), kc.p(), vc.p(), kt, T, pos0, H, KV, hd, scale, ds.p(), window, out.p());
      std::vector<double> want;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h) {
          const int64_t p = pos0 + t, kvh = h / (H / KV);
          const int64_t j0 = window ? std::max<int64_t>(0, p - window + 1) : 0;
          const auto o = ref::attend_sinks(&q[(t * H + h) * hd], &k[kvh * hd], &v[kvh * hd], KV * hd, j0, p,
                                           sinks[h], hd, scale);
          want.insert(want.end(), o.begin(), o.end());
        }
      // float32 sums of <= 301 terms of magnitude <= 1 against double: measured 1.1e-7 (CPU)
      expect_err(max_err(out.get(), want, std::vector<double>(want.size(), 1.0)), 1e-6,
                 str("attention_sinks ", kv_type_name(kt), " N=", N, " window=", window));
    }
}

// gpt-oss's attention on the tensor cores (STRATA_CUDA_SINKS_MMA=1; f16 caches of head dims 64 and 128; a
// backend without it runs its own kernel): a token's output the same bits from a whole chunk, two chunks and
// one token at a time (decode: a key block a CTA, the combine from the window's first block, the sink last);
// and against the reference on the values the cache holds, q rounded to fp16 where the tensor cores round it,
// within AttentionF16HeadDimsOfTheTensorCores' derived bound. Windows of one key, inside one 64-key block,
// across blocks from an unaligned first key, none; gpt-oss's 64 heads over 8 kv heads at 1,100 keys.
TEST_P(OssOp, AttentionSinksOnTheTensorCores) {
  if (!be().supports_kv(KvType::F16)) GTEST_SKIP() << "no f16 cache on this backend";
  const ScopedEnv mma("STRATA_CUDA_SINKS_MMA", "1");
  std::mt19937 rng(71);
  struct Case {
    int64_t H, KV, hd, N, pos0, window;
  };
  for (const Case c :
       {Case{16, 2, 64, 300, 263, 0}, Case{16, 2, 64, 300, 263, 1}, Case{16, 2, 64, 300, 263, 50},
        Case{16, 2, 64, 300, 263, 128}, Case{12, 3, 128, 140, 0, 0}, Case{12, 3, 128, 140, 0, 70},
        Case{64, 8, 64, 1100, 1060, 128}}) {
    const int64_t H = c.H, KV = c.KV, hd = c.hd, width = KV * hd, N = c.N, pos0 = c.pos0, T = N - pos0;
    const int64_t first = std::min<int64_t>(7, T - 1);
    const auto k = randf(rng, N * width, -1.f, 1.f), v = randf(rng, N * width, -1.5f, 1.5f);
    const auto q = randf(rng, T * H * hd, -2.f, 2.f), sinks = randf(rng, H, -1.f, 3.f);
    Dev<float> dk(be(), k, "k"), dv(be(), v, "v"), dq(be(), q, "q"), ds(be(), sinks, "sinks");
    Dev<uint8_t> kc(be(), (size_t)N * width * 2, "k cache"), vc(be(), (size_t)N * width * 2, "v cache");
    be().kv_store(kc.p(), KvType::F16, 0, N, width, dk.p());
    be().kv_store(vc.p(), KvType::F16, 0, N, width, dv.p());
    const float scale = 1.0f / std::sqrt((float)hd);
    Dev<float> whole(be(), T * H * hd, "whole"), chunks(be(), T * H * hd, "chunks"),
        tokens(be(), T * H * hd, "tokens");
    ops().attention_sinks(dq.p(), kc.p(), vc.p(), KvType::F16, T, pos0, H, KV, hd, scale, ds.p(), c.window,
                          whole.p());
    ops().attention_sinks(dq.p(), kc.p(), vc.p(), KvType::F16, first, pos0, H, KV, hd, scale, ds.p(),
                          c.window, chunks.p());
    ops().attention_sinks(dq.p() + first * H * hd, kc.p(), vc.p(), KvType::F16, T - first, pos0 + first, H,
                          KV, hd, scale, ds.p(), c.window, chunks.p() + first * H * hd);
    for (int64_t t = 0; t < T; ++t)
      ops().attention_sinks(dq.p() + t * H * hd, kc.p(), vc.p(), KvType::F16, 1, pos0 + t, H, KV, hd, scale,
                            ds.p(), c.window, tokens.p() + t * H * hd);
    const std::string what =
        str("attention_sinks f16 H=", H, " KV=", KV, " hd=", hd, " at ", N, " keys, window ", c.window);
    const auto w = whole.get();
    expect_same(chunks.get(), w, "in two chunks vs one, " + what);
    expect_same(tokens.get(), w, "token by token vs one chunk, " + what);
    if (bounds().attention_f16_tc) {  // the tensor cores ran: their fp16 q and p give other bits than the
                                      // CUDA-core kernel somewhere in the chunk
      const ScopedEnv cores("STRATA_CUDA_SINKS_MMA", "0");
      Dev<float> other(be(), T * H * hd, "cuda cores");
      ops().attention_sinks(dq.p(), kc.p(), vc.p(), KvType::F16, T, pos0, H, KV, hd, scale, ds.p(), c.window,
                            other.p());
      EXPECT_NE(other.get(), w) << what << ": the same bits as the CUDA-core kernel";
    }
    const auto half = [](std::vector<float> x) {
      for (float& e : x) e = fp16_to_f32(f32_to_fp16(std::clamp(e, -65504.0f, 65504.0f)));
      return x;
    };
    const bool tc = bounds().attention_f16_tc;
    const auto qr = tc ? half(q) : q, kr = half(k), vr = half(v);
    std::vector<double> want;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t p = pos0 + t, kvh = h / (H / KV);
        const int64_t j0 = c.window ? std::max<int64_t>(0, p - c.window + 1) : 0;
        const auto o = ref::attend_sinks(&qr[(t * H + h) * hd], &kr[kvh * hd], &vr[kvh * hd], width, j0, p,
                                         sinks[h], hd, scale);
        want.insert(want.end(), o.begin(), o.end());
      }
    // AttentionF16HeadDimsOfTheTensorCores' bound: p rounded to fp16 (u), float sums over n keys, the scores'
    // fp16 products; the sink's weight is a float32 exp and moves no bound.
    double bound = bounds().attention;
    if (tc) {
      const double u = std::ldexp(1.0, -11), ulp = std::ldexp(1.0, -23), vmax = 1.5, n = (double)N;
      const double dsc = scale * 2.0 * (double)(hd * hd) * ulp * 2.0 * 1.0;
      bound += vmax * (u + n * std::ldexp(1.0, -25) + 2.0 * dsc + 2.0 * 64 * 64 * ulp);
    }
    expect_err(max_err(w, want, std::vector<double>(want.size(), 1.0)), bound, what);
  }
  // A decode step with its position from the device (a replayed graph's): the bits of the host position.
  if (be().supports_graphs()) {
    const int64_t H = 16, KV = 2, hd = 64, width = KV * hd, ctx = 300;
    const float scale = 1.0f / std::sqrt((float)hd);
    const auto k = randf(rng, ctx * width, -1.f, 1.f), v = randf(rng, ctx * width, -1.f, 1.f);
    const auto sinks = randf(rng, H, -1.f, 3.f);
    Dev<float> dk(be(), k, "k"), dv(be(), v, "v"), ds(be(), sinks, "sinks");
    Dev<uint8_t> kc(be(), (size_t)ctx * width * 2, "k cache"), vc(be(), (size_t)ctx * width * 2, "v cache");
    be().kv_store(kc.p(), KvType::F16, 0, ctx, width, dk.p());
    be().kv_store(vc.p(), KvType::F16, 0, ctx, width, dv.p());
    for (int32_t pos : {0, 63, 64, 130, 299})
      for (int64_t window : {0, 1, 70}) {
        const auto q = randf(rng, H * hd, -2.f, 2.f);
        std::vector<int32_t> pv = {pos};
        Dev<int32_t> dp(be(), pv, "pos");
        Dev<float> dq(be(), q, "q"), o1(be(), H * hd, "out"), o2(be(), H * hd, "out");
        ops().attention_sinks(dq.p(), kc.p(), vc.p(), KvType::F16, 1, pos, H, KV, hd, scale, ds.p(), window,
                              o1.p());
        be().set_position_source(dp.p(), ctx);
        ops().attention_sinks(dq.p(), kc.p(), vc.p(), KvType::F16, 1, 0, H, KV, hd, scale, ds.p(), window,
                              o2.p());
        be().set_position_source(nullptr, 0);
        expect_same(o2.get(), o1.get(),
                    str("attention_sinks f16 from the position source at ", pos, " window ", window));
      }
  }
}

// With a position source, rope_neox and attention_sinks add the device's int32 to pos0 as they run: the
// same bits as passing the position itself (what a replayed decode step relies on).
TEST_P(OssOp, PositionSourceMatchesHostPositions) {
  if (!be().supports_graphs()) GTEST_SKIP() << "no position source without graphs";
  std::mt19937 rng(61);
  const int64_t H = 4, KV = 2, hd = 64, width = KV * hd, ctx = 300;
  const float scale = 1.0f / std::sqrt((float)hd);
  const auto inv = randf(rng, hd / 2, 1e-4f, 1.f), sinks = randf(rng, H, -1.f, 3.f);
  Dev<float> di(be(), inv, "inv_freq"), ds(be(), sinks, "sinks");
  for (int32_t pos : {0, 5, 130, 299})
    for (int64_t window : {0, 7}) {
      const auto q = randf(rng, H * hd, -2.f, 2.f);
      const auto kc = randf(rng, ctx * width, -1.f, 1.f), vc = randf(rng, ctx * width, -1.f, 1.f);
      std::vector<int32_t> p = {pos};
      Dev<int32_t> dp(be(), p, "pos");
      Dev<float> dq1(be(), q, "q"), dq2(be(), q, "q"), dk(be(), kc, "k cache"), dv(be(), vc, "v cache");
      Dev<float> o1(be(), H * hd, "out"), o2(be(), H * hd, "out");
      ops().rope_neox(dq1.p(), 1, H, hd, di.p(), 1.3f, pos);
      ops().attention_sinks(dq1.p(), dk.p(), dv.p(), KvType::F32, 1, pos, H, KV, hd, scale, ds.p(), window,
                            o1.p());
      be().set_position_source(dp.p(), ctx);
      ops().rope_neox(dq2.p(), 1, H, hd, di.p(), 1.3f, 0);
      ops().attention_sinks(dq2.p(), dk.p(), dv.p(), KvType::F32, 1, 0, H, KV, hd, scale, ds.p(), window,
                            o2.p());
      be().set_position_source(nullptr, 0);
      expect_same(dq2.get(), dq1.get(), str("rope_neox from the position source at ", pos));
      expect_same(o2.get(), o1.get(),
                  str("attention_sinks from the position source at ", pos, " window ", window));
    }
}

TEST_P(OssOp, SwigluOaiWithExpertBiases) {
  std::mt19937 rng(53);
  const int64_t T = 9, K = 3, E = 5, F = 19, n = T * K;
  const auto ids = randi(rng, n, (int32_t)E);
  std::vector<int32_t> rows(n);
  for (int64_t i = 0; i < n; ++i) rows[i] = (int32_t)((i * 7) % n);  // any order of the (t, k) rows
  const auto g = randf(rng, n * F, -12.f, 12.f), u = randf(rng, n * F, -12.f, 12.f);
  const auto gb = randf(rng, E * F, -1.f, 1.f), ub = randf(rng, E * F, -1.f, 1.f);
  Dev<float> dg(be(), g, "g"), du(be(), u, "u"), dgb(be(), gb, "gate_b"), dub(be(), ub, "up_b");
  Dev<int32_t> di(be(), ids, "ids"), dr(be(), rows, "rows");
  ops().swiglu_oai(dg.p(), du.p(), di.p(), dr.p(), n, F, dgb.p(), dub.p(), 1.702f, 7.0f);
  std::vector<double> want(n * F);
  std::vector<float> same(n * F);  // every backend's bits, through exp_portable
  for (int64_t i = 0; i < n; ++i) {
    const int64_t e = ids[rows[i]];
    for (int64_t c = 0; c < F; ++c) {
      want[i * F + c] = ref::swiglu_oai((double)(g[i * F + c] + gb[e * F + c]),
                                        (double)(u[i * F + c] + ub[e * F + c]), 1.702, 7.0);
      const float x = std::min(g[i * F + c] + gb[e * F + c], 7.0f);
      const float y = std::clamp(u[i * F + c] + ub[e * F + c], -7.0f, 7.0f);
      same[i * F + c] = (y + 1.0f) * (x / (1.0f + exp_portable(-(1.702f * x))));
    }
  }
  expect_same(dg.get(), same, "swiglu_oai against exp_portable's form");
  // Inputs past the limit on both sides: the clamps are exercised. measured 5.4e-7
  expect_err(max_err(dg.get(), want, std::vector<double>(want.size(), 8.0)), 2e-6, "swiglu_oai");
}

TEST_P(OssOp, ExpertDownBiases) {
  std::mt19937 rng(59);
  const int64_t T = 11, K = 4, E = 7, D = 45;
  const auto ids = randi(rng, T * K, (int32_t)E);
  const auto w = randf(rng, T * K, 0.f, 1.f), bias = randf(rng, E * D, -1.f, 1.f),
             y = randf(rng, T * D, -1.f, 1.f);
  Dev<float> dy(be(), y, "y"), dw(be(), w, "w"), db(be(), bias, "bias");
  Dev<int32_t> di(be(), ids, "ids");
  ops().expert_bias(dy.p(), di.p(), dw.p(), db.p(), T, K, D);
  std::vector<double> want(T * D);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < D; ++c) {
      double acc = y[t * D + c];
      for (int64_t k = 0; k < K; ++k) acc += (double)w[t * K + k] * bias[ids[t * K + k] * D + c];
      want[t * D + c] = acc;
    }
  expect_err(max_err(dy.get(), want, std::vector<double>(want.size(), 4.0)), 1e-6,
             "expert_bias");  // measured 8.3e-8
}

// A backend without the ops refuses gpt-oss files at load with UnsupportedError naming the file, the
// backend and the fix, in one line. The CPU backend is accepted.
TEST(GptOssOps, BackendWithoutThemIsRefused) {
  class Bare final : public strata::testing_support::ForwardingBackend {
   public:
    const char* name() const override { return "bare"; }
  };
  Bare bare;
  EXPECT_EQ(gptoss_ops(bare), nullptr);
  const Architecture& oss = find_architecture("gpt-oss", "oss.gguf");
  ASSERT_NE(oss.check_backend, nullptr);
  try {
    oss.check_backend(bare, "oss.gguf");
    ADD_FAILURE() << "a backend without the gpt-oss ops was accepted";
  } catch (const UnsupportedError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("oss.gguf: gpt-oss runs on the CPU and CUDA backends; the bare backend"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("--device cpu"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  const auto cpu = make_cpu_backend(1);
  EXPECT_NE(gptoss_ops(*cpu), nullptr);
  EXPECT_NO_THROW(oss.check_backend(*cpu, "oss.gguf"));
}

}  // namespace
