// The op harness's attention ops (split from test_backend_ops.cpp, whose header comment holds for these):
// per-head norms and RoPE, the fused q/k RoPE and KV store, causal GQA attention over f32 and f16 caches,
// its independence of the chunking, the prompt's tile kernel against the general one, and positions read
// on the device (a recorded decode step).
#include "backend_ops_harness.h"
#include "core/thread_pool.h"

namespace {

class AttentionOp : public Op {};

INSTANTIATE_TEST_SUITE_P(BackendOps, AttentionOp, testing::ValuesIn(backends_under_test()),
                         [](const testing::TestParamInfo<BackendFactory>& i) { return i.param.name; });

TEST_P(AttentionOp, HeadNormRope) {
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
TEST_P(AttentionOp, QkRopeStoreIsItsSteps) {
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

TEST_P(AttentionOp, Attention) {
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
TEST_P(AttentionOp, KvStoreAndAttentionPerKvType) {
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

// Attention over an f16 cache at the head dims the GPU runs on tensor cores (64, 128, and 576 with one cache
// read as keys and values: MLA's latent rows), against the reference on the values the cache holds: prompts
// of several 64-key blocks and query tiles, chunks that start inside a block, decode steps, query heads per
// kv head 1 to 128 (more than a warp's or a CTA's 16 rows, and not a multiple of them). Where the backend
// rounds q and p to fp16 (Bounds::attention_f16_tc), the reference takes q rounded as the kernel rounds it
// (to nearest, clamped to +-65504; exact in the dot's fp32 products) and the bound adds what is left,
// derived:
//   p rounded to fp16: |p16 - p| <= u p + 2^-25 (u = 2^-11; 2^-25 for subnormals), and l is the sum of
//     the unrounded p (>= 1: every block's largest p is 1), so the output moves by at most
//     (u + n 2^-25) max|v| over n keys;
//   the tensor cores' fp32 sums: at most 17 roundings of 2^-23 relative a 16-term step, so a dot of d
//     terms errs by at most 2 d^2 2^-23 max|term|: scores by Ds = scale 2 hd^2 2^-23 max|q| max|k|,
//     which moves the softmax weights by a factor within exp(+-2 Ds), the output by 2 Ds max|v| (to
//     first order, Ds << 1), and a block's p v sum (64 keys, p <= 1) by 2 64^2 2^-23 max|v|.
TEST_P(AttentionOp, AttentionF16HeadDimsOfTheTensorCores) {
  if (!be().supports_kv(KvType::F16)) GTEST_SKIP() << "no f16 cache on this backend";
  std::mt19937 rng(62);
  struct Shape {
    int64_t H, KV, hd, T, pos0;
    bool shared = false;  // one cache read as keys and values (MLA's 576-dim latent rows)
  };
  for (const Shape sh :
       {Shape{32, 4, 128, 150, 0}, Shape{16, 1, 64, 70, 200}, Shape{12, 2, 128, 41, 129},
        Shape{40, 2, 128, 5, 60}, Shape{8, 8, 64, 66, 1}, Shape{32, 4, 128, 1, 300}, Shape{40, 2, 64, 1, 127},
        Shape{6, 6, 128, 1, 0}, Shape{128, 1, 576, 70, 0, true}, Shape{40, 1, 576, 33, 100, true},
        Shape{128, 1, 576, 1, 300, true}, Shape{24, 1, 576, 1, 0, true}}) {
    const int64_t width = sh.KV * sh.hd, ctx = sh.pos0 + sh.T;
    const auto k = randf(rng, ctx * width, -1.f, 1.f);
    const auto v = sh.shared ? k : randf(rng, ctx * width, -1.5f, 1.5f);
    const auto q = randf(rng, sh.T * sh.H * sh.hd, -2.f, 2.f);
    Dev<uint8_t> kc(be(), (size_t)ctx * width * 2, "k cache"), vc(be(), (size_t)ctx * width * 2, "v cache");
    Dev<float> dk(be(), k, "k"), dv(be(), v, "v"), dq(be(), q, "q"), out(be(), sh.T * sh.H * sh.hd, "out");
    be().kv_store(kc.p(), KvType::F16, 0, ctx, width, dk.p());
    be().kv_store(vc.p(), KvType::F16, 0, ctx, width, dv.p());
    const float scale = 1.0f / std::sqrt((float)sh.hd);
    be().attention(dq.p(), kc.p(), sh.shared ? kc.p() : vc.p(), KvType::F16, sh.T, sh.pos0, sh.H, sh.KV,
                   sh.hd, scale, out.p());
    const auto half = [](std::vector<float> x) {
      for (float& e : x) e = fp16_to_f32(f32_to_fp16(std::clamp(e, -65504.0f, 65504.0f)));
      return x;
    };
    const bool tc = bounds().attention_f16_tc;
    const auto want =
        ref::attention(tc ? half(q) : q, half(k), half(v), sh.T, sh.pos0, sh.H, sh.KV, sh.hd, scale);
    double bound = bounds().attention;
    if (tc) {
      const double u = std::ldexp(1.0, -11), ulp = std::ldexp(1.0, -23), vmax = sh.shared ? 1.0 : 1.5,
                   n = (double)ctx;
      const double ds = scale * 2.0 * (double)(sh.hd * sh.hd) * ulp * 2.0 * 1.0;
      bound += vmax * (u + n * std::ldexp(1.0, -25) + 2.0 * ds + 2.0 * 64 * 64 * ulp);
    }
    expect_err(max_err(out.get(), want, std::vector<double>(want.size(), 1.0)), bound,
               str("attention over an f16 cache, H=", sh.H, " KV=", sh.KV, " hd=", sh.hd, " T=", sh.T,
                   " pos0=", sh.pos0, sh.shared ? " (one cache)" : ""));
  }
}

// A token's attention output does not depend on how the prompt was cut into chunks (DESIGN.md,
// invariant 4): a chunk at once, the same queries in two chunks, and one at a time as in decode
// give the same bits, on every KV type the backend keeps.
TEST_P(AttentionOp, AttentionIndependentOfChunking) {
  std::mt19937 rng(16);
  struct Shape {
    int64_t H, KV, hd, pos0, T;
    bool shared = false;  // one cache read as keys and values (MLA)
  };
  // Query heads per kv head 4, 16 and 1; head dims of the GPU's decode kernel and one it leaves to the
  // general kernel (72); chunks that cross key 128. Then a long context, where a decode step's partials span
  // many key blocks (47 of 64 keys, 24 of 128: more than the combine loads at once, and not a multiple of
  // it; at 8,303 keys 130 of 64 on an f16 cache: the tensor cores' combine reloads its register batches of
  // 32, the last one partial).
  // Wider rows and groups: 20 heads per kv head (the decode kernel's 16 a block, then 4), gemma4's 512-dim
  // global heads, MLA's 576-dim latent rows under 40 heads.
  for (const Shape sh :
       {Shape{8, 2, 64, 120, 19}, Shape{32, 2, 128, 120, 19}, Shape{3, 3, 256, 120, 19},
        Shape{4, 2, 72, 120, 19}, Shape{16, 4, 64, 2997, 3}, Shape{16, 4, 128, 2997, 3},
        Shape{16, 4, 128, 8300, 3}, Shape{40, 2, 128, 120, 19}, Shape{4, 2, 512, 120, 19},
        Shape{40, 1, 576, 120, 19}, Shape{40, 1, 576, 120, 19, true}, Shape{128, 1, 576, 200, 9, true}})
    for (KvType t : {KvType::F32, KvType::F16}) {
      const int64_t H = sh.H, KV = sh.KV, hd = sh.hd, width = KV * hd, pos0 = sh.pos0, T = sh.T;
      const int64_t ctx = pos0 + T, first = std::min<int64_t>(7, T - 1);
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
      const void* vcache = sh.shared ? kc.p() : vc.p();
      be().attention(dq.p(), kc.p(), vcache, t, T, pos0, H, KV, hd, scale, whole.p());
      be().attention(dq.p(), kc.p(), vcache, t, first, pos0, H, KV, hd, scale, chunks.p());
      be().attention(dq.p() + first * H * hd, kc.p(), vcache, t, T - first, pos0 + first, H, KV, hd, scale,
                     chunks.p() + first * H * hd);
      for (int64_t i = 0; i < T; ++i)
        be().attention(dq.p() + i * H * hd, kc.p(), vcache, t, 1, pos0 + i, H, KV, hd, scale,
                       tokens.p() + i * H * hd);
      const auto w = whole.get();
      const std::string what = str(kv_type_name(t), ", H=", H, " KV=", KV, " hd=", hd, " at ", ctx, " keys",
                                   sh.shared ? " (one cache)" : "");
      expect_same(chunks.get(), w, "attention in two chunks vs one, " + what);
      expect_same(tokens.get(), w, "attention token by token vs one chunk, " + what);
    }
}

// Decode steps over an f16 cache with rows as wide as MLA's latent (576, here in two caches: one cache read
// as both keys and values goes to the tensor cores, AttentionF16HeadDimsOfTheTensorCores) and gemma4's global
// heads (512), against the reference on the values the cache holds: a first key, a context inside the first
// key block, and one across several (the CUDA decode kernel takes 16 query heads a block, its partials folded
// by the last block of each (kv head, head chunk)).
TEST_P(AttentionOp, AttentionDecodeWideRowsF16) {
  if (!be().supports_kv(KvType::F16)) GTEST_SKIP() << "no f16 cache on this backend";
  std::mt19937 rng(64);
  struct Shape {
    int64_t H, KV, hd;
  };
  for (const Shape sh : {Shape{128, 1, 576}, Shape{24, 1, 576}, Shape{8, 2, 512}})
    for (const int64_t pos0 : {int64_t{0}, int64_t{77}, int64_t{300}}) {
      const int64_t width = sh.KV * sh.hd, ctx = pos0 + 1;
      const auto k = randf(rng, ctx * width, -1.f, 1.f), v = randf(rng, ctx * width, -1.5f, 1.5f);
      const auto q = randf(rng, sh.H * sh.hd, -0.5f, 0.5f);
      Dev<uint8_t> kc(be(), (size_t)ctx * width * 2, "k cache"), vc(be(), (size_t)ctx * width * 2, "v cache");
      Dev<float> dk(be(), k, "k"), dv(be(), v, "v"), dq(be(), q, "q"), out(be(), sh.H * sh.hd, "out");
      be().kv_store(kc.p(), KvType::F16, 0, ctx, width, dk.p());
      be().kv_store(vc.p(), KvType::F16, 0, ctx, width, dv.p());
      const float scale = 1.0f / std::sqrt((float)sh.hd);
      be().attention(dq.p(), kc.p(), vc.p(), KvType::F16, 1, pos0, sh.H, sh.KV, sh.hd, scale, out.p());
      auto half = [](std::vector<float> x) {
        for (float& e : x) e = fp16_to_f32(f32_to_fp16(e));
        return x;
      };
      const auto want = ref::attention(q, half(k), half(v), 1, pos0, sh.H, sh.KV, sh.hd, scale);
      // Derived for any summation order: a score's dot of hd products errs by at most
      // gamma_hd sum_i |q_i k_i| <= gamma_hd sum_i |q_i| (|k| <= 1), gamma_n = n u / (1 - n u), u = 2^-24;
      // scores off by Ds move the softmax weights by a factor within exp(+-2 Ds), the output by
      // 2 Ds max|v| (to first order); the weighted sum of ctx values errs by gamma_ctx max|v| (the
      // weights sum to 1 after the division), and expf, the folds and the division by a few ulps more.
      const auto gamma = [](double n) { return n * std::ldexp(1.0, -24) / (1.0 - n * std::ldexp(1.0, -24)); };
      double qsum = 0.0;
      for (int64_t h = 0; h < sh.H; ++h) {
        double a = 0.0;
        for (int64_t i = 0; i < sh.hd; ++i) a += std::fabs(q[h * sh.hd + i]);
        qsum = std::max(qsum, a);
      }
      const double vmax = 1.5, ds = scale * gamma((double)sh.hd + 1) * qsum;
      const double bound = vmax * (2.0 * ds + gamma((double)ctx + 2) + std::ldexp(1.0, -18));
      expect_err(
          max_err(out.get(), want, std::vector<double>(want.size(), 1.0)), bound,
          str("decode attention over an f16 cache, H=", sh.H, " KV=", sh.KV, " hd=", sh.hd, " pos0=", pos0));
    }
}

// A prompt's attention is the same bits whichever CUDA-core prompt kernel the backend picks: on CUDA
// the tile kernel (head dims 64, 128, 256) against the general one (STRATA_CUDA_ATTN_TILE=0), over
// prompts of several query tiles and key blocks, query heads per kv head 8, 16, 1 and 6, and chunks
// that start inside a key block; the tensor-core kernels, which f16 caches at head dims 64 and 128
// take otherwise, are off (STRATA_CUDA_ATTN_MMA=0). (A backend with one prompt kernel runs it twice.)
TEST_P(AttentionOp, AttentionTileKernelIsTheGeneralOne) {
  std::mt19937 rng(61);
  const ScopedEnv mma_off("STRATA_CUDA_ATTN_MMA", "0");
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
      {
        const ScopedEnv tile_off("STRATA_CUDA_ATTN_TILE", "0");
        be().attention(dq.p(), kc.p(), vc.p(), t, sh.T, sh.pos0, sh.H, sh.KV, sh.hd, scale, general.p());
      }
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

// With a position source the position ops add the device's int32 to pos0 as they run: the same bits
// as passing the position itself, for launches sized for any position below max_pos.
TEST_P(AttentionOp, PositionSourceMatchesHostPositions) {
  if (!be().supports_graphs()) {
    std::vector<int32_t> p = {3};
    Dev<int32_t> dp(be(), p, "pos");
    EXPECT_THROW(be().set_position_source(dp.p(), 10), UnsupportedError);
    return;
  }
  std::mt19937 rng(19);
  const int64_t H = 6, KV = 2, hd = 64, width = KV * hd, ctx = 300;
  const float scale = 1.0f / std::sqrt((float)hd);
  for (KvType t : {KvType::F32, KvType::F16})
    for (int32_t pos : {0, 5, 130, 299}) {
      if (!be().supports_kv(t)) continue;
      const size_t cb = (size_t)ctx * width * kv_elem_bytes(t);
      const auto q = randf(rng, H * hd, -2.f, 2.f), k = randf(rng, width, -1.f, 1.f);
      const auto kc = randf(rng, ctx * width, -1.f, 1.f), vc = randf(rng, ctx * width, -1.f, 1.f);
      std::vector<int32_t> p = {pos};
      Dev<int32_t> dp(be(), p, "pos");
      Dev<float> dq1(be(), q, "q"), dq2(be(), q, "q"), dk(be(), k, "k"), dkc(be(), kc, "k rows"),
          dvc(be(), vc, "v rows");
      Dev<uint8_t> kc1(be(), cb, "k cache"), kc2(be(), cb, "k cache"), dv(be(), cb, "v cache");
      be().kv_store(kc1.p(), t, 0, ctx, width, dkc.p());
      be().kv_store(kc2.p(), t, 0, ctx, width, dkc.p());
      be().kv_store(dv.p(), t, 0, ctx, width, dvc.p());
      Dev<float> o1(be(), H * hd, "out"), o2(be(), H * hd, "out");
      const RopeParams rope{hd, 1e6f, true};
      be().head_norm_rope(dq1.p(), 1, H, hd, nullptr, 1e-6f, pos, rope);
      be().kv_store(kc1.p(), t, pos, 1, width, dk.p());
      be().attention(dq1.p(), kc1.p(), dv.p(), t, 1, pos, H, KV, hd, scale, o1.p());
      be().set_position_source(dp.p(), ctx);
      be().head_norm_rope(dq2.p(), 1, H, hd, nullptr, 1e-6f, 0, rope);
      be().kv_store(kc2.p(), t, 0, 1, width, dk.p());
      be().attention(dq2.p(), kc2.p(), dv.p(), t, 1, 0, H, KV, hd, scale, o2.p());
      be().set_position_source(nullptr, 0);
      const std::string at = str(" from the position source at ", pos, ", ", kv_type_name(t));
      expect_same(dq2.get(), dq1.get(), "head_norm_rope" + at);
      expect_same(kc2.get(), kc1.get(), "kv_store" + at);
      expect_same(o2.get(), o1.get(), "attention" + at);
    }
}

}  // namespace
