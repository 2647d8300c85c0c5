// Eviction policies behind a small interface: LRU (the default), LFU with aging, and scan-resistant.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "expert_cache/scan_rank.h"

namespace strata {

// What a device mirrors to make a policy's choices itself (Backend::resolve_experts): each slot's tick
// of last use and the clock; for the scan policy also each slot's pass and layer of last use, the pass
// now and the last layer it resolved.
struct PolicyState {
  std::vector<uint64_t> last;
  uint64_t tick = 0;
  bool scan = false;
  std::vector<uint64_t> pass;
  std::vector<int64_t> layer;
  uint64_t pass_now = 0;
  int64_t layer_now = 0;
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  // A forward pass begins: its layers follow in ascending order (ExpertCache::begin_pass).
  virtual void on_pass() {}
  // The layer of the experts the next on_use calls concern.
  virtual void on_layer(int64_t /*layer*/) {}
  virtual void on_use(int32_t slot) = 0;
  virtual void on_clear(int32_t slot) = 0;
  // The slot to evict among those marked evictable; -1 if none.
  virtual int32_t victim(const std::vector<uint8_t>& evictable) const = 0;
  // How much keeping the expert in `slot` is worth (higher is more valuable); 0 for an empty slot.
  virtual uint64_t value(int32_t slot) const = 0;
  // The state a device runs the same choices from; false for a policy no device runs (LFU).
  virtual bool get_state(PolicyState* /*st*/) const { return false; }
  virtual void set_state(const PolicyState& /*st*/) {}
};

class LruPolicy final : public EvictionPolicy {
 public:
  explicit LruPolicy(int32_t n_slots) : last_(n_slots, 0) {}
  void on_use(int32_t slot) override { last_[slot] = ++tick_; }
  void on_clear(int32_t slot) override { last_[slot] = 0; }
  int32_t victim(const std::vector<uint8_t>& evictable) const override {
    int32_t best = -1;
    for (int32_t s = 0; s < (int32_t)last_.size(); ++s)
      if (evictable[s] && (best < 0 || last_[s] < last_[best])) best = s;
    return best;
  }
  uint64_t value(int32_t slot) const override { return last_[slot]; }
  bool get_state(PolicyState* st) const override {
    *st = PolicyState{};
    st->last = last_;
    st->tick = tick_;
    return true;
  }
  void set_state(const PolicyState& st) override {
    last_ = st.last;
    tick_ = st.tick;
  }

 private:
  std::vector<uint64_t> last_;
  uint64_t tick_ = 0;
};

// LFU with aging: each slot counts its uses; every kAgeRounds * n_slots uses all counts halve, so
// an expert popular long ago loses to one popular now. The victim has the smallest count, then the
// oldest last use (LRU among equals), then the lowest slot. It keeps no LRU state for a device:
// with it a decode step resolves its experts on the host.
class LfuPolicy final : public EvictionPolicy {
 public:
  static constexpr uint64_t kAgeRounds = 8;
  explicit LfuPolicy(int32_t n_slots)
      : count_(n_slots, 0), last_(n_slots, 0), period_(kAgeRounds * std::max<uint64_t>(n_slots, 1)) {}
  void on_use(int32_t slot) override {
    ++count_[slot];
    last_[slot] = ++tick_;
    if (tick_ % period_ == 0)
      for (uint64_t& c : count_) c /= 2;
  }
  void on_clear(int32_t slot) override { count_[slot] = last_[slot] = 0; }
  int32_t victim(const std::vector<uint8_t>& evictable) const override {
    int32_t best = -1;
    for (int32_t s = 0; s < (int32_t)count_.size(); ++s)
      if (evictable[s] &&
          (best < 0 || count_[s] < count_[best] || (count_[s] == count_[best] && last_[s] < last_[best])))
        best = s;
    return best;
  }
  // Occupied slots are worth at least 1 (their count may have aged to 0).
  uint64_t value(int32_t slot) const override { return last_[slot] ? count_[slot] + 1 : 0; }

 private:
  std::vector<uint64_t> count_, last_;
  uint64_t tick_ = 0, period_;
};

// Scan-resistant: a pass walks the layers in order, so an expert's next use is most likely at its
// layer in this pass (when the pass has not reached it) or in the next. A victim is, in order: a
// stale slot (last used before the previous pass, or in it at a layer this pass has passed without
// using it; the least recent first); else one used in this pass (the most recent first: its next use
// is the farthest); else one the previous pass used at a layer still ahead (the farthest layer
// first). While a pass's experts fit the cache a stale slot always exists and it is LRU; when they
// outgrow it, LRU evicts each expert just before its next use (a cyclic scan: every lookup misses)
// while this keeps part of the pass's experts resident. The order is scan_key's (scan_rank.h), which a
// decode step resolved on the device runs too; it counts the passes itself there (a call for a layer no
// later than the last one's begins a pass). No prefetch (check_config): its fills come before their pass.
class ScanPolicy final : public EvictionPolicy {
 public:
  explicit ScanPolicy(int32_t n_slots) : last_(n_slots, 0), pass_(n_slots, 0), layer_(n_slots, 0) {}
  void on_pass() override {
    ++pass_now_;
    layer_now_ = 0;
  }
  void on_layer(int64_t layer) override { layer_now_ = layer; }
  void on_use(int32_t slot) override {
    last_[slot] = ++tick_;
    pass_[slot] = pass_now_;
    layer_[slot] = layer_now_;
  }
  void on_clear(int32_t slot) override { last_[slot] = pass_[slot] = 0, layer_[slot] = 0; }
  int32_t victim(const std::vector<uint8_t>& evictable) const override {
    int32_t best = -1;
    ScanKey kb{};
    for (int32_t s = 0; s < (int32_t)last_.size(); ++s) {
      if (!evictable[s]) continue;
      const ScanKey k = scan_key(last_[s], pass_[s], layer_[s], pass_now_, layer_now_);
      if (best < 0 || scan_less(k, kb)) best = s, kb = k;
    }
    return best;
  }
  uint64_t value(int32_t slot) const override { return last_[slot]; }
  bool get_state(PolicyState* st) const override {
    *st = PolicyState{last_, tick_, true, pass_, layer_, pass_now_, layer_now_};
    return true;
  }
  void set_state(const PolicyState& st) override {
    last_ = st.last;
    tick_ = st.tick;
    pass_ = st.pass;
    layer_ = st.layer;
    pass_now_ = st.pass_now;
    layer_now_ = st.layer_now;
  }

 private:
  std::vector<uint64_t> last_, pass_;
  std::vector<int64_t> layer_;
  uint64_t tick_ = 0, pass_now_ = 2;  // pass 0 (an empty slot's) is always stale
  int64_t layer_now_ = 0;
};

// The names --cache-policy takes.
inline const char* cache_policy_names() { return "lru, lfu, scan"; }
inline std::unique_ptr<EvictionPolicy> make_policy(const std::string& name, int32_t n_slots) {
  if (name == "lru") return std::make_unique<LruPolicy>(n_slots);
  if (name == "lfu") return std::make_unique<LfuPolicy>(n_slots);
  if (name == "scan") return std::make_unique<ScanPolicy>(n_slots);
  throw ConfigError(str("cache policy '", name, "' is not one of ", cache_policy_names(),
                        " (--cache-policy / cache_policy)"));
}

}  // namespace strata
