// Eviction policies behind a small interface: LRU (the default) and LFU with aging.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace strata {

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual void on_use(int32_t slot) = 0;
  virtual void on_clear(int32_t slot) = 0;
  // The slot to evict among those marked evictable; -1 if none.
  virtual int32_t victim(const std::vector<uint8_t>& evictable) const = 0;
  // How much keeping the expert in `slot` is worth (higher is more valuable); 0 for an empty slot.
  virtual uint64_t value(int32_t slot) const = 0;
  // LRU's state (each slot's last tick, the clock), for a device that runs the same choice
  // (Backend::resolve_experts); false for a policy that has none.
  virtual bool get_lru(std::vector<uint64_t>* /*last*/, uint64_t* /*tick*/) const { return false; }
  virtual void set_lru(const std::vector<uint64_t>& /*last*/, uint64_t /*tick*/) {}
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
  bool get_lru(std::vector<uint64_t>* last, uint64_t* tick) const override {
    *last = last_;
    *tick = tick_;
    return true;
  }
  void set_lru(const std::vector<uint64_t>& last, uint64_t tick) override {
    last_ = last;
    tick_ = tick;
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

// The names --cache-policy takes.
inline const char* cache_policy_names() { return "lru, lfu"; }
inline std::unique_ptr<EvictionPolicy> make_policy(const std::string& name, int32_t n_slots) {
  if (name == "lru") return std::make_unique<LruPolicy>(n_slots);
  if (name == "lfu") return std::make_unique<LfuPolicy>(n_slots);
  throw ConfigError(str("cache policy '", name, "' is not one of ", cache_policy_names(),
                        " (--cache-policy / cache_policy)"));
}

}  // namespace strata
