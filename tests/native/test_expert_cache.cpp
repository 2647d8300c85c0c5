// ExpertCache: the two-phase protocol (prepare / wait / release) and lending, checked on a backend
// that records every stream operation: misses are copied on the copy stream only after the victim's
// last use, compute waits only for misses, a slot held by the layer is never evicted, lent or
// refilled before its last use, LRU order, pinning, and the device slot table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "expert_cache/expert_cache.h"
#include "expert_cache/stage_copy.h"
#include "forwarding_backend.h"

using namespace strata;

namespace {

// Forwards memory and ops to the CPU backend and logs the stream operations as text:
// "wait copy e7", "copy->slot3", "record e7 copy", "wait compute e7".
class TraceBackend final : public testing_support::ForwardingBackend {
 public:
  std::vector<std::string> log;
  uint8_t* arena = nullptr;  // set by the test: slot addresses are logged relative to it
  size_t slot_bytes = 1;
  size_t n_slots = 0;

  const char* name() const override { return "trace"; }
  std::string describe() const override { return "trace"; }
  void upload_async(void* d, const void* s, size_t n, Stream st) override {
    const auto* p = static_cast<uint8_t*>(d);
    if (arena && p >= arena && p < arena + n_slots * slot_bytes)
      log.push_back(str(sname(st), "->slot", (p - arena) / slot_bytes));
    else
      log.push_back(str(sname(st), "->table"));
    inner().upload_async(d, s, n, st);
  }
  EventId event_create() override { return ++next_; }
  void event_destroy(EventId) override {}
  void record(EventId e, Stream s) override { log.push_back(str("record e", e, " ", sname(s))); }
  void wait(Stream s, EventId e) override { log.push_back(str("wait ", sname(s), " e", e)); }
  bool query(EventId) override { return true; }
  void event_sync(EventId) override {}
  void sync() override {}

 private:
  static const char* sname(Stream s) { return s == Stream::Copy ? "copy" : "compute"; }
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
  const std::vector<std::string> want = {"wait copy e2",   "copy->slot0",    "copy->slot0",   "copy->slot0",
                                         "record e1 copy", "wait copy e4",   "copy->slot1",   "copy->slot1",
                                         "copy->slot1",    "record e3 copy", "compute->table"};
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

// prefetch_layer: the copies of the named experts of a layer the cache lacks, queued behind those already
// queued, evicting neither held slots nor the named experts already resident; the layer's prepare then hits
// them (prefetch_used) and waits for their copies; one evicted before any use counts as wasted. Under other
// policies, or with fewer free slots than two layers' experts, it does nothing.
TEST(ExpertCache, PrefetchLayerFillsTheLayerAheadOfItsPrepare) {
  Fixture fx(3, 4, 256);
  TraceBackend be;
  auto src = make_mmap_source(fx.layout);
  const size_t slot = fx.layout.slot_bytes;
  ExpertCache cache(be, fx.layout, src.get(), 12 * slot);
  be.arena = const_cast<uint8_t*>(cache.wait_base_for_tests());
  be.slot_bytes = slot;
  be.n_slots = (size_t)cache.n_slots();
  const int32_t all[] = {0, 1, 2, 3};
  // Layer 1's expert 2 is resident and the least recent: a fill must not evict it.
  ASSERT_EQ(cache.prepare(1, all + 2, 1), 1);
  cache.wait(1, 2);
  cache.release(1);
  for (int64_t l : {0, 2}) {  // 8 more slots used, 3 left empty
    ASSERT_EQ(cache.prepare(l, all, 4), 4);
    for (int e = 0; e < 4; ++e) cache.wait(l, e);
    cache.release(l);
  }
  // Layer 0 held (4 slots), 8 usable: exactly two layers' worth, so the prefetch runs.
  ASSERT_EQ(cache.prepare(0, all, 4), 4);
  be.log.clear();
  EXPECT_EQ(cache.prefetch_layer(1, all, 4), 3);
  // Neither slot 0 (layer 1's resident expert 2) nor slot 1 (held by layer 0) refilled.
  EXPECT_EQ(count(be.log, "record e1 copy") + count(be.log, "record e3 copy"), 0u);
  EXPECT_EQ(cache.stats().prefetch_fills, 3u);
  EXPECT_EQ(cache.stats().prefetch_bytes, 3u * fx.layout.layers[1].bytes);
  for (int e = 0; e < 4; ++e) {
    EXPECT_TRUE(cache.resident(0, e));
    EXPECT_TRUE(cache.resident(1, e));
  }
  // Of the 3 fills, 3 took the empty slots: layer 2 is whole too.
  for (int e = 0; e < 4; ++e) EXPECT_TRUE(cache.resident(2, e));
  for (int e = 0; e < 4; ++e) cache.wait(0, e);
  cache.release(0);
  // Layer 1's prepare: all hits; the prefetched ones wait for their copies, once.
  const uint64_t misses = cache.stats().misses;
  be.log.clear();
  ASSERT_EQ(cache.prepare(1, all, 4), 4);
  EXPECT_EQ(cache.stats().misses, misses);
  EXPECT_EQ(cache.stats().prefetch_used, 3u);
  EXPECT_TRUE(cache.in_flight(1, 0) && !cache.in_flight(1, 2));
  for (int e = 0; e < 4; ++e) EXPECT_EQ(cache.wait(1, e).gate[0], 16 + e);
  size_t waits = 0;
  for (const auto& s : be.log) waits += s.rfind("wait compute", 0) == 0;
  EXPECT_EQ(waits, 3u);
  cache.release(1);
  // Fewer than 2 * E usable slots: nothing.
  ASSERT_EQ(cache.prepare(0, all, 4), 4);
  ASSERT_EQ(cache.prepare(2, all, 4), 4);
  EXPECT_EQ(cache.prefetch_layer(1, all, 4), 0);
  cache.release(0);
  // Every fill above was used; one evicted before its layer's prepare counts as wasted (here by a lend
  // of every slot).
  EXPECT_EQ(cache.stats().prefetch_wasted, 0u);
  Fixture fy(3, 4, 256);
  auto src2 = make_mmap_source(fy.layout);
  ExpertCache c2(be, fy.layout, src2.get(), 12 * slot);
  const int32_t some[] = {3, 1, 3};  // named twice: filled once
  EXPECT_EQ(c2.prefetch_layer(2, some, 3), 2);
  EXPECT_TRUE(c2.resident(2, 1) && c2.resident(2, 3) && !c2.resident(2, 0) && !c2.resident(2, 2));
  c2.lend(12);
  EXPECT_EQ(c2.stats().prefetch_wasted, 2u);
  c2.give_back();
  // Other policies: nothing.
  for (const char* pol : {"lfu", "scan"}) {
    ExpertCache c3(be, fy.layout, src2.get(), 12 * slot, pol);
    EXPECT_EQ(c3.prefetch_layer(1, all, 4), 0) << pol;
    EXPECT_EQ(c3.stats().prefetch_fills, 0u) << pol;
  }
}

// LFU: the least used expert goes (the least recent among equals), whatever its recency; counts
// halve every 8 * slots uses, so old popularity fades.
TEST(ExpertCache, LfuEvictsTheLeastUsedAndAges) {
  Fixture fx(1, 8, 256);
  TraceBackend be;
  auto src = make_mmap_source(fx.layout);
  ExpertCache cache(be, fx.layout, src.get(), 3 * fx.layout.slot_bytes, "lfu");
  auto use = [&](int32_t e) {
    ASSERT_EQ(cache.prepare(0, &e, 1), 1);
    cache.wait(0, e);
    cache.release(0);
  };
  use(0), use(0), use(0), use(1), use(1), use(2);  // counts 3, 2, 1
  use(3);                                          // evicts 2 (count 1), though 0 is the least recent
  EXPECT_FALSE(cache.resident(0, 2));
  EXPECT_TRUE(cache.resident(0, 0) && cache.resident(0, 1) && cache.resident(0, 3));
  use(3);  // counts 3, 2, 2: the tie between 1 and 3 goes to the less recent, 1
  use(4);
  EXPECT_FALSE(cache.resident(0, 1));
  EXPECT_TRUE(cache.resident(0, 0) && cache.resident(0, 3) && cache.resident(0, 4));
}

TEST(EvictionPolicy, LfuAgingAndTheNamedPolicies) {
  LfuPolicy p(2);  // counts halve every 16 uses
  for (int i = 0; i < 9; ++i) p.on_use(0);
  for (int i = 0; i < 6; ++i) p.on_use(1);  // 15 uses: counts 9 and 6
  const std::vector<uint8_t> both = {1, 1};
  EXPECT_EQ(p.victim(both), 1);
  p.on_use(1);  // the 16th use: counts 9 and 7, then halved to 4 and 3
  EXPECT_EQ(p.value(0), 5u);
  EXPECT_EQ(p.value(1), 4u);
  p.on_use(1);  // 4 and 4: the tie goes to the less recent slot, 0
  EXPECT_EQ(p.victim(both), 0);
  EXPECT_EQ(p.victim({0, 1}), 1);
  EXPECT_EQ(p.victim({0, 0}), -1);
  p.on_clear(0);
  EXPECT_EQ(p.value(0), 0u);
  EXPECT_NE(dynamic_cast<LruPolicy*>(make_policy("lru", 4).get()), nullptr);
  EXPECT_NE(dynamic_cast<LfuPolicy*>(make_policy("lfu", 4).get()), nullptr);
  EXPECT_NE(dynamic_cast<ScanPolicy*>(make_policy("scan", 4).get()), nullptr);
  try {
    make_policy("mru", 4);
    FAIL() << "an unknown policy was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("lru, lfu, scan"), std::string::npos) << e.what();
  }
}

// Scan: stale slots first (least recent), then this pass's (most recent), then those the last pass
// used at a layer still ahead (the farthest layer first).
TEST(EvictionPolicy, ScanEvictionOrder) {
  ScanPolicy p(6);
  const std::vector<uint8_t> all(6, 1);
  p.on_pass();
  for (int32_t l = 0; l < 3; ++l) {  // pass 1: slots 2l and 2l + 1 at layer l
    p.on_layer(l);
    p.on_use(2 * l);
    p.on_use(2 * l + 1);
  }
  // Within a pass its own slots go most recent first (LRU would take slot 0).
  EXPECT_EQ(p.victim(all), 5);
  EXPECT_EQ(p.victim({1, 1, 1, 1, 0, 0}), 3);
  p.on_pass();
  // Pass 2 at layer 0: nothing is stale yet; everything is ahead, the farthest layer first.
  p.on_layer(0);
  EXPECT_EQ(p.victim(all), 5);
  EXPECT_EQ(p.victim({1, 1, 0, 0, 1, 0}), 4);
  p.on_use(0);  // layer 0 uses slot 0 again, not slot 1
  // At layer 1 slot 1 (layer 0 last pass, skipped in this one) is stale: it goes before anything.
  p.on_layer(1);
  EXPECT_EQ(p.victim(all), 1);
  // Without stale ones, this pass's slot 0 goes before the ahead slots.
  EXPECT_EQ(p.victim({1, 0, 1, 1, 1, 1}), 0);
  EXPECT_EQ(p.victim({0, 0, 1, 1, 1, 1}), 5);
  // Two passes later every slot from pass 1 is stale: the least recent first, as LRU.
  p.on_pass();
  p.on_pass();
  p.on_layer(0);
  EXPECT_EQ(p.victim({0, 1, 1, 1, 1, 1}), 1);
  EXPECT_EQ(p.victim({0, 0, 0, 1, 1, 1}), 3);
  EXPECT_EQ(p.victim({1, 0, 0, 1, 1, 1}), 3);  // slot 0 (pass 2) is younger
  p.on_clear(3);
  EXPECT_EQ(p.value(3), 0u);
  EXPECT_EQ(p.victim({0, 0, 0, 0, 0, 0}), -1);
}

// Through the cache, a pass of 3 layers x 2 experts over 4 slots: LRU evicts each expert before its
// next use (every lookup of the second pass misses); scan keeps the first layers' and hits them.
TEST(ExpertCache, ScanKeepsPartOfAPassThatOutgrowsTheCache) {
  for (const char* policy : {"lru", "scan"}) {
    Fixture fx(3, 4, 256);
    TraceBackend be;
    auto src = make_mmap_source(fx.layout);
    ExpertCache cache(be, fx.layout, src.get(), 4 * fx.layout.slot_bytes, policy);
    const int32_t ids[2] = {1, 2};
    auto pass = [&] {
      cache.begin_pass();
      for (int64_t l = 0; l < 3; ++l) {
        ASSERT_EQ(cache.prepare(l, ids, 2), 2);
        cache.release(l);
      }
    };
    pass();
    const uint64_t h0 = cache.stats().hits;
    pass();
    pass();
    const uint64_t hits = cache.stats().hits - h0;
    if (std::string(policy) == "lru")
      EXPECT_EQ(hits, 0u);
    else
      EXPECT_EQ(hits, 6u);  // 4 of the second pass's 6 lookups, 2 of the third's
  }
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
  const std::vector<std::string> want = {"record e2 compute", "record e4 compute", "wait copy e2",
                                         "copy->slot0",       "copy->slot0",       "copy->slot0",
                                         "record e1 copy",    "wait copy e4",      "copy->slot1",
                                         "copy->slot1",       "copy->slot1",       "record e3 copy"};
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

// Random batches against a plain LRU model of the cache: an empty slot first, else the least recently
// used expert not held by the batch; every expert of a batch counts as used in the order named.
TEST(ExpertCache, RandomBatchesFollowAnLruModel) {
  const int64_t L = 2, E = 8;
  const int32_t n_slots = 5;
  Fixture fx(L, E, 256);
  TraceBackend be;
  auto src = make_mmap_source(fx.layout);
  ExpertCache cache(be, fx.layout, src.get(), n_slots * fx.layout.slot_bytes);
  std::vector<int64_t> lru;  // keys (layer * E + e), least recent first
  uint64_t hits = 0, misses = 0;
  std::mt19937 rng(3);
  for (int step = 0; step < 400; ++step) {
    const int64_t l = (int64_t)(rng() % L);
    std::vector<int32_t> ids;
    const size_t n = 1 + rng() % 3;
    while (ids.size() < n) {
      const int32_t e = (int32_t)(rng() % E);
      if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
    }
    std::vector<int64_t> held;
    for (int32_t e : ids) {
      const int64_t key = l * E + e;
      auto it = std::find(lru.begin(), lru.end(), key);
      if (it != lru.end()) {
        ++hits;
        lru.erase(it);
      } else {
        ++misses;
        if ((int32_t)lru.size() == n_slots) {
          auto victim = std::find_if(lru.begin(), lru.end(), [&](int64_t k) {
            return std::find(held.begin(), held.end(), k) == held.end();
          });
          ASSERT_NE(victim, lru.end());
          lru.erase(victim);
        }
      }
      lru.push_back(key);
      held.push_back(key);
    }
    ASSERT_EQ(cache.prepare(l, ids.data(), (int64_t)ids.size()), (int64_t)ids.size());
    for (int32_t e : ids) ASSERT_EQ(cache.wait(l, e).gate[0], (uint8_t)(16 * l + e));
    cache.release(l);
    for (int64_t key = 0; key < L * E; ++key)
      ASSERT_EQ(cache.resident(key / E, key % E), std::find(lru.begin(), lru.end(), key) != lru.end())
          << "step " << step << " key " << key;
  }
  EXPECT_EQ(cache.stats().hits, hits);
  EXPECT_EQ(cache.stats().misses, misses);
  EXPECT_EQ(cache.stats().evictions, misses - (uint64_t)n_slots);
}

// Lending takes the least valuable run of unpinned slots (the least recently used residents), never
// one over a pinned slot, and refuses when no run of unpinned slots is long enough.
TEST(ExpertCache, LendTakesTheLeastRecentRunAndNeverAPinnedSlot) {
  Fixture fx(1, 8, 256);
  TraceBackend be;
  auto src = make_mmap_source(fx.layout);
  const int32_t n_slots = 8;
  ExpertCache cache(be, fx.layout, src.get(), n_slots * fx.layout.slot_bytes);
  const uint8_t* base = cache.wait_base_for_tests();
  const size_t slot = fx.layout.slot_bytes;
  for (int32_t e = 0; e < 8; ++e) {
    ASSERT_EQ(cache.prepare(0, &e, 1), 1);  // empty slots in order: expert e in slot e
    cache.release(0);
  }
  cache.pin(0, 2);
  cache.pin(0, 6);  // runs of unpinned slots: 0-1, 3-5, 7
  std::vector<int32_t> free_experts = {0, 1, 3, 4, 5, 7};
  std::mt19937 rng(5);
  for (int round = 0; round < 60; ++round) {
    // Use every unpinned expert once, in a random order: slot recency ranks 1..6 (pinned slots: none).
    std::shuffle(free_experts.begin(), free_experts.end(), rng);
    std::vector<int64_t> rank(n_slots, -1);
    for (size_t i = 0; i < free_experts.size(); ++i) {
      const int32_t e = free_experts[i];
      ASSERT_EQ(cache.prepare(0, &e, 1), 1);
      cache.release(0);
      rank[cache.slot_index()[e]] = (int64_t)i + 1;
    }
    ASSERT_EQ(cache.slot_index()[2], 2);
    ASSERT_EQ(cache.slot_index()[6], 6);
    const int32_t n = 1 + round % 3;
    int32_t want = -1;
    int64_t best = 0;
    for (int32_t b = 0; b + n <= n_slots; ++b) {
      int64_t cost = 0;
      bool ok = true;
      for (int32_t s = b; s < b + n; ++s) ok = ok && rank[s] > 0, cost += rank[s];
      if (ok && (want < 0 || cost < best)) want = b, best = cost;
    }
    auto [region, bytes] = cache.lend(n);
    ASSERT_EQ(bytes, (size_t)n * slot);
    ASSERT_EQ(region, base + (size_t)want * slot) << "round " << round << " n " << n;
    cache.give_back();
    EXPECT_TRUE(cache.resident(0, 2) && cache.resident(0, 6));
  }
  EXPECT_THROW(cache.lend(4), MemoryError);
  EXPECT_EQ(cache.stats().slots_lent, 0u);
}

namespace {

// stage_copy puts every byte of 1 to 3 segments at its offset, whatever the thread count and however the
// segments' sizes fall on the pieces' boundaries, and touches nothing between or after them.
TEST(StageCopy, EverySegmentLandsWhole) {
  std::mt19937 rng(5);
  std::vector<uint8_t> src(3 * kStagePiece + 12345);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  for (int threads : {1, 2, 5})
    for (const std::vector<size_t>& sizes : std::vector<std::vector<size_t>>{
             {1}, {kStagePiece}, {kStagePiece + 1, 7}, {100, 2 * kStagePiece + 3, kStagePiece - 1}}) {
      ThreadPool pool(threads);
      std::vector<ExpertCopy> c;
      size_t from = 0, to = 16;
      for (size_t s : sizes) {
        c.push_back(ExpertCopy{to, src.data() + from, s});
        from += s + 5;
        to += s + 256;  // gaps the copy must leave
      }
      std::vector<uint8_t> dst(to + 64, 0xA5);
      stage_copy(pool, dst.data(), c.data(), static_cast<int>(c.size()));
      std::vector<uint8_t> want(to + 64, 0xA5);
      for (const ExpertCopy& x : c) std::memcpy(want.data() + x.dst_off, x.src, x.bytes);
      EXPECT_EQ(dst, want) << threads << " threads, " << sizes.size() << " segments";
    }
}

}  // namespace
