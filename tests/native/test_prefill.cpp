// Prefill: invariant 1 (exact sizing) and 2 (one plan, one choice) at the carve level. Every
// buffer carve() hands out is written in full inside a region of exactly bytes_needed bytes,
// fenced by guard bytes; a region one byte short is refused.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/memory.h"
#include "model/blocks.h"
#include "model/deepseek4.h"
#include "prefill/chunk_plan.h"
#include "prefill/prefill.h"

using namespace strata;

namespace {

constexpr uint8_t kGuardByte = 0xA5;
constexpr size_t kGuard = 4096;  // guard bytes on each side (a multiple of kAlign)
constexpr uint32_t kQ4K = 12;    // ggml type id of Q4_K

// A qwen3moe-like shape: the attention block's scratch (model/blocks.h's declaration) for H heads,
// KV kv heads of hd.
PrefillShape make_shape(int64_t D, int64_t HC, int64_t E, int64_t K, int64_t F, int64_t H, int64_t KV,
                        int64_t hd, bool unfused) {
  PrefillShape s;
  s.D = D;
  s.HC = HC;
  s.E = E;
  s.K = K;
  s.F = F;
  s.expert_types = {kQ4K, kQ4K, kQ4K};
  s.gr_unfused = unfused;
  ScratchList list;
  declare_attention(list, AttentionShape{H, KV, hd, 1e-6f, RopeParams{hd, 1e4f, true}});
  s.scratch = list.specs();
  return s;
}

// A V4 spec with one layer per compress ratio in `ratios` (the indexer's shape used only with a 4).
std::pair<ModelSpec, Ds4Spec> v4_spec(int64_t D, int64_t H, int64_t hd, std::vector<int64_t> ratios) {
  ModelSpec m;
  m.D = D;
  m.n_head = H;
  m.n_kv_head = 1;
  m.head_dim = hd;
  Ds4Spec d;
  d.q_lora = 24;
  d.o_groups = 2;
  d.o_lora = 12;
  d.idx_heads = 3;
  d.idx_dim = 32;
  d.idx_topk = 5;
  d.shared_ffn = 40;
  for (int64_t r : ratios) d.layers.push_back(Ds4Layer{r});
  return {m, d};
}

// DeepSeek V4's scratch (its own declaration, model/deepseek4.h) on a shape.
PrefillShape v4(PrefillShape s, std::vector<int64_t> ratios) {
  const auto [m, d] = v4_spec(s.D, 2, 16, std::move(ratios));
  ScratchList list;
  ds4_scratch(m, d, list);
  s.scratch = list.specs();
  return s;
}

// Small enough that T = 65536 stays around 200 MB in the largest layout. Each shape twice: as the
// default plans it (MMQ with a source too) and with streamed_fused (moe_layout "fused"), so the
// src=true cases carve both MoE layouts.
std::vector<std::pair<std::string, PrefillShape>> shapes() {
  std::vector<std::pair<std::string, PrefillShape>> v = {
      {"qwen-like", make_shape(64, 1, 8, 2, 32, 4, 2, 16, false)},
      {"qwen-like-unfused", make_shape(64, 1, 8, 2, 32, 4, 2, 16, true)},
      {"hc4-unfused", make_shape(32, 4, 4, 4, 96, 2, 1, 16, true)},  // K == E, F not a power of two
      {"hc4-fused-gr", make_shape(96, 4, 5, 1, 32, 6, 3, 18, false)},
      {"v4-indexer-unfused", v4(make_shape(32, 4, 4, 2, 32, 2, 1, 16, true), {0, 4, 128})},
      {"v4-hca-only", v4(make_shape(32, 4, 5, 3, 32, 4, 1, 18, false), {128, 0})},
      {"v4-window-only", v4(make_shape(64, 4, 3, 1, 32, 2, 1, 16, false), {0})},
  };
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) {
    PrefillShape s = v[i].second;
    s.streamed_fused = true;
    v.emplace_back(v[i].first + "-streamed-fused", std::move(s));
  }
  return v;
}

const std::vector<int64_t> kTokens = {1, 2, 3, 17, 255, 256, 257, 4096, 65536};

// A 256-aligned allocation with kGuard guard bytes on each side of a region of exactly `bytes`.
struct Fenced {
  explicit Fenced(size_t bytes) : bytes(bytes) {
    const size_t total = align_up(kGuard + bytes + kGuard);
    base = static_cast<uint8_t*>(std::aligned_alloc(kAlign, total));
    if (base) std::memset(base, kGuardByte, total);
    tail = total - kGuard - bytes;  // >= kGuard
  }
  ~Fenced() { std::free(base); }
  Fenced(const Fenced&) = delete;
  Fenced& operator=(const Fenced&) = delete;
  uint8_t* region() const { return base + kGuard; }
  // The first changed guard byte as an offset from the region start, or 0 with ok = true.
  bool guards_intact(int64_t* where) const {
    for (size_t i = 0; i < kGuard; ++i)
      if (base[i] != kGuardByte) return *where = (int64_t)i - (int64_t)kGuard, false;
    for (size_t i = 0; i < tail; ++i)
      if (region()[bytes + i] != kGuardByte) return *where = (int64_t)(bytes + i), false;
    return true;
  }
  size_t bytes;
  size_t tail = 0;
  uint8_t* base = nullptr;
};

// The PrefillBuffers pointer a plan buffer lands in: a common one by its name, an architecture's by
// its entry (which must carry the same name).
const void* pointer_of(const PrefillShape& shape, const PrefillBuffers& b, const BufferSpec& s) {
  if (s.scratch_index >= 0) {
    EXPECT_EQ(shape.scratch.at(s.scratch_index).name, s.name);
    return b.scratch.at(s.scratch_index);
  }
  const std::string& n = s.name;
  if (n == "R") return b.R;
  if (n == "grs") return b.grs;
  if (n == "xn") return b.xn;
  if (n == "proj") return b.proj;
  if (n == "router.logits") return b.router;
  if (n == "router.ids") return b.topk_ids;
  if (n == "router.weights") return b.topk_w;
  if (n == "moe.offsets") return b.expert_off;
  if (n == "moe.rows") return b.expert_rows;
  if (n == "moe.x") return b.xg;
  if (n == "moe.xq") return b.xq;
  if (n == "moe.gate") return b.hg;
  if (n == "moe.up") return b.hu;
  if (n == "moe.down") return b.yd;
  ADD_FAILURE() << "plan buffer '" << n << "' has no PrefillBuffers field";
  return nullptr;
}

std::vector<const void*> all_pointers(const PrefillBuffers& b) {
  std::vector<const void*> v = {b.R,          b.grs,         b.xn, b.proj, b.router, b.topk_ids, b.topk_w,
                                b.expert_off, b.expert_rows, b.xg, b.xq,   b.hg,     b.hu,       b.yd};
  v.insert(v.end(), b.scratch.begin(), b.scratch.end());
  return v;
}

}  // namespace

TEST(Prefill, CarveWritesStayInsideExactRegion) {
  for (const auto& [name, shape] : shapes()) {
    const Prefill pf(shape);
    for (const bool src : {true, false}) {
      for (const int64_t T : kTokens) {
        SCOPED_TRACE(name + " src=" + std::to_string(src) + " T=" + std::to_string(T));
        const PrefillPlan plan = pf.layout(T, src);
        const size_t need = pf.bytes_needed(T, src);
        ASSERT_EQ(plan.total, need);
        ASSERT_EQ(need % kAlign, 0u);
        // bytes_needed == sum of the aligned buffer sizes == aligned end of the last buffer
        size_t sum = 0;
        for (const auto& s : plan.buffers) {
          EXPECT_EQ(s.offset, sum) << s.name;
          EXPECT_EQ(s.offset % kAlign, 0u) << s.name;
          sum += align_up(s.bytes);
        }
        ASSERT_EQ(sum, need);

        Fenced mem(need);
        ASSERT_NE(mem.base, nullptr) << "could not allocate " << need << " bytes";
        const PrefillBuffers b = pf.carve(mem.region(), need, T, src);
        EXPECT_EQ(b.T, T);
        EXPECT_EQ(b.moe, plan.moe);

        // every non-null pointer lies inside the region, 256-aligned
        const auto* lo = mem.region();
        const auto* hi = mem.region() + need;
        for (const void* p : all_pointers(b)) {
          if (!p) continue;
          const auto* q = static_cast<const uint8_t*>(p);
          EXPECT_TRUE(q >= lo && q < hi)
              << "pointer at offset " << (q - lo) << " outside [0, " << need << ")";
          EXPECT_EQ(reinterpret_cast<uintptr_t>(q) % kAlign, 0u);
        }
        // each plan buffer sits at its offset, and writing it in full stays inside the region
        size_t non_null = 0;
        for (const auto& s : plan.buffers) {
          const void* p = pointer_of(shape, b, s);
          ASSERT_EQ(p, static_cast<const void*>(mem.region() + s.offset)) << s.name;
          ASSERT_LE(s.offset + s.bytes, need) << s.name;
          std::memset(mem.region() + s.offset, 0x5A ^ (int)(s.offset / kAlign & 0x7f), s.bytes);
          ++non_null;
        }
        size_t carved = 0;
        for (const void* p : all_pointers(b)) carved += p != nullptr;
        EXPECT_EQ(carved, non_null) << "a PrefillBuffers pointer is set that the plan does not size";
        int64_t where = 0;
        EXPECT_TRUE(mem.guards_intact(&where)) << "guard byte changed at region offset " << where;

        // the pointers that must be absent are: xn unless unfused; the other layout's MoE buffer
        EXPECT_EQ(b.xn != nullptr, shape.gr_unfused);
        EXPECT_NE(b.grs, nullptr);
        EXPECT_EQ(b.HC, shape.HC);
        // every entry of the architecture's list is carved
        ASSERT_EQ(b.scratch.size(), shape.scratch.size());
        for (const void* p : b.scratch) EXPECT_NE(p, nullptr);
        if (b.moe == MoeLayout::Fused) {
          EXPECT_NE(b.xg, nullptr);
          EXPECT_EQ(b.xq, nullptr);
        } else {
          EXPECT_EQ(b.xg, nullptr);
          EXPECT_NE(b.xq, nullptr);
        }
      }
    }
  }
}

TEST(Prefill, RegionOneByteShortThrows) {
  for (const auto& [name, shape] : shapes()) {
    const Prefill pf(shape);
    for (const bool src : {true, false}) {
      for (const int64_t T : kTokens) {
        if (T > 4096) continue;  // the size check happens before any write; large T adds nothing
        SCOPED_TRACE(name + " src=" + std::to_string(src) + " T=" + std::to_string(T));
        const size_t need = pf.bytes_needed(T, src);
        Fenced mem(need);
        ASSERT_NE(mem.base, nullptr);
        EXPECT_THROW(pf.carve(mem.region(), need - 1, T, src), MemoryError);
        EXPECT_THROW(pf.carve(nullptr, need, T, src), MemoryError);
        EXPECT_NO_THROW(pf.carve(mem.region(), need, T, src));
        EXPECT_NO_THROW(pf.carve(mem.region(), need + 1, T, src));
      }
    }
  }
}

TEST(Prefill, MisalignedRegionThrows) {
  const Prefill pf(shapes()[0].second);
  const size_t need = pf.bytes_needed(17, true);
  Fenced mem(need + kAlign);
  ASSERT_NE(mem.base, nullptr);
  EXPECT_THROW(pf.carve(mem.region() + 8, need + kAlign - 8, 17, true), ConfigError);
}

TEST(Prefill, LayoutAndBytesNeededAgree) {
  for (const auto& [name, shape] : shapes()) {
    const Prefill pf(shape);
    size_t prev[2] = {0, 0};
    for (int64_t T = 1; T <= 1100; ++T) {
      for (const bool src : {true, false}) {
        const PrefillPlan p = pf.layout(T, src);
        ASSERT_EQ(p.total, pf.bytes_needed(T, src)) << name << " T=" << T;
        ASSERT_EQ(p.T, T);
        ASSERT_EQ(p.src, src);
        ASSERT_GE(p.total, prev[src]) << name << " T=" << T << ": bytes_needed shrank";
        prev[src] = p.total;
      }
    }
  }
}

TEST(Prefill, FusedOrMmqChosenBySourceAndFlag) {
  for (const auto& [name, shape] : shapes()) {
    const Prefill pf(shape);
    ASSERT_TRUE(pf.fused_supported()) << name;
    // fused only where a source streams the experts and streamed_fused asks for it; MMQ otherwise
    const MoeLayout streamed = shape.streamed_fused ? MoeLayout::Fused : MoeLayout::MMQ;
    for (const int64_t T : kTokens) {
      EXPECT_EQ(pf.fused_layout(T, true), streamed) << name;
      EXPECT_EQ(pf.fused_layout(T, false), MoeLayout::MMQ) << name;
      EXPECT_EQ(pf.layout(T, true).moe, streamed) << name;
      EXPECT_EQ(pf.layout(T, false).moe, MoeLayout::MMQ) << name;
    }
  }
  EXPECT_STREQ(moe_layout_name(MoeLayout::Fused), "fused");
  EXPECT_STREQ(moe_layout_name(MoeLayout::MMQ), "mmq");
  // no expert type the fused path supports: MMQ even with a source and streamed_fused
  PrefillShape s = shapes()[0].second;
  s.streamed_fused = true;
  s.expert_types.clear();
  const Prefill pf(s);
  EXPECT_FALSE(pf.fused_supported());
  EXPECT_EQ(pf.layout(16, true).moe, MoeLayout::MMQ);
}

TEST(Prefill, RejectsBadShapesAndChunks) {
  EXPECT_THROW(Prefill(make_shape(0, 1, 8, 2, 32, 4, 2, 16, false)), ConfigError);
  EXPECT_THROW(Prefill(make_shape(64, 0, 8, 2, 32, 4, 2, 16, false)), ConfigError);
  EXPECT_THROW(Prefill(make_shape(64, 1, 8, 9, 32, 4, 2, 16, false)), ConfigError);  // K > E
  EXPECT_THROW(Prefill(make_shape(64, 1, 8, 2, 0, 4, 2, 16, false)), ConfigError);
  const Prefill pf(shapes()[0].second);
  EXPECT_THROW(pf.layout(0, true), ConfigError);
  EXPECT_THROW(pf.bytes_needed(-1, false), ConfigError);
}

TEST(Prefill, RejectsBadScratch) {
  PrefillShape s = shapes()[0].second;
  s.scratch.push_back(ScratchSpec{"extra", ScratchType::F32, {4, 0}});
  EXPECT_THROW(Prefill{s}, ConfigError);  // an empty dimension
  s.scratch.back() = ScratchSpec{"", ScratchType::F32, {4}};
  EXPECT_THROW(Prefill{s}, ConfigError);  // no name
  s.scratch.back() = ScratchSpec{"proj", ScratchType::F32, {4}};
  const Prefill pf(s);
  EXPECT_THROW(pf.layout(8, true), ConfigError);  // a name the plan already has
}

// An architecture's handles resolve to the buffers of their names, whatever sits before them.
TEST(Prefill, ScratchHandlesResolveToTheirBuffers) {
  for (const bool unfused : {false, true}) {
    PrefillShape s = make_shape(32, 4, 4, 2, 32, 2, 1, 16, unfused);
    const auto [m, d] = v4_spec(32, 2, 16, {0, 4});
    ScratchList list;
    const Ds4Scratch h = ds4_scratch(m, d, list);
    s.scratch = list.specs();
    const Prefill pf(s);
    const PrefillPlan plan = pf.layout(9, true);
    Fenced mem(plan.total);
    const PrefillBuffers b = pf.carve(mem.region(), plan.total, 9, true);
    auto at = [&](const std::string& name) -> const void* {
      for (const auto& x : plan.buffers)
        if (x.name == name) return mem.region() + x.offset;
      ADD_FAILURE() << name << " is not in the plan";
      return nullptr;
    };
    EXPECT_EQ(b[h.hc_mix], at("hc.mix"));
    EXPECT_EQ(b[h.tokens], at("tokens"));
    EXPECT_EQ(b[h.out], at("attn.out"));
    EXPECT_EQ(b[h.idx_sel], at("index.sel"));
    EXPECT_EQ(b[h.sh_out], at("shexp.out"));
    EXPECT_EQ(b.proj, at("proj"));
  }
}

// The three --prefill modes on one cache. Fixed is exactly N, or an error naming with units the
// cache that fits N and the largest --prefill that fits the cache; Default is N when it fits, else
// what Auto takes (so a small cache steps the default chunk down instead of failing).
TEST(ChunkPlan, ModesAndTheirErrors) {
  const Prefill pf(shapes()[0].second);
  const size_t slot = 4096;
  const int64_t n = region_slots(pf, 256, slot) + 2;  // room for 256 tokens and an expert, not 8192
  const ChunkPlan fixed = plan_chunk(pf, slot, n, n * slot, 8192, PrefillMode::Fixed);
  ASSERT_FALSE(fixed.fits);
  const std::string& e = fixed.error;
  ASSERT_NE(e.find("MiB or more, or --prefill "), std::string::npos) << e;
  const int64_t named = std::stoll(e.substr(e.find(", or --prefill ") + 15));
  EXPECT_GE(named, 256) << e;
  EXPECT_TRUE(plan_chunk(pf, slot, n, n * slot, named, PrefillMode::Fixed).fits) << e;
  EXPECT_FALSE(plan_chunk(pf, slot, n, n * slot, named + 1, PrefillMode::Fixed).fits) << e;
  const uint64_t mib = std::stoull(e.substr(e.find("use --expert-cache ") + 19));
  EXPECT_TRUE(plan_chunk(pf, slot, (int64_t)((mib << 20) / slot), mib << 20, 8192, PrefillMode::Fixed).fits)
      << e;

  const ChunkPlan def = plan_chunk(pf, slot, n, n * slot, 8192, PrefillMode::Default);
  const ChunkPlan aut = plan_chunk(pf, slot, n, n * slot, 8192, PrefillMode::Auto);
  EXPECT_TRUE(def.fits && aut.fits);
  EXPECT_EQ(def.chunk, aut.chunk);
  EXPECT_LT(def.chunk, 8192);
  // Room for 8192 and one expert: Default and Fixed take it, Auto (room for a layer's experts) less.
  const int64_t n8k = region_slots(pf, 8192, slot) + 1;
  EXPECT_EQ(plan_chunk(pf, slot, n8k, n8k * slot, 8192, PrefillMode::Default).chunk, 8192);
  EXPECT_EQ(plan_chunk(pf, slot, n8k, n8k * slot, 8192, PrefillMode::Fixed).chunk, 8192);
  EXPECT_LT(plan_chunk(pf, slot, n8k, n8k * slot, 8192, PrefillMode::Auto).chunk, 8192);
  // No chunk fits: the error names a cache with its unit, and no --prefill.
  const ChunkPlan none = plan_chunk(pf, slot, 1, slot, 8192, PrefillMode::Fixed);
  EXPECT_FALSE(none.fits);
  EXPECT_EQ(none.error.find("--prefill"), std::string::npos) << none.error;
  EXPECT_NE(none.error.find("MiB or more"), std::string::npos) << none.error;

  for (PrefillMode m : {PrefillMode::Default, PrefillMode::Fixed, PrefillMode::Auto})
    EXPECT_EQ(parse_prefill_mode(prefill_mode_name(m)), m);
  EXPECT_THROW(parse_prefill_mode("fast"), ConfigError);
}
