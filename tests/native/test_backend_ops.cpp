// The op harness: every op of the Backend interface, on every backend under test, against the plain
// references of backend_ops_ref.h, on fresh random inputs at awkward shapes. Data goes through the
// backend's own memory; outputs are poisoned first and followed by a guard tail that must survive.
#include "backend_ops_harness.h"
#include "core/thread_pool.h"

namespace {

// A long row: many of the GPU kernels' chunks (512 columns), more than they keep in flight.
int64_t long_cols_of(QType t) {
  const int64_t bs = quant_traits(t).block_size;
  return bs == 1 ? 2819 : bs == 32 ? 89 * 32 : 11 * 256;
}

// Token counts of the matmul tests: both sides of the GPU's kernel choices (up to 8 tokens and
// beyond) and the edges of their tiles.
const int64_t kMatmulTs[] = {1, 2, 3, 8, 9, 16, 17, 257};
// Where a row or the shape is large, a few of them.
bool few_tokens(int64_t T) { return T == 1 || T == 2 || T == 9 || T == 16; }

INSTANTIATE_TEST_SUITE_P(BackendOps, Op, testing::ValuesIn(backends_under_test()),
                         [](const testing::TestParamInfo<BackendFactory>& i) { return i.param.name; });

TEST_P(Op, Embed) {
  std::mt19937 rng(1);
  for (QType t : kAllTypes) {
    const int64_t D = cols_of(t), rows = 13;
    const size_t rb = row_bytes(t, D);
    const auto table = random_weights(t, rows, D, rng);
    const auto tf = ref::dequant_rows(t, table.data(), rb, D, rows);
    Dev<uint8_t> dtable(be(), table, "table");
    for (int64_t T : kTs) {
      auto ids = randi(rng, T, rows);
      ids[0] = rows - 1;
      Dev<int32_t> dids(be(), ids, "ids");
      Dev<float> out(be(), T * D, "embed out");
      be().embed((uint32_t)t, dtable.p(), D, dids.p(), T, out.p());
      std::vector<float> want(T * D);
      for (int64_t i = 0; i < T; ++i) std::copy_n(&tf[ids[i] * D], D, &want[i * D]);
      expect_same(out.get(), want, str("embed ", quant_traits(t).name, " T=", T));  // exact: dequantization
    }
  }
}

TEST_P(Op, DequantRows) {
  std::mt19937 rng(2);
  for (QType t : kAllTypes)
    for (const bool long_rows : {false, true}) {  // long: many of a GPU kernel's groups of units
      const int64_t D = long_rows ? long_cols_of(t) : cols_of(t), n = long_rows ? 3 : 11;
      const size_t rb = row_bytes(t, D), src_rb = rb + 16;  // padded rows
      const auto w = random_weights(t, n, D, rng);
      std::vector<uint8_t> padded(n * src_rb, kPoison);
      for (int64_t i = 0; i < n; ++i) std::memcpy(&padded[i * src_rb], &w[i * rb], rb);
      Dev<uint8_t> src(be(), padded, "dequant src");
      Dev<float> out(be(), n * D, "dequant out");
      be().dequant_rows((uint32_t)t, src.p(), src_rb, D, n, out.p());
      expect_same(out.get(), ref::dequant_rows(t, w.data(), rb, D, n),
                  str("dequant_rows ", quant_traits(t).name, " D=", D));
    }
}

// dequant_rows at every source offset and row stride past the rows' bytes that the format's blocks allow
// (backend.h): rows at multiples of 4 bytes, and MXFP4's at any byte, are read by every backend; rows at
// other even places are read right or refused with a ConfigError (the CUDA backend reads F32 by 4-byte
// elements), never misread. (Odd places of the other types: their blocks are 2-byte structs.)
TEST_P(Op, DequantRowsAtAnyStride) {
  std::mt19937 rng(37);
  for (QType t : kAllTypes) {
    const int64_t D = cols_of(t), n = 5;
    const size_t rb = row_bytes(t, D);
    const auto w = random_weights(t, n, D, rng);
    const auto want = ref::dequant_rows(t, w.data(), rb, D, n);
    const bool any_byte = t == QType::MXFP4;  // 17-byte blocks
    for (size_t off = 0; off < 4; ++off)
      for (size_t pad = 0; pad < 9; ++pad) {
        const size_t stride = rb + pad;
        if (!any_byte && (off % 2 != 0 || stride % 2 != 0)) continue;
        std::vector<uint8_t> placed(off + n * stride, kPoison);
        for (int64_t i = 0; i < n; ++i) std::memcpy(&placed[off + i * stride], &w[i * rb], rb);
        Dev<uint8_t> src(be(), placed, "dequant src");
        Dev<float> out(be(), n * D, "dequant out");
        const std::string what =
            str("dequant_rows ", quant_traits(t).name, " at offset ", off, ", ", stride, " bytes apart");
        try {
          be().dequant_rows((uint32_t)t, src.p() + off, stride, D, n, out.p());
        } catch (const ConfigError& e) {
          EXPECT_FALSE(any_byte || (off % 4 == 0 && stride % 4 == 0)) << what << ": refused: " << e.what();
          continue;
        }
        expect_same(out.get(), want, what);
      }
  }
}

TEST_P(Op, RmsScale) {
  std::mt19937 rng(3);
  for (int64_t D : {229, 768})
    for (int64_t T : kTs) {
      const auto x = randf(rng, T * D, -2.f, 2.f);
      // An epsilon unlike the usual 1e-6: an op that ignores the caller's moves grs by ~1e-4.
      constexpr float kEps = 3e-4f;
      Dev<float> dx(be(), x, "x"), grs(be(), T, "grs");
      be().rms_scale(dx.p(), T, D, kEps, grs.p());
      const auto want = ref::rms_scale(x, T, D, kEps);
      expect_err(max_err(grs.get(), want, abs_of(want)), bounds().rms_scale,
                 str("rms_scale D=", D, " T=", T));
    }
}

// The fused GR read equals its two steps on the same backend bit for bit (which their own tests hold
// against the reference).
TEST_P(Op, RmsNormReadIsScaleThenApply) {
  std::mt19937 rng(31);
  for (int64_t D : {229, 2048})
    for (int64_t T : kTs) {
      const auto x = randf(rng, T * D, -2.f, 2.f), w = randf(rng, D, -1.5f, 1.5f);
      constexpr float kEps = 3e-4f;
      Dev<float> dx(be(), x, "x"), dw(be(), w, "w"), g1(be(), T, "grs"), g2(be(), T, "grs fused");
      Dev<float> o1(be(), T * D, "norm out"), o2(be(), T * D, "norm out fused");
      be().rms_scale(dx.p(), T, D, kEps, g1.p());
      be().apply_norm(dx.p(), g1.p(), dw.p(), D, nullptr, 1, T, o1.p());
      be().rms_norm_read(dx.p(), T, D, kEps, dw.p(), g2.p(), o2.p());
      const std::string what = str("rms_norm_read D=", D, " T=", T);
      expect_same(g2.get(), g1.get(), what + " grs");
      expect_same(o2.get(), o1.get(), what + " out");
    }
}

// The residual add fused into the next GR read equals add then rms_norm_read bit for bit, also when
// the output overwrites the added rows (as the forward pass stages it in proj).
TEST_P(Op, AddRmsNormReadIsAddThenRead) {
  std::mt19937 rng(34);
  for (int64_t D : {229, 2048})
    for (int64_t T : kTs)
      for (bool in_place : {false, true}) {
        const auto x = randf(rng, T * D, -2.f, 2.f), y = randf(rng, T * D, -2.f, 2.f),
                   w = randf(rng, D, -1.5f, 1.5f);
        constexpr float kEps = 3e-4f;
        Dev<float> x1(be(), x, "x"), y1(be(), y, "y"), x2(be(), x, "x fused"), y2(be(), y, "y fused");
        Dev<float> dw(be(), w, "w"), g1(be(), T, "grs"), g2(be(), T, "grs fused"), o1(be(), T * D, "out"),
            o2(be(), T * D, "out fused");
        be().add(x1.p(), y1.p(), T * D);
        be().rms_norm_read(x1.p(), T, D, kEps, dw.p(), g1.p(), o1.p());
        be().add_rms_norm_read(x2.p(), y2.p(), T, D, kEps, dw.p(), g2.p(), in_place ? y2.p() : o2.p());
        const std::string what = str("add_rms_norm_read D=", D, " T=", T, in_place ? " in place" : "");
        expect_same(x2.get(), x1.get(), what + " x");
        expect_same(g2.get(), g1.get(), what + " grs");
        expect_same(in_place ? y2.get() : o2.get(), o1.get(), what + " out");
      }
}

TEST_P(Op, ApplyNormAndGather) {
  std::mt19937 rng(4);
  const int64_t D = 229, K = 3;
  for (int64_t T : kTs)
    for (bool indexed : {false, true}) {
      const auto x = randf(rng, T * D, -2.f, 2.f), w = randf(rng, D, -1.5f, 1.5f),
                 grs = randf(rng, T, 0.1f, 4.f);
      // Indexed: 2T + 1 rows t * K + k read in any order, several from one token.
      const int64_t n = indexed ? 2 * T + 1 : T;
      const auto rows = randi(rng, n, T * K);
      const int32_t* rp = indexed ? rows.data() : nullptr;
      Dev<float> dx(be(), x, "x"), dw(be(), w, "w"), dg(be(), grs, "grs"), out(be(), n * D, "norm out");
      Dev<int32_t> drows(be(), rows, "rows");
      be().apply_norm(dx.p(), dg.p(), dw.p(), D, indexed ? drows.p() : nullptr, K, n, out.p());
      std::vector<double> want(n * D);
      std::vector<float> gathered(n * D);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t s = ref::src_row(rp, K, i);
        for (int64_t c = 0; c < D; ++c) {
          want[i * D + c] = (double)x[s * D + c] * grs[s] * w[c];
          gathered[i * D + c] = x[s * D + c];
        }
      }
      const std::string what = str(" T=", T, indexed ? " indexed" : "");
      expect_err(max_err(out.get(), want, abs_of(want)), 1e-6, "apply_norm" + what);  // measured 1.1e-7
      if (!indexed) continue;  // gather always reads rows[]
      Dev<float> g(be(), n * D, "gather out");
      be().gather(dx.p(), D, drows.p(), K, n, g.p());
      expect_same(g.get(), gathered, "gather" + what);
    }
}

TEST_P(Op, QuantizeQ8_0) {
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
class MmaQ8Env {
 public:
  explicit MmaQ8Env(bool on) { setenv("STRATA_CUDA_MMA_Q8", on ? "1" : "0", 1); }
  ~MmaQ8Env() { unsetenv("STRATA_CUDA_MMA_Q8"); }
};
std::vector<bool> mma_q8_modes(Backend& be) {
  return be.host_is_device() ? std::vector<bool>{false} : std::vector<bool>{false, true};
}

TEST_P(Op, MatmulQ8) {
  for (const bool mma : mma_q8_modes(be())) {
    const MmaQ8Env env(mma);
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

TEST_P(Op, Matmul) {
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
TEST_P(Op, MatmulNIsItsCalls) {
  std::mt19937 rng(33);
  for (QType t : kAllTypes) {
    const int64_t cols = cols_of(t);
    const int64_t rows[3] = {37, 5, 130};
    std::vector<Dev<uint8_t>> W;
    for (int64_t r : rows) W.emplace_back(be(), random_weights(t, r, cols, rng), "W");
    for (Phase ph : {Phase::Decode, Phase::Prompt})
      for (int64_t T : {1, 3}) {
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

TEST_P(Op, HeadNormRope) {
  std::mt19937 rng(8);
  const int64_t H = 5, hd = 76;
  struct Case {
    bool norm;
    int64_t pos0, n_dims;
    float base;
  };
  for (const Case c : {Case{true, 0, hd, 1e6f}, Case{false, 777, hd, 1e4f}, Case{true, 130, 32, 1e4f}})
    for (int64_t T : kTs) {
      const auto x = randf(rng, T * H * hd, -2.f, 2.f), w = randf(rng, hd, 0.5f, 1.5f);
      Dev<float> dx(be(), x, "x"), dw(be(), w, "w");
      const RopeParams rope{c.n_dims, c.base, true};
      be().head_norm_rope(dx.p(), T, H, hd, c.norm ? dw.p() : nullptr, 1e-6f, c.pos0, rope);
      const auto want = ref::head_norm_rope(x, T, H, hd, c.norm ? w.data() : nullptr, 1e-6f, c.pos0, rope);
      std::vector<double> scale(want.size());  // per head: its largest element
      for (int64_t th = 0; th < T * H; ++th) {
        double m = 0;
        for (int64_t i = 0; i < hd; ++i) m = std::max(m, std::fabs(want[th * hd + i]));
        std::fill_n(&scale[th * hd], hd, m);
      }
      // Float angles: the error grows with the position, by about 5e-8 a position. Measured: 1.4e-7
      // at position 0, 7.5e-6 up to 256, 9.7e-6 up to 386, 5.6e-5 up to 1033.
      const double bound = bounds().head_norm_rope + 3e-7 * (double)(c.pos0 + T - 1);
      expect_err(max_err(dx.get(), want, scale), bound,
                 str("head_norm_rope norm=", c.norm, " pos0=", c.pos0, " n_dims=", c.n_dims, " T=", T));
    }
}

// The attention block's fused per-head op equals its four steps on the same backend bit for bit.
TEST_P(Op, QkRopeStoreIsItsSteps) {
  std::mt19937 rng(32);
  const int64_t H = 6, KV = 2, hd = 40, width = KV * hd, ctx = 50, pos0 = 37;
  for (int64_t T : {1, 5})
    for (bool normed : {true, false})
      for (KvType t : {KvType::F32, KvType::F16}) {
        if (!be().supports_kv(t)) continue;
        const RopeParams rope{hd - 8, 5e5f, true};  // a tail of unrotated dims
        const auto q = randf(rng, T * H * hd, -2.f, 2.f), k = randf(rng, T * width, -2.f, 2.f),
                   v = randf(rng, T * width, -2.f, 2.f), qn = randf(rng, hd, 0.5f, 1.5f),
                   kn = randf(rng, hd, 0.5f, 1.5f);
        const size_t cb = (size_t)ctx * width * kv_elem_bytes(t);
        Dev<float> q1(be(), q, "q"), k1(be(), k, "k"), q2(be(), q, "q fused"), k2(be(), k, "k fused");
        Dev<float> dv(be(), v, "v"), dqn(be(), qn, "q_norm"), dkn(be(), kn, "k_norm");
        Dev<uint8_t> kc1(be(), cb, "k cache"), vc1(be(), cb, "v cache"), kc2(be(), cb, "k cache fused"),
            vc2(be(), cb, "v cache fused");
        const float* qw = normed ? dqn.p() : nullptr;
        const float* kw = normed ? dkn.p() : nullptr;
        be().head_norm_rope(q1.p(), T, H, hd, qw, 1e-5f, pos0, rope);
        be().head_norm_rope(k1.p(), T, KV, hd, kw, 1e-5f, pos0, rope);
        be().kv_store(kc1.p(), t, pos0, T, width, k1.p());
        be().kv_store(vc1.p(), t, pos0, T, width, dv.p());
        be().qk_rope_store(q2.p(), k2.p(), dv.p(), T, H, KV, hd, qw, kw, 1e-5f, pos0, rope, kc2.p(), vc2.p(),
                           t);
        const std::string what = str("qk_rope_store T=", T, normed ? " normed " : " ", kv_type_name(t));
        expect_same(q2.get(), q1.get(), what + " q");
        expect_same(k2.get(), k1.get(), what + " k");
        expect_same(kc2.get(), kc1.get(), what + " k cache");
        expect_same(vc2.get(), vc1.get(), what + " v cache");
      }
}

TEST_P(Op, Attention) {
  std::mt19937 rng(9);
  const int64_t H = 6, KV = 2, hd = 76;
  const float scale = 1.0f / std::sqrt((float)hd);
  struct Case {
    int64_t T, pos0;
  };
  // Decode past one 128-key block; prompts from 0, crossing a block, and a later chunk.
  for (const Case c : {Case{1, 300}, Case{1, 0}, Case{9, 0}, Case{140, 5}, Case{3, 130}}) {
    const int64_t ctx = c.pos0 + c.T + 3;
    const auto q = randf(rng, c.T * H * hd, -2.f, 2.f);
    auto kc = randf(rng, ctx * KV * hd, -1.f, 1.f), vc = randf(rng, ctx * KV * hd, -1.f, 1.f);
    // Cache rows past the chunk: never read.
    std::fill(kc.begin() + (c.pos0 + c.T) * KV * hd, kc.end(), NAN);
    std::fill(vc.begin() + (c.pos0 + c.T) * KV * hd, vc.end(), NAN);
    Dev<float> dq(be(), q, "q"), dk(be(), kc, "kc"), dv(be(), vc, "vc"), out(be(), c.T * H * hd, "attn out");
    be().attention(dq.p(), dk.p(), dv.p(), KvType::F32, c.T, c.pos0, H, KV, hd, scale, out.p());
    const auto want = ref::attention(q, kc, vc, c.T, c.pos0, H, KV, hd, scale);
    expect_err(max_err(out.get(), want, std::vector<double>(want.size(), 1.0)), bounds().attention,
               str("attention T=", c.T, " pos0=", c.pos0));
  }
}

// kv_store writes exactly its rows; an f16 cache (where the backend keeps one) holds the rounded
// values, and attention over it matches the reference on those rounded keys and values.
TEST_P(Op, KvStoreAndAttentionPerKvType) {
  std::mt19937 rng(15);
  const int64_t H = 4, KV = 2, hd = 40, width = KV * hd, ctx = 70, pos0 = 37, T = 9;
  const auto src = randf(rng, T * width, -1.5f, 1.5f);
  for (KvType t : {KvType::F32, KvType::F16}) {
    if (!be().supports_kv(t)) continue;
    const size_t eb = kv_elem_bytes(t);
    Dev<uint8_t> cache(be(), (size_t)ctx * width * eb, "kv cache");
    Dev<float> dsrc(be(), src, "src");
    be().kv_store(cache.p(), t, pos0, T, width, dsrc.p());
    const auto got = cache.get();
    std::vector<float> rounded(T * width);
    for (int64_t i = 0; i < T * width; ++i) {
      rounded[i] = t == KvType::F32 ? src[i] : fp16_to_f32(f32_to_fp16(src[i]));
      float v;
      if (t == KvType::F32)
        std::memcpy(&v, &got[(pos0 * width + i) * 4], 4);
      else {
        uint16_t h;
        std::memcpy(&h, &got[(pos0 * width + i) * 2], 2);
        v = fp16_to_f32(h);
      }
      ASSERT_EQ(v, rounded[i]) << kv_type_name(t) << " element " << i;
    }
    for (size_t i = 0; i < (size_t)pos0 * width * eb; ++i)
      ASSERT_EQ(got[i], kPoison) << "kv_store wrote before pos0";
    for (size_t i = (size_t)(pos0 + T) * width * eb; i < got.size(); ++i)
      ASSERT_EQ(got[i], kPoison) << "kv_store wrote past its rows";

    // Attention over caches filled by two stores (an earlier chunk, then this one; src is the
    // chunk's keys) matches the reference on the values the caches hold.
    const auto k0 = randf(rng, pos0 * width, -1.5f, 1.5f), v0 = randf(rng, pos0 * width, -1.5f, 1.5f),
               v1 = randf(rng, T * width, -1.5f, 1.5f), q = randf(rng, T * H * hd, -2.f, 2.f);
    Dev<uint8_t> kc(be(), (size_t)ctx * width * eb, "k cache"), vc(be(), (size_t)ctx * width * eb, "v cache");
    Dev<float> dk0(be(), k0, "k0"), dv0(be(), v0, "v0"), dv1(be(), v1, "v1"), dq(be(), q, "q");
    Dev<float> out(be(), T * H * hd, "attn out");
    be().kv_store(kc.p(), t, 0, pos0, width, dk0.p());
    be().kv_store(kc.p(), t, pos0, T, width, dsrc.p());
    be().kv_store(vc.p(), t, 0, pos0, width, dv0.p());
    be().kv_store(vc.p(), t, pos0, T, width, dv1.p());
    auto held = [&](const std::vector<float>& a, const std::vector<float>& b) {  // rows [0, pos0 + T)
      std::vector<float> r(a);
      r.insert(r.end(), b.begin(), b.end());
      if (t == KvType::F16)
        for (float& x : r) x = fp16_to_f32(f32_to_fp16(x));
      return r;
    };
    const float scale = 1.0f / std::sqrt((float)hd);
    be().attention(dq.p(), kc.p(), vc.p(), t, T, pos0, H, KV, hd, scale, out.p());
    const auto want = ref::attention(q, held(k0, src), held(v0, v1), T, pos0, H, KV, hd, scale);
    expect_err(max_err(out.get(), want, std::vector<double>(want.size(), 1.0)), bounds().attention,
               str("attention over an ", kv_type_name(t), " cache"));
  }
}

// A token's attention output does not depend on how the prompt was cut into chunks (DESIGN.md,
// invariant 4): a chunk at once, the same queries in two chunks, and one at a time as in decode
// give the same bits, on every KV type the backend keeps.
TEST_P(Op, AttentionIndependentOfChunking) {
  std::mt19937 rng(16);
  struct Shape {
    int64_t H, KV, hd;
  };
  // Query heads per kv head 4, 16 and 1; head dims of the GPU's decode kernel and one it leaves to the
  // general kernel (72).
  for (const Shape sh : {Shape{8, 2, 64}, Shape{32, 2, 128}, Shape{3, 3, 256}, Shape{4, 2, 72}})
    for (KvType t : {KvType::F32, KvType::F16}) {
      const int64_t H = sh.H, KV = sh.KV, hd = sh.hd, width = KV * hd, pos0 = 120, T = 19;  // crosses key 128
      const int64_t ctx = pos0 + T, first = 7;
      if (!be().supports_kv(t)) continue;
      const size_t eb = kv_elem_bytes(t);
      const auto k = randf(rng, ctx * width, -1.f, 1.f), v = randf(rng, ctx * width, -1.f, 1.f),
                 q = randf(rng, T * H * hd, -2.f, 2.f);
      Dev<uint8_t> kc(be(), (size_t)ctx * width * eb, "k cache"),
          vc(be(), (size_t)ctx * width * eb, "v cache");
      Dev<float> dk(be(), k, "k"), dv(be(), v, "v"), dq(be(), q, "q");
      be().kv_store(kc.p(), t, 0, ctx, width, dk.p());
      be().kv_store(vc.p(), t, 0, ctx, width, dv.p());
      const float scale = 1.0f / std::sqrt((float)hd);
      Dev<float> whole(be(), T * H * hd, "whole"), chunks(be(), T * H * hd, "chunks"),
          tokens(be(), T * H * hd, "tokens");
      be().attention(dq.p(), kc.p(), vc.p(), t, T, pos0, H, KV, hd, scale, whole.p());
      be().attention(dq.p(), kc.p(), vc.p(), t, first, pos0, H, KV, hd, scale, chunks.p());
      be().attention(dq.p() + first * H * hd, kc.p(), vc.p(), t, T - first, pos0 + first, H, KV, hd, scale,
                     chunks.p() + first * H * hd);
      for (int64_t i = 0; i < T; ++i)
        be().attention(dq.p() + i * H * hd, kc.p(), vc.p(), t, 1, pos0 + i, H, KV, hd, scale,
                       tokens.p() + i * H * hd);
      const auto w = whole.get();
      const std::string what = str(kv_type_name(t), ", H=", H, " KV=", KV, " hd=", hd);
      expect_same(chunks.get(), w, "attention in two chunks vs one, " + what);
      expect_same(tokens.get(), w, "attention token by token vs one chunk, " + what);
    }
}

// A prompt's attention is the same bits whichever prompt kernel the backend picks: on CUDA the tile
// kernel (head dims 64, 128, 256) against the general one (STRATA_CUDA_ATTN_TILE=0), over prompts of
// several query tiles and key blocks, query heads per kv head 8, 16, 1 and 6, and chunks that start
// inside a key block. (A backend with one prompt kernel runs it twice.)
TEST_P(Op, AttentionTileKernelIsTheGeneralOne) {
  std::mt19937 rng(61);
  struct Shape {
    int64_t H, KV, hd, T, pos0;
  };
  for (const Shape sh : {Shape{32, 4, 128, 300, 0}, Shape{16, 1, 64, 70, 200}, Shape{4, 4, 256, 140, 3},
                         Shape{12, 2, 128, 41, 129}})
    for (KvType t : {KvType::F32, KvType::F16}) {
      if (!be().supports_kv(t)) continue;
      const int64_t width = sh.KV * sh.hd, ctx = sh.pos0 + sh.T;
      const size_t eb = kv_elem_bytes(t);
      const auto k = randf(rng, ctx * width, -1.f, 1.f), v = randf(rng, ctx * width, -1.f, 1.f),
                 q = randf(rng, sh.T * sh.H * sh.hd, -2.f, 2.f);
      Dev<uint8_t> kc(be(), (size_t)ctx * width * eb, "k cache"),
          vc(be(), (size_t)ctx * width * eb, "v cache");
      Dev<float> dk(be(), k, "k"), dv(be(), v, "v"), dq(be(), q, "q");
      be().kv_store(kc.p(), t, 0, ctx, width, dk.p());
      be().kv_store(vc.p(), t, 0, ctx, width, dv.p());
      const float scale = 1.0f / std::sqrt((float)sh.hd);
      Dev<float> tile(be(), sh.T * sh.H * sh.hd, "tile"), general(be(), sh.T * sh.H * sh.hd, "general");
      be().attention(dq.p(), kc.p(), vc.p(), t, sh.T, sh.pos0, sh.H, sh.KV, sh.hd, scale, tile.p());
      setenv("STRATA_CUDA_ATTN_TILE", "0", 1);
      be().attention(dq.p(), kc.p(), vc.p(), t, sh.T, sh.pos0, sh.H, sh.KV, sh.hd, scale, general.p());
      unsetenv("STRATA_CUDA_ATTN_TILE");
      const auto g = general.get();
      const std::string what =
          str(kv_type_name(t), ", H=", sh.H, " KV=", sh.KV, " hd=", sh.hd, " T=", sh.T, " pos0=", sh.pos0);
      expect_same(tile.get(), g, "attention, tile kernel vs general, " + what);
      // And each token of it as a decode step computes it (the split kernel).
      Dev<float> one(be(), sh.H * sh.hd, "one");
      for (const int64_t i : {int64_t{0}, sh.T / 2, sh.T - 1}) {
        be().attention(dq.p() + i * sh.H * sh.hd, kc.p(), vc.p(), t, 1, sh.pos0 + i, sh.H, sh.KV, sh.hd,
                       scale, one.p());
        expect_same(one.get(),
                    std::vector<float>(g.begin() + i * sh.H * sh.hd, g.begin() + (i + 1) * sh.H * sh.hd),
                    str("attention, token ", i, " as a decode step, ", what));
      }
    }
}

TEST_P(Op, AddAndSwiglu) {
  std::mt19937 rng(10);
  const int64_t n = 1001;
  const auto x = randf(rng, n, -3.f, 3.f), y = randf(rng, n, -3.f, 3.f);
  Dev<float> dx(be(), x, "x"), dy(be(), y, "y");
  be().add(dx.p(), dy.p(), n);
  std::vector<float> sum(n);
  for (int64_t i = 0; i < n; ++i) sum[i] = x[i] + y[i];
  expect_same(dx.get(), sum, "add");  // exact: one IEEE addition

  const auto g = randf(rng, n, -12.f, 12.f), u = randf(rng, n, -2.f, 2.f);
  Dev<float> dg(be(), g, "g"), du(be(), u, "u");
  be().swiglu(dg.p(), du.p(), n);
  std::vector<double> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = g[i] / (1.0 + std::exp(-(double)g[i])) * u[i];
  expect_err(max_err(dg.get(), want, abs_of(want)), 1.5e-6, "swiglu");  // measured 1.5e-7
}

// swiglu_q8_0 is swiglu then quantize_q8_0, bit for bit: the gate rows and their q8_0 bytes (row
// stride past the blocks, whose gap stays untouched), a block of zeros (id = 0) among them.
TEST_P(Op, SwigluQ8IsItsSteps) {
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
TEST_P(Op, MatmulQ8ExpertsPairIsItsCalls) {
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
TEST_P(Op, MatmulQ8RunsIsMatmulQ8OnEachRun) {
  for (const bool mma : mma_q8_modes(be())) {
    const MmaQ8Env env(mma);
    std::mt19937 rng(41);
    ThreadPool pool(1);
    const std::vector<int64_t> lens = {3, 1, 16, 17, 40};
    const int64_t gap_after = 2;  // run 2 starts one row after run 1 ends
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
TEST_P(Op, MatmulRunsIsMatmulOnEachRun) {
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

TEST_P(Op, RouterTopk) {
  std::mt19937 rng(11);
  const int64_t E = 37, K = 5;
  for (int64_t T : kTs)
    for (bool norm : {false, true}) {
      // Logits on a 1/16 grid: many exact ties, and different values far apart after softmax.
      std::vector<float> logits(T * E);
      for (auto& v : logits) v = (float)((int)(rng() % 81) - 40) / 16.f;
      std::fill_n(logits.begin(), E, 0.5f);  // token 0: all tied, so ids 0..K-1
      if (T > 1) {  // token 1: three tied for the last two places, so ids 4 and 9 but not 30
        std::fill_n(logits.begin() + E, E, -3.f);
        for (int e : {2, 11, 20}) logits[E + e] = 2.f;
        for (int e : {30, 4, 9}) logits[E + e] = 1.f;
      }
      if (T > 2)  // token 2: distinct logits in [90, 99], where exp without subtracting the max overflows
        for (int64_t e = 0; e < E; ++e) logits[2 * E + e] = 90.f + (float)((e * 7) % E) / 4.f;
      Dev<float> dl(be(), logits, "logits"), wts(be(), T * K, "weights");
      Dev<int32_t> ids(be(), T * K, "ids");
      be().router_topk(dl.p(), T, E, K, norm, ids.p(), wts.p());
      std::vector<int32_t> want_ids;
      std::vector<double> want_w;
      ref::router_topk(logits, T, E, K, norm, &want_ids, &want_w);
      if (T > 1) {
        ASSERT_EQ(want_ids[K + 3] * 100 + want_ids[K + 4], 409) << "the reference's tie order";
      }
      const std::string what = str("router_topk T=", T, " norm=", norm);
      expect_same(ids.get(), want_ids, what);
      expect_err(max_err(wts.get(), want_w, abs_of(want_w)), 2e-6, what);  // measured 3.5e-7
    }
}

// route is its three steps bit for bit, on the fused path (one token, a float router on the GEMV
// path) and off it (more tokens, a prompt, a quantized router); the fused launch leaves its ticket
// zeroed, so the calls in a row each find the last block.
TEST_P(Op, RouteIsItsSteps) {
  std::mt19937 rng(34);
  struct Shape {
    int64_t E, D, K;
  };
  for (QType t : {QType::F32, QType::F16, QType::BF16, QType::Q8_0})
    for (const Shape sh :
         {Shape{128, 2048, 8}, Shape{7, 96, 3}, Shape{64, 512, 1}, Shape{300, 64, 300}, Shape{96, 256, 7}})
      for (Phase ph : {Phase::Decode, Phase::Prompt})
        for (int64_t T : {1, 3})
          for (bool norm : {false, true}) {
            const int64_t E = sh.E, D = sh.D, K = sh.K;
            auto wb = random_weights(t, E, D, rng);
            if (E == 96) {  // experts 2i and 2i + 1 alike: every logit tied with its neighbour's
              const size_t rb = row_bytes(t, D);
              for (int64_t r = 1; r < E; r += 2)
                std::copy_n(wb.begin() + (r - 1) * rb, rb, wb.begin() + r * rb);
            }
            Dev<uint8_t> W(be(), wb, "router");
            auto xs = randf(rng, T * D, -2.f, 2.f);
            if (E == 7) std::fill(xs.begin(), xs.end(), 0.f);  // every logit 0: ties everywhere
            Dev<float> x(be(), xs, "x");
            Dev<float> lg(be(), T * E, "logits"), lg1(be(), T * E, "logits"), w(be(), T * K, "w"),
                w1(be(), T * K, "w");
            Dev<int32_t> ids(be(), T * K, "ids"), ids1(be(), T * K, "ids"), off(be(), E + 1, "off"),
                off1(be(), E + 1, "off"), rows(be(), T * K, "rows"), rows1(be(), T * K, "rows");
            be().set_phase(ph);
            be().route((uint32_t)t, W.p(), E, D, x.p(), T, K, norm, lg.p(), ids.p(), w.p(), off.p(),
                       rows.p());
            be().matmul((uint32_t)t, W.p(), E, D, x.p(), D, T, lg1.p(), E);
            be().router_topk(lg1.p(), T, E, K, norm, ids1.p(), w1.p());
            be().group_by_expert(ids1.p(), T, K, E, off1.p(), rows1.p());
            be().set_phase(Phase::Any);
            const std::string what =
                str("route ", quant_traits(t).name, " E=", E, " D=", D, " K=", K, " T=", T, " norm=", norm,
                    ph == Phase::Decode ? " decode" : " prompt");
            expect_same(lg.get(), lg1.get(), what + " logits");
            expect_same(ids.get(), ids1.get(), what + " ids");
            expect_same(w.get(), w1.get(), what + " weights");
            expect_same(off.get(), off1.get(), what + " off");
            expect_same(rows.get(), rows1.get(), what + " rows");
          }
}

TEST_P(Op, GroupByExpertAndScatterAdd) {
  std::mt19937 rng(12);
  const int64_t E = 37, K = 4, D = 229;
  for (int64_t T : kTs) {
    // K distinct experts per token, as the router gives; experts 0, 17 and 36 get none.
    std::vector<int32_t> ids(T * K), experts;
    for (int32_t e = 1; e < E - 1; ++e)
      if (e != 17) experts.push_back(e);
    for (int64_t t = 0; t < T; ++t) {
      std::shuffle(experts.begin(), experts.end(), rng);
      std::copy_n(experts.begin(), K, &ids[t * K]);
    }
    Dev<int32_t> dids(be(), ids, "ids"), off(be(), E + 1, "off"), rows(be(), T * K, "rows");
    be().group_by_expert(dids.p(), T, K, E, off.p(), rows.p());
    std::vector<int32_t> want_off, want_rows;
    ref::group_by_expert(ids, T, K, E, &want_off, &want_rows);
    expect_same(off.get(), want_off, str("group_by_expert off T=", T));
    expect_same(rows.get(), want_rows, str("group_by_expert rows T=", T));

    // The MoE combine: K rows of every token, in expert order, onto a residual; then only the
    // first half of them (a partial pass).
    for (int64_t n : {T * K, T * K / 2}) {
      const auto y = randf(rng, n * D, -2.f, 2.f), w = randf(rng, T * K, 0.f, 1.f);
      const auto out0 = randf(rng, T * D, -2.f, 2.f);
      Dev<float> dy(be(), y, "y"), dw(be(), w, "w"), out(be(), out0, "out");
      Dev<int32_t> drows(be(), want_rows, "rows");
      be().scatter_add(dy.p(), drows.p(), dw.p(), K, n, D, out.p());
      std::vector<double> want(out0.begin(), out0.end()), mag(want.size());
      for (size_t i = 0; i < mag.size(); ++i) mag[i] = std::fabs(want[i]) + 1e-30;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < D; ++c) {
          const int64_t r = want_rows[i];
          want[r / K * D + c] += (double)w[r] * y[i * D + c];
          mag[r / K * D + c] += std::fabs((double)w[r] * y[i * D + c]);
        }
      expect_err(max_err(out.get(), want, mag), 1e-6,  // measured 1.7e-7
                 str("scatter_add T=", T, " n=", n));
    }
  }
}

TEST_P(Op, CopyZeroFill) {
  std::mt19937 rng(13);
  const size_t n = 1003;  // odd sizes at odd offsets
  std::vector<uint8_t> src(n);
  for (auto& b : src) b = (uint8_t)rng();
  Dev<uint8_t> dsrc(be(), src, "src"), dst(be(), n, "dst");
  be().copy(dst.p() + 3, dsrc.p() + 1, n - 5);
  std::vector<uint8_t> want(n, kPoison);
  std::copy_n(&src[1], n - 5, &want[3]);
  expect_same(dst.get(), want, "copy");

  dst.poison();
  be().zero(dst.p() + 3, n - 5);
  std::fill(want.begin(), want.end(), kPoison);
  std::fill_n(&want[3], n - 5, 0);
  expect_same(dst.get(), want, "zero");

  be().fill(dst.p() + 5, 0x3C, n - 9);
  std::fill_n(&want[5], n - 9, 0x3C);
  expect_same(dst.get(), want, "fill");
}

// An upload queued on the copy stream is visible to compute work ordered after its event, and
// to the host after event_sync.
TEST_P(Op, AsyncUploadOrderedByEvent) {
  std::mt19937 rng(14);
  const size_t n = 4099;
  PinnedBuffer pinned(be(), n, "pinned src");
  std::vector<uint8_t> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = pinned.get()[i] = (uint8_t)rng();
  Dev<uint8_t> a(be(), n, "async dst"), b(be(), n, "copy of it");
  Event e(be());
  EXPECT_TRUE(be().query(e.id())) << "an event never recorded is done";
  be().upload_async(a.p(), pinned.get(), n, Stream::Copy);
  e.record(Stream::Copy);
  be().wait(Stream::Compute, e.id());
  be().copy(b.p(), a.p(), n);
  e.sync();
  EXPECT_TRUE(e.done());
  expect_same(a.get(), want, "upload_async");
  expect_same(b.get(), want, "copy after wait");
}

// A row's matmul result does not depend on how many tokens the call had nor where the row sat, in
// each phase (invariant 4 on a backend whose kernels depend on the phase): rows of a 40-token call
// equal the same rows computed in calls of 1, 7, 9 and 17 tokens, bit for bit.
TEST_P(Op, MatmulRowsIndependentOfTokenCount) {
  std::mt19937 rng(17);
  const int64_t rows = 37, T = 40;
  for (Phase ph : {Phase::Prompt, Phase::Decode}) {
    be().set_phase(ph);
    for (QType t : kAllTypes) {
      const int64_t cols = cols_of(t), ldx = (cols + 3) / 4 * 4;
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
                    str("matmul ", quant_traits(t).name, " phase ", (int)ph, ": ", n, " tokens against 40"));
      }
    }
  }
  be().set_phase(Phase::Any);
}

// matmul_experts (and its q8_0 twin) find each row's expert through the table, resident at a stride
// or in permuted cache slots, and give per row the bits of the decode matmul on that expert's matrix.
TEST_P(Op, MatmulExpertsMatchesPerExpertMatmul) {
  std::mt19937 rng(18);
  const int64_t E = 5, K = 3, T = 2, n = T * K;
  be().set_phase(Phase::Decode);
  // Rows sorted by expert as group_by_expert leaves them: order[i] = t * K + k.
  const std::vector<int32_t> ids = {4, 0, 2, 2, 3, 0};  // token 0: 4 0 2; token 1: 2 3 0
  std::vector<int32_t> order(n);
  for (int32_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return ids[a] < ids[b]; });
  for (QType t : kAllTypes) {
    for (const bool slotted : {false, true}) {
      const int64_t rows = 37, cols = cols_of(t);
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
      be().matmul_experts((uint32_t)t, tab, m, rows, cols, dids.p(), dorder.p(), n, dx.p(), ldx, Y.p(), ldy);
      const auto y = Y.get();
      const std::string what =
          str("matmul_experts ", quant_traits(t).name, slotted ? " slotted" : " resident");
      for (int64_t i = 0; i < n; ++i) {
        Dev<uint8_t> dw(be(), W[ids[order[i]]], "W");
        Dev<float> yi(be(), rows, "Y row");
        be().matmul((uint32_t)t, dw.p(), rows, cols, dx.p() + i * ldx, ldx, 1, yi.p(), rows);
        expect_same(std::vector<float>(y.begin() + i * ldy, y.begin() + i * ldy + rows), yi.get(),
                    str(what, " row ", i));
      }
      expect_gaps_untouched(y, n, rows, ldy, what);
      if (uses_matmul_q8((uint32_t)t)) {
        const size_t xrb = cols / 32 * 34 + 2;
        std::vector<uint8_t> xq(n * xrb, kPoison);
        for (int64_t i = 0; i < n; ++i) ref::quantize_q8_0(&x[i * ldx], &xq[i * xrb], cols);
        Dev<uint8_t> dxq(be(), xq, "Xq");
        Y.poison();
        be().matmul_q8_experts((uint32_t)t, tab, m, rows, cols, dids.p(), dorder.p(), n, dxq.p(), xrb, Y.p(),
                               ldy);
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
          be().matmul_experts((uint32_t)t, tab, m, rows, cols, da.p(), dz.p(), 1, dx.p(), ldx, y1.p(), rows);
          for (float v : y1.get()) ASSERT_TRUE(std::isnan(v)) << what << ": an absent expert's row";
        }
      }
    }
  }
  be().set_phase(Phase::Any);
}

// With a position source the position ops add the device's int32 to pos0 as they run: the same bits
// as passing the position itself, for launches sized for any position below max_pos.
TEST_P(Op, PositionSourceMatchesHostPositions) {
  if (!be().supports_graphs()) {
    std::vector<int32_t> p = {3};
    Dev<int32_t> dp(be(), p, "pos");
    EXPECT_THROW(be().set_position_source(dp.p(), 10), UnsupportedError);
    return;
  }
  std::mt19937 rng(19);
  const int64_t H = 6, KV = 2, hd = 64, width = KV * hd, ctx = 300;
  const float scale = 1.0f / std::sqrt((float)hd);
  for (int32_t pos : {0, 5, 130, 299}) {
    const auto q = randf(rng, H * hd, -2.f, 2.f), k = randf(rng, width, -1.f, 1.f);
    auto kc = randf(rng, ctx * width, -1.f, 1.f), vc = randf(rng, ctx * width, -1.f, 1.f);
    std::vector<int32_t> p = {pos};
    Dev<int32_t> dp(be(), p, "pos");
    Dev<float> dq1(be(), q, "q"), dq2(be(), q, "q"), dk(be(), k, "k");
    Dev<float> kc1(be(), kc, "k cache"), kc2(be(), kc, "k cache"), dv(be(), vc, "v cache");
    Dev<float> o1(be(), H * hd, "out"), o2(be(), H * hd, "out");
    const RopeParams rope{hd, 1e6f, true};
    be().head_norm_rope(dq1.p(), 1, H, hd, nullptr, 1e-6f, pos, rope);
    be().kv_store(kc1.p(), KvType::F32, pos, 1, width, dk.p());
    be().attention(dq1.p(), kc1.p(), dv.p(), KvType::F32, 1, pos, H, KV, hd, scale, o1.p());
    be().set_position_source(dp.p(), ctx);
    be().head_norm_rope(dq2.p(), 1, H, hd, nullptr, 1e-6f, 0, rope);
    be().kv_store(kc2.p(), KvType::F32, 0, 1, width, dk.p());
    be().attention(dq2.p(), kc2.p(), dv.p(), KvType::F32, 1, 0, H, KV, hd, scale, o2.p());
    be().set_position_source(nullptr, 0);
    expect_same(dq2.get(), dq1.get(), str("head_norm_rope from the position source at ", pos));
    expect_same(kc2.get(), kc1.get(), str("kv_store from the position source at ", pos));
    expect_same(o2.get(), o1.get(), str("attention from the position source at ", pos));
  }
}

// A recorded graph replays its work on what its pinned inputs hold at launch time; the uploads and
// downloads recorded in it move the bytes then.
TEST_P(Op, GraphReplaysWithNewInputs) {
  if (!be().supports_graphs()) {
    EXPECT_THROW(be().capture_begin(), UnsupportedError);
    return;
  }
  const int64_t n = 1000;
  PinnedBuffer in(be(), n * sizeof(float), "in"), out(be(), n * sizeof(float), "out");
  Dev<float> a(be(), n, "a"), b(be(), n, "b");
  b.set(std::vector<float>(n, 0.5f));
  be().capture_begin();
  be().upload(a.p(), in.get(), n * sizeof(float));
  be().add(a.p(), b.p(), n);
  be().download(out.get(), a.p(), n * sizeof(float));
  Graph g(be(), be().capture_end());
  for (float base : {1.0f, -7.0f, 100.0f}) {
    auto* pi = reinterpret_cast<float*>(in.get());
    for (int64_t i = 0; i < n; ++i) pi[i] = base + (float)i;
    g.launch();
    be().sync();
    const auto* po = reinterpret_cast<const float*>(out.get());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(po[i], base + (float)i + 0.5f) << "replay with base " << base;
  }
}

// resolve_experts: the backend's resolution of a layer's experts against the sequential reference
// on the same random state (some slots pinned, some empty, some holding other layers' experts, ties
// in the ticks), over several calls: the same table, keys, ticks, counters, job list and slot bytes.
TEST_P(Op, ResolveExpertsMatchesReference) {
  std::mt19937 rng(20);
  const int64_t L = 3, E = 11, S = 9;
  // Each expert of the source: 3 segments of the slot image, 16-byte multiples and not.
  for (const bool odd : {false, true}) {
    const size_t seg[3] = {odd ? 37u : 64u, odd ? 101u : 128u, odd ? 3u : 48u};
    const size_t off[3] = {0, 80, 224}, slot_bytes = 288;
    const size_t stride = seg[0] + seg[1] + seg[2];
    PinnedBuffer src(be(), L * E * stride + 64, "expert source");
    for (size_t i = 0; i < L * E * stride + 64; ++i) src.get()[i] = (uint8_t)rng();
    // Host state, mirrored on the device.
    std::vector<int32_t> table(L * E, -1), key(S, -1);
    std::vector<uint64_t> last(S, 0);
    std::vector<uint8_t> held(S, 0), pinned(S, 0), pref(S, 0), arena(S * slot_bytes, 0);
    for (int32_t s = 0; s < (int32_t)S; ++s) {
      if (s % 4 == 3) continue;  // empty
      int32_t k;
      do k = (int32_t)(rng() % (L * E));
      while (table[k] >= 0);
      table[k] = s;
      key[s] = k;
      last[s] = 1 + rng() % 5;  // ties
    }
    pinned[1] = 1;
    uint64_t tick = 10, counters[kResolveCounters] = {};
    Dev<int32_t> dtable(be(), table, "table"), dkey(be(), key, "key");
    Dev<uint64_t> dlast(be(), last, "last"), dtick(be(), std::vector<uint64_t>{tick}, "tick"),
        dcounters(be(), std::vector<uint64_t>(kResolveCounters, 0), "counters");
    Dev<uint8_t> dheld(be(), held, "held"), dpinned(be(), pinned, "pinned"), dpref(be(), pref, "pref"),
        darena(be(), arena, "arena");
    Dev<int32_t> djobs(be(), std::vector<int32_t>(1 + 2 * E, 0), "jobs");
    const uint8_t* view = static_cast<const uint8_t*>(be().device_view(src.get()));
    ASSERT_NE(view, nullptr) << "pinned memory has no device view";
    // Every third call a prefetch, and the call after it resolves what it prefetched (its fills used);
    // the other calls evict some prefetched slots before any use (wasted).
    std::vector<int32_t> ids(4);
    int64_t layer = 0;
    for (int call = 0; call < 9; ++call) {
      const int64_t n = 4;
      const bool prefetch = call % 3 == 1, after = call % 3 == 2;
      if (!after) {
        layer = (call / 3 + call) % L;
        for (auto& e : ids) e = (int32_t)(rng() % E);
        ids[3] = ids[0];  // named twice
      }
      std::vector<int32_t> order(n);
      for (int32_t i = 0; i < n; ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return ids[a] < ids[b]; });
      Dev<int32_t> dids(be(), ids, "ids"), dorder(be(), order, "order");
      ExpertResolve r;
      r.prefetch = prefetch;
      r.layer = layer;
      r.E = E;
      r.n_slots = S;
      r.n = n;
      r.slot_bytes = slot_bytes;
      r.layer_bytes = stride;
      for (int m = 0; m < 3; ++m) {
        r.src_stride[m] = stride;
        r.bytes[m] = seg[m];
        r.off[m] = off[m];
      }
      // The reference on host memory.
      std::vector<int32_t> jobs(1 + 2 * E, 0);
      ExpertResolve h = r;
      h.ids = ids.data();
      h.order = order.data();
      h.table = table.data();
      h.key = key.data();
      h.last = last.data();
      h.tick = &tick;
      h.held = held.data();
      h.pinned = pinned.data();
      h.counters = counters;
      h.jobs = jobs.data();
      h.pref = pref.data();
      h.arena = arena.data();
      size_t o = layer * E * stride;
      for (int m = 0; m < 3; ++m) h.src[m] = src.get() + o, o += seg[m];
      resolve_experts_reference(h, [](void* d, const void* x, size_t k) { std::memcpy(d, x, k); });
      // The backend on its memory.
      ExpertResolve d = r;
      d.ids = dids.p();
      d.order = dorder.p();
      d.table = dtable.p();
      d.key = dkey.p();
      d.last = dlast.p();
      d.tick = dtick.p();
      d.held = dheld.p();
      d.pinned = dpinned.p();
      d.counters = dcounters.p();
      d.jobs = djobs.p();
      d.pref = dpref.p();
      d.arena = darena.p();
      o = layer * E * stride;
      for (int m = 0; m < 3; ++m) d.src[m] = view + o, o += seg[m];
      be().resolve_experts(d);
      const std::string what = str("resolve_experts call ", call, prefetch ? " (prefetch)" : "",
                                   odd ? " (unaligned segments)" : "");
      expect_same(dpref.get(), pref, what + ": prefetched slots");
      expect_same(dtable.get(), table, what + ": table");
      expect_same(dkey.get(), key, what + ": keys");
      expect_same(dlast.get(), last, what + ": ticks");
      expect_same(dtick.get(), std::vector<uint64_t>{tick}, what + ": clock");
      expect_same(dheld.get(), held, what + ": held (all clear)");
      expect_same(dcounters.get(), std::vector<uint64_t>(counters, counters + kResolveCounters),
                  what + ": counters");
      const auto dj = djobs.get();
      expect_same(std::vector<int32_t>(dj.begin(), dj.begin() + 1 + 2 * jobs[0]),
                  std::vector<int32_t>(jobs.begin(), jobs.begin() + 1 + 2 * jobs[0]), what + ": jobs");
      expect_same(darena.get(), arena, what + ": slot bytes");
    }
    EXPECT_GT(counters[1], 0u) << "no miss: the fill was not exercised";
    EXPECT_GT(counters[3], 0u) << "no eviction";
    EXPECT_GT(counters[5], 0u) << "no prefetch fill";
    EXPECT_GT(counters[6], 0u) << "no prefetched expert used";
    EXPECT_EQ(counters[8], counters[5] * stride) << "prefetch bytes";
  }
}

#if defined(STRATA_HAVE_CUDA)
// Without a GPU (or a driver) the CUDA backend is an UnsupportedError with a one-line reason.
TEST(CudaBackend, NoDeviceIsUnsupported) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  try {
    make_cuda_backend(0);
    ADD_FAILURE() << "make_cuda_backend succeeded without a device";
  } catch (const UnsupportedError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("no CUDA device: ", 0), 0u) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

TEST(CudaBackend, NamesItsDeviceAndRejectsOthers) {
  const int n = cuda_device_count();
  if (n == 0) GTEST_SKIP() << "no GPU";
  auto be = make_cuda_backend(0);
  EXPECT_STREQ(be->name(), "cuda");
  const std::string d = be->describe();
  EXPECT_NE(d.find(" GiB free of "), std::string::npos) << d;
  EXPECT_NE(d.find(", sm_"), std::string::npos) << d;
  EXPECT_EQ(cuda_device_describe(0).substr(0, d.find(',')), d.substr(0, d.find(',')));
  EXPECT_THROW(make_cuda_backend(n), ConfigError);
  EXPECT_TRUE(be->supports_kv(KvType::F32) && be->supports_kv(KvType::F16));
}
#endif

TEST_P(Op, LiveAllocationsReturnToStart) {
  const size_t start = be().live_allocations();
  {
    DeviceBuffer a(be(), 100, "a"), b(be(), 1, "b");
    PinnedBuffer p(be(), 100, "p");
    EXPECT_EQ(be().live_allocations(), start + 3);
    DeviceBuffer moved = std::move(a);
    PinnedBuffer pmoved = std::move(p);
    EXPECT_EQ(be().live_allocations(), start + 3);
    b.reset();
    EXPECT_EQ(be().live_allocations(), start + 2);
  }
  EXPECT_EQ(be().live_allocations(), start);
}

}  // namespace
