// The op harness for qwen35moe's backend ops: the DeltaNet's causal conv1d and gated delta rule (fresh
// and continued states, split passes), its gated RMSNorm, the attention's q/gate split and sigmoid gate,
// the shared expert's gated add, on every backend that has them against backend_ops_ref_qwen35.h at
// awkward shapes, outputs poisoned.
#include "backend/qwen35_ops.h"
#include "backend_ops_harness.h"
#include "backend_ops_ref_qwen35.h"
#include "forwarding_backend.h"
#include "model/arch.h"

namespace {

// The qwen35moe ops of each backend that has them; a backend without them refuses qwen35moe models at
// load (checked below), so its skip here hides nothing.
class Q35Op : public Op {
 protected:
  void SetUp() override {
    Op::SetUp();
    if (!qwen35_ops(be()))
      GTEST_SKIP() << "the " << be().name() << " backend has no qwen35moe ops (CPU only)";
  }
  Qwen35Ops& ops() { return *qwen35_ops(be()); }
};

INSTANTIATE_TEST_SUITE_P(BackendOps, Q35Op, testing::ValuesIn(backends_under_test()),
                         [](const testing::TestParamInfo<BackendFactory>& i) { return i.param.name; });

std::vector<double> ones(size_t n) { return std::vector<double>(n, 1.0); }

TEST_P(Q35Op, Conv1dSiluWithAndWithoutState) {
  std::mt19937 rng(61);
  struct Case {
    int64_t T, C, Kc;
    bool state;
  };
  for (const Case c : {Case{1, 37, 4, true}, Case{7, 37, 4, false}, Case{2, 45, 5, true},
                       Case{9, 19, 1, true}, Case{3, 130, 4, true}}) {
    const int64_t S = c.Kc - 1;
    const auto x = randf(rng, c.T * c.C, -2.f, 2.f), w = randf(rng, c.C * c.Kc, -1.f, 1.f);
    const auto st = c.state ? randf(rng, S * c.C, -2.f, 2.f) : std::vector<float>();
    Dev<float> dx(be(), x, "x"), dw(be(), w, "w"), dy(be(), c.T * c.C, "y"), dso(be(), S * c.C, "state_out");
    Dev<float> dsi(be(), c.state ? st : std::vector<float>(1), "state_in");
    ops().conv1d_silu(dx.p(), c.T, c.C, c.Kc, dw.p(), c.state ? dsi.p() : nullptr, dso.p(), dy.p());
    std::vector<double> want_state;
    const auto want = ref::conv1d_silu(x, c.T, c.C, c.Kc, w, st, &want_state);
    const std::string what = str("conv1d_silu T=", c.T, " C=", c.C, " Kc=", c.Kc, c.state ? " state" : "");
    // Sums of <= 5 products of |.| <= 2 (|y| <= 20, an ulp 2e-6 at the top), then SiLU: measured 4.5e-7
    expect_err(max_err(dy.get(), want, ones(want.size())), 5e-6, what);
    // The state is copied rows, exactly.
    const auto got_state = dso.get();
    for (size_t i = 0; i < got_state.size(); ++i)
      if ((double)got_state[i] != want_state[i]) {
        ADD_FAILURE() << what << ": state_out[" << i << "] = " << got_state[i] << ", want " << want_state[i];
        break;
      }
  }
}

TEST_P(Q35Op, GatedDeltaRuleFreshContinuedAndSplit) {
  std::mt19937 rng(67);
  const int64_t Hk = 2, Hv = 6, dk = 12, dv = 20, W = 2 * Hk * dk + Hv * dv;
  for (const int64_t T : {1, 9, 40}) {
    for (const bool cont : {false, true}) {
      const auto qkv = randf(rng, T * W, -1.f, 1.f), a = randf(rng, T * Hv, -3.f, 3.f),
                 b = randf(rng, T * Hv, -3.f, 3.f), A = randf(rng, Hv, -4.f, -0.02f),
                 dtb = randf(rng, Hv, -1.f, 1.f);
      const auto s0 = cont ? randf(rng, Hv * dk * dv, -0.5f, 0.5f) : std::vector<float>();
      Dev<float> dqkv(be(), qkv, "qkv"), da(be(), a, "a"), db(be(), b, "b"), dA(be(), A, "A"),
          ddt(be(), dtb, "dt_bias"), dso(be(), Hv * dk * dv, "state_out"), dout(be(), T * Hv * dv, "out");
      Dev<float> dsi(be(), cont ? s0 : std::vector<float>(1), "state_in");
      ops().gated_delta_rule(dqkv.p(), da.p(), db.p(), T, Hk, Hv, dk, dv, dA.p(), ddt.p(),
                             cont ? dsi.p() : nullptr, dso.p(), dout.p());
      std::vector<double> state(s0.begin(), s0.end());
      const auto want = ref::gated_delta_rule(qkv, a, b, T, Hk, Hv, dk, dv, A, dtb, state);
      const std::string what = str("gated_delta_rule T=", T, cont ? " continued" : " fresh");
      // Outputs and state entries are O(1); float32 sums of dk = 12 terms, 40 steps whose decays
      // (< 1) shrink earlier roundings. measured 3.8e-8 (out), 1.1e-7 (state)
      expect_err(max_err(dout.get(), want, ones(want.size())), 1e-6, what + " out");
      expect_err(max_err(dso.get(), state, ones(state.size())), 1e-6, what + " state");
      if (T < 9) continue;
      // Split in two passes, the state handed over: bit for bit the one pass (no reduction over tokens).
      const int64_t T1 = 4;
      Dev<float> mid(be(), Hv * dk * dv, "state_mid"), s2(be(), Hv * dk * dv, "state_end"),
          o2(be(), T * Hv * dv, "out_split");
      const int64_t off_q = T1 * W, off_h = T1 * Hv;
      ops().gated_delta_rule(dqkv.p(), da.p(), db.p(), T1, Hk, Hv, dk, dv, dA.p(), ddt.p(),
                             cont ? dsi.p() : nullptr, mid.p(), o2.p());
      ops().gated_delta_rule(dqkv.p() + off_q, da.p() + off_h, db.p() + off_h, T - T1, Hk, Hv, dk, dv, dA.p(),
                             ddt.p(), mid.p(), s2.p(), o2.p() + T1 * Hv * dv);
      expect_same(o2.get(), dout.get(), what + " split out");
      expect_same(s2.get(), dso.get(), what + " split state");
    }
  }
}

TEST_P(Q35Op, GatedRmsNorm) {
  std::mt19937 rng(71);
  const int64_t rows = 13, n = 37;
  const auto x = randf(rng, rows * n, -2.f, 2.f), z = randf(rng, rows * n, -4.f, 4.f),
             w = randf(rng, n, 0.5f, 1.5f);
  Dev<float> dx(be(), x, "x"), dz(be(), z, "z"), dw(be(), w, "w");
  ops().gated_rms_norm(dx.p(), dz.p(), dw.p(), rows, n, 3e-5f);
  std::vector<double> want(rows * n);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += (double)x[r * n + i] * x[r * n + i];
    const double inv = 1.0 / std::sqrt(ss / n + 3e-5);
    for (int64_t i = 0; i < n; ++i) {
      const double g = z[r * n + i];
      want[r * n + i] = x[r * n + i] * inv * w[i] * g * ref::sigmoid(g);
    }
  }
  // |out| up to ~20 (an ulp 2e-6 at the top). measured 1.2e-6
  expect_err(max_err(dx.get(), want, ones(want.size())), 1e-5, "gated_rms_norm");
}

TEST_P(Q35Op, SplitQGateSigmoidMulAndSharedExpertAdd) {
  std::mt19937 rng(73);
  const int64_t T = 5, H = 3, hd = 22;
  const auto qg = randf(rng, T * H * 2 * hd, -3.f, 3.f);
  Dev<float> dqg(be(), qg, "qg"), dq(be(), T * H * hd, "q"), dg(be(), T * H * hd, "gate");
  ops().split_q_gate(dqg.p(), T, H, hd, dq.p(), dg.p());
  std::vector<float> wq(T * H * hd), wg(T * H * hd);
  for (int64_t r = 0; r < T * H; ++r)
    for (int64_t i = 0; i < hd; ++i) {
      wq[r * hd + i] = qg[r * 2 * hd + i];
      wg[r * hd + i] = qg[r * 2 * hd + hd + i];
    }
  expect_same(dq.get(), wq, "split_q_gate q");
  expect_same(dg.get(), wg, "split_q_gate gate");

  const auto x = randf(rng, T * H * hd, -2.f, 2.f);
  Dev<float> dx(be(), x, "x");
  ops().sigmoid_mul(dx.p(), dg.p(), T * H * hd);
  std::vector<double> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = x[i] * ref::sigmoid(wg[i]);
  expect_err(max_err(dx.get(), want, ones(want.size())), 2e-6, "sigmoid_mul");  // measured 1.7e-7

  const int64_t D = 45;
  const auto y = randf(rng, T * D, -2.f, 2.f), sh = randf(rng, T * D, -2.f, 2.f),
             s = randf(rng, T, -4.f, 4.f);
  Dev<float> dy(be(), y, "y"), dsh(be(), sh, "shared"), ds(be(), s, "scale");
  ops().add_sigmoid_scaled(dy.p(), dsh.p(), ds.p(), T, D);
  std::vector<double> want2(y.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D; ++i) want2[t * D + i] = y[t * D + i] + ref::sigmoid(s[t]) * sh[t * D + i];
  expect_err(max_err(dy.get(), want2, ones(want2.size())), 2e-6, "add_sigmoid_scaled");  // measured 2.1e-7
}

// A backend without the ops refuses qwen35moe files at load with UnsupportedError naming the file, the
// backend and the fix, in one line. The CPU backend is accepted.
TEST(Qwen35Ops, BackendWithoutThemIsRefused) {
  class Bare final : public strata::testing_support::ForwardingBackend {
   public:
    const char* name() const override { return "bare"; }
  };
  Bare bare;
  EXPECT_EQ(qwen35_ops(bare), nullptr);
  const Architecture& q35 = find_architecture("qwen35moe", "q35.gguf");
  ASSERT_NE(q35.check_backend, nullptr);
  try {
    q35.check_backend(bare, "q35.gguf");
    ADD_FAILURE() << "a backend without the qwen35moe ops was accepted";
  } catch (const UnsupportedError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("q35.gguf: qwen35moe runs on the CPU backend only for now; the bare backend"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("--device cpu"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  const auto cpu = make_cpu_backend(1);
  EXPECT_NE(qwen35_ops(*cpu), nullptr);
  EXPECT_NO_THROW(q35.check_backend(*cpu, "q35.gguf"));
}

}  // namespace
