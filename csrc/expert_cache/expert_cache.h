// ExpertCache: a fixed pool of device slots holding routed experts, streamed in on a miss,
// evicted by a policy, and lent to the prompt path as one contiguous region per chunk.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "expert_cache/expert_source.h"
#include "expert_cache/policy.h"

namespace strata {

class Backend;

struct ExpertView {
  const uint8_t* gate = nullptr;
  const uint8_t* up = nullptr;
  const uint8_t* down = nullptr;
};

struct CacheStats {
  uint64_t hits = 0, misses = 0, bytes_streamed = 0, evictions = 0, refills = 0;
  uint64_t lends = 0, slots_lent = 0;  // slots_lent: currently lent
};

class ExpertCache {
 public:
  // With `src` null every expert is resident (--expert-cache all): nothing streams, no slots.
  ExpertCache(Backend& be, const ExpertLayout& layout, const ExpertSource* src, size_t cache_bytes);
  ~ExpertCache();
  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;

  bool all_resident() const { return src_ == nullptr; }
  size_t slot_bytes() const { return layout_.slot_bytes; }
  int32_t n_slots() const { return n_slots_; }
  int32_t free_slots() const;  // slots not lent and not pinned
  const CacheStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CacheStats{}; }
  // Stream log for tests and --trace: every stream as (lend index, layer, expert, refill?).
  struct StreamEvent {
    uint64_t lend;
    int32_t layer, expert;
    bool refill;
  };
  void set_trace(bool on) { trace_on_ = on; trace_.clear(); }
  const std::vector<StreamEvent>& trace() const { return trace_; }

  // The expert's matrices in device memory, streaming it on a miss.
  ExpertView acquire(int64_t layer, int64_t e);
  bool resident(int64_t layer, int64_t e) const;
  // Pinned experts are never evicted nor lent over.
  void pin(int64_t layer, int64_t e);

  // Lends a contiguous run of n slots to the prompt path (evicting the least valuable run).
  std::pair<uint8_t*, size_t> lend(int32_t n);
  // Returns the lent run and refills the most valuable experts it evicted.
  void give_back();
  // Guard bytes around the slot arena are intact (nothing wrote past the pool).
  bool guards_intact() const;
  static constexpr uint8_t kGuard = 0xA5;

 private:
  int32_t slot_of(int64_t layer, int64_t e) const { return index_[layer * layout_.E + e]; }
  void evict(int32_t slot);
  void fill(int32_t slot, int64_t layer, int64_t e, bool refill);
  ExpertView view(int64_t layer, uint8_t* base) const;

  Backend& be_;
  const ExpertLayout& layout_;
  const ExpertSource* src_;
  int32_t n_slots_ = 0;
  uint8_t* arena_ = nullptr;  // kAlign guard bytes before and after it
  std::vector<int32_t> index_;    // (layer * E + e) -> slot, -1 if absent
  std::vector<int64_t> key_;      // slot -> layer * E + e, -1 if empty
  std::vector<uint8_t> pinned_, lent_;
  std::unique_ptr<EvictionPolicy> policy_;
  int32_t lent_begin_ = -1, lent_n_ = 0;
  std::vector<std::pair<uint64_t, int64_t>> evicted_by_lend_;  // (value, key)
  CacheStats stats_;
  std::vector<const uint8_t*> resident_;
  bool trace_on_ = false;
  std::vector<StreamEvent> trace_;  // all-resident mode: expert bases
};

}  // namespace strata
