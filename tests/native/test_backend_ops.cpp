// The op harness: every op of the Backend interface, on every backend under test, against the plain
// references of backend_ops_ref.h, on fresh random inputs at awkward shapes. Data goes through the
// backend's own memory; outputs are poisoned first and followed by a guard tail that must survive.
// The matmul ops are in test_backend_ops_matmul.cpp, attention's in test_backend_ops_attention.cpp, each
// architecture's own ops in test_backend_ops_<arch>.cpp.
#include <tuple>

#include "backend_ops_harness.h"
#include "core/thread_pool.h"

namespace {

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
  // Every backend's bits: swiglu_portable's (an expert computed on either side of the link is the same).
  std::vector<float> same(n);
  for (int64_t i = 0; i < n; ++i) same[i] = swiglu_portable(g[i], u[i]);
  expect_same(dg.get(), same, "swiglu against swiglu_portable");
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
  // On a GPU the fused launch with 4 warps a block (the default) and STRATA_CUDA_ROUTE_WARPS 1 and 2.
  for (const char* warps : {"4", "2", "1"}) {
    const ScopedEnv env("STRATA_CUDA_ROUTE_WARPS", warps);
    SCOPED_TRACE(str("STRATA_CUDA_ROUTE_WARPS=", warps));
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
}

// The backend's group_by_expert of ids against the reference (offsets and rows, bit for bit); returns the
// rows.
std::vector<int32_t> expect_group_by_expert(Backend& be, const std::vector<int32_t>& ids, int64_t T,
                                            int64_t K, int64_t E, const std::string& what) {
  Dev<int32_t> dids(be, ids, "ids"), off(be, E + 1, "off"), rows(be, T * K, "rows");
  be.group_by_expert(dids.p(), T, K, E, off.p(), rows.p());
  std::vector<int32_t> want_off, want_rows;
  ref::group_by_expert(ids, T, K, E, &want_off, &want_rows);
  expect_same(off.get(), want_off, "group_by_expert off " + what);
  expect_same(rows.get(), want_rows, "group_by_expert rows " + what);
  return want_rows;
}

TEST_P(Op, GroupByExpertAndScatterAdd) {
  // On a GPU both placements of the sort (one warp, and STRATA_CUDA_SORT_PARALLEL=1's eight): the same
  // output.
  for (const char* parallel : {"0", "1"}) {
    const ScopedEnv env("STRATA_CUDA_SORT_PARALLEL", parallel);
    SCOPED_TRACE(str("STRATA_CUDA_SORT_PARALLEL=", parallel));
    std::mt19937 rng(12);
    const int64_t E = 37, K = 4, D = 229;
    // kTs, and 2100 tokens: 8400 rows, three of a GPU sort's 4096-item tiles, each placed by 8 warps.
    std::vector<int64_t> Ts(std::begin(kTs), std::end(kTs));
    Ts.push_back(2100);
    for (int64_t T : Ts) {
      // K distinct experts per token, as the router gives; experts 0, 17 and 36 get none.
      std::vector<int32_t> ids(T * K), experts;
      for (int32_t e = 1; e < E - 1; ++e)
        if (e != 17) experts.push_back(e);
      for (int64_t t = 0; t < T; ++t) {
        std::shuffle(experts.begin(), experts.end(), rng);
        std::copy_n(experts.begin(), K, &ids[t * K]);
      }
      const std::vector<int32_t> want_rows = expect_group_by_expert(be(), ids, T, K, E, str("T=", T));

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
        // Each token's rows added in the order they come (i ascending), as float: the same bits on every
        // backend (a GPU sorts the rows by token stably to get there).
        std::vector<float> want_f(out0);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t c = 0; c < D; ++c) {
            const int64_t r = want_rows[i];
            float& o = want_f[r / K * D + c];
            o = o + w[r] * y[i * D + c];
          }
        expect_same(out.get(), want_f, str("scatter_add T=", T, " n=", n, " in row order"));
      }
    }
  }
}

// group_by_expert over many bins: more than a GPU sort block's 1,024 threads, up to the 4,096 experts its
// one-warp placement takes in 48 KiB (the eight-warp placement fits up to 682 bins and leaves wider sorts to
// one warp), with 1,100 tokens (4,400 rows: two 4,096-item tiles) routed to a skewed subset.
TEST_P(Op, GroupByExpertManyExperts) {
  for (const char* parallel : {"0", "1"}) {
    const ScopedEnv env("STRATA_CUDA_SORT_PARALLEL", parallel);
    SCOPED_TRACE(str("STRATA_CUDA_SORT_PARALLEL=", parallel));
    std::mt19937 rng(21);
    for (int64_t E : {600, 1500, 4096}) {
      const int64_t T = 1100, K = 4;
      std::vector<int32_t> ids(T * K);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t k = 0; k < K; ++k) {
          // Distinct per token: expert (t * 7 + k * (E / K)) % E, skewed towards the low ids half the time.
          const int64_t e = (rng() % 2 ? (t * 7) % (E / 8) : t * 7) + k * (E / K);
          ids[t * K + k] = (int32_t)(e % E);
        }
      expect_group_by_expert(be(), ids, T, K, E, str("E=", E));
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
// in the ticks), over several calls: the same table, keys, ticks, counters, job list and slot bytes; with
// write-through (the calls that are not prefetches), the same pending flags and no fill of those misses;
// with a budget (prefetches fill at most one expert, walking the ids in their own order), the same choice.
// Calls of 4, 8 and 300 experts (a GPU walks up to 256 with each expert's slot loaded first, more one at a
// time), and on a GPU again with STRATA_CUDA_RESOLVE_PRELOAD=0 (one at a time always).
void resolve_experts_matches_reference(Backend& backend) {
  const auto be = [&]() -> Backend& { return backend; };
  std::mt19937 rng(20);
  const int64_t L = 3, E = 11, S = 9;
  // Each expert of the source: 3 segments of the slot image, 16-byte multiples and not; LRU, and the
  // scan policy (its ranks from slots used in this pass, the previous one at layers behind and ahead,
  // and earlier ones; calls for a lower layer begin passes).
  for (const auto& [odd, scan, wt, budget] :
       std::vector<std::tuple<bool, bool, bool, bool>>{{false, false, false, false},
                                                       {true, false, false, false},
                                                       {false, true, false, false},
                                                       {true, true, false, false},
                                                       {false, false, true, false},
                                                       {true, true, true, false},
                                                       {false, false, true, true}}) {
    uint64_t fills_before = 0;
    bool cleared = false;  // some call found an earlier write-through's slot resident (or refilled it)
    bool marked = false;   // some call left a miss to write through
    const size_t seg[3] = {odd ? 37u : 64u, odd ? 101u : 128u, odd ? 3u : 48u};
    const size_t off[3] = {0, 80, 224}, slot_bytes = 288;
    const size_t stride = seg[0] + seg[1] + seg[2];
    PinnedBuffer src(be(), L * E * stride + 64, "expert source");
    for (size_t i = 0; i < L * E * stride + 64; ++i) src.get()[i] = (uint8_t)rng();
    // Host state, mirrored on the device.
    std::vector<int32_t> table(L * E, -1), key(S, -1);
    std::vector<uint64_t> last(S, 0), pass(S, 0), scan_now{5, 1};
    std::vector<int64_t> pass_layer(S, 0);
    std::vector<uint8_t> held(S, 0), pinned(S, 0), pref(S, 0), arena(S * slot_bytes, 0), pending(S, 0);
    pending[0] = 1;  // a write-through of an earlier call: cleared by the next call that finds it
    for (int32_t s = 0; s < (int32_t)S; ++s) {
      if (s % 4 == 3) continue;  // empty
      int32_t k;
      do k = (int32_t)(rng() % (L * E));
      while (table[k] >= 0);
      table[k] = s;
      key[s] = k;
      last[s] = 1 + rng() % 5;  // ties
      pass[s] = 3 + rng() % 3;  // stale, the previous pass, this one
      pass_layer[s] = (int64_t)(rng() % L);
    }
    pinned[1] = 1;
    uint64_t tick = 10, counters[kResolveCounters] = {};
    Dev<int32_t> dtable(be(), table, "table"), dkey(be(), key, "key");
    Dev<uint64_t> dlast(be(), last, "last"), dtick(be(), std::vector<uint64_t>{tick}, "tick"),
        dcounters(be(), std::vector<uint64_t>(kResolveCounters, 0), "counters");
    Dev<uint8_t> dheld(be(), held, "held"), dpinned(be(), pinned, "pinned"), dpref(be(), pref, "pref"),
        darena(be(), arena, "arena"), dpending(be(), pending, "pending");
    Dev<uint64_t> dpass(be(), pass, "pass"), dscan_now(be(), scan_now, "scan_now");
    Dev<int64_t> dpass_layer(be(), pass_layer, "pass_layer");
    Dev<int32_t> djobs(be(), std::vector<int32_t>(1 + 2 * E, 0), "jobs");
    const uint8_t* view = static_cast<const uint8_t*>(be().device_view(src.get()));
    ASSERT_NE(view, nullptr) << "pinned memory has no device view";
    // Every third call a prefetch, and the call after it resolves what it prefetched (its fills used);
    // the other calls evict some prefetched slots before any use (wasted).
    std::vector<int32_t> ids;
    int64_t layer = 0;
    for (int call = 0; call < 9; ++call) {
      const int64_t n = call < 3 ? 300 : call < 6 ? 8 : 4;
      const bool prefetch = call % 3 == 1, after = call % 3 == 2;
      if (!after) {
        layer = (call / 3 + call) % L;
        ids.resize(n);
        for (auto& e : ids) e = (int32_t)(rng() % E);
        ids[3] = ids[0];  // named twice
      }
      std::vector<int32_t> order(n);
      for (int32_t i = 0; i < n; ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return ids[a] < ids[b]; });
      Dev<int32_t> dids(be(), ids, "ids"), dorder(be(), order, "order");
      ExpertResolve r;
      r.prefetch = prefetch;
      if (budget && prefetch) r.max_fills = 1, r.ranked = true;
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
      if (wt) h.pending = pending.data(), h.write_through = !prefetch;
      if (scan) h.pass = pass.data(), h.pass_layer = pass_layer.data(), h.scan_now = scan_now.data();
      size_t o = layer * E * stride;
      for (int m = 0; m < 3; ++m) h.src[m] = src.get() + o, o += seg[m];
      const std::vector<uint8_t> pending_before = pending;
      resolve_experts_reference(h, [](void* d, const void* x, size_t k) { std::memcpy(d, x, k); });
      for (size_t s = 0; s < S; ++s) cleared = cleared || (pending_before[s] && !pending[s]);
      for (size_t s = 0; s < S; ++s) marked = marked || (!pending_before[s] && pending[s]);
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
      if (wt) d.pending = dpending.p(), d.write_through = !prefetch;
      if (scan) d.pass = dpass.p(), d.pass_layer = dpass_layer.p(), d.scan_now = dscan_now.p();
      o = layer * E * stride;
      for (int m = 0; m < 3; ++m) d.src[m] = view + o, o += seg[m];
      be().resolve_experts(d);
      const std::string what = str("resolve_experts call ", call, prefetch ? " (prefetch)" : "",
                                   odd ? " (unaligned segments)" : "", scan ? " (scan)" : "",
                                   wt ? " (write-through)" : "", budget ? " (budget)" : "");
      if (budget && prefetch) EXPECT_LE(counters[5] - fills_before, 1u) << what << ": the budget of one fill";
      fills_before = counters[5];
      expect_same(dpending.get(), pending, what + ": pending");
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
      if (scan) {
        expect_same(dpass.get(), pass, what + ": passes");
        expect_same(dpass_layer.get(), pass_layer, what + ": layers");
        expect_same(dscan_now.get(), scan_now, what + ": pass and layer now");
      }
    }
    if (scan) EXPECT_GT(scan_now[0], 5u) << "no call began a pass";
    if (wt) EXPECT_TRUE(marked) << "no miss left to write through";
    if (wt) EXPECT_TRUE(cleared) << "no call cleared an earlier write-through's flag";
    EXPECT_GT(counters[1], 0u) << "no miss: the fill was not exercised";
    EXPECT_GT(counters[3], 0u) << "no eviction";
    EXPECT_GT(counters[5], 0u) << "no prefetch fill";
    EXPECT_GT(counters[6], 0u) << "no prefetched expert used";
    EXPECT_EQ(counters[8], counters[5] * stride) << "prefetch bytes";
  }
}

TEST_P(Op, ResolveExpertsMatchesReference) {
  for (const char* preload : {"1", "0"}) {
    SCOPED_TRACE(str("STRATA_CUDA_RESOLVE_PRELOAD=", preload));
    const ScopedEnv env("STRATA_CUDA_RESOLVE_PRELOAD", preload);
    resolve_experts_matches_reference(be());
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
