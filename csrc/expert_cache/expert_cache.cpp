// ExpertCache: slots, index, policy, lend/give_back and stats.
#include "expert_cache/expert_cache.h"

#include <algorithm>

#include "backend/backend.h"
#include "core/error.h"

namespace strata {

ExpertCache::ExpertCache(Backend& be, const ExpertLayout& layout, const ExpertSource* src, size_t cache_bytes)
    : be_(be), layout_(layout), src_(src) {
  const int64_t keys = layout.L * layout.E;
  index_.assign(keys, -1);
  if (!src_) {
    // Every expert resident: the device reads each layer's expert tensors in place.
    for (int64_t l = 0; l < layout.L; ++l) {
      const auto& ll = layout.layers[l];
      const char* what = "resident experts (--expert-cache all)";
      resident_.push_back(static_cast<const uint8_t*>(be.resident(ll.gate.host, ll.gate.bytes * layout.E, what)));
      resident_.push_back(static_cast<const uint8_t*>(be.resident(ll.up.host, ll.up.bytes * layout.E, what)));
      resident_.push_back(static_cast<const uint8_t*>(be.resident(ll.down.host, ll.down.bytes * layout.E, what)));
    }
    return;
  }
  // Slots beyond one per expert still serve: the prompt chunks borrow them.
  n_slots_ = (int32_t)(cache_bytes / layout.slot_bytes);
  // Zero slots is allowed here: the caller sizes the cache against its prompt chunk and names the fix.
  const size_t pool = (size_t)n_slots_ * layout.slot_bytes;
  arena_ = static_cast<uint8_t*>(be.alloc(pool + 2 * kAlign, "the expert cache")) + kAlign;
  be.fill(arena_ - kAlign, kGuard, kAlign);
  be.fill(arena_ + pool, kGuard, kAlign);
  key_.assign(n_slots_, -1);
  pinned_.assign(n_slots_, 0);
  lent_.assign(n_slots_, 0);
  policy_ = std::make_unique<LruPolicy>(n_slots_);
}

ExpertCache::~ExpertCache() {
  if (arena_) be_.free(arena_ - kAlign);
}

int32_t ExpertCache::free_slots() const {
  int32_t n = 0;
  for (int32_t s = 0; s < n_slots_; ++s) n += !(pinned_[s] || lent_[s]);
  return n;
}

ExpertView ExpertCache::view(int64_t layer, uint8_t* base) const {
  const auto& ll = layout_.layers[layer];
  return ExpertView{base + ll.gate_off, base + ll.up_off, base + ll.down_off};
}

bool ExpertCache::resident(int64_t layer, int64_t e) const { return !src_ || slot_of(layer, e) >= 0; }

void ExpertCache::evict(int32_t slot) {
  if (key_[slot] >= 0) {
    index_[key_[slot]] = -1;
    key_[slot] = -1;
    ++stats_.evictions;
  }
  policy_->on_clear(slot);
}

void ExpertCache::fill(int32_t slot, int64_t layer, int64_t e, bool refill) {
  if (trace_on_) trace_.push_back(StreamEvent{stats_.lends, (int32_t)layer, (int32_t)e, refill});
  src_->stream(layer, e, arena_ + (size_t)slot * layout_.slot_bytes, be_);
  stats_.bytes_streamed += layout_.layers[layer].bytes;
  key_[slot] = layer * layout_.E + e;
  index_[key_[slot]] = slot;
}

ExpertView ExpertCache::acquire(int64_t layer, int64_t e) {
  if (!src_) {
    const auto& ll = layout_.layers[layer];
    ++stats_.hits;
    return ExpertView{resident_[layer * 3] + (size_t)e * ll.gate.bytes,
                      resident_[layer * 3 + 1] + (size_t)e * ll.up.bytes,
                      resident_[layer * 3 + 2] + (size_t)e * ll.down.bytes};
  }
  int32_t s = slot_of(layer, e);
  if (s >= 0) {
    ++stats_.hits;
  } else {
    ++stats_.misses;
    std::vector<uint8_t> evictable(n_slots_);
    for (int32_t i = 0; i < n_slots_; ++i) evictable[i] = !(pinned_[i] || lent_[i]);
    // Prefer an empty slot before evicting anything.
    s = -1;
    for (int32_t i = 0; i < n_slots_ && s < 0; ++i)
      if (evictable[i] && key_[i] < 0) s = i;
    if (s < 0) s = policy_->victim(evictable);
    STRATA_CHECK(s >= 0, MemoryError, "expert cache has no free slot for layer ", layer, " expert ", e,
                 ": all ", n_slots_, " slots are lent or pinned; raise --expert-cache or lower --prefill");
    evict(s);
    fill(s, layer, e, false);
  }
  policy_->on_use(s);
  return view(layer, arena_ + (size_t)s * layout_.slot_bytes);
}

bool ExpertCache::guards_intact() const {
  if (!arena_) return true;
  uint8_t g[2 * kAlign];
  be_.download(g, arena_ - kAlign, kAlign);
  be_.download(g + kAlign, arena_ + (size_t)n_slots_ * layout_.slot_bytes, kAlign);
  for (uint8_t b : g)
    if (b != kGuard) return false;
  return true;
}

void ExpertCache::pin(int64_t layer, int64_t e) {
  if (!src_) return;  // every expert is resident already
  acquire(layer, e);
  pinned_[slot_of(layer, e)] = 1;
}

std::pair<uint8_t*, size_t> ExpertCache::lend(int32_t n) {
  STRATA_CHECK(src_ != nullptr, Error, "lend: an all-resident expert cache has no slots to lend");
  STRATA_CHECK(lent_n_ == 0, Error, "lend: slots are already lent; give them back first");
  STRATA_CHECK(n >= 1 && n <= n_slots_, MemoryError, "the prompt chunk needs ", n, " slots but the cache has ",
               n_slots_);
  // The run whose residents are least valuable; runs over pinned slots are not candidates.
  int32_t best = -1;
  uint64_t best_cost = UINT64_MAX;
  for (int32_t b = 0; b + n <= n_slots_; ++b) {
    uint64_t cost = 0;
    bool ok = true;
    for (int32_t s = b; s < b + n && ok; ++s) {
      if (pinned_[s]) ok = false;
      else if (key_[s] >= 0) cost += policy_->value(s) + 1;
    }
    if (ok && cost < best_cost) best = b, best_cost = cost;
  }
  STRATA_CHECK(best >= 0, MemoryError, "no run of ", n, " unpinned slots in the expert cache");
  evicted_by_lend_.clear();
  for (int32_t s = best; s < best + n; ++s) {
    if (key_[s] >= 0) evicted_by_lend_.emplace_back(policy_->value(s), key_[s]);
    evict(s);
    lent_[s] = 1;
  }
  lent_begin_ = best;
  lent_n_ = n;
  ++stats_.lends;
  stats_.slots_lent = n;
  return {arena_ + (size_t)best * layout_.slot_bytes, (size_t)n * layout_.slot_bytes};
}

void ExpertCache::give_back() {
  if (lent_n_ == 0) return;
  for (int32_t s = lent_begin_; s < lent_begin_ + lent_n_; ++s) lent_[s] = 0;
  // Refill the most valuable of the evicted experts into the returned slots.
  std::sort(evicted_by_lend_.begin(), evicted_by_lend_.end(), std::greater<>());
  int32_t s = lent_begin_;
  for (const auto& [value, key] : evicted_by_lend_) {
    if (index_[key] >= 0) continue;  // streamed back in already by the chunk
    while (s < lent_begin_ + lent_n_ && key_[s] >= 0) ++s;
    if (s >= lent_begin_ + lent_n_) break;
    fill(s, key / layout_.E, key % layout_.E, true);
    policy_->on_use(s);
    ++stats_.refills;
  }
  evicted_by_lend_.clear();
  lent_begin_ = -1;
  lent_n_ = 0;
  stats_.slots_lent = 0;
}

}  // namespace strata
