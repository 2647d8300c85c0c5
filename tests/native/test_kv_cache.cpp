// KVCache's sequence regions: each region of each layer is its own block of the allocation, none
// overlapping another, for keys and values and for an architecture's own tensor layout; the selected
// region is the one a one-sequence pass reads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "model/kv_cache.h"
#include "model/spec.h"

using namespace strata;

namespace {

using Range = std::pair<const uint8_t*, const uint8_t*>;

// Every range inside [lo, hi) and no two overlapping.
void expect_disjoint_inside(std::vector<Range> r, const uint8_t* lo, const uint8_t* hi) {
  std::sort(r.begin(), r.end());
  for (size_t i = 0; i < r.size(); ++i) {
    EXPECT_GE(r[i].first, lo);
    EXPECT_LE(r[i].second, hi);
    if (i) EXPECT_LE(r[i - 1].second, r[i].first) << "regions " << i - 1 << " and " << i << " overlap";
  }
}

}  // namespace

TEST(KVCache, RegionsOfKeysAndValuesAreDisjointBlocks) {
  auto be = make_cpu_backend(1);
  ModelSpec s;
  s.L = 3;
  s.n_kv_head = 2;
  s.head_dim = 5;  // width 10: rows of 40 bytes (f32), 20 (f16)
  for (KvType t : {KvType::F32, KvType::F16}) {
    const int64_t ctx = 7, seqs = 4, width = 10;
    KVCache kv(*be, t, s, ctx, seqs);
    EXPECT_EQ(kv.ctx(), ctx);
    EXPECT_EQ(kv.seqs(), seqs);
    EXPECT_EQ(kv.total_bytes(), KVCache::bytes(t, s, ctx, seqs));
    const size_t region = (size_t)ctx * width * kv_elem_bytes(t);
    EXPECT_EQ(kv.total_bytes(), 2 * region * s.L * seqs);
    std::vector<Range> ks, vs;
    for (int64_t l = 0; l < s.L; ++l)
      for (int64_t r = 0; r < seqs; ++r) {
        const auto* k = static_cast<const uint8_t*>(kv.k(l, r));
        const auto* v = static_cast<const uint8_t*>(kv.v(l, r));
        ks.emplace_back(k, k + region);
        vs.emplace_back(v, v + region);
        kv.select(r);
        EXPECT_EQ(kv.k(l), kv.k(l, r));
        EXPECT_EQ(kv.v(l), kv.v(l, r));
      }
    const auto* k0 = static_cast<const uint8_t*>(kv.k(0, 0));
    const auto* v0 = static_cast<const uint8_t*>(kv.v(0, 0));
    expect_disjoint_inside(ks, k0, k0 + region * s.L * seqs);
    expect_disjoint_inside(vs, v0, v0 + region * s.L * seqs);
    EXPECT_THROW(kv.select(seqs), Error);
    EXPECT_THROW(kv.select(-1), Error);
  }
  // One region is the layout it always was: layer l at l blocks of ctx rows.
  KVCache one(*be, KvType::F32, s, 9);
  EXPECT_EQ(static_cast<uint8_t*>(one.k(2)) - static_cast<uint8_t*>(one.k(0)), 2 * 9 * 10 * 4);
}

TEST(KVCache, AnArchitecturesOwnLayoutHasACopyARegion) {
  auto be = make_cpu_backend(1);
  ModelSpec s;
  s.L = 2;
  // A window ring of 3 rows, compressed rows every 4 positions, per layer (as DeepSeek V4 lays them).
  for (int64_t l = 0; l < s.L; ++l) s.kv_layers.push_back({{"window", 3, 0, 6}, {"comp", 0, 4, 5}});
  const int64_t ctx = 10, seqs = 3;
  KVCache kv(*be, KvType::F32, s, ctx, seqs);
  EXPECT_EQ(kv.total_bytes(), KVCache::bytes(KvType::F32, s, ctx, seqs));
  EXPECT_EQ(kv.total_bytes() % seqs, 0u);
  const size_t region = kv.total_bytes() / seqs;
  std::vector<Range> all;
  const uint8_t* base = nullptr;
  for (int64_t r = 0; r < seqs; ++r) {
    kv.select(r);
    for (int64_t l = 0; l < s.L; ++l) {
      const auto* w = reinterpret_cast<const uint8_t*>(kv.tensor(l, "window"));
      const auto* c = reinterpret_cast<const uint8_t*>(kv.tensor(l, "comp"));
      all.emplace_back(w, w + 3 * 6 * sizeof(float));
      all.emplace_back(c, c + KVCache::tensor_rows({"comp", 0, 4, 5}, ctx) * 5 * sizeof(float));
      if (r == 0 && l == 0) base = w;
      if (r > 0) {  // the same tensor of region 0, `region` bytes on a region
        kv.select(0);
        const auto* w0 = reinterpret_cast<const uint8_t*>(kv.tensor(l, "window"));
        kv.select(r);
        EXPECT_EQ(w - w0, (std::ptrdiff_t)(region * r));
      }
    }
  }
  expect_disjoint_inside(all, base, base + kv.total_bytes());
}
