// ExpertCache: the two-phase protocol (prepare / wait / release) and lending, checked on a backend
// that records every stream operation: misses are copied on the copy stream only after the victim's
// last use, compute waits only for misses, a slot held by the layer is never evicted, lent or
// refilled before its last use, LRU order, pinning, and the device slot table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "expert_cache/expert_cache.h"

using namespace strata;

namespace {

// Forwards memory and ops to the CPU backend and logs the stream operations as text:
// "wait copy e7", "copy->slot3", "record e7 copy", "wait compute e7".
class TraceBackend final : public Backend {
 public:
  TraceBackend() : cpu_(make_cpu_backend(1)) {}
  std::vector<std::string> log;
  uint8_t* arena = nullptr;  // set by the test: slot addresses are logged relative to it
  size_t slot_bytes = 1;
  size_t n_slots = 0;

  const char* name() const override { return "trace"; }
  std::string describe() const override { return "trace"; }
  int threads() const override { return 1; }
  void* alloc(size_t b, const char* w) override { return cpu_->alloc(b, w); }
  void free(void* p) override { cpu_->free(p); }
  void* alloc_pinned(size_t b, const char* w) override { return cpu_->alloc_pinned(b, w); }
  void free_pinned(void* p) override { cpu_->free_pinned(p); }
  size_t live_allocations() const override { return cpu_->live_allocations(); }
  void memory_info(size_t* f, size_t* t) const override { cpu_->memory_info(f, t); }
  bool host_is_device() const override { return true; }
  bool register_host(const void*, size_t) override { return false; }
  void unregister_host(const void*) override {}
  void upload(void* d, const void* s, size_t n) override { cpu_->upload(d, s, n); }
  void download(void* d, const void* s, size_t n) override { cpu_->download(d, s, n); }
  void upload_async(void* d, const void* s, size_t n, Stream st) override {
    const auto* p = static_cast<uint8_t*>(d);
    if (arena && p >= arena && p < arena + n_slots * slot_bytes) log.push_back(str(sname(st), "->slot", (p - arena) / slot_bytes));
    else log.push_back(str(sname(st), "->table"));
    cpu_->upload_async(d, s, n, st);
  }
  DeviceBuffer resident(const void* h, size_t b, const char* w) override { return cpu_->resident(h, b, w); }
  EventId event_create() override { return ++next_; }
  void event_destroy(EventId) override {}
  void record(EventId e, Stream s) override { log.push_back(str("record e", e, " ", sname(s))); }
  void wait(Stream s, EventId e) override { log.push_back(str("wait ", sname(s), " e", e)); }
  bool query(EventId) override { return true; }
  void event_sync(EventId) override {}
  void sync() override {}
#define FWD(name, sig, args) \
  void name sig override { cpu_->name args; }
  FWD(embed, (uint32_t a, const void* b, int64_t c, const int32_t* d, int64_t e, float* f), (a, b, c, d, e, f))
  FWD(rms_scale, (const float* a, int64_t b, int64_t c, float d, float* e), (a, b, c, d, e))
  FWD(apply_norm,
      (const float* a, const float* b, const float* c, int64_t d, const int32_t* e, int64_t f, int64_t g, float* h),
      (a, b, c, d, e, f, g, h))
  FWD(gather, (const float* a, int64_t b, const int32_t* c, int64_t d, int64_t e, float* f), (a, b, c, d, e, f))
  FWD(quantize_q8_0,
      (const float* a, const float* b, const float* c, int64_t d, const int32_t* e, int64_t f, int64_t g, uint8_t* h,
       size_t i),
      (a, b, c, d, e, f, g, h, i))
  FWD(matmul_q8,
      (uint32_t a, const void* b, int64_t c, int64_t d, const uint8_t* e, size_t f, int64_t g, float* h, int64_t i),
      (a, b, c, d, e, f, g, h, i))
  FWD(dequant_rows, (uint32_t a, const void* b, size_t c, int64_t d, int64_t e, float* f), (a, b, c, d, e, f))
  FWD(copy, (void* a, const void* b, size_t c), (a, b, c))
  FWD(matmul,
      (uint32_t a, const void* b, int64_t c, int64_t d, const float* e, int64_t f, int64_t g, float* h, int64_t i),
      (a, b, c, d, e, f, g, h, i))
  FWD(head_norm_rope,
      (float* a, int64_t b, int64_t c, int64_t d, const float* e, float f, int64_t g, const RopeParams& h),
      (a, b, c, d, e, f, g, h))
  bool supports_kv(KvType t) const override { return cpu_->supports_kv(t); }
  FWD(kv_store, (void* a, KvType b, int64_t c, int64_t d, int64_t e, const float* f), (a, b, c, d, e, f))
  FWD(attention,
      (const float* a, const void* b, const void* c, KvType t, int64_t d, int64_t e, int64_t f, int64_t g, int64_t h,
       float i, float* j),
      (a, b, c, t, d, e, f, g, h, i, j))
  FWD(add, (float* a, const float* b, int64_t c), (a, b, c))
  FWD(router_topk, (const float* a, int64_t b, int64_t c, int64_t d, bool e, int32_t* f, float* g),
      (a, b, c, d, e, f, g))
  FWD(group_by_expert, (const int32_t* a, int64_t b, int64_t c, int64_t d, int32_t* e, int32_t* f),
      (a, b, c, d, e, f))
  FWD(swiglu, (float* a, const float* b, int64_t c), (a, b, c))
  FWD(scatter_add, (const float* a, const int32_t* b, const float* c, int64_t d, int64_t e, int64_t f, float* g),
      (a, b, c, d, e, f, g))
  FWD(zero, (void* a, size_t b), (a, b))
  FWD(fill, (void* a, uint8_t b, size_t c), (a, b, c))
  FWD(apply_norm_hc,
      (const float* a, const float* b, const float* c, int64_t d, int64_t e, const int32_t* f, int64_t g, int64_t h,
       float* i),
      (a, b, c, d, e, f, g, h, i))
  FWD(quantize_q8_0_hc,
      (const float* a, const float* b, const float* c, int64_t d, int64_t e, const int32_t* f, int64_t g, int64_t h,
       uint8_t* i, size_t j),
      (a, b, c, d, e, f, g, h, i, j))
  FWD(hc_pre,
      (const float* a, const float* b, int64_t c, int64_t d, int64_t e, float f, const float* g, const float* h,
       float i, int64_t j, float* k, float* l, float* m),
      (a, b, c, d, e, f, g, h, i, j, k, l, m))
  FWD(hc_post, (float* a, const float* b, const float* c, const float* d, int64_t e, int64_t f, int64_t g),
      (a, b, c, d, e, f, g))
  FWD(hc_expand, (const float* a, int64_t b, int64_t c, int64_t d, float* e), (a, b, c, d, e))
  FWD(rms_norm, (float* a, int64_t b, int64_t c, const float* d, float e), (a, b, c, d, e))
  FWD(rope_tail,
      (float* a, int64_t b, int64_t c, int64_t d, int64_t e, const float* f, float g, int64_t h, int64_t i, bool j),
      (a, b, c, d, e, f, g, h, i, j))
  FWD(ring_store, (float* a, int64_t b, int64_t c, int64_t d, int64_t e, const float* f), (a, b, c, d, e, f))
  FWD(compress_pool,
      (const float* a, const float* b, const float* c, const float* d, const float* e, int64_t f, int64_t g, int64_t h,
       int64_t i, int64_t j, float* k),
      (a, b, c, d, e, f, g, h, i, j, k))
  FWD(attention_sink,
      (const float* a, const float* b, const float* c, int64_t d, const float* e, int64_t f, const int32_t* g,
       int64_t h, const float* i, int64_t j, int64_t k, int64_t l, int64_t m, float n, float* o),
      (a, b, c, d, e, f, g, h, i, j, k, l, m, n, o))
  FWD(indexer_topk,
      (const float* a, const float* b, const float* c, int64_t d, int64_t e, int64_t f, int64_t g, int64_t h,
       int64_t i, float j, int32_t* k),
      (a, b, c, d, e, f, g, h, i, j, k))
  FWD(router_v4,
      (const float* a, int64_t b, int64_t c, int64_t d, const float* e, const int32_t* f, const int32_t* g, bool h,
       float i, int32_t* j, float* k),
      (a, b, c, d, e, f, g, h, i, j, k))
  FWD(swiglu_clamp, (float* a, const float* b, int64_t c, float d), (a, b, c, d))
#undef FWD

 private:
  static const char* sname(Stream s) { return s == Stream::Copy ? "copy" : "compute"; }
  std::unique_ptr<Backend> cpu_;
  EventId next_ = 0;
};

// L layers of E experts; expert (l, e) is `bytes` bytes of the value 16 * l + e.
struct Fixture {
  Fixture(int64_t L, int64_t E, size_t bytes) {
    host.resize(L * 3);
    std::vector<ExpertLayerLayout> layers(L);
    for (int64_t l = 0; l < L; ++l) {
      for (int k = 0; k < 3; ++k) {
        auto& h = host[l * 3 + k];
        h.resize(bytes * E);
        for (int64_t e = 0; e < E; ++e) std::memset(h.data() + e * bytes, int(16 * l + e), bytes);
      }
      for (auto [t, k] : {std::pair{&layers[l].gate, 0}, {&layers[l].up, 1}, {&layers[l].down, 2}}) {
        t->type = 0;
        t->rows = 1;
        t->cols = (int64_t)bytes / 4;
        t->bytes = bytes;
        t->host = host[l * 3 + k].data();
      }
    }
    layout = ExpertLayout::make(E, std::move(layers));
  }
  std::vector<std::vector<uint8_t>> host;
  ExpertLayout layout;
};

size_t count(const std::vector<std::string>& log, const std::string& s) {
  return (size_t)std::count(log.begin(), log.end(), s);
}

}  // namespace

TEST(ExpertCache, PrepareQueuesMissesAfterLastUseAndComputeWaitsOnlyForThem) {
  Fixture fx(2, 8, 256);
  TraceBackend be;
  auto src = make_mmap_source(fx.layout);
  const size_t slot = fx.layout.slot_bytes;
  ExpertCache cache(be, fx.layout, src.get(), 4 * slot);
  be.arena = const_cast<uint8_t*>(cache.wait_base_for_tests());
  be.slot_bytes = slot;
  be.n_slots = (size_t)cache.n_slots();

  const int32_t ids[] = {1, 5};
  be.log.clear();
  ASSERT_EQ(cache.prepare(0, ids, 2), 2);
  // Each miss: the copy stream waits for the slot's last use, three copies land, the ready event.
  // Slots are empty: 0 and 1. Event ids: ready_s = 2s + 1, last_use_s = 2s + 2.
  const std::vector<std::string> want = {"wait copy e2",    "copy->slot0", "copy->slot0", "copy->slot0",
                                         "record e1 copy",  "wait copy e4", "copy->slot1", "copy->slot1",
                                         "copy->slot1",     "record e3 copy", "compute->table"};
  EXPECT_EQ(be.log, want);
  be.log.clear();
  const ExpertView v = cache.wait(0, 5);
  EXPECT_EQ(be.log, std::vector<std::string>{"wait compute e3"});
  EXPECT_EQ(v.gate[0], 5);
  EXPECT_EQ(v.up[255], 5);
  EXPECT_EQ(v.down[255], 5);
  be.log.clear();
  cache.wait(0, 5);  // waited once already: the stream is ordered after it
  EXPECT_TRUE(be.log.empty());
  cache.wait(0, 1);
  cache.release(0);
  EXPECT_EQ(count(be.log, "record e2 compute"), 1u);
  EXPECT_EQ(count(be.log, "record e4 compute"), 1u);

  // Hits: no copy and no wait.
  be.log.clear();
  ASSERT_EQ(cache.prepare(0, ids, 2), 2);
  cache.wait(0, 1);
  cache.wait(0, 5);
  cache.release(0);
  for (const auto& s : be.log) EXPECT_EQ(s.find("wait"), std::string::npos) << s;
  EXPECT_EQ(cache.stats().hits, 2u);
  EXPECT_EQ(cache.stats().misses, 2u);

  // The device slot table says where every expert is.
  std::vector<int32_t> table(2 * 8);
  be.download(table.data(), cache.slot_table(), table.size() * 4);
  EXPECT_EQ(table, cache.slot_index());
  EXPECT_EQ(table[1], 0);
  EXPECT_EQ(table[5], 1);
  EXPECT_EQ(table[8 + 1], -1);
}

TEST(ExpertCache, HeldSlotsAreNeverEvictedAndBatchesSplitWhenSlotsRunOut) {
  Fixture fx(1, 8, 256);
  TraceBackend be;
  auto src = make_mmap_source(fx.layout);
  ExpertCache cache(be, fx.layout, src.get(), 3 * fx.layout.slot_bytes);
  const int32_t ids[] = {0, 1, 2, 3, 4};
  // Three slots: the first three are held, the rest wait for a release.
  ASSERT_EQ(cache.prepare(0, ids, 5), 3);
  for (int e = 0; e < 3; ++e) EXPECT_EQ(cache.wait(0, e).gate[0], e);
  EXPECT_THROW(cache.wait(0, 3), Error);  // not prepared
  cache.release(0);
  ASSERT_EQ(cache.prepare(0, ids + 3, 2), 2);
  for (int e = 3; e < 5; ++e) EXPECT_EQ(cache.wait(0, e).gate[0], e);
  cache.release(0);
  EXPECT_EQ(cache.stats().misses, 5u);
  EXPECT_EQ(cache.stats().evictions, 2u);
}

TEST(ExpertCache, EvictsLeastRecentlyUsed) {
  Fixture fx(1, 8, 256);
  TraceBackend be;
  auto src = make_mmap_source(fx.layout);
  ExpertCache cache(be, fx.layout, src.get(), 3 * fx.layout.slot_bytes);
  auto use = [&](int32_t e) {
    ASSERT_EQ(cache.prepare(0, &e, 1), 1);
    cache.wait(0, e);
    cache.release(0);
  };
  use(0), use(1), use(2), use(0);  // recency: 1 < 2 < 0
  use(3);                          // evicts 1
  EXPECT_FALSE(cache.resident(0, 1));
  EXPECT_TRUE(cache.resident(0, 0) && cache.resident(0, 2) && cache.resident(0, 3));
  use(4);  // evicts 2
  EXPECT_FALSE(cache.resident(0, 2));
  EXPECT_TRUE(cache.resident(0, 0));
}

TEST(ExpertCache, LendWaitsForLandingCopiesAndRefillsAfterTheChunksLastUse) {
  Fixture fx(1, 8, 256);
  TraceBackend be;
  auto src = make_mmap_source(fx.layout);
  const size_t slot = fx.layout.slot_bytes;
  ExpertCache cache(be, fx.layout, src.get(), 4 * slot);
  be.arena = const_cast<uint8_t*>(cache.wait_base_for_tests());
  be.slot_bytes = slot;
  be.n_slots = (size_t)cache.n_slots();
  const int32_t ids[] = {0, 1, 2, 3};
  ASSERT_EQ(cache.prepare(0, ids, 4), 4);
  cache.release(0);  // nobody waited: all four copies are still "landing"
  cache.pin(0, 3);
  be.log.clear();
  auto [region, bytes] = cache.lend(2);
  EXPECT_EQ(bytes, 2 * slot);
  // The least valuable run of two unpinned slots: 0-1; compute waits for their copies.
  EXPECT_EQ(region, be.arena);
  EXPECT_EQ(be.log, (std::vector<std::string>{"wait compute e1", "wait compute e3"}));
  EXPECT_THROW(cache.lend(1), Error);  // already lent
  const int32_t e3 = 3;
  ASSERT_EQ(cache.prepare(0, &e3, 1), 1);  // a hit on the pinned slot
  cache.release(0);
  be.log.clear();
  cache.give_back();
  // The region's last use is recorded before the refills, which wait for it.
  const std::vector<std::string> want = {"record e2 compute", "record e4 compute", "wait copy e2", "copy->slot0",
                                         "copy->slot0",       "copy->slot0",       "record e1 copy", "wait copy e4",
                                         "copy->slot1",       "copy->slot1",       "copy->slot1",    "record e3 copy"};
  EXPECT_EQ(be.log, want);
  EXPECT_EQ(cache.stats().refills, 2u);
  // Lending never covers the pinned slot, even when every other run is more valuable.
  for (int i = 0; i < 3; ++i) {
    auto [r, n] = cache.lend(3);
    EXPECT_EQ(r, be.arena);  // slots 0-2: the only run of three without slot 3
    cache.give_back();
  }
  EXPECT_THROW(cache.lend(4), MemoryError);
  EXPECT_TRUE(cache.resident(0, 3));
}
