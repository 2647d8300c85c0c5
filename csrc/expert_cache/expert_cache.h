// ExpertCache: a fixed pool of device slots holding routed experts, filled from an ExpertSource on
// a miss, evicted by a policy, and lent to the prompt path as one contiguous region per chunk.
//
// Experts are resolved a layer at a time, in two phases: prepare(layer, experts) finds hits,
// gives misses slots and queues their copies on the copy stream (one ready event per slot); then
// wait(layer, e) makes the compute stream wait for that expert's copy only, so resident experts
// are computed while misses are in flight. release(layer) records each prepared slot's last use
// on the compute stream; a slot is refilled only after its last use.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/thread_pool.h"
#include "expert_cache/expert_source.h"
#include "expert_cache/policy.h"

namespace strata {

struct ExpertView {
  const uint8_t* gate = nullptr;
  const uint8_t* up = nullptr;
  const uint8_t* down = nullptr;
};

struct CacheStats {
  uint64_t hits = 0, misses = 0, bytes_streamed = 0, evictions = 0, refills = 0;
  uint64_t lends = 0, slots_lent = 0;  // slots_lent: currently lent
  // Prefetches (decode resolved on the device, --prefetch on): experts filled ahead of their layer, those
  // of them a resolution then hit, those evicted before any did, and their bytes (in bytes_streamed too).
  uint64_t prefetch_fills = 0, prefetch_used = 0, prefetch_wasted = 0, prefetch_bytes = 0;
  // Misses a decode step computed on the host from the source instead of streaming them (cpu_experts;
  // counted in misses too), and the bytes of their matrices read there.
  uint64_t cpu_experts = 0, cpu_bytes = 0;
};

class ExpertCache {
 public:
  // With `src` null every expert is resident (--expert-cache all): nothing streams, no slots.
  ExpertCache(Backend& be, const ExpertLayout& layout, const ExpertSource* src, size_t cache_bytes,
              const std::string& policy = "lru");
  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;

  bool all_resident() const { return src_ == nullptr; }
  const ExpertSource* source() const { return src_; }
  // A decode step computed n missed experts of `bytes` on the host (HostExperts): counted as misses.
  void count_cpu(uint64_t n, uint64_t bytes) {
    stats_.misses += n;
    stats_.cpu_experts += n;
    stats_.cpu_bytes += bytes;
  }
  size_t slot_bytes() const { return layout_.slot_bytes; }
  int32_t n_slots() const { return n_slots_; }
  int32_t free_slots() const;  // slots not lent and not pinned
  const CacheStats& stats() const { return stats_; }
  void reset_stats() {
    to_host();
    stats_ = CacheStats{};
  }
  void set_stats(const CacheStats& s) { stats_ = s; }
  // Stream log for tests: every fill as (lend index, layer, expert, refill?).
  struct StreamEvent {
    uint64_t lend;
    int32_t layer, expert;
    bool refill;
  };
  void set_trace(bool on) {
    trace_on_ = on;
    trace_.clear();
  }
  const std::vector<StreamEvent>& trace() const { return trace_; }

  // Phase 1: resolves experts[0..n) of `layer` (each at most once): hits keep their slots; each miss
  // takes an empty slot, else the policy's victim among slots that are not pinned, lent or held by
  // this layer, and its copy is queued on the copy stream after the victim's last use. Returns how
  // many experts from the front now have slots: all of them unless usable slots run out; then the
  // caller computes those, calls release(layer) and prepares the rest. Throws MemoryError when not
  // even the first expert finds a slot.
  int64_t prepare(int64_t layer, const int32_t* experts, int64_t n);
  // Phase 2: the compute stream waits for expert e's copy (when it was a miss); its matrices.
  ExpertView wait(int64_t layer, int64_t e);
  // Between the two: whether prepared expert e was a miss whose copy the compute stream has not waited
  // for yet (on a GPU it may still be crossing the link: work on experts before it can run meanwhile;
  // the CPU's copies are done by now, but it answers alike, so the tests run the same pieces).
  bool in_flight(int64_t layer, int64_t e) const;
  // Work reading the prepared experts is queued: records their slots' last use on the compute stream
  // and lets the next prepare evict them.
  void release(int64_t layer);
  // A prompt pass's look ahead: queues the copies of experts[0..n) of `layer` (each at most once) that
  // the cache lacks, behind the copies already queued, so they cross the link while the layers before it
  // compute. Only under LRU, only while the slots neither pinned, lent nor held could hold two layers'
  // experts; the named experts already resident count as used first, so no fill evicts another of them.
  // Returns the copies queued (prefetch_fills); a later prepare's hit on one counts as prefetch_used,
  // its eviction unused as prefetch_wasted.
  int64_t prefetch_layer(int64_t layer, const int32_t* experts, int64_t n);

  bool resident(int64_t layer, int64_t e);
  // A forward pass begins (its layers' prepares follow in ascending order): the policy's on_pass.
  // The scan policy places its experts by it (between_layers calls it before layer 0). While the state
  // is on the device, the device counts the passes it resolves (ExpertResolve::scan_now).
  void begin_pass() {
    if (policy_ && !on_device_) policy_->on_pass();
  }

  // ---- decode steps resolved on the device (design (b) of bench/NOTES.md) ----
  // Whether Backend::resolve_experts can serve this cache: slots, a policy the device runs (LRU or
  // scan) and every source byte readable by the device (pinned or registered host memory on a GPU).
  bool can_resolve_on_device() const { return !dev_src_.empty(); }
  // Moves the cache's state (slot table, slot keys, the policy's stamps, pins) into device memory: from now
  // on decode steps resolve there, without the host. No expert may be held or slot lent.
  void to_device();
  // Brings the state back to the host; every host-side method (prepare, lend, pin, ...) calls it.
  void to_host();
  bool on_device() const { return on_device_; }
  // The arguments of resolve_experts for the experts ids[order[i]], i < n, of layer. write_through:
  // its misses written through by the layer's matmul_experts (ExpertResolve::write_through) where the
  // layer allows it (write_through(layer)), filled by the resolution otherwise.
  ExpertResolve resolve_args(int64_t layer, const int32_t* ids, const int32_t* order, int64_t n,
                             bool write_through = false) const;
  // Whether a device resolution of layer can leave its misses to matmul_experts: every matrix of the
  // layer's experts is one run of source bytes at a fixed stride per expert, with rows no longer than
  // kWriteThroughRowBytes, lying at the same offsets modulo 16 as in a slot.
  bool write_through(int64_t layer) const { return !dev_src_.empty() && dev_src_[layer].wt; }
  // The same for a prefetch of those experts (ExpertResolve::prefetch).
  ExpertResolve prefetch_args(int64_t layer, const int32_t* ids, const int32_t* order, int64_t n) const;
  // Reads the device's counters into stats() (a small download; call after a step).
  void read_device_counters();
  // Pinned experts are never evicted nor lent over.
  void pin(int64_t layer, int64_t e);
  // (layer * E + e) -> slot index or -1, in device memory, kept current by prepare: kernels find
  // expert weights without the host. Null for an all-resident cache.
  const int32_t* slot_table() const { return table_dev_.as<int32_t>(); }
  // Where layer's experts are for the ops that find them by id on the device (Backend::matmul_experts):
  // the resident tensors, or the slots through the device slot table (current once prepare has run).
  // write_through: with the pending flags and the sources the layer's write-through needs (the table
  // of a step whose resolution was resolve_args(.., true)); nothing where write_through(layer) is false.
  ExpertTable table(int64_t layer, bool write_through = false) const;
  // Hits the device resolved without prepare (an all-resident cache's decode): counted in the stats.
  void count_hits(uint64_t n) { stats_.hits += n; }
  // The host's copy of the slot table, for tests: (layer * E + e) -> slot or -1.
  const std::vector<int32_t>& slot_index() {
    to_host();
    return index_;
  }

  // Lends a contiguous run of n slots to the prompt path (evicting the least valuable run); the
  // compute stream waits for copies still landing in it.
  std::pair<uint8_t*, size_t> lend(int32_t n);
  // Returns the lent run (its last use is the compute work queued so far) and refills the most
  // valuable experts it evicted.
  void give_back();
  // The first slot's address (tests locate slots by it).
  const uint8_t* wait_base_for_tests() const { return arena_; }
  // Guard bytes around the slot arena are intact (nothing wrote past the pool).
  bool guards_intact() const;
  static constexpr uint8_t kGuard = 0xA5;
  static constexpr int kStages = 4;  // staging buffers in flight for an mmap source on a GPU

 private:
  int32_t slot_of(int64_t layer, int64_t e) const { return index_[layer * layout_.E + e]; }
  uint8_t* slot_ptr(int32_t s) const { return arena_ + (size_t)s * layout_.slot_bytes; }
  bool usable(int32_t s) const { return !(pinned_[s] || lent_[s] || held_[s]); }
  int32_t find_victim() const;
  void evict(int32_t slot);
  void fill(int32_t slot, int64_t layer, int64_t e, bool refill);
  void set_index(int64_t key, int32_t slot);
  ExpertView view(int64_t layer, const uint8_t* base) const;
  void setup_device_resolution();

  Backend& be_;
  const ExpertLayout& layout_;
  const ExpertSource* src_;
  int32_t n_slots_ = 0;
  DeviceBuffer arena_buf_;      // the slots, with kAlign guard bytes before and after
  uint8_t* arena_ = nullptr;    // the first slot
  DeviceBuffer table_dev_;      // the slot table in device memory
  PinnedBuffer table_host_;     // its staging copy (upload source)
  std::vector<int32_t> index_;  // (layer * E + e) -> slot, -1 if absent
  std::vector<int64_t> key_;    // slot -> layer * E + e, -1 if empty
  std::vector<uint8_t> pinned_, lent_, held_, landing_;  // held: prepared, not released; landing: copy queued
  std::vector<uint8_t> ahead_;                           // filled by prefetch_layer, not used since
  bool lru_ = false;                                     // the policy is LRU (prefetch_layer runs)
  std::vector<Event> ready_, last_use_;                  // per slot: copy landed; compute done reading
  std::vector<int32_t> held_list_;
  mutable std::vector<uint8_t> evictable_;  // find_victim's scratch
  std::vector<uint8_t> table_dirty_;        // per layer: the device row is stale
  // Pinned staging for a source the copy engine cannot read directly (mmap on a GPU): each fill
  // copies the expert into the next buffer, once the copy that last read that buffer is done.
  struct Stage {
    PinnedBuffer buf;
    Event done;
  };
  std::vector<Stage> stages_;
  size_t next_stage_ = 0;
  std::unique_ptr<ThreadPool> stage_pool_;  // the staging copies' threads (stage_copy), with stages_
  std::unique_ptr<EvictionPolicy> policy_;
  int32_t lent_begin_ = -1, lent_n_ = 0;
  std::vector<std::pair<uint64_t, int64_t>> evicted_by_lend_;  // (value, key)
  CacheStats stats_;
  std::vector<DeviceBuffer> resident_;  // all-resident mode: expert tensors, 3 per layer
  // Device mode: the mirrored state, the sources as the device sees them, the counters.
  struct DevSrc {
    const uint8_t* src[3];
    size_t stride[3], bytes[3], off[3];
    bool wt;  // write_through(layer): matrix m (gate, up, down) of expert e at wt_src[m] + e * wt_stride[m]
    const uint8_t* wt_src[3];
    size_t wt_stride[3];
  };
  std::vector<DevSrc> dev_src_;  // per layer; empty: no device resolution
  DeviceBuffer dev_key_, dev_last_, dev_tick_, dev_held_, dev_pinned_, dev_counters_, dev_jobs_, dev_pref_,
      dev_pending_;
  DeviceBuffer dev_pass_, dev_pass_layer_, dev_scan_now_;  // the scan policy's (empty under LRU)
  PinnedBuffer dev_stage_;                                 // staging of the uploads and downloads above
  bool on_device_ = false;
  CacheStats stats_at_device_;
  bool trace_on_ = false;
  std::vector<StreamEvent> trace_;
};

}  // namespace strata
