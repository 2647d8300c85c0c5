// The op harness's matmul ops (split from test_backend_ops.cpp, whose header comment holds for these):
// q8_0 quantization, float and integer matmuls at every type and awkward token counts, the fused
// pairs and runs, the experts by id, and row results independent of the token count; a GPU backend
// under both of its integer tiles.
#include "backend_ops_harness.h"
#include "core/thread_pool.h"

namespace {

// Token counts of the matmul tests: both sides of the GPU's kernel choices (up to 8 tokens and
// beyond) and the edges of their tiles.
const int64_t kMatmulTs[] = {1, 2, 3, 8, 9, 16, 17, 257};
// Where a row or the shape is large, a few of them.
bool few_tokens(int64_t T) { return T == 1 || T == 2 || T == 9 || T == 16; }
class MatmulOp : public Op {};

INSTANTIATE_TEST_SUITE_P(BackendOps, MatmulOp, testing::ValuesIn(backends_under_test()),
                         [](const testing::TestParamInfo<BackendFactory>& i) { return i.param.name; });

TEST_P(MatmulOp, QuantizeQ8_0) {
  std::mt19937 rng(5);
  const int64_t K = 4;
  for (int64_t D : {7 * 32, 768})
    for (int64_t T : kTs)
      for (int mode = 0; mode < 4; ++mode) {  // bit 0: normed by grs and w; bit 1: rows[] / K
        const bool normed = mode & 1, indexed = mode & 2;
        auto x = randf(rng, T * D, -3.f, 3.f);
        std::fill_n(x.begin(), 32, 0.f);  // an all-zero block: d = 0, q = 0
        const auto w = randf(rng, D, -1.5f, 1.5f), grs = randf(rng, T, 0.1f, 4.f);
        const int64_t n = indexed ? T * K - 1 : T;
        const auto rows = randi(rng, n, T * K);
        const int32_t* rp = indexed ? rows.data() : nullptr;
        const size_t orb = D / 32 * 34 + 6;
        Dev<float> dx(be(), x, "x"), dw(be(), w, "w"), dg(be(), grs, "grs");
        Dev<int32_t> drows(be(), rows, "rows");
        Dev<uint8_t> out(be(), n * orb, "q8 out");
        be().quantize_q8_0(dx.p(), normed ? dg.p() : nullptr, normed ? dw.p() : nullptr, D,
                           indexed ? drows.p() : nullptr, K, n, out.p(), orb);
        const auto got = out.get();
        const std::string what =
            str("quantize_q8_0 D=", D, " T=", T, normed ? " normed" : "", indexed ? " indexed" : "");
        // d must be exact; each q a rounding of v / d, off only by float rounding near the halves:
        // measured 0 here; ggml's q = round(v * (1 / d)), the CPU's rule, reaches 8.6e-6 past the half
        // on other random data (two float roundings at |q| <= 127), q = round(v / d) on a GPU 7.6e-6.
        constexpr double kQ8RoundSlack = 2e-5;
        double excess = 0;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t s = ref::src_row(rp, K, i);
          std::vector<float> v(&x[s * D], &x[s * D] + D);
          if (normed)
            for (int64_t c = 0; c < D; ++c) v[c] = (v[c] * grs[s]) * w[c];
          std::vector<uint8_t> want(D / 32 * 34);
          ref::quantize_q8_0(v.data(), want.data(), D);
          for (int64_t b = 0; b < D / 32; ++b) {
            const uint8_t* blk = &got[i * orb + b * 34];
            ASSERT_EQ(std::memcmp(blk, &want[b * 34], 2), 0) << what << ": d of row " << i << " block " << b;
            float amax = 0;
            for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(v[b * 32 + l]));
            const float d = amax / 127.f;
            for (int l = 0; l < 32; ++l) {
              const int q = (int8_t)blk[2 + l];
              const double e = d == 0 ? std::fabs(q) + 0.5 : std::fabs(q - (double)v[b * 32 + l] / d);
              ASSERT_TRUE(q >= -127 && q <= 127 && e - 0.5 <= kQ8RoundSlack)
                  << what << ": row " << i << " block " << b << " q[" << l << "] = " << q;
              excess = std::max(excess, e - 0.5);
            }
          }
        }
        expect_err(excess, kQ8RoundSlack, what + ", past the half");
      }
}

// The GPU's integer kernels of many tokens have two tiles, dp4a and tensor cores (STRATA_CUDA_MMA_Q8=1):
// the tests below run a GPU backend under both.
std::vector<bool> mma_q8_modes(Backend& be) {
  return be.host_is_device() ? std::vector<bool>{false} : std::vector<bool>{false, true};
}

TEST_P(MatmulOp, MatmulQ8) {
  for (const bool mma : mma_q8_modes(be())) {
    const ScopedEnv env("STRATA_CUDA_MMA_Q8", mma ? "1" : "0");
    std::mt19937 rng(6);
    ThreadPool pool(1);
    for (QType t : kAllTypes) {
      if (!uses_matmul_q8((uint32_t)t)) continue;
      for (const bool long_rows : {false, true}) {
        const int64_t cols = long_rows ? long_cols_of(t) : cols_of(t);
        const size_t rb = row_bytes(t, cols), xrb = cols / 32 * 34 + 6;
        for (int64_t rows : {1, 37, 129}) {  // 37, 129: no tile shape divides them
          if (long_rows && rows != 37) continue;
          const auto W = random_weights(t, rows, cols, rng);
          Dev<uint8_t> dW(be(), W, "W");
          for (int64_t T : kMatmulTs) {
            if ((rows != 37 || long_rows) && !few_tokens(T)) continue;
            const int64_t ldy = rows + 3;
            const auto x = randf(rng, T * cols, -2.f, 2.f);
            std::vector<uint8_t> xq(T * xrb, kPoison);
            for (int64_t i = 0; i < T; ++i) ref::quantize_q8_0(&x[i * cols], &xq[i * xrb], cols);
            Dev<uint8_t> dxq(be(), xq, "Xq");
            Dev<float> Y(be(), T * ldy, "Y");
            be().matmul_q8((uint32_t)t, dW.p(), rows, cols, dxq.p(), xrb, T, Y.p(), ldy);
            const auto y = Y.get();
            std::vector<float> got(T * rows), cpu(T * rows);
            std::vector<double> want(T * rows), mag(T * rows);
            matmul_q8(t, W.data(), rows, cols, xq.data(), (int64_t)xrb, T, cpu.data(), rows, pool);
            for (int64_t i = 0; i < T; ++i)
              for (int64_t r = 0; r < rows; ++r) {
                const ref::Val v = ref::dot_q8(t, &W[r * rb], &xq[i * xrb], cols);
                got[i * rows + r] = y[i * ldy + r];
                want[i * rows + r] = v.v;
                mag[i * rows + r] = v.mag + 1e-30;
              }
            const std::string what = str("matmul_q8 ", quant_traits(t).name, " rows=", rows, " cols=", cols,
                                         " T=", T, mma ? " (tensor cores)" : "");
            // Every backend applies quant.h's float steps in the CPU's order: the CPU's bits.
            expect_same(got, cpu, what + " against the CPU's matmul_q8");
            expect_err(max_err(got, want, mag), bounds().matmul_q8, what);
            expect_gaps_untouched(y, T, rows, ldy, what);
          }
        }
      }
    }
  }
}

TEST_P(MatmulOp, Matmul) {
  std::mt19937 rng(7);
  for (QType t : kAllTypes) {
    for (const bool long_rows : {false, true}) {
      const int64_t cols = long_rows ? long_cols_of(t) : cols_of(t);
      const size_t rb = row_bytes(t, cols);
      for (int64_t rows : {1, 37, 129}) {
        if (long_rows && rows != 37) continue;
        const auto W = random_weights(t, rows, cols, rng);
        const auto wf = ref::dequant_rows(t, W.data(), rb, cols, rows);
        Dev<uint8_t> dW(be(), W, "W");
        for (int64_t T : kMatmulTs) {
          if ((rows != 37 || long_rows) && !few_tokens(T)) continue;
          // Odd T: rows 5 floats past the columns (unaligned); even T: rows of whole 16-byte pieces.
          const int64_t ldx = T % 2 ? cols + 5 : (cols + 3) / 4 * 4 + 4, ldy = rows + 3;
          auto x = randf(rng, T * ldx, -2.f, 2.f);
          for (int64_t i = 0; i < T; ++i)
            std::fill_n(&x[i * ldx + cols], ldx - cols, NAN);  // no op reads these
          Dev<float> dx(be(), x, "X"), Y(be(), T * ldy, "Y");
          be().matmul((uint32_t)t, dW.p(), rows, cols, dx.p(), ldx, T, Y.p(), ldy);
          const auto y = Y.get();
          std::vector<float> got(T * rows);
          std::vector<double> want(T * rows), mag(T * rows);
          for (int64_t i = 0; i < T; ++i)
            for (int64_t r = 0; r < rows; ++r) {
              const ref::Val v = ref::dot(&wf[r * cols], &x[i * ldx], cols);
              got[i * rows + r] = y[i * ldy + r];
              want[i * rows + r] = v.v;
              mag[i * rows + r] = v.mag + 1e-30;
            }
          const std::string what =
              str("matmul ", quant_traits(t).name, " rows=", rows, " cols=", cols, " T=", T);
          expect_err(max_err(got, want, mag),
                     T >= bounds().matmul_tc_from_T ? bounds().matmul_tc : bounds().matmul, what);
          expect_gaps_untouched(y, T, rows, ldy, what);
          Y.poison();  // the same inputs give the same bits
          be().matmul((uint32_t)t, dW.p(), rows, cols, dx.p(), ldx, T, Y.p(), ldy);
          expect_same(Y.get(), y, what + ", run again");
        }
      }
    }
  }
}

// Several matmuls of one activation (the attention's q, k, v) equal their single calls bit for bit,
// in both phases: one token (a GPU's one launch) and more.
TEST_P(MatmulOp, MatmulNIsItsCalls) {
  std::mt19937 rng(33);
  for (QType t : kAllTypes) {
    const int64_t cols = cols_of(t);
    const int64_t rows[3] = {37, 5, 130};
    std::vector<Dev<uint8_t>> W;
    for (int64_t r : rows) W.emplace_back(be(), random_weights(t, r, cols, rng), "W");
    for (Phase ph : {Phase::Decode, Phase::Prompt})
      for (int64_t T : {1, 3, 130}) {  // 130: two token tiles of the tensor-core launch
        const int64_t ldx = cols + 4;
        Dev<float> dx(be(), randf(rng, T * ldx, -2.f, 2.f), "X");
        std::vector<Dev<float>> one, many;
        Backend::MatmulOut outs[3];
        be().set_phase(ph);
        for (int i = 0; i < 3; ++i) {
          one.emplace_back(be(), T * (rows[i] + 1), "Y");
          many.emplace_back(be(), T * (rows[i] + 1), "Y n");
          be().matmul((uint32_t)t, W[i].p(), rows[i], cols, dx.p(), ldx, T, one.back().p(), rows[i] + 1);
          outs[i] = {W[i].p(), rows[i], many.back().p(), rows[i] + 1};
        }
        be().matmul_n((uint32_t)t, cols, dx.p(), ldx, T, outs, 3);
        be().set_phase(Phase::Any);
        for (int i = 0; i < 3; ++i)
          expect_same(many[i].get(), one[i].get(),
                      str("matmul_n ", quant_traits(t).name, " matrix ", i, " T=", T,
                          ph == Phase::Decode ? " decode" : " prompt"));
      }
  }
}

// n products of one shape at fixed strides (latent attention's per-head k_b and v_b) equal their single
// calls bit for bit, in both phases: one token (a GPU's one launch over the heads), a few, and a prompt's
// 40 (the GPU's tensor-core tile, one launch over the heads), activation rows 16-byte aligned or not.
TEST_P(MatmulOp, MatmulStridedIsItsCalls) {
  std::mt19937 rng(36);
  for (QType t : kAllTypes) {
    const int64_t cols = cols_of(t), rows = 19, n = 5;
    const size_t rb = row_bytes(t, cols);
    Dev<uint8_t> W(be(), random_weights(t, n * rows, cols, rng), "W");
    for (Phase ph : {Phase::Decode, Phase::Prompt})
      for (int64_t T : {1, 3, 40})
        for (int64_t pad : {0, 3}) {
          if (T == 3 && pad == 0) continue;
          const int64_t xs = (cols + 3) / 4 * 4 + 4, ldx = n * xs + pad, ys = rows + 2, ldy = n * ys + 1;
          Dev<float> dx(be(), randf(rng, T * ldx, -2.f, 2.f), "X"), one(be(), T * ldy, "Y"),
              many(be(), T * ldy, "Y n");
          be().set_phase(ph);
          for (int64_t i = 0; i < n; ++i)
            be().matmul((uint32_t)t, W.p() + i * rows * rb, rows, cols, dx.p() + i * xs, ldx, T,
                        one.p() + i * ys, ldy);
          be().matmul_strided((uint32_t)t, W.p(), rows * rb, rows, cols, dx.p(), xs, ldx, T, many.p(), ys,
                              ldy, n);
          be().set_phase(Phase::Any);
          // Outside the products' rows both stay poisoned (NaN): compare only what they wrote.
          const auto a = many.get(), b = one.get();
          std::vector<float> wa, wb;
          for (int64_t tt = 0; tt < T; ++tt)
            for (int64_t i = 0; i < n; ++i)
              for (int64_t r = 0; r < rows; ++r) {
                wa.push_back(a[tt * ldy + i * ys + r]);
                wb.push_back(b[tt * ldy + i * ys + r]);
              }
          expect_same(wa, wb,
                      str("matmul_strided ", quant_traits(t).name, " T=", T, " pad ", pad,
                          ph == Phase::Decode ? " decode" : " prompt"));
        }
  }
}

// One token's Q8_0 GEMV that loads a lane's raw words of a row before decoding any (a GPU's
// STRATA_CUDA_GEMV_RAW=1) gives the bits of the default one: through matmul, matmul_n (one launch) and
// matmul_strided (one launch over the products); rows of fewer units than a warp, of one group of 4 or 8
// rounds and a partial one, of two groups; some rows off 16-byte alignment (odd block counts).
TEST_P(MatmulOp, OneTokenQ8RawIsTheDefaultGemv) {
  std::mt19937 rng(41);
  const QType t = QType::Q8_0;
  for (const int64_t cols : {224, 2048, 2080, 4096, 9728}) {
    const size_t rb = row_bytes(t, cols);
    const int64_t rows = 37, n = 3;
    const auto host_w = random_weights(t, n * rows, cols, rng);
    Dev<uint8_t> W(be(), host_w, "W");
    // The same bytes as a resident weight: a GPU's raw-word kernel loads them before grid_start.
    const DeviceBuffer fixed_w = be().resident(host_w.data(), host_w.size(), "W resident");
    const int64_t ldx = cols + 4, ldy = rows + 1;
    Dev<float> dx(be(), randf(rng, n * ldx, -2.f, 2.f), "X");
    std::vector<float> got[3]
                          [3];  // [default, raw, raw on the resident copy][matmul, matmul_n, matmul_strided]
    for (const int raw : {0, 1, 2}) {
      const ScopedEnv env("STRATA_CUDA_GEMV_RAW", raw ? "1" : "0");
      const uint8_t* wp = raw == 2 ? static_cast<const uint8_t*>(fixed_w.get()) : W.p();
      be().set_phase(Phase::Decode);
      Dev<float> y1(be(), n * ldy, "Y"), yn(be(), n * ldy, "Y n"), ys(be(), n * ldy, "Y strided");
      for (int64_t i = 0; i < n; ++i)
        be().matmul((uint32_t)t, wp + i * rows * rb, rows, cols, dx.p() + i * ldx, ldx, 1, y1.p() + i * ldy,
                    ldy);
      Backend::MatmulOut outs[3];
      for (int64_t i = 0; i < n; ++i) outs[i] = {wp + i * rows * rb, rows - i, yn.p() + i * ldy, ldy};
      be().matmul_n((uint32_t)t, cols, dx.p(), ldx, 1, outs, n);
      be().matmul_strided((uint32_t)t, wp, rows * rb, rows, cols, dx.p(), ldx, ldx, 1, ys.p(), ldy, ldy, n);
      be().set_phase(Phase::Any);
      got[raw][0] = y1.get();
      got[raw][1] = yn.get();
      got[raw][2] = ys.get();
    }
    for (int v = 1; v < 3; ++v)
      for (int k = 0; k < 3; ++k)
        expect_same(got[v][k], got[0][k],
                    str(k == 0   ? "matmul"
                        : k == 1 ? "matmul_n"
                                 : "matmul_strided",
                        " Q8_0 ", cols, " columns, one token: STRATA_CUDA_GEMV_RAW=1",
                        v == 2 ? " on resident weights" : "", " against 0"));
    // and the default one's rows against the reference, so that equal bits are right bits
    const auto wf = ref::dequant_rows(t, W.get().data(), rb, cols, n * rows);
    const auto x = dx.get();
    std::vector<float> g;
    std::vector<double> want, mag;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t r = 0; r < rows; ++r) {
        const ref::Val v = ref::dot(&wf[(i * rows + r) * cols], &x[i * ldx], cols);
        g.push_back(got[1][0][i * ldy + r]);
        want.push_back(v.v);
        mag.push_back(v.mag + 1e-30);
      }
    expect_err(max_err(g, want, mag), bounds().matmul, str("matmul Q8_0 ", cols, " columns, raw"));
  }
}

// swiglu_q8_0 is swiglu then quantize_q8_0, bit for bit: the gate rows and their q8_0 bytes (row
// stride past the blocks, whose gap stays untouched), a block of zeros (id = 0) among them.
TEST_P(MatmulOp, SwigluQ8IsItsSteps) {
  std::mt19937 rng(35);
  for (const int64_t n : {1, 8, 13})
    for (const int64_t F : {32, 768}) {
      auto g = randf(rng, n * F, -12.f, 12.f);
      const auto u = randf(rng, n * F, -2.f, 2.f);
      std::fill_n(g.begin(), 32, 0.f);
      const size_t rb = F / 32 * 34 + 6;
      Dev<float> g1(be(), g, "g"), g2(be(), g, "g"), du(be(), u, "u");
      Dev<uint8_t> q1(be(), std::vector<uint8_t>(n * rb, kPoison), "q"),
          q2(be(), std::vector<uint8_t>(n * rb, kPoison), "q");
      be().swiglu_q8_0(g1.p(), du.p(), n, F, q1.p(), rb);
      be().swiglu(g2.p(), du.p(), n * F);
      be().quantize_q8_0(g2.p(), nullptr, nullptr, F, nullptr, 1, n, q2.p(), rb);
      const std::string what = str("swiglu_q8_0 n=", n, " F=", F);
      expect_same(g1.get(), g2.get(), what + " gate");
      expect_same(q1.get(), q2.get(), what + " q8_0 rows");
    }
}

// matmul_q8_experts_pair is its two calls bit for bit: two matrices of different weights, resident
// and slotted, each row's expert found for both.
TEST_P(MatmulOp, MatmulQ8ExpertsPairIsItsCalls) {
  std::mt19937 rng(36);
  const int64_t E = 4, n = 5;
  const std::vector<int32_t> ids = {3, 0, 2, 2, 1};
  std::vector<int32_t> order(n);
  for (int32_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return ids[a] < ids[b]; });
  be().set_phase(Phase::Decode);
  for (QType t : kAllTypes) {
    if (!uses_matmul_q8((uint32_t)t)) continue;
    const int64_t rows = 37, cols = cols_of(t);
    const size_t mb = rows * row_bytes(t, cols);
    std::vector<uint8_t> g(E * mb), u(E * mb);
    for (int64_t e = 0; e < E; ++e) {
      const auto wg = random_weights(t, rows, cols, rng), wu = random_weights(t, rows, cols, rng);
      std::memcpy(&g[e * mb], wg.data(), mb);
      std::memcpy(&u[e * mb], wu.data(), mb);
    }
    Dev<uint8_t> dg(be(), g, "gate"), du(be(), u, "up");
    Dev<int32_t> dids(be(), ids, "ids"), dorder(be(), order, "order");
    ExpertTable tab;
    tab.E = E;
    tab.base[0] = dg.p();
    tab.base[1] = du.p();
    tab.stride[0] = tab.stride[1] = mb;
    const size_t xrb = cols / 32 * 34 + 2;
    std::vector<uint8_t> xq(n * xrb, kPoison);
    const auto x = randf(rng, n * cols, -2.f, 2.f);
    for (int64_t i = 0; i < n; ++i) ref::quantize_q8_0(&x[i * cols], &xq[i * xrb], cols);
    Dev<uint8_t> dxq(be(), xq, "Xq");
    const int64_t ldy = rows + 3;
    Dev<float> y0(be(), n * ldy, "Y"), y1(be(), n * ldy, "Y2"), z0(be(), n * ldy, "Y"),
        z1(be(), n * ldy, "Y2");
    for (auto* d : {&y0, &y1, &z0, &z1}) d->poison();
    be().matmul_q8_experts_pair((uint32_t)t, tab, 0, 1, rows, cols, dids.p(), dorder.p(), n, dxq.p(), xrb,
                                y0.p(), y1.p(), ldy);
    be().matmul_q8_experts((uint32_t)t, tab, 0, rows, cols, dids.p(), dorder.p(), n, dxq.p(), xrb, z0.p(),
                           ldy);
    be().matmul_q8_experts((uint32_t)t, tab, 1, rows, cols, dids.p(), dorder.p(), n, dxq.p(), xrb, z1.p(),
                           ldy);
    const std::string what = str("matmul_q8_experts_pair ", quant_traits(t).name);
    expect_same(y0.get(), z0.get(), what + " first");
    expect_same(y1.get(), z1.get(), what + " second");
  }
  be().set_phase(Phase::Any);
}

// matmul_q8_runs is matmul_q8 on each run, bit for bit: runs of awkward lengths (one row, a tile, a
// tile and one, more than two tiles) and a gap between runs that no run may write, one matrix and two.
TEST_P(MatmulOp, MatmulQ8RunsIsMatmulQ8OnEachRun) {
  for (const bool mma : mma_q8_modes(be())) {
    const ScopedEnv env("STRATA_CUDA_MMA_Q8", mma ? "1" : "0");
    std::mt19937 rng(41);
    ThreadPool pool(1);
    const std::vector<int64_t> lens = {3, 1, 16, 17, 40, 70};  // 70: two of the tensor-core tiles
    const int64_t gap_after = 2;                               // run 2 starts one row after run 1 ends
    for (QType t : kAllTypes) {
      if (!uses_matmul_q8((uint32_t)t)) continue;
      for (const bool long_rows : {false, true}) {
        if (long_rows && t != QType::Q4_K && t != QType::Q8_0) continue;
        const int64_t rows = 37, cols = long_rows ? long_cols_of(t) : cols_of(t), ldy = rows + 3;
        const size_t xrb = cols / 32 * 34 + 2;
        std::vector<Backend::ExpertRun> runs;
        std::vector<std::vector<uint8_t>> W, W2;
        std::vector<std::unique_ptr<Dev<uint8_t>>> dW;
        int64_t N = 0;
        for (size_t j = 0; j < lens.size(); ++j) {
          if ((int64_t)j == gap_after) ++N;
          W.push_back(random_weights(t, rows, cols, rng));
          W2.push_back(random_weights(t, rows, cols, rng));
          dW.push_back(std::make_unique<Dev<uint8_t>>(be(), W.back(), "W"));
          dW.push_back(std::make_unique<Dev<uint8_t>>(be(), W2.back(), "W2"));
          runs.push_back({dW[2 * j]->p(), dW[2 * j + 1]->p(), N, lens[j]});
          N += lens[j];
        }
        const auto x = randf(rng, N * cols, -2.f, 2.f);
        std::vector<uint8_t> xq(N * xrb, kPoison);
        for (int64_t i = 0; i < N; ++i) ref::quantize_q8_0(&x[i * cols], &xq[i * xrb], cols);
        Dev<uint8_t> dxq(be(), xq, "Xq");
        for (const bool pair : {false, true}) {
          Dev<float> Y(be(), N * ldy, "Y"), Y2(be(), N * ldy, "Y2");
          be().matmul_q8_runs((uint32_t)t, runs.data(), (int64_t)runs.size(), rows, cols, dxq.p(), xrb, Y.p(),
                              pair ? Y2.p() : nullptr, ldy);
          const auto y = Y.get(), y2 = Y2.get();
          const std::string what =
              str("matmul_q8_runs ", quant_traits(t).name, " cols=", cols, pair ? " pair" : "");
          std::vector<float> want(N * ldy), want2(N * ldy);
          std::memset(want.data(), kPoison, want.size() * sizeof(float));
          std::memset(want2.data(), kPoison, want2.size() * sizeof(float));
          for (size_t j = 0; j < runs.size(); ++j) {
            const int64_t r0 = runs[j].row0;
            matmul_q8(t, W[j].data(), rows, cols, &xq[r0 * xrb], (int64_t)xrb, runs[j].n, &want[r0 * ldy],
                      ldy, pool);
            if (pair)
              matmul_q8(t, W2[j].data(), rows, cols, &xq[r0 * xrb], (int64_t)xrb, runs[j].n, &want2[r0 * ldy],
                        ldy, pool);
          }
          // The CPU's matmul_q8 leaves Y's gaps alone too: the whole arrays are compared, gaps and the gap
          // row still poison.
          expect_same(y, want, what);
          expect_same(y2, want2, what + " (Y2)");
        }
      }
    }
  }
}

// matmul_runs is matmul on each run, bit for bit, in a prompt (the GPU's one launch) and outside one
// (matmul's own choice run by run): the runs of MatmulQ8Runs's test, float weights and quantized.
TEST_P(MatmulOp, MatmulRunsIsMatmulOnEachRun) {
  std::mt19937 rng(43);
  const std::vector<int64_t> lens = {3, 1, 128, 129, 40};
  for (const Phase phase : {Phase::Prompt, Phase::Any}) {
    be().set_phase(phase);
    for (QType t : kAllTypes) {
      const int64_t rows = 37, cols = cols_of(t), ldx = cols + 4, ldy = rows + 3;
      std::vector<Backend::ExpertRun> runs;
      std::vector<std::unique_ptr<Dev<uint8_t>>> dW;
      int64_t N = 0;
      for (size_t j = 0; j < lens.size(); ++j) {
        if (j == 2) ++N;  // a row no run covers
        dW.push_back(std::make_unique<Dev<uint8_t>>(be(), random_weights(t, rows, cols, rng), "W"));
        dW.push_back(std::make_unique<Dev<uint8_t>>(be(), random_weights(t, rows, cols, rng), "W2"));
        runs.push_back({dW[2 * j]->p(), dW[2 * j + 1]->p(), N, lens[j]});
        N += lens[j];
      }
      Dev<float> dx(be(), randf(rng, N * ldx, -2.f, 2.f), "X");
      const std::string what =
          str("matmul_runs ", quant_traits(t).name, phase == Phase::Prompt ? " (prompt)" : "");
      Dev<float> Y(be(), N * ldy, "Y"), Y2(be(), N * ldy, "Y2"), Z(be(), N * ldy, "Y"),
          Z2(be(), N * ldy, "Y2");
      be().matmul_runs((uint32_t)t, runs.data(), (int64_t)runs.size(), rows, cols, dx.p(), ldx, Y.p(), Y2.p(),
                       ldy);
      for (const auto& r : runs) {
        be().matmul((uint32_t)t, r.W, rows, cols, dx.p() + r.row0 * ldx, ldx, r.n, Z.p() + r.row0 * ldy, ldy);
        be().matmul((uint32_t)t, r.W2, rows, cols, dx.p() + r.row0 * ldx, ldx, r.n, Z2.p() + r.row0 * ldy,
                    ldy);
      }
      expect_same(Y.get(), Z.get(), what);
      expect_same(Y2.get(), Z2.get(), what + " (Y2)");
    }
  }
  be().set_phase(Phase::Any);
}

// A row's matmul result does not depend on how many tokens the call had nor where the row sat, in
// each phase (invariant 4 on a backend whose kernels depend on the phase): rows of a 40-token call
// equal the same rows computed in calls of 1, 7, 9 and 17 tokens, bit for bit.
TEST_P(MatmulOp, MatmulRowsIndependentOfTokenCount) {
  std::mt19937 rng(17);
  const int64_t rows = 37, T = 40;
  // Long rows: past the 4 x 32 units a warp of the one-token GEMV copies to shared memory at once
  // (gemv::WStage), some rows aligned for its loads and some not (Q8_0: 3,026 bytes apart).
  for (Phase ph : {Phase::Prompt, Phase::Decode}) {
    be().set_phase(ph);
    for (QType t : kAllTypes) {
      for (const bool long_rows : {false, true}) {
        const int64_t cols = long_rows ? long_cols_of(t) : cols_of(t), ldx = (cols + 3) / 4 * 4;
        const auto W = random_weights(t, rows, cols, rng);
        const auto x = randf(rng, T * ldx, -2.f, 2.f);
        Dev<uint8_t> dW(be(), W, "W");
        Dev<float> dx(be(), x, "X"), Y(be(), T * rows, "Y");
        be().matmul((uint32_t)t, dW.p(), rows, cols, dx.p(), ldx, T, Y.p(), rows);
        const auto all = Y.get();
        for (int64_t n : {1, 7, 9, 17}) {
          const int64_t first = T - n - 3;  // rows that sat elsewhere in the big call's tiles
          Dev<float> y(be(), n * rows, "Y part");
          be().matmul((uint32_t)t, dW.p(), rows, cols, dx.p() + first * ldx, ldx, n, y.p(), rows);
          const std::vector<float> want(all.begin() + first * rows, all.begin() + (first + n) * rows);
          expect_same(y.get(), want,
                      str("matmul ", quant_traits(t).name, " ", cols, " columns, phase ", (int)ph, ": ", n,
                          " tokens against 40"));
        }
      }
    }
  }
  be().set_phase(Phase::Any);
}

// matmul_experts' output y (rows of ldy) against the decode matmul of each row i on its expert's matrix
// W[ids[order[i]]], bit for bit, and the gaps between rows untouched.
void expect_rows_of_matmul(Backend& be, QType t, const std::vector<std::vector<uint8_t>>& W,
                           const std::vector<int32_t>& ids, const std::vector<int32_t>& order, int64_t rows,
                           int64_t cols, const float* dx, int64_t ldx, const std::vector<float>& y,
                           int64_t ldy, const std::string& what) {
  const int64_t n = (int64_t)order.size();
  for (int64_t i = 0; i < n; ++i) {
    Dev<uint8_t> dw(be, W[ids[order[i]]], "W");
    Dev<float> yi(be, rows, "Y row");
    be.matmul((uint32_t)t, dw.p(), rows, cols, dx + i * ldx, ldx, 1, yi.p(), rows);
    expect_same(std::vector<float>(y.begin() + i * ldy, y.begin() + i * ldy + rows), yi.get(),
                str(what, " row ", i));
  }
  expect_gaps_untouched(y, n, rows, ldy, what);
}

// matmul_experts (and its q8_0 twin) find each row's expert through the table, resident at a stride
// or in permuted cache slots, and give per row the bits of the decode matmul on that expert's matrix.
TEST_P(MatmulOp, MatmulExpertsMatchesPerExpertMatmul) {
  // On a GPU both one-token kernels: activations staged once a block (opt-in) and read per lane (the
  // default).
  for (const char* xs : {"1", "0"}) {
    const ScopedEnv env("STRATA_CUDA_EXPERTS_XS", xs);
    SCOPED_TRACE(str("STRATA_CUDA_EXPERTS_XS=", xs));
    std::mt19937 rng(18);
    const int64_t E = 5, K = 3, T = 2, n = T * K;
    be().set_phase(Phase::Decode);
    // Rows sorted by expert as group_by_expert leaves them: order[i] = t * K + k.
    const std::vector<int32_t> ids = {4, 0, 2, 2, 3, 0};  // token 0: 4 0 2; token 1: 2 3 0
    std::vector<int32_t> order(n);
    for (int32_t i = 0; i < n; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return ids[a] < ids[b]; });
    for (QType t : kAllTypes) {
      // Resident, slotted, and slotted with long rows (a Q6_K row of 2,816 columns fills the GEMV's staged
      // weight batches of 128 units; 768 columns never reach them).
      for (const int shape : {0, 1, 2}) {
        const bool slotted = shape != 0;
        const int64_t rows = 37, cols = shape == 2 ? long_cols_of(t) : cols_of(t);
        const size_t mb = rows * row_bytes(t, cols);
        std::vector<std::vector<uint8_t>> W(E);
        for (auto& w : W) w = random_weights(t, rows, cols, rng);
        // Resident: experts back to back. Slotted: expert e in slot perm[e] (matrix at offset 256 of
        // a slot), expert 1 absent; slots a whole number of 256 bytes apart.
        const size_t slot_bytes = (mb + 256 + 255) / 256 * 256;
        const std::vector<int32_t> perm = {2, -1, 0, 4, 1};
        std::vector<uint8_t> mem(slotted ? 5 * slot_bytes : E * mb, 0);
        for (int64_t e = 0; e < E; ++e) {
          if (slotted && perm[e] < 0) continue;
          std::memcpy(&mem[slotted ? perm[e] * slot_bytes + 256 : e * mb], W[e].data(), mb);
        }
        Dev<uint8_t> dmem(be(), mem, "experts");
        Dev<int32_t> dslots(be(), perm, "slot table"), dids(be(), ids, "ids"), dorder(be(), order, "order");
        ExpertTable tab;
        tab.E = E;
        const int m = slotted ? 1 : 2;  // any of gate/up/down: the table's matrix m
        if (slotted) {
          tab.slots = dslots.p();
          tab.arena = dmem.p();
          tab.slot_bytes = slot_bytes;
          tab.off[m] = 256;
        } else {
          tab.base[m] = dmem.p();
          tab.stride[m] = mb;
        }
        const int64_t ldx = cols + 4, ldy = rows + 3;
        const auto x = randf(rng, n * ldx, -2.f, 2.f);
        Dev<float> dx(be(), x, "X"), Y(be(), n * ldy, "Y");
        be().matmul_experts((uint32_t)t, tab, m, rows, cols, dids.p(), dorder.p(), n, dx.p(), ldx, Y.p(),
                            ldy);
        const auto y = Y.get();
        const std::string what =
            str("matmul_experts ", quant_traits(t).name, slotted ? " slotted" : " resident", " cols=", cols);
        expect_rows_of_matmul(be(), t, W, ids, order, rows, cols, dx.p(), ldx, y, ldy, what);
        if (uses_matmul_q8((uint32_t)t)) {
          const size_t xrb = cols / 32 * 34 + 2;
          std::vector<uint8_t> xq(n * xrb, kPoison);
          for (int64_t i = 0; i < n; ++i) ref::quantize_q8_0(&x[i * ldx], &xq[i * xrb], cols);
          Dev<uint8_t> dxq(be(), xq, "Xq");
          Y.poison();
          be().matmul_q8_experts((uint32_t)t, tab, m, rows, cols, dids.p(), dorder.p(), n, dxq.p(), xrb,
                                 Y.p(), ldy);
          const auto yq = Y.get();
          for (int64_t i = 0; i < n; ++i) {
            Dev<uint8_t> dw(be(), W[ids[order[i]]], "W");
            Dev<float> yi(be(), rows, "Y row");
            be().matmul_q8((uint32_t)t, dw.p(), rows, cols, dxq.p() + i * xrb, xrb, 1, yi.p(), rows);
            expect_same(std::vector<float>(yq.begin() + i * ldy, yq.begin() + i * ldy + rows), yi.get(),
                        str("matmul_q8_experts ", quant_traits(t).name, slotted ? " slotted" : " resident",
                            " row ", i));
          }
        }
        if (slotted) {  // a row whose expert is not resident: the CPU refuses, a GPU writes NaN rows
          const std::vector<int32_t> absent = {1};
          const std::vector<int32_t> zero = {0};
          Dev<int32_t> da(be(), absent, "ids"), dz(be(), zero, "order");
          Dev<float> y1(be(), rows, "Y");
          if (be().host_is_device()) {
            EXPECT_THROW(be().matmul_experts((uint32_t)t, tab, m, rows, cols, da.p(), dz.p(), 1, dx.p(), ldx,
                                             y1.p(), rows),
                         Error);
          } else {
            be().matmul_experts((uint32_t)t, tab, m, rows, cols, da.p(), dz.p(), 1, dx.p(), ldx, y1.p(),
                                rows);
            for (float v : y1.get()) ASSERT_TRUE(std::isnan(v)) << what << ": an absent expert's row";
          }
        }
      }
    }
    be().set_phase(Phase::Any);
  }
}

// matmul_experts through a table with pending slots (ExpertTable::pending, a decode step's write-through):
// a pending expert's matrix is read from the source, written into its slot byte for byte (nothing around
// it touched), and multiplied with the bits of a filled slot; a slot not pending is read as it is (its
// source deliberately differs, so reading it there would show). Rows of 16-byte multiples and not (so rows
// start anywhere modulo 16), the source's matrices at offsets aligned as the slots' modulo 16 (the cache's
// condition for write-through), pieces that cross a matrix's ends read byte by byte; an expert
// named twice (a batch's rows) is written twice with the same bytes.
// The write-through tests' rows and slots: 6 rows on 5 experts (0 and 2 twice), sorted by expert as
// group_by_expert leaves them; expert -> slot (expert 1 absent); slots 0 (expert 2) and 4 (expert 3) pending.
struct WriteThroughCase {
  static constexpr int64_t E = 5, n = 6;
  const std::vector<int32_t> ids = {4, 0, 2, 2, 3, 0};
  const std::vector<int32_t> perm = {2, -1, 0, 4, 1};
  const std::vector<uint8_t> pending = {1, 0, 0, 0, 1};
  std::vector<int32_t> order = [this] {
    std::vector<int32_t> o(n);
    for (int32_t i = 0; i < n; ++i) o[i] = i;
    std::stable_sort(o.begin(), o.end(), [&](int32_t a, int32_t b) { return ids[a] < ids[b]; });
    return o;
  }();
};

TEST_P(MatmulOp, MatmulExpertsWritesThrough) {
  // On a GPU both one-token kernels: activations staged once a block (opt-in) and read per lane (the
  // default).
  for (const char* xs : {"1", "0"}) {
    const ScopedEnv env("STRATA_CUDA_EXPERTS_XS", xs);
    SCOPED_TRACE(str("STRATA_CUDA_EXPERTS_XS=", xs));
    std::mt19937 rng(19);
    const WriteThroughCase wc;
    be().set_phase(Phase::Decode);
    for (QType t : kAllTypes) {
      for (const bool long_rows : {false, true}) {
        const int64_t rows = 21, cols = long_rows ? long_cols_of(t) : cols_of(t);
        const size_t rb = row_bytes(t, cols), mb = rows * rb;
        if (rb > kWriteThroughRowBytes) continue;
        for (const size_t lead : {size_t{0}, size_t{48}}) {  // the source's matrices at 256 k + lead
          std::vector<std::vector<uint8_t>> W(wc.E);
          for (auto& w : W) w = random_weights(t, rows, cols, rng);
          const size_t slot_bytes = (mb + 256 + 255) / 256 * 256, stride = (mb + 255) / 256 * 256 + 256;
          PinnedBuffer src(be(), wc.E * stride + lead, "expert source");
          std::memset(src.get(), 0x5A, wc.E * stride + lead);
          for (int64_t e = 0; e < wc.E; ++e) std::memcpy(src.get() + lead + e * stride, W[e].data(), mb);
          std::vector<uint8_t> mem(5 * slot_bytes, 0xC3);  // pending slots: stale bytes
          auto stale_weights = random_weights(t, rows, cols, rng);
          for (int64_t e = 0; e < wc.E; ++e) {
            if (wc.perm[e] < 0 || wc.pending[wc.perm[e]]) continue;
            std::memcpy(&mem[wc.perm[e] * slot_bytes + 256], W[e].data(), mb);
            // the source of a resident expert differs from its slot: write-through must not read it
            std::memcpy(src.get() + lead + e * stride, stale_weights.data(), mb);
          }
          const uint8_t* view = static_cast<const uint8_t*>(be().device_view(src.get()));
          ASSERT_NE(view, nullptr) << "pinned memory has no device view";
          Dev<uint8_t> dmem(be(), mem, "slots");
          Dev<int32_t> dslots(be(), wc.perm, "slot table"), dids(be(), wc.ids, "wc.ids"),
              dorder(be(), wc.order, "wc.order");
          Dev<uint8_t> dpending(be(), wc.pending, "wc.pending");
          ExpertTable tab;
          tab.E = wc.E;
          const int m = 2;
          tab.slots = dslots.p();
          tab.arena = dmem.p();
          tab.slot_bytes = slot_bytes;
          tab.off[m] = 256;
          tab.pending = dpending.p();
          tab.src[m] = view + lead;
          tab.src_stride[m] = stride;
          const int64_t ldx = cols + 4, ldy = rows + 3;
          const auto x = randf(rng, wc.n * ldx, -2.f, 2.f);
          Dev<float> dx(be(), x, "X"), Y(be(), wc.n * ldy, "Y");
          be().matmul_experts((uint32_t)t, tab, m, rows, cols, dids.p(), dorder.p(), wc.n, dx.p(), ldx, Y.p(),
                              ldy);
          const auto y = Y.get();
          const std::string what = str("matmul_experts write-through ", quant_traits(t).name, " ", cols,
                                       " columns, source lead ", lead);
          expect_rows_of_matmul(be(), t, W, wc.ids, wc.order, rows, cols, dx.p(), ldx, y, ldy, what);
          std::vector<uint8_t> want = mem;
          for (int64_t e : {2, 3}) std::memcpy(&want[wc.perm[e] * slot_bytes + 256], W[e].data(), mb);
          expect_same(dmem.get(), want, what + ": the slots after");
        }
      }
    }
    be().set_phase(Phase::Any);
  }
}

// matmul_q8_experts (and its gate/up pair) writing missed experts through: the q8_0 GEMV stages a pending
// slot's rows from the source instead of the slot and stores them into it. Rows as the per-expert matmul_q8
// on each expert's matrix (bit for bit), the pending slots' bytes the experts' after, the other slots
// untouched.
TEST_P(MatmulOp, MatmulQ8ExpertsWritesThrough) {
  std::mt19937 rng(23);
  const WriteThroughCase wc;
  be().set_phase(Phase::Decode);
  for (QType t : kAllTypes) {
    if (!uses_matmul_q8((uint32_t)t)) continue;
    for (const bool long_rows : {false, true}) {
      const int64_t rows = 21, cols = long_rows ? long_cols_of(t) : cols_of(t);
      const size_t rb = row_bytes(t, cols), mb = rows * rb, mpad = (mb + 255) / 256 * 256;
      for (const size_t lead : {size_t{0}, size_t{48}, size_t{8}}) {
        // Two matrices an expert (m 0 and 1, the pair's gate and up): in a slot at base and base + mpad, in
        // the source at lead + (m E + e) stride; base lies as lead modulo 16 (write-through's condition),
        // so a lead of 8 puts every matrix off 16-byte alignment on both sides.
        const size_t base = 256 + lead % 16;
        std::vector<std::vector<uint8_t>> W[2];
        for (auto& ws : W) {
          ws.resize(wc.E);
          for (auto& w : ws) w = random_weights(t, rows, cols, rng);
        }
        const size_t slot_bytes = 256 + 16 + 2 * mpad, stride = mpad + 256;
        PinnedBuffer src(be(), 2 * wc.E * stride + lead, "expert source");
        std::memset(src.get(), 0x5A, 2 * wc.E * stride + lead);
        std::vector<uint8_t> mem(5 * slot_bytes, 0xC3);  // pending slots: stale bytes
        for (int m = 0; m < 2; ++m)
          for (int64_t e = 0; e < wc.E; ++e) {
            std::memcpy(src.get() + lead + (m * wc.E + e) * stride, W[m][e].data(), mb);
            if (wc.perm[e] >= 0 && !wc.pending[wc.perm[e]]) {
              std::memcpy(&mem[wc.perm[e] * slot_bytes + base + m * mpad], W[m][e].data(), mb);
              // a resident expert's source differs from its slot: write-through must not read it
              std::memset(src.get() + lead + (m * wc.E + e) * stride, 0x11, mb);
            }
          }
        const uint8_t* view = static_cast<const uint8_t*>(be().device_view(src.get()));
        ASSERT_NE(view, nullptr) << "pinned memory has no device view";
        Dev<int32_t> dslots(be(), wc.perm, "slot table"), dids(be(), wc.ids, "wc.ids"),
            dorder(be(), wc.order, "wc.order");
        Dev<uint8_t> dpending(be(), wc.pending, "wc.pending");
        const int64_t ldy = rows + 3;
        const auto x = randf(rng, wc.n * cols, -2.f, 2.f);
        const size_t xrb = cols / 32 * 34 + 2;
        std::vector<uint8_t> xq(wc.n * xrb, kPoison);
        for (int64_t i = 0; i < wc.n; ++i) ref::quantize_q8_0(&x[i * cols], &xq[i * xrb], cols);
        Dev<uint8_t> dxq(be(), xq, "Xq");
        std::vector<uint8_t> want = mem;
        for (int m = 0; m < 2; ++m)
          for (int64_t e : {2, 3})
            std::memcpy(&want[wc.perm[e] * slot_bytes + base + m * mpad], W[m][e].data(), mb);
        // On a GPU both stagings of the pending rows: cp.async (the default) and register loads
        // (STRATA_CUDA_WT_LD=1).
        for (const int combo : {0, 1, 2, 3}) {
          const bool pair = combo % 2 == 1;
          const ScopedEnv env("STRATA_CUDA_WT_LD", combo / 2 ? "1" : "0");
          Dev<uint8_t> dmem(be(), mem, "slots");
          ExpertTable tab;
          tab.E = wc.E;
          tab.slots = dslots.p();
          tab.arena = dmem.p();
          tab.slot_bytes = slot_bytes;
          tab.pending = dpending.p();
          for (int m = 0; m < 2; ++m) {
            tab.off[m] = base + m * mpad;
            tab.src[m] = view + lead + m * wc.E * stride;
            tab.src_stride[m] = stride;
          }
          Dev<float> Y0(be(), wc.n * ldy, "Y gate"), Y1(be(), wc.n * ldy, "Y up");
          if (pair) {
            be().matmul_q8_experts_pair((uint32_t)t, tab, 0, 1, rows, cols, dids.p(), dorder.p(), wc.n,
                                        dxq.p(), xrb, Y0.p(), Y1.p(), ldy);
          } else {
            be().matmul_q8_experts((uint32_t)t, tab, 0, rows, cols, dids.p(), dorder.p(), wc.n, dxq.p(), xrb,
                                   Y0.p(), ldy);
            be().matmul_q8_experts((uint32_t)t, tab, 1, rows, cols, dids.p(), dorder.p(), wc.n, dxq.p(), xrb,
                                   Y1.p(), ldy);
          }
          const std::string what =
              str("matmul_q8_experts", pair ? "_pair" : "", " write-through ", quant_traits(t).name, " ",
                  cols, " columns, source lead ", lead, combo / 2 ? ", STRATA_CUDA_WT_LD=1" : "");
          const std::vector<float> y[2] = {Y0.get(), Y1.get()};
          for (int m = 0; m < 2; ++m)
            for (int64_t i = 0; i < wc.n; ++i) {
              Dev<uint8_t> dw(be(), W[m][wc.ids[wc.order[i]]], "W");
              Dev<float> yi(be(), rows, "Y row");
              be().matmul_q8((uint32_t)t, dw.p(), rows, cols, dxq.p() + i * xrb, xrb, 1, yi.p(), rows);
              expect_same(std::vector<float>(y[m].begin() + i * ldy, y[m].begin() + i * ldy + rows), yi.get(),
                          str(what, " matrix ", m, " row ", i));
            }
          expect_same(dmem.get(), want, what + ": the slots after");
        }
      }
    }
  }
  be().set_phase(Phase::Any);
}

}  // namespace
