// The op harness for qwen35moe's backend ops: the DeltaNet's causal conv1d and chunked gated delta rule
// (against the recurrent form; fresh and continued states; any split into passes bit for bit), its gated
// RMSNorm, the attention's q/gate split and sigmoid gate, the shared expert's gated add, on every backend
// that has them against backend_ops_ref_qwen35.h at awkward shapes, outputs poisoned.
#include "backend/qwen35_ops.h"
#include "backend_ops_harness.h"
#include "backend_ops_ref_qwen35.h"
#include "forwarding_backend.h"
#include "model/arch.h"

namespace {

class Q35Op : public ArchOp<Qwen35Ops, qwen35_ops> {};

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

// The chunked delta rule over positions pos_start .. pos_start + N, run as passes of the given lengths:
// the outputs (N x Hv x dv) and the state after the last position (from the pass's swaps, which buffer
// holds it: the op's contract), against the recurrent reference; every split equals one pass bit for bit.
struct DeltaRun {
  std::vector<float> out, state;
};

class DeltaChunks {
 public:
  // Decays A uniform in [-a_max, -a_min]: strong ones (16, transformers' initial range) make the chunk's
  // cumulative log decay large while neighbouring positions still weigh on each other.
  DeltaChunks(Backend& be, Qwen35Ops& ops, std::mt19937& rng, int64_t N, int64_t C, float a_min, float a_max,
              int64_t value_dim = 20)
      : dv(value_dim), W(2 * Hk * dk + Hv * value_dim), be_(be), ops_(ops), N_(N), C_(C) {
    qkv = randf(rng, N * W, -1.f, 1.f);
    a = randf(rng, N * Hv, -3.f, 3.f);
    b = randf(rng, N * Hv, -3.f, 3.f);
    A = randf(rng, Hv, -a_max, -a_min);
    dtb = randf(rng, Hv, -1.f, 1.f);
  }
  static constexpr int64_t Hk = 2, Hv = 6, dk = 12;
  const int64_t dv, W;
  std::vector<float> qkv, a, b, A, dtb;

  // From position pos_start (a multiple of C) with state s0 (empty: fresh).
  DeltaRun run(const std::vector<int64_t>& passes, int64_t pos_start, const std::vector<float>& s0) {
    const int64_t S = Hv * dk * dv;
    Dev<float> dqkv(be_, qkv, "qkv"), da(be_, a, "a"), db(be_, b, "b"), dA(be_, A, "A"),
        ddt(be_, dtb, "dt_bias");
    Dev<float> s_a(be_, s0.empty() ? std::vector<float>(S, 7.f) : s0, "state0"), s_b(be_, S, "state1");
    Dev<float> rk(be_, C_ * Hv * dk, "rows_k"), rd(be_, C_ * Hv * dv, "rows_d"), rg(be_, C_ * Hv, "rows_g");
    Dev<float> out(be_, N_ * Hv * dv, "out");
    float* cur = s_a.p();
    float* other = s_b.p();
    int64_t t0 = 0;
    for (const int64_t T : passes) {
      const int64_t pos0 = pos_start + t0;
      ops_.gated_delta_chunked(dqkv.p() + t0 * W, da.p() + t0 * Hv, db.p() + t0 * Hv, T, pos0, C_, Hk, Hv, dk,
                               dv, dA.p(), ddt.p(), s0.empty() && t0 == 0, cur, other, rk.p(), rd.p(), rg.p(),
                               out.p() + t0 * Hv * dv);
      if (((pos0 + T) / C_ - pos0 / C_) % 2) std::swap(cur, other);
      t0 += T;
    }
    EXPECT_EQ(t0, N_);
    // The state after the last position: the chunk state advanced over the chunk's rows, as the next
    // pass would read it; at a chunk end it is the current buffer itself.
    DeltaRun r{out.get(), {}};
    r.state = (cur == s_a.p() ? s_a : s_b).get();
    return r;
  }

 private:
  Backend& be_;
  Qwen35Ops& ops_;
  int64_t N_, C_;
};

// Each case with each of a GPU's delta rule kernels (kDeltaModes: one block a head, split over value columns,
// the default, and a chunk at a time: each sums in its own order, so has its own bits, which every split into
// passes must give too) and 70 value dims (three column groups, the last one partial).
// The delta rule kernel a GPU runs: STRATA_CUDA_DELTA_SPLIT and STRATA_CUDA_DELTA_CHUNK for a scope (the CPU
// backend reads neither).
struct DeltaMode {
  const char* name;
  const char* split;
  const char* chunk;
};
constexpr DeltaMode kDeltaModes[] = {{"one block", "0", "0"}, {"split", "1", "0"}, {"chunk", "0", "1"}};
struct DeltaModeEnv {
  explicit DeltaModeEnv(const DeltaMode& m)
      : split("STRATA_CUDA_DELTA_SPLIT", m.split), chunk("STRATA_CUDA_DELTA_CHUNK", m.chunk) {}
  ScopedEnv split, chunk;
};

TEST_P(Q35Op, GatedDeltaChunkedAgainstRecurrentAndAnySplit) {
  std::mt19937 rng(67);
  struct Case {
    int64_t N, C, pos_start;
    bool cont, strong;
    int64_t dv = 20;
  };
  // Chunks of 8 (many ends) and 64; fresh from position 0 and continued from a chunk start; decays up
  // to 4 and from 4 to 16.
  for (const DeltaMode& mode : kDeltaModes)
    for (const Case c :
         {Case{48, 8, 0, false, false}, Case{48, 8, 16, true, false}, Case{130, 64, 0, false, false},
          Case{70, 64, 64, true, false}, Case{130, 64, 0, false, true}, Case{70, 64, 64, true, true},
          Case{48, 8, 16, true, false, 70}, Case{70, 64, 64, true, true, 70}}) {
      const DeltaModeEnv env(mode);
      const bool one_block = std::string(mode.name) == "one block";
      const int64_t Hv = DeltaChunks::Hv, dk = DeltaChunks::dk, dv = c.dv;
      DeltaChunks dc(be(), ops(), rng, c.N, c.C, c.strong ? 4.f : 0.02f, c.strong ? 16.f : 4.f, dv);
      const auto s0 = c.cont ? randf(rng, Hv * dk * dv, -0.5f, 0.5f) : std::vector<float>();
      const DeltaRun one = dc.run({c.N}, c.pos_start, s0);
      std::vector<double> state(s0.begin(), s0.end());
      const auto want =
          ref::gated_delta_rule(dc.qkv, dc.a, dc.b, c.N, DeltaChunks::Hk, Hv, dk, dv, dc.A, dc.dtb, state);
      const std::string what =
          str("gated_delta_chunked N=", c.N, " C=", c.C, " dv=", dv, c.cont ? " continued" : " fresh",
              c.strong ? " strong decay" : "", " (", mode.name, ")");
      // Outputs are O(1); float32 sums of dk = 12 and of <= C earlier rows, each weighted by a decay <= 1
      // whose exponent is summed back from p (never a difference of two large sums). measured 5.9e-8 (with
      // the difference of cumulative sums instead: 5.4e-7, and 1.2e-6 with strong decays)
      expect_err(max_err(one.out, want, ones(want.size())), 1e-6, what + " out");
      if (c.N % c.C == 0) {  // the pass ended at a chunk end: the state buffer is the recurrent state
        // measured 1.1e-7
        expect_err(max_err(one.state, state, ones(state.size())), 1e-6, what + " state");
      }
      // Splits: single tokens (decode), uneven pieces across chunk ends, a piece spanning several ends.
      std::vector<std::vector<int64_t>> splits = {std::vector<int64_t>(c.N, 1), {3, c.N - 3}};
      std::vector<int64_t> uneven;
      for (int64_t t = 0, i = 0; t < c.N; ++i)
        uneven.push_back(std::min<int64_t>(c.N - t, 1 + (i * 7) % 11)), t += uneven.back();
      splits.push_back(uneven);
      for (const auto& sp : splits) {
        const DeltaRun r = dc.run(sp, c.pos_start, s0);
        expect_same(r.out, one.out, what + str(" split in ", sp.size(), " out"));
        expect_same(r.state, one.state, what + str(" split in ", sp.size(), " state"));
      }
      if (std::string(mode.name) == "chunk") {  // sub-segments of 5 positions: the same bits
        const ScopedEnv sub("STRATA_CUDA_DELTA_CHUNK_SUB", "5");
        const DeltaRun r = dc.run(uneven, c.pos_start, s0);
        expect_same(r.out, one.out, what + " sub-segments of 5, out");
        expect_same(r.state, one.state, what + " sub-segments of 5, state");
      }
      if (one_block) {  // a GPU's A/B: the chunk's rows read from global memory instead of shared memory, the
                        // same bits
        const ScopedEnv rows("STRATA_CUDA_DELTA_ROWS", "0");
        const DeltaRun r = dc.run(uneven, c.pos_start, s0);
        expect_same(r.out, one.out, what + " rows from global memory, out");
        expect_same(r.state, one.state, what + " rows from global memory, state");
      }
    }
}

// The one-token forms that pick the state copies by position (a decode step, recorded or not): token by
// token from position 0, conv1d_silu_at and gated_delta_at give bit for bit what conv1d_silu and
// gated_delta_chunked give with the copies a host would pick (conv rows after q in copy q % 2, chunk c's
// state in copy c % 2); with a position source (a recorded step: pos0 0, the position on the device) the
// same again.
TEST_P(Q35Op, OneTokenFormsPickCopiesByPosition) {
  for (const DeltaMode& mode : kDeltaModes) {  // each GPU kernel (the CPU runs the same thrice)
    const DeltaModeEnv env(mode);
    SCOPED_TRACE(mode.name);
    std::mt19937 rng(71);
    const int64_t N = 21, C = 8, Cc = 37, Kc = 4, S = Kc - 1;
    const int64_t Hk = DeltaChunks::Hk, Hv = DeltaChunks::Hv, dk = DeltaChunks::dk;
    DeltaChunks dc(be(), ops(), rng, N, C, 0.02f, 4.f);
    const int64_t dv = dc.dv, W = dc.W;
    const DeltaRun want = dc.run(std::vector<int64_t>(N, 1), 0, {});
    const auto x = randf(rng, N * Cc, -2.f, 2.f), w = randf(rng, Cc * Kc, -1.f, 1.f);
    // The conv reference: each token with state_in the previous token's state_out (none first).
    std::vector<float> want_y;
    {
      Dev<float> dx(be(), x, "x"), dw(be(), w, "w"), y(be(), Cc, "y"), s0(be(), S * Cc, "s0"),
          s1(be(), S * Cc, "s1");
      for (int64_t p = 0; p < N; ++p) {
        ops().conv1d_silu(dx.p() + p * Cc, 1, Cc, Kc, dw.p(), p == 0 ? nullptr : (p % 2 ? s1.p() : s0.p()),
                          (p + 1) % 2 ? s1.p() : s0.p(), y.p());
        const auto yy = y.get();
        want_y.insert(want_y.end(), yy.begin(), yy.end());
      }
    }
    for (const bool device : {false, true}) {
      if (device && !be().supports_graphs()) continue;  // no position source without graphs
      const int64_t SS = Hv * dk * dv;
      Dev<float> dqkv(be(), dc.qkv, "qkv"), da(be(), dc.a, "a"), db(be(), dc.b, "b"), dA(be(), dc.A, "A"),
          ddt(be(), dc.dtb, "dt_bias"), st0(be(), std::vector<float>(SS, 7.f), "state0"),
          st1(be(), SS, "state1");
      Dev<float> rk(be(), C * Hv * dk, "rows_k"), rd(be(), C * Hv * dv, "rows_d"), rg(be(), C * Hv, "rows_g");
      Dev<float> out(be(), N * Hv * dv, "out"), dx(be(), x, "x"), dw(be(), w, "w"), y(be(), N * Cc, "y"),
          c0(be(), S * Cc, "conv0"), c1(be(), S * Cc, "conv1");
      Dev<int32_t> dp(be(), 1, "position");
      for (int64_t p = 0; p < N; ++p) {
        int64_t pos0 = p;
        if (device) {
          dp.set(std::vector<int32_t>{(int32_t)p});
          be().set_position_source(dp.p(), N);
          pos0 = 0;
        }
        ops().conv1d_silu_at(dx.p() + p * Cc, Cc, Kc, dw.p(), c0.p(), c1.p(), pos0, y.p() + p * Cc);
        ops().gated_delta_at(dqkv.p() + p * W, da.p() + p * Hv, db.p() + p * Hv, pos0, C, Hk, Hv, dk, dv,
                             dA.p(), ddt.p(), st0.p(), st1.p(), rk.p(), rd.p(), rg.p(),
                             out.p() + p * Hv * dv);
        be().set_position_source(nullptr, 0);
      }
      const std::string what = device ? "position source" : "host positions";
      expect_same(y.get(), want_y, "conv1d_silu_at, " + what);
      expect_same(out.get(), want.out, "gated_delta_at, " + what);
      expect_same((N / C % 2 ? st1 : st0).get(), want.state, "gated_delta_at's state copy, " + what);
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
    EXPECT_NE(m.find("q35.gguf: qwen35moe runs on the CPU and CUDA backends; the bare backend"),
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
