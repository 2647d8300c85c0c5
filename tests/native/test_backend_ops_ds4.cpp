// The op harness for DeepSeek V4's backend ops: hyper-connections, norms and RoPE, the cache rings,
// the compressor's pooling, the indexer, attention with a sink, routing and the clamped SwiGLU, on
// every backend under test against backend_ops_ref_ds4.h at awkward shapes, outputs poisoned.
#include "backend/ds4_ops.h"
#include "backend_ops_harness.h"
#include "backend_ops_ref_ds4.h"
#include "forwarding_backend.h"
#include "model/arch.h"
#include "quant/formats.h"

namespace {

class Ds4Op : public ArchOp<Ds4Ops, ds4_ops> {};

INSTANTIATE_TEST_SUITE_P(BackendOps, Ds4Op, testing::ValuesIn(backends_under_test()),
                         [](const testing::TestParamInfo<BackendFactory>& i) { return i.param.name; });

TEST_P(Ds4Op, ApplyNormHcAndQuantize) {
  std::mt19937 rng(31);
  for (int64_t HC : {1, 4})
    for (int64_t T : {1, 5, 33}) {
      const int64_t D = 96, K = 3, n = T * K;
      const auto x = randf(rng, T * HC * D, -2.f, 2.f), g = randf(rng, T * HC, 0.1f, 1.f),
                 w = randf(rng, D, .5f, 1.5f);
      auto rows = randi(rng, n, (int32_t)n);
      Dev<float> dx(be(), x, "x"), dg(be(), g, "grs"), dw(be(), w, "w"), out(be(), n * D, "out");
      Dev<int32_t> dr(be(), rows, "rows");
      ops().apply_norm_hc(dx.p(), dg.p(), dw.p(), D, HC, dr.p(), K, n, out.p());
      std::vector<double> want, scale;
      ref::apply_norm_hc(x, g, w, D, HC, rows.data(), K, n, want, scale);
      const auto got = out.get();
      expect_err(max_err(got, want, scale), 4e-7, str("apply_norm_hc HC=", HC, " T=", T));  // measured 1.4e-7
      if (HC == 1) {  // one stream: apply_norm itself
        Dev<float> one(be(), n * D, "apply_norm");
        be().apply_norm(dx.p(), dg.p(), dw.p(), D, dr.p(), K, n, one.p());
        expect_same(got, one.get(), "apply_norm_hc HC=1 == apply_norm");
      }
      // q8_0 of the same rows, summed over the streams in order as backend.h says: bit for bit.
      const size_t rb = D / kQK8_0 * kQ8_0Bytes + 6;  // padded rows
      Dev<uint8_t> q(be(), n * rb, "xq");
      ops().quantize_q8_0_hc(dx.p(), dg.p(), dw.p(), D, HC, dr.p(), K, n, q.p(), rb);
      const auto gq = q.get();
      std::vector<float> row(D);
      std::vector<uint8_t> wq(D / kQK8_0 * kQ8_0Bytes);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t s = rows[i] / K;
        for (int64_t c = 0; c < D; ++c) {
          float acc = x[(s * HC) * D + c] * g[s * HC];
          for (int64_t j = 1; j < HC; ++j) acc = acc + x[(s * HC + j) * D + c] * g[s * HC + j];
          row[c] = acc * w[c];
        }
        ref::quantize_q8_0(row.data(), wq.data(), D);
        ASSERT_EQ(std::memcmp(wq.data(), &gq[i * rb], wq.size()), 0) << "quantize_q8_0_hc row " << i;
      }
    }
}

TEST_P(Ds4Op, HcPreWeightsAndSinkhorn) {
  std::mt19937 rng(32);
  const int64_t HC = 4, M = (2 + HC) * HC;
  // D = 57: hc_pre_kernel<4>; 100 and 4096 (V4 Flash's): the float4 kernel, its Sinkhorn by a warp.
  for (int64_t D : {57, 100, 4096})
    for (bool head : {false, true})
      for (int64_t iters : {1, 20})
        for (int64_t T : {1, 3, 17}) {
          const int64_t m = head ? HC : M;
          const auto x = randf(rng, T * HC * D, -3.f, 3.f), mix = randf(rng, T * m, -20.f, 20.f);
          const auto scale = randf(rng, 3, .5f, 1.5f), base = randf(rng, m, -1.f, 1.f);
          Dev<float> dx(be(), x, "x"), dm(be(), mix, "mix"), ds(be(), scale, "scale"), db(be(), base, "base");
          Dev<float> grs(be(), T * HC, "grs"), post(be(), T * HC, "post"), comb(be(), T * HC * HC, "comb");
          ops().hc_pre(dm.p(), dx.p(), T, HC, D, 1e-6f, ds.p(), db.p(), 1e-6f, iters, grs.p(),
                       head ? nullptr : post.p(), head ? nullptr : comb.p());
          const auto gg = grs.get(), gp = post.get(), gc = comb.get();
          double err = 0;
          for (int64_t t = 0; t < T; ++t) {
            std::vector<double> rg, rp, rc;
            ref::hc_pre(&mix[t * m], &x[t * HC * D], HC, D, 1e-6, scale.data(), base.data(), 1e-6, iters,
                        head, rg, rp, rc);
            for (int64_t j = 0; j < HC; ++j)
              err = std::max(err, std::fabs(gg[t * HC + j] - rg[j]) / std::fabs(rg[j]));
            if (head) continue;
            for (int64_t j = 0; j < HC; ++j)
              err = std::max(err, std::fabs(gp[t * HC + j] - rp[j]) / std::fabs(rp[j]));
            for (int64_t j = 0; j < HC * HC; ++j)
              err = std::max(err, std::fabs(gc[t * HC * HC + j] - rc[j]) / rc[j]);
          }
          if (head) {  // the head writes neither post nor comb
            for (float v : gp) ASSERT_TRUE(std::isnan(v)) << "hc_pre (head) wrote post";
          }
          // The RMS sum of HC D positive squares is within HC D 2^-24 of its exact value in any order (the
          // serial chain's bound), so r = 1 / rms within half that; the weights see r through the logits
          // mix r scale, which amplify its relative error by |mix| max(scale) r <= 20 * 1.5 / 1.7 (rms of
          // U(-3, 3): sqrt 3): that first-order bound, or what D = 57 measured (5.9e-6) with room, whichever
          // is larger.
          const double sum_bound = 20.0 * 1.5 / std::sqrt(3.0) * (HC * D) * std::ldexp(1.0, -24);
          expect_err(err, std::max(2e-5, sum_bound),
                     str("hc_pre D=", D, " head=", head, " iters=", iters, " T=", T));
        }
}

// The mix of a site's few F32 rows against long stream rows, against a float64 reference: any order of
// the K products' float sums is within K * 2^-24 of sum |fn x| (the bound of a serial chain, the worst
// order); and a token's row is the same bits whatever T (the decode step's and a prompt's).
TEST_P(Ds4Op, HcMixAnyTokenCount) {
  std::mt19937 rng(37);
  for (int64_t K : {57 * 4, 1030, 16384}) {
    const int64_t M = 24, T = 5;
    const auto fn = randf(rng, M * K, -1.f, 1.f), x = randf(rng, T * K, -3.f, 3.f);
    Dev<float> dfn(be(), fn, "fn"), dx(be(), x, "x"), mix(be(), T * M, "mix"), one(be(), M, "mix t=2");
    ops().hc_mix(static_cast<uint32_t>(QType::F32), dfn.p(), M, K, dx.p(), T, mix.p());
    std::vector<double> want(T * M), scale(T * M);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t m = 0; m < M; ++m) {
        double v = 0, a = 0;
        for (int64_t k = 0; k < K; ++k) {
          v += (double)fn[m * K + k] * x[t * K + k];
          a += std::fabs((double)fn[m * K + k] * x[t * K + k]);
        }
        want[t * M + m] = v;
        scale[t * M + m] = a;
      }
    const auto got = mix.get();
    expect_err(max_err(got, want, scale), K * std::ldexp(1.0, -24), str("hc_mix K=", K));
    ops().hc_mix(static_cast<uint32_t>(QType::F32), dfn.p(), M, K, dx.p() + 2 * K, 1, one.p());
    expect_same(one.get(), std::vector<float>(got.begin() + 2 * M, got.begin() + 3 * M),
                str("hc_mix K=", K, " T=1"));
  }
}

TEST_P(Ds4Op, HcPostAndExpand) {
  std::mt19937 rng(33);
  for (int64_t HC : {1, 4})
    for (int64_t T : {1, 9}) {
      const int64_t D = 71;
      const auto x = randf(rng, T * HC * D, -2.f, 2.f), y = randf(rng, T * D, -2.f, 2.f);
      const auto post = randf(rng, T * HC, 0.f, 2.f), comb = randf(rng, T * HC * HC, 0.f, 1.f);
      Dev<float> dx(be(), x, "x"), dy(be(), y, "y"), dp(be(), post, "post"), dc(be(), comb, "comb");
      ops().hc_post(dx.p(), dy.p(), dp.p(), dc.p(), T, HC, D);
      std::vector<double> want(T * HC * D), scale(T * HC * D);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t k = 0; k < HC; ++k)
          for (int64_t d = 0; d < D; ++d) {
            double v = (double)post[t * HC + k] * y[t * D + d], s = std::fabs(v);
            for (int64_t j = 0; j < HC; ++j) {
              const double c = (double)comb[(t * HC + j) * HC + k] * x[(t * HC + j) * D + d];
              v += c;
              s += std::fabs(c);
            }
            want[(t * HC + k) * D + d] = v;
            scale[(t * HC + k) * D + d] = std::max(s, 1e-30);
          }
      expect_err(max_err(dx.get(), want, scale), 1e-6, str("hc_post HC=", HC, " T=", T));  // measured 1.5e-7
      Dev<float> e(be(), T * HC * D, "expand");
      ops().hc_expand(dy.p(), T, HC, D, e.p());
      std::vector<float> we(T * HC * D);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < HC; ++j) std::copy_n(&y[t * D], D, &we[(t * HC + j) * D]);
      expect_same(e.get(), we, "hc_expand");
    }
}

TEST_P(Ds4Op, RmsNormAndRopeTail) {
  std::mt19937 rng(34);
  for (bool weighted : {true, false}) {
    const int64_t rows = 13, D = 77;
    const auto x = randf(rng, rows * D, -3.f, 3.f), w = randf(rng, D, .5f, 1.5f);
    Dev<float> dx(be(), x, "x"), dw(be(), w, "w");
    ops().rms_norm(dx.p(), rows, D, weighted ? dw.p() : nullptr, 1e-6f);
    const auto g = ref::rms_scale(x, rows, D, 1e-6f);
    std::vector<double> want(rows * D);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < D; ++i) want[r * D + i] = x[r * D + i] * g[r] * (weighted ? w[i] : 1.0);
    expect_err(max_err(dx.get(), want, abs_of(want)), 2e-6,
               str("rms_norm weighted=", weighted));  // measured 3.4e-7
  }
  for (bool inverse : {false, true}) {
    const int64_t rows = 7, H = 3, hd = 40, pairs = 6, pos0 = 250, step = 4;
    const auto x = randf(rng, rows * H * hd, -1.f, 1.f), inv = randf(rng, pairs, 0.001f, 1.f);
    Dev<float> dx(be(), x, "x"), di(be(), inv, "inv_freq");
    ops().rope_tail(dx.p(), rows, H, hd, pairs, di.p(), 0.75f, pos0, step, inverse);
    std::vector<double> want(x.begin(), x.end());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < pairs; ++i) {
          const double th = (float)(pos0 + r * step) * inv[i];  // the op's float angle
          const double c = std::cos(th) * 0.75, s = std::sin(th) * 0.75 * (inverse ? -1 : 1);
          const int64_t o = (r * H + h) * hd + hd - 2 * pairs + 2 * i;
          want[o] = x[o] * c - x[o + 1] * s;
          want[o + 1] = x[o + 1] * c + x[o] * s;
        }
    std::vector<double> one(want.size(), 1.0);
    expect_err(max_err(dx.get(), want, one), 1e-6, str("rope_tail inverse=", inverse));  // measured 7.1e-8
  }
}

TEST_P(Ds4Op, RingStore) {
  std::mt19937 rng(35);
  const int64_t slots = 8, width = 5;
  for (int64_t pos0 : {0, 3, 13})
    for (int64_t T : {1, 6, 19}) {
      auto ring = randf(rng, slots * width, -1.f, 1.f);
      const auto src = randf(rng, T * width, -1.f, 1.f);
      Dev<float> dr(be(), ring, "ring"), ds(be(), src, "src");
      ops().ring_store(dr.p(), slots, width, pos0, T, ds.p());
      for (int64_t p = std::max(pos0, pos0 + T - slots); p < pos0 + T; ++p)
        std::copy_n(&src[(p - pos0) * width], width, &ring[(p % slots) * width]);
      expect_same(dr.get(), ring, str("ring_store pos0=", pos0, " T=", T));
    }
}

// A prompt of N positions compressed chunk by chunk with the state rings between chunks: the rows
// match the reference, and are the same bits whatever the chunking.
TEST_P(Ds4Op, CompressPoolAcrossChunks) {
  std::mt19937 rng(36);
  for (int64_t lanes : {1, 2})
    for (int64_t ratio : {4, 8}) {
      const int64_t hd = 19, N = 53, width = lanes * hd, slots = lanes * ratio, n_rows = N / ratio;
      const auto kv = randf(rng, N * width, -2.f, 2.f), sc = randf(rng, N * width, -3.f, 3.f);
      const auto ape = randf(rng, ratio * width, -1.f, 1.f);
      Dev<float> dape(be(), ape, "ape");
      std::vector<float> first;
      for (int64_t chunk : {N, int64_t{1}, int64_t{5}, int64_t{11}}) {
        Dev<float> skv(be(), slots * width, "state kv"), ssc(be(), slots * width, "state score");
        Dev<float> rows(be(), n_rows * hd, "rows");
        for (int64_t p0 = 0; p0 < N; p0 += chunk) {
          const int64_t T = std::min(chunk, N - p0);
          Dev<float> ck(be(), std::vector<float>(kv.begin() + p0 * width, kv.begin() + (p0 + T) * width),
                        "kv");
          Dev<float> cs(be(), std::vector<float>(sc.begin() + p0 * width, sc.begin() + (p0 + T) * width),
                        "score");
          ops().compress_pool(ck.p(), cs.p(), skv.p(), ssc.p(), dape.p(), p0, T, ratio, lanes, hd,
                              rows.p() + (p0 / ratio) * hd);
          ops().ring_store(skv.p(), slots, width, p0, T, ck.p());
          ops().ring_store(ssc.p(), slots, width, p0, T, cs.p());
        }
        const auto got = rows.get();
        if (first.empty()) {
          first = got;
          std::vector<double> want;
          for (int64_t w = 0; w < n_rows; ++w) {
            const auto r = ref::compress_window(kv, sc, ape, w, ratio, lanes, hd);
            want.insert(want.end(), r.begin(), r.end());
          }
          expect_err(max_err(got, want, std::vector<double>(want.size(), 2.0)), 2e-6,  // measured 1.8e-7
                     str("compress_pool lanes=", lanes, " ratio=", ratio));
        } else {
          expect_same(got, first, str("compress_pool lanes=", lanes, " ratio=", ratio, " chunk=", chunk));
        }
      }
    }
}

// One token at a time, the compressor as a decode step runs it: pool into a scratch row, then
// window_commit moves it to its row when a window closes at the token (and leaves the rows alone when
// none does). Host positions, on every backend; the device's (a recorded step) in PositionSource below.
TEST_P(Ds4Op, WindowCommitOneTokenAtATime) {
  std::mt19937 rng(40);
  const int64_t hd = 11, ratio = 4, n_rows = 5;
  const auto rows0 = randf(rng, n_rows * hd, -1.f, 1.f), row = randf(rng, hd, -1.f, 1.f);
  for (int64_t pos = 0; pos < n_rows * ratio; ++pos) {
    Dev<float> dr(be(), rows0, "rows"), drow(be(), row, "row");
    ops().window_commit(drow.p(), dr.p(), hd, ratio, pos, 1);
    auto want = rows0;
    if ((pos + 1) % ratio == 0)
      std::copy(row.begin(), row.end(), want.begin() + ((pos + 1) / ratio - 1) * hd);
    expect_same(dr.get(), want, str("window_commit at ", pos));
  }
}

// With a position source (a recorded decode step), the V4 ops that take a position add the device's
// int32 to pos0 as they run: the same bits as passing the position itself. The compressor's pooling
// then pools the window that closes at the position, if any, into its output's first row (the
// rotation of that row at the window's first position, pos0 1 - ratio plus the device's), and
// window_commit moves it to its row: the rows a host-position pass writes.
TEST_P(Ds4Op, PositionSourceMatchesHostPositions) {
  if (!be().supports_graphs()) GTEST_SKIP() << "no position source without graphs";
  std::mt19937 rng(41);
  const int64_t H = 3, hd = 24, window = 5, ratio = 4, lanes = 2, ctx = 64, topk = 3, nh = 2, idim = 16;
  const int64_t width = lanes * hd, slots = lanes * ratio, n_pairs = 4;
  const float scale = 1.0f / std::sqrt((float)hd);
  const auto inv = randf(rng, n_pairs, 1e-3f, 1.f), sinks = randf(rng, H, -1.f, 2.f);
  const auto ape = randf(rng, ratio * width, -1.f, 1.f), norm = randf(rng, hd, .5f, 1.5f);
  Dev<float> di(be(), inv, "inv_freq"), dsink(be(), sinks, "sinks"), dape(be(), ape, "ape"),
      dn(be(), norm, "norm");
  for (int32_t pos : {0, 3, 6, 7, 11, 40, 63}) {
    std::vector<int32_t> pv = {pos};
    Dev<int32_t> dp(be(), pv, "pos");
    const auto x = randf(rng, H * hd, -2.f, 2.f), kv1 = randf(rng, hd, -1.f, 1.f);
    const auto win = randf(rng, window * hd, -1.f, 1.f), comp = randf(rng, (ctx / ratio) * hd, -1.f, 1.f);
    const auto ck = randf(rng, width, -2.f, 2.f), cs = randf(rng, width, -3.f, 3.f);
    const auto skv = randf(rng, slots * width, -2.f, 2.f), ssc = randf(rng, slots * width, -3.f, 3.f);
    const auto iq = randf(rng, nh * idim, -1.f, 1.f), iw = randf(rng, nh, -1.f, 1.f);
    const auto ikeys = randf(rng, (ctx / ratio) * idim, -1.f, 1.f);
    Dev<float> dck(be(), ck, "comp kv"), dcs(be(), cs, "comp score"), dskv(be(), skv, "state kv"),
        dssc(be(), ssc, "state score"), dik(be(), ikeys, "index keys"), diq(be(), iq, "index q"),
        diw(be(), iw, "index w"), dwin(be(), win, "win"), dcomp(be(), comp, "comp"), dkv(be(), kv1, "kv");
    // Host positions.
    Dev<float> x1(be(), x, "x"), ring1(be(), win, "ring"), rows1(be(), comp, "rows"), o1(be(), H * hd, "out");
    Dev<int32_t> sel1(be(), topk, "sel");
    ops().rope_tail(x1.p(), 1, H, hd, n_pairs, di.p(), 1.1f, pos, 1, false);
    ops().ring_store(ring1.p(), window, hd, pos, 1, dkv.p());
    const bool closes = (pos + 1) % ratio == 0;
    if (closes) {
      float* r = rows1.p() + ((pos + 1) / ratio - 1) * hd;
      ops().compress_pool(dck.p(), dcs.p(), dskv.p(), dssc.p(), dape.p(), pos, 1, ratio, lanes, hd, r);
      ops().rms_norm(r, 1, hd, dn.p(), 1e-5f);
      ops().rope_tail(r, 1, 1, hd, n_pairs, di.p(), 1.1f, pos + 1 - ratio, ratio, false);
    }
    ops().indexer_topk(diq.p(), diw.p(), dik.p(), 1, pos, nh, idim, ratio, topk, 0.3f, sel1.p());
    ops().attention_sink(x1.p(), dkv.p(), dwin.p(), window, dcomp.p(), ratio, sel1.p(), topk, dsink.p(), 1,
                         pos, H, hd, scale, o1.p());
    // The device's position.
    Dev<float> x2(be(), x, "x"), ring2(be(), win, "ring"), rows2(be(), comp, "rows"), o2(be(), H * hd, "out"),
        row(be(), hd, "row");
    Dev<int32_t> sel2(be(), topk, "sel");
    be().set_position_source(dp.p(), ctx);
    ops().rope_tail(x2.p(), 1, H, hd, n_pairs, di.p(), 1.1f, 0, 1, false);
    ops().ring_store(ring2.p(), window, hd, 0, 1, dkv.p());
    ops().compress_pool(dck.p(), dcs.p(), dskv.p(), dssc.p(), dape.p(), 0, 1, ratio, lanes, hd, row.p());
    ops().rms_norm(row.p(), 1, hd, dn.p(), 1e-5f);
    ops().rope_tail(row.p(), 1, 1, hd, n_pairs, di.p(), 1.1f, 1 - ratio, ratio, false);
    ops().window_commit(row.p(), rows2.p(), hd, ratio, 0, 1);
    ops().indexer_topk(diq.p(), diw.p(), dik.p(), 1, 0, nh, idim, ratio, topk, 0.3f, sel2.p());
    ops().attention_sink(x2.p(), dkv.p(), dwin.p(), window, dcomp.p(), ratio, sel2.p(), topk, dsink.p(), 1, 0,
                         H, hd, scale, o2.p());
    be().set_position_source(nullptr, 0);
    const std::string at = str(" from the position source at ", pos);
    expect_same(x2.get(), x1.get(), "rope_tail" + at);
    expect_same(ring2.get(), ring1.get(), "ring_store" + at);
    expect_same(rows2.get(), rows1.get(), "compress_pool, rms_norm, rope_tail, window_commit" + at);
    expect_same(sel2.get(), sel1.get(), "indexer_topk" + at);
    expect_same(o2.get(), o1.get(), "attention_sink" + at);
  }
}

// Heads of 24, 300 and 520 dims (the CUDA kernel takes four heads a block: 3, 9 and 5 heads leave its last
// block part empty; 300 has a tail past the lanes' eight-element steps and two columns a thread; 520 passes
// twice over a key's elements, 512 at a time). Bound: a logit is a sum of hd products of values in [-1, 1]
// times 1/sqrt(hd), within hd^1.5 2^-24 of exact in any order; the softmax's weights move by at most twice
// that, relatively, and the output is their combination of rows in [-1, 1] (plus its own nk roundings of
// values below 1).
TEST_P(Ds4Op, AttentionSinkWindowAndCompressed) {
  for (const auto [H, hd] : {std::pair<int64_t, int64_t>{3, 24}, {9, 300}, {5, 520}}) {
    std::mt19937 rng(37);
    const int64_t window = 5, N = 41, pos0 = 29, T = N - pos0, topk = 3;
    const auto kv = randf(rng, N * hd, -1.f, 1.f), q = randf(rng, T * H * hd, -1.f, 1.f);
    const auto sinks = randf(rng, H, -1.f, 2.f);
    std::vector<float> win(window * hd);
    for (int64_t p = pos0 - window; p < pos0; ++p) std::copy_n(&kv[p * hd], hd, &win[(p % window) * hd]);
    const auto comp = randf(rng, 12 * hd, -1.f, 1.f);
    for (int64_t ratio : {0, 4})
      for (bool selected : {false, true}) {
        if (!ratio && selected) continue;
        std::vector<int32_t> sel(T * topk, -1);
        for (int64_t t = 0; t < T; ++t) {  // ascending ids below (p + 1) / ratio, then -1
          const int64_t n = ratio ? (pos0 + t + 1) / ratio : 0;
          for (int64_t k = 0, s = (t % 3); k < topk && s < n; ++k, s += 2) sel[t * topk + k] = (int32_t)s;
        }
        Dev<float> dq(be(), q, "q"), dkv(be(), std::vector<float>(kv.begin() + pos0 * hd, kv.end()), "kv");
        Dev<float> dwin(be(), win, "win"), dcomp(be(), comp, "comp"), dsink(be(), sinks, "sinks"),
            out(be(), T * H * hd, "out");
        Dev<int32_t> dsel(be(), sel, "sel");
        const float scale = 1.0f / std::sqrt((float)hd);
        ops().attention_sink(dq.p(), dkv.p(), dwin.p(), window, ratio ? dcomp.p() : nullptr, ratio,
                             selected ? dsel.p() : nullptr, topk, dsink.p(), T, pos0, H, hd, scale, out.p());
        std::vector<double> want;
        for (int64_t t = 0; t < T; ++t)
          for (int64_t h = 0; h < H; ++h) {
            const int64_t p = pos0 + t;
            std::vector<const float*> keys;
            for (int64_t j = std::max<int64_t>(0, p - window + 1); j <= p; ++j) keys.push_back(&kv[j * hd]);
            if (ratio && selected) {
              for (int64_t k = 0; k < topk && sel[t * topk + k] >= 0; ++k)
                keys.push_back(&comp[sel[t * topk + k] * hd]);
            } else if (ratio) {
              for (int64_t s = 0; s < (p + 1) / ratio; ++s) keys.push_back(&comp[s * hd]);
            }
            const auto o = ref::attend_sink(&q[(t * H + h) * hd], keys, sinks[h], hd, scale);
            want.insert(want.end(), o.begin(), o.end());
          }
        const double u = std::ldexp(1.0, -24), bound = 2 * std::pow((double)hd, 1.5) * u + (window + 12) * u;
        expect_err(max_err(out.get(), want, std::vector<double>(want.size(), 1.0)), bound,  // hd 24: 9.2e-8
                   str("attention_sink H=", H, " hd=", hd, " ratio=", ratio, " selected=", selected));
      }
  }
}

TEST_P(Ds4Op, IndexerTopk) {
  std::mt19937 rng(38);
  const int64_t nh = 5, dim = 20, ratio = 4, n_keys = 12;
  for (int64_t topk : {1, 3, 20})
    for (int64_t pos0 : {0, 30}) {
      const int64_t T = 19;
      const auto q = randf(rng, T * nh * dim, -1.f, 1.f), w = randf(rng, T * nh, -1.f, 1.f);
      const auto keys = randf(rng, n_keys * dim, -1.f, 1.f);
      Dev<float> dq(be(), q, "q"), dw(be(), w, "w"), dk(be(), keys, "keys");
      Dev<int32_t> sel(be(), T * topk, "sel");
      ops().indexer_topk(dq.p(), dw.p(), dk.p(), T, pos0, nh, dim, ratio, topk, 0.3f, sel.p());
      std::vector<int32_t> want(T * topk, -1);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t n = std::min<int64_t>((pos0 + t + 1) / ratio, n_keys);
        std::vector<double> sc(n, 0);
        for (int64_t s = 0; s < n; ++s)
          for (int64_t h = 0; h < nh; ++h) {
            double d = 0;
            for (int64_t i = 0; i < dim; ++i) d += (double)q[(t * nh + h) * dim + i] * keys[s * dim + i];
            sc[s] += std::max(d, 0.0) * w[t * nh + h] * 0.3;
          }
        std::vector<int32_t> idx(n);
        std::iota(idx.begin(), idx.end(), 0);
        const int64_t k = std::min(topk, n);
        std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                          [&](int32_t a, int32_t b) { return sc[a] > sc[b] || (sc[a] == sc[b] && a < b); });
        std::sort(idx.begin(), idx.begin() + k);
        std::copy_n(idx.begin(), k, &want[t * topk]);
      }
      expect_same(sel.get(), want, str("indexer_topk topk=", topk, " pos0=", pos0));
    }
}

TEST_P(Ds4Op, RouterV4BiasedAndHash) {
  std::mt19937 rng(39);
  const int64_t E = 23, K = 4, V = 11;
  for (bool hash : {false, true})
    for (bool norm : {true, false})
      for (int64_t T : {1, 7}) {
        const auto logits = randf(rng, T * E, -25.f, 25.f), bias = randf(rng, E, -.5f, .5f);
        std::vector<int32_t> table(V * K), tokens = randi(rng, T, (int32_t)V);
        for (auto& e : table) e = (int32_t)(rng() % E);
        Dev<float> dl(be(), logits, "logits"), db(be(), bias, "bias"), wts(be(), T * K, "weights");
        Dev<int32_t> dt(be(), table, "table"), dtok(be(), tokens, "tokens"), ids(be(), T * K, "ids");
        ops().router_v4(dl.p(), T, E, K, hash ? nullptr : db.p(), hash ? dt.p() : nullptr, dtok.p(), norm,
                        1.5f, ids.p(), wts.p());
        std::vector<int32_t> wid(T * K);
        std::vector<double> ww(T * K);
        for (int64_t t = 0; t < T; ++t) {
          std::vector<double> s(E);
          for (int64_t e = 0; e < E; ++e) {
            const double l = logits[t * E + e];
            s[e] = std::sqrt(l > 20 ? l : std::log1p(std::exp(l)));
          }
          std::vector<int32_t> idx(E);
          std::iota(idx.begin(), idx.end(), 0);
          std::partial_sort(idx.begin(), idx.begin() + K, idx.end(), [&](int32_t a, int32_t b) {
            return s[a] + bias[a] > s[b] + bias[b] || (s[a] + bias[a] == s[b] + bias[b] && a < b);
          });
          double sum = 0;
          for (int64_t k = 0; k < K; ++k) {
            wid[t * K + k] = hash ? table[tokens[t] * K + k] : idx[k];
            sum += s[wid[t * K + k]];
          }
          for (int64_t k = 0; k < K; ++k)
            ww[t * K + k] = (norm ? s[wid[t * K + k]] / sum : s[wid[t * K + k]]) * 1.5;
        }
        expect_same(ids.get(), wid, str("router_v4 ids hash=", hash));
        expect_err(max_err(wts.get(), ww, abs_of(ww)), 1e-6,  // measured 1.3e-7
                   str("router_v4 weights hash=", hash, " norm=", norm));
      }
}

TEST_P(Ds4Op, SwigluClamp) {
  std::mt19937 rng(40);
  for (float limit : {0.f, 0.7f, 10.f}) {
    const int64_t n = 1000;
    const auto g = randf(rng, n, -3.f, 3.f), u = randf(rng, n, -3.f, 3.f);
    Dev<float> dg(be(), g, "g"), du(be(), u, "u");
    ops().swiglu_clamp(dg.p(), du.p(), n, limit);
    std::vector<double> want(n);
    std::vector<float> same(n);  // every backend's bits: swiglu_portable of the clamped pair
    for (int64_t i = 0; i < n; ++i) {
      double x = g[i], y = u[i];
      if (limit > 0) x = std::min<double>(x, limit), y = std::clamp<double>(y, -limit, limit);
      want[i] = x / (1 + std::exp(-x)) * y;
      same[i] = swiglu_portable(limit > 0 ? std::min(g[i], limit) : g[i],
                                limit > 0 ? std::clamp(u[i], -limit, limit) : u[i]);
    }
    expect_same(dg.get(), same, str("swiglu_clamp limit=", limit, " against swiglu_portable"));
    expect_err(max_err(dg.get(), want, std::vector<double>(n, 1.0)), 4e-6,  // measured 6.8e-7 (|values| <= 9)
               str("swiglu_clamp limit=", limit));
  }
}

// A backend without the V4 ops (here one that forwards the shared surface to the CPU)
// is refused for a V4 model before anything is allocated: UnsupportedError naming the file, the
// backend and the fix, in one line. The CPU backend is accepted.
TEST(Ds4Ops, BackendWithoutThemIsRefused) {
  class Bare final : public strata::testing_support::ForwardingBackend {
   public:
    const char* name() const override { return "bare"; }
  };
  Bare bare;
  EXPECT_EQ(ds4_ops(bare), nullptr);
  const Architecture& v4 = find_architecture("deepseek4", "v4.gguf");
  ASSERT_NE(v4.check_backend, nullptr);
  try {
    v4.check_backend(bare, "v4.gguf");
    ADD_FAILURE() << "a backend without the V4 ops was accepted";
  } catch (const UnsupportedError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("v4.gguf: DeepSeek V4 runs on the CPU and CUDA backends; the bare backend"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("--device cpu"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  const auto cpu = make_cpu_backend(1);
  EXPECT_NE(ds4_ops(*cpu), nullptr);
  EXPECT_NO_THROW(v4.check_backend(*cpu, "v4.gguf"));
  // Architectures on the shared surface alone run on every backend.
  EXPECT_EQ(find_architecture("qwen3moe", "q.gguf").check_backend, nullptr);
}

}  // namespace
