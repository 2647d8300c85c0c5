// Eviction policies behind a small interface; LRU is the default.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

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

}  // namespace strata
