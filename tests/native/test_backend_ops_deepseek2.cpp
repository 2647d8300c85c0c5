// The op harness for deepseek2's backend ops: the RMSNorm of rows inside wider rows, RoPE over interleaved
// pairs between strided buffers (in place and into another), and the grouped router (sigmoid with a
// selection bias and groups, softmax without), on every backend that has them against plain double
// references at awkward shapes.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/deepseek2_ops.h"
#include "backend_ops_harness.h"

namespace {

class Ds2Op : public ArchOp<Deepseek2Ops, deepseek2_ops> {};

INSTANTIATE_TEST_SUITE_P(BackendOps, Ds2Op, testing::ValuesIn(backends_under_test()),
                         [](const testing::TestParamInfo<BackendFactory>& i) { return i.param.name; });

TEST_P(Ds2Op, RmsNormRowsLeavesTheRestOfEachRow) {
  std::mt19937 rng(81);
  const int64_t rows = 7, D = 37, stride = 45;
  const float eps = 3e-6f;
  const auto x = randf(rng, rows * stride, -3.f, 3.f), w = randf(rng, D, 0.5f, 1.5f);
  Dev<float> dx(be(), x, "x"), dw(be(), w, "w");
  ops().rms_norm_rows(dx.p(), rows, D, stride, dw.p(), eps);
  const auto got = dx.get();
  std::vector<double> want(x.begin(), x.end());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) ss += (double)x[r * stride + i] * x[r * stride + i];
    const double g = 1.0 / std::sqrt(ss / D + eps);
    for (int64_t i = 0; i < D; ++i) want[r * stride + i] = x[r * stride + i] * g * w[i];
    for (int64_t i = D; i < stride; ++i) ASSERT_EQ(got[r * stride + i], x[r * stride + i]) << "row " << r;
  }
  // outputs of magnitude ~2.5 from float32 sums of 37 squares: one ulp of the sum moves them by ~1e-7
  expect_err(max_err(got, want, std::vector<double>(want.size(), 1.0)), 2e-6, "rms_norm_rows");
}

TEST_P(Ds2Op, RopePairsInPlaceAndIntoAnotherBuffer) {
  std::mt19937 rng(83);
  // The absorbed query's layout: heads of (nope 6, rope 8) read, rows of heads of (latent 5, rope 8) written.
  const int64_t T = 5, H = 3, dn = 6, dr = 8, P = dr / 2, C = 5, dk = dn + dr, W = C + dr;
  const auto inv = randf(rng, P, 1e-4f, 1.f);
  for (int64_t pos0 : {int64_t{0}, int64_t{1029}}) {
    const auto q = randf(rng, T * H * dk, -2.f, 2.f), out0 = randf(rng, T * H * W, -2.f, 2.f);
    Dev<float> dq(be(), q, "q"), dout(be(), out0, "q latent"), di(be(), inv, "inv_freq");
    ops().rope_pairs(dq.p() + dn, H * dk, dk, dout.p() + C, H * W, W, T, H, P, di.p(), pos0);
    // And in place, one head a row (the rope key after the latent).
    ops().rope_pairs(dq.p() + dn, H * dk, dk, dq.p() + dn, H * dk, dk, T, 1, P, di.p(), pos0);
    const auto got = dout.get(), got_q = dq.get();
    std::vector<double> want(out0.begin(), out0.end()), want_q(q.begin(), q.end());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < P; ++i) {
        const double a = (double)(pos0 + t) * inv[i], c = std::cos(a), s = std::sin(a);
        for (int64_t h = 0; h < H; ++h) {
          const float* x = q.data() + t * H * dk + h * dk + dn + 2 * i;
          double* y = want.data() + t * H * W + h * W + C + 2 * i;
          y[0] = x[0] * c - x[1] * s;
          y[1] = x[0] * s + x[1] * c;
          if (h == 0) {
            want_q[t * H * dk + dn + 2 * i] = y[0];
            want_q[t * H * dk + dn + 2 * i + 1] = y[1];
          }
        }
      }
    for (size_t e = 0; e < got.size(); ++e)
      if ((int64_t)(e % W) < C) ASSERT_EQ(got[e], out0[e]) << "the latent part of the output, element " << e;
    // The angle is formed in float32 as the op says: at position ~1000 its rounding moves the rotation by
    // ~1e-4 rad.
    const std::string what = str("rope_pairs pos0=", pos0);
    expect_err(max_err(got, want, std::vector<double>(want.size(), 1.0)), pos0 ? 5e-4 : 2e-6, what);
    expect_err(max_err(got_q, want_q, std::vector<double>(want_q.size(), 1.0)), pos0 ? 5e-4 : 2e-6,
               what + " in place");
  }
}

// With the backend's position source set (a recorded decode step), rope_pairs adds the device's position
// to pos0: bit for bit the host position's rotation.
TEST_P(Ds2Op, RopePairsReadsThePositionSource) {
  if (!be().supports_graphs()) GTEST_SKIP() << "no position source without graphs";
  std::mt19937 rng(43);
  const int64_t H = 3, dk = 10, P = 3, ctx = 2048;
  const auto inv = randf(rng, P, 1e-3f, 1.f);
  Dev<float> di(be(), inv, "inv_freq");
  for (int32_t pos : {0, 5, 1029, 2047}) {
    const auto q = randf(rng, H * dk, -2.f, 2.f);
    Dev<float> host(be(), q, "q host"), dev(be(), q, "q device");
    Dev<int32_t> dp(be(), std::vector<int32_t>{pos}, "pos");
    ops().rope_pairs(host.p() + 4, dk, dk, host.p() + 4, dk, dk, 1, H, P, di.p(), pos);
    be().set_position_source(dp.p(), ctx);
    ops().rope_pairs(dev.p() + 4, dk, dk, dev.p() + 4, dk, dk, 1, H, P, di.p(), 0);
    be().set_position_source(nullptr, 0);
    expect_same(dev.get(), host.get(), str("rope_pairs at device position ", pos));
  }
}

// The reference router in double: the same selection rules as deepseek2_ops.h states.
void ref_router(const std::vector<float>& logits, int64_t T, int64_t E, int64_t K, bool sigmoid,
                const std::vector<float>& bias, int64_t groups, int64_t used, bool norm, double scale,
                std::vector<int32_t>& ids, std::vector<double>& w) {
  ids.assign(T * K, -1);
  w.assign(T * K, 0);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> p(E), s(E);
    double mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < E; ++i) mx = std::max(mx, (double)logits[t * E + i]);
    for (int64_t i = 0; i < E; ++i) {
      p[i] = sigmoid ? 1 / (1 + std::exp(-(double)logits[t * E + i])) : std::exp(logits[t * E + i] - mx);
      sum += p[i];
    }
    for (int64_t i = 0; i < E; ++i) {
      if (!sigmoid) p[i] /= sum;
      s[i] = p[i] + (bias.empty() ? 0.0 : bias[i]);
    }
    std::vector<char> ok(E, groups > 1 ? 0 : 1);
    if (groups > 1) {
      const int64_t per = E / groups;
      std::vector<double> gs(groups);
      for (int64_t g = 0; g < groups; ++g) {
        std::vector<double> v(s.begin() + g * per, s.begin() + (g + 1) * per);
        std::sort(v.rbegin(), v.rend());
        gs[g] = v[0] + v[1];
      }
      std::vector<int> gi(groups);
      std::iota(gi.begin(), gi.end(), 0);
      std::stable_sort(gi.begin(), gi.end(), [&](int a, int b) { return gs[a] > gs[b]; });
      for (int64_t k = 0; k < used; ++k)
        std::fill(ok.begin() + gi[k] * per, ok.begin() + (gi[k] + 1) * per, 1);
    }
    std::vector<int> ei;
    for (int64_t i = 0; i < E; ++i)
      if (ok[i]) ei.push_back((int)i);
    std::stable_sort(ei.begin(), ei.end(), [&](int a, int b) { return s[a] > s[b]; });
    double tot = 0;
    for (int64_t k = 0; k < K; ++k) tot += p[ei[k]];
    for (int64_t k = 0; k < K; ++k) {
      ids[t * K + k] = ei[k];
      w[t * K + k] = (norm ? p[ei[k]] / std::max(tot, 6.103515625e-5) : p[ei[k]]) * scale;
    }
  }
}

TEST_P(Ds2Op, RouterGroupedSigmoidBiasGroupsAndSoftmax) {
  std::mt19937 rng(85);
  struct Case {
    int64_t T, E, K, groups, used;
    bool sigmoid, bias, norm;
  };
  for (const Case c : {Case{9, 24, 5, 6, 3, true, true, true}, Case{4, 20, 3, 1, 1, false, false, false},
                       Case{3, 256, 8, 8, 4, true, true, true}, Case{5, 12, 12, 4, 4, true, true, false}}) {
    // Logits on a grid of spacing 1/64 from a shuffled range: no two experts' scores within rounding of a
    // tie (and no two groups' sums), so every backend picks the same experts as the double reference.
    std::vector<float> logits(c.T * c.E);
    for (int64_t t = 0; t < c.T; ++t) {
      std::vector<int> perm(c.E);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int64_t i = 0; i < c.E; ++i)
        logits[t * c.E + i] = (perm[i] - c.E / 2) / 64.0f * (c.sigmoid ? 1 : 4);
    }
    std::vector<float> bias;
    if (c.bias)
      for (int64_t i = 0; i < c.E; ++i) bias.push_back((float)((i * 7) % c.E) / 4096.0f);
    Dev<float> dl(be(), logits, "logits"), db(be(), c.bias ? bias : std::vector<float>(1), "bias");
    Dev<int32_t> di(be(), c.T * c.K, "ids");
    Dev<float> dw(be(), c.T * c.K, "weights");
    const float scale = 2.5f;
    ops().router_grouped(dl.p(), c.T, c.E, c.K, c.sigmoid, c.bias ? db.p() : nullptr, c.groups, c.used,
                         c.norm, scale, di.p(), dw.p());
    std::vector<int32_t> want_ids;
    std::vector<double> want_w;
    ref_router(logits, c.T, c.E, c.K, c.sigmoid, bias, c.groups, c.used, c.norm, scale, want_ids, want_w);
    const std::string what = str("router_grouped E=", c.E, " K=", c.K, " groups=", c.groups, "/", c.used,
                                 c.sigmoid ? " sigmoid" : " softmax");
    EXPECT_EQ(di.get(), want_ids) << what;
    // float32 sigmoid / softmax and a sum of <= 12 weights: measured ~2e-7 relative
    expect_err(max_err(dw.get(), want_w, abs_of(want_w)), 2e-6, what);
  }
}

}  // namespace
