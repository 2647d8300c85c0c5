// ExpertCache: slots, index, policy, the two-phase prepare/wait, lend/give_back and stats.
#include "expert_cache/expert_cache.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "expert_cache/stage_copy.h"

namespace strata {

ExpertCache::ExpertCache(Backend& be, const ExpertLayout& layout, const ExpertSource* src, size_t cache_bytes,
                         const std::string& policy)
    : be_(be), layout_(layout), src_(src) {
  const int64_t keys = layout.L * layout.E;
  index_.assign(keys, -1);
  if (!src_) {
    // Every expert resident: the device reads each layer's expert tensors where they were loaded.
    const char* what = "resident experts (--expert-cache all)";
    for (int64_t l = 0; l < layout.L; ++l) {
      const auto& ll = layout.layers[l];
      for (const ExpertTensor* t : {&ll.gate, &ll.up, &ll.down})
        resident_.push_back(be.resident(t->host, t->bytes * layout.E, what));
    }
    return;
  }
  // Slots beyond one per expert still serve: the prompt chunks borrow them.
  n_slots_ = (int32_t)(cache_bytes / layout.slot_bytes);
  // Zero slots is allowed here: the caller sizes the cache against its prompt chunk and names the fix.
  const size_t pool = (size_t)n_slots_ * layout.slot_bytes;
  arena_buf_ = DeviceBuffer(be, pool + 2 * kAlign, "the expert cache");
  arena_ = arena_buf_.as<uint8_t>() + kAlign;
  be.fill(arena_ - kAlign, kGuard, kAlign);
  be.fill(arena_ + pool, kGuard, kAlign);
  table_dev_ = DeviceBuffer(be, keys * sizeof(int32_t), "the expert slot table");
  table_host_ = PinnedBuffer(be, keys * sizeof(int32_t), "the expert slot table");
  std::fill_n(reinterpret_cast<int32_t*>(table_host_.get()), keys, -1);
  be.upload(table_dev_.get(), table_host_.get(), keys * sizeof(int32_t));
  table_dirty_.assign(layout.L, 0);
  key_.assign(n_slots_, -1);
  pinned_.assign(n_slots_, 0);
  lent_.assign(n_slots_, 0);
  held_.assign(n_slots_, 0);
  landing_.assign(n_slots_, 0);
  ahead_.assign(n_slots_, 0);
  evictable_.assign(n_slots_, 0);
  for (int32_t s = 0; s < n_slots_; ++s) {
    ready_.emplace_back(be);
    last_use_.emplace_back(be);
  }
  policy_ = make_policy(policy, n_slots_);
  lru_ = policy == "lru";
  if (!src_->page_locked() && !be.host_is_device()) {
    for (int i = 0; i < kStages; ++i)
      stages_.push_back(Stage{
          PinnedBuffer(be, layout.slot_bytes, "the expert staging buffers (--source mmap)"), Event(be)});
    stage_pool_ = std::make_unique<ThreadPool>(stage_threads());
  }
  setup_device_resolution();
}

void ExpertCache::setup_device_resolution() {
  // The source's copies of an expert, as the device reads them: segments at a fixed stride per expert.
  std::vector<DevSrc> ds(layout_.L);
  for (int64_t l = 0; l < layout_.L; ++l) {
    ExpertCopy c0[3], c1[3], cl[3];
    const int n = src_->copies(l, 0, c0);
    const int64_t last = layout_.E - 1;
    if (src_->copies(l, std::min<int64_t>(1, last), c1) != n || src_->copies(l, last, cl) != n) return;
    DevSrc d{};
    for (int m = 0; m < n; ++m) {
      const uint8_t* v = static_cast<const uint8_t*>(be_.device_view(c0[m].src));
      if (!v) return;  // the device cannot read this source: prepare resolves on the host
      const size_t stride = layout_.E > 1 ? (size_t)(c1[m].src - c0[m].src) : 0;
      if (c1[m].dst_off != c0[m].dst_off || c1[m].bytes != c0[m].bytes ||
          cl[m].src != c0[m].src + (size_t)last * stride)
        return;  // not one stride per expert
      d.src[m] = v;
      d.stride[m] = stride;
      d.bytes[m] = c0[m].bytes;
      d.off[m] = c0[m].dst_off;
    }
    // Write-through: each matrix inside one segment (so at that segment's stride), rows short enough.
    const ExpertLayerLayout& ll = layout_.layers[l];
    const ExpertTensor* mt[3] = {&ll.gate, &ll.up, &ll.down};
    const size_t moff[3] = {ll.gate_off, ll.up_off, ll.down_off};
    d.wt = true;
    for (int i = 0; i < 3 && d.wt; ++i) {
      const size_t rb = mt[i]->rows > 0 ? mt[i]->bytes / (size_t)mt[i]->rows : 0;
      int seg = -1;
      for (int m = 0; m < n; ++m)
        if (moff[i] >= d.off[m] && moff[i] + mt[i]->bytes <= d.off[m] + d.bytes[m]) seg = m;
      d.wt = rb > 0 && rb <= kWriteThroughRowBytes && rb * (size_t)mt[i]->rows == mt[i]->bytes && seg >= 0;
      if (d.wt) {
        d.wt_src[i] = d.src[seg] + (moff[i] - d.off[seg]);
        d.wt_stride[i] = d.stride[seg];
        // A row's bytes stay aligned as in the slot (arena and slots 256-byte aligned): a GPU decodes
        // the row from a copy at the source's alignment modulo 16.
        d.wt = ((uintptr_t)d.wt_src[i] - moff[i]) % 16 == 0 && d.wt_stride[i] % 16 == 0 &&
               layout_.slot_bytes % 16 == 0;
      }
    }
    ds[l] = d;
  }
  PolicyState st;
  if (!policy_->get_state(&st)) return;
  const size_t S = (size_t)n_slots_;
  const char* what = "the expert cache's device state";
  if (st.scan) {
    dev_pass_ = DeviceBuffer(be_, S * 8, what);
    dev_pass_layer_ = DeviceBuffer(be_, S * 8, what);
    dev_scan_now_ = DeviceBuffer(be_, 16, what);
  }
  dev_key_ = DeviceBuffer(be_, S * 4, what);
  dev_last_ = DeviceBuffer(be_, S * 8, what);
  dev_tick_ = DeviceBuffer(be_, 8, what);
  dev_held_ = DeviceBuffer(be_, S, what);
  dev_pinned_ = DeviceBuffer(be_, S, what);
  dev_counters_ = DeviceBuffer(be_, kResolveCounters * 8, what);
  dev_jobs_ = DeviceBuffer(be_, (1 + 2 * (size_t)layout_.E) * 4, what);
  dev_pref_ = DeviceBuffer(be_, S, what);
  dev_pending_ = DeviceBuffer(be_, S, what);
  dev_stage_ = PinnedBuffer(be_, S * 8 + 64, what);
  be_.zero(dev_held_.get(), S);
  dev_src_ = std::move(ds);
}

void ExpertCache::to_device() {
  if (on_device_) return;
  STRATA_CHECK(can_resolve_on_device(), Error,
               "internal error: this expert cache cannot resolve on the device");
  STRATA_CHECK(held_list_.empty() && lent_n_ == 0, Error,
               "internal error: the expert cache moves to the device with experts held or slots lent");
  const size_t S = (size_t)n_slots_;
  for (int32_t s = 0; s < n_slots_; ++s)
    if (landing_[s]) {  // the device's reads of the slot come after the copy
      be_.wait(Stream::Compute, ready_[s].id());
      landing_[s] = 0;
    }
  uint8_t* st = dev_stage_.get();
  be_.upload(table_dev_.get(), table_host_.get(), (size_t)layout_.L * layout_.E * sizeof(int32_t));
  std::fill(table_dirty_.begin(), table_dirty_.end(), 0);
  auto* k = reinterpret_cast<int32_t*>(st);
  for (size_t s = 0; s < S; ++s) k[s] = (int32_t)key_[s];
  be_.upload(dev_key_.get(), st, S * 4);
  PolicyState pst;
  policy_->get_state(&pst);
  be_.upload(dev_last_.get(), pst.last.data(), S * 8);
  be_.upload(dev_tick_.get(), &pst.tick, 8);
  if (pst.scan) {
    const uint64_t now[2] = {pst.pass_now, (uint64_t)pst.layer_now};
    be_.upload(dev_pass_.get(), pst.pass.data(), S * 8);
    be_.upload(dev_pass_layer_.get(), pst.layer.data(), S * 8);
    be_.upload(dev_scan_now_.get(), now, sizeof now);
  }
  be_.upload(dev_pinned_.get(), pinned_.data(), S);
  be_.zero(dev_counters_.get(), kResolveCounters * 8);
  be_.zero(dev_pref_.get(), S);     // the host does not track prefetches: none is pending from before
  be_.zero(dev_pending_.get(), S);  // every slot the host filled holds its bytes
  std::fill(ahead_.begin(), ahead_.end(), 0);  // nor does the device track prefetch_layer's
  stats_at_device_ = stats_;
  on_device_ = true;
}

void ExpertCache::read_device_counters() {
  if (!on_device_) return;
  uint64_t c[kResolveCounters];
  be_.download(c, dev_counters_.get(), sizeof c);
  STRATA_CHECK(c[4] == 0, Error, "internal error: ", c[4],
               " experts found no slot in a decode step resolved on the device");
  stats_ = stats_at_device_;
  stats_.hits += c[0];
  stats_.misses += c[1];
  stats_.bytes_streamed += c[2];
  stats_.evictions += c[3];
  stats_.prefetch_fills += c[5];
  stats_.prefetch_used += c[6];
  stats_.prefetch_wasted += c[7];
  stats_.prefetch_bytes += c[8];
}

void ExpertCache::to_host() {
  if (!on_device_) return;
  read_device_counters();
  const size_t S = (size_t)n_slots_;
  std::vector<int32_t> k(S);
  PolicyState pst;
  policy_->get_state(&pst);
  be_.download(k.data(), dev_key_.get(), S * 4);
  be_.download(pst.last.data(), dev_last_.get(), S * 8);
  be_.download(&pst.tick, dev_tick_.get(), 8);
  if (pst.scan) {
    uint64_t now[2];
    be_.download(pst.pass.data(), dev_pass_.get(), S * 8);
    be_.download(pst.layer.data(), dev_pass_layer_.get(), S * 8);
    be_.download(now, dev_scan_now_.get(), sizeof now);
    pst.pass_now = now[0];
    pst.layer_now = (int64_t)now[1];
  }
  auto* table = reinterpret_cast<int32_t*>(table_host_.get());
  std::fill(index_.begin(), index_.end(), -1);
  std::fill_n(table, index_.size(), -1);
  for (size_t s = 0; s < S; ++s) {
    key_[s] = k[s];
    if (k[s] >= 0) index_[k[s]] = table[k[s]] = (int32_t)s;
    last_use_[s].record(Stream::Compute);  // the decode steps' reads of every slot
  }
  policy_->set_state(pst);
  on_device_ = false;
}

ExpertResolve ExpertCache::resolve_args(int64_t layer, const int32_t* ids, const int32_t* order, int64_t n,
                                        bool write_through) const {
  const DevSrc& d = dev_src_[layer];
  ExpertResolve r;
  r.layer = layer;
  r.E = layout_.E;
  r.n_slots = n_slots_;
  r.ids = ids;
  r.order = order;
  r.n = n;
  r.table = table_dev_.as<int32_t>();
  r.key = dev_key_.as<int32_t>();
  r.last = dev_last_.as<uint64_t>();
  r.tick = dev_tick_.as<uint64_t>();
  r.held = dev_held_.as<uint8_t>();
  r.pinned = dev_pinned_.as<uint8_t>();
  r.counters = dev_counters_.as<uint64_t>();
  r.jobs = dev_jobs_.as<int32_t>();
  r.arena = arena_;
  r.slot_bytes = layout_.slot_bytes;
  for (int m = 0; m < 3; ++m) {
    r.src[m] = d.src[m];
    r.src_stride[m] = d.stride[m];
    r.bytes[m] = d.bytes[m];
    r.off[m] = d.off[m];
  }
  r.layer_bytes = layout_.layers[layer].bytes;
  r.pref = dev_pref_.as<uint8_t>();
  r.pending = dev_pending_.as<uint8_t>();
  r.write_through = write_through && d.wt;
  if (dev_scan_now_) {
    r.pass = dev_pass_.as<uint64_t>();
    r.pass_layer = dev_pass_layer_.as<int64_t>();
    r.scan_now = dev_scan_now_.as<uint64_t>();
  }
  return r;
}

ExpertResolve ExpertCache::prefetch_args(int64_t layer, const int32_t* ids, const int32_t* order,
                                         int64_t n) const {
  ExpertResolve r = resolve_args(layer, ids, order, n);
  r.prefetch = true;
  return r;
}

int32_t ExpertCache::free_slots() const {
  int32_t n = 0;
  for (int32_t s = 0; s < n_slots_; ++s) n += !(pinned_[s] || lent_[s]);
  return n;
}

ExpertView ExpertCache::view(int64_t layer, const uint8_t* base) const {
  const auto& ll = layout_.layers[layer];
  return ExpertView{base + ll.gate_off, base + ll.up_off, base + ll.down_off};
}

ExpertTable ExpertCache::table(int64_t layer, bool write_through) const {
  const auto& ll = layout_.layers[layer];
  ExpertTable t;
  t.E = layout_.E;
  if (!src_) {
    const ExpertTensor* m[3] = {&ll.gate, &ll.up, &ll.down};
    for (int i = 0; i < 3; ++i) {
      t.base[i] = resident_[layer * 3 + i].as<uint8_t>();
      t.stride[i] = m[i]->bytes;
    }
    return t;
  }
  t.slots = table_dev_.as<int32_t>() + layer * layout_.E;
  t.arena = arena_;
  t.slot_bytes = layout_.slot_bytes;
  t.off[0] = ll.gate_off;
  t.off[1] = ll.up_off;
  t.off[2] = ll.down_off;
  if (write_through && this->write_through(layer)) {
    const DevSrc& d = dev_src_[layer];
    t.pending = dev_pending_.as<uint8_t>();
    for (int m = 0; m < 3; ++m) {
      t.src[m] = d.wt_src[m];
      t.src_stride[m] = d.wt_stride[m];
    }
  }
  return t;
}

bool ExpertCache::resident(int64_t layer, int64_t e) {
  to_host();
  return !src_ || slot_of(layer, e) >= 0;
}

void ExpertCache::set_index(int64_t key, int32_t slot) {
  index_[key] = slot;
  reinterpret_cast<int32_t*>(table_host_.get())[key] = slot;
  table_dirty_[key / layout_.E] = 1;
}

void ExpertCache::evict(int32_t slot) {
  if (key_[slot] >= 0) {
    set_index(key_[slot], -1);
    key_[slot] = -1;
    ++stats_.evictions;
  }
  if (ahead_[slot]) {
    ++stats_.prefetch_wasted;
    ahead_[slot] = 0;
  }
  policy_->on_clear(slot);
}

void ExpertCache::fill(int32_t slot, int64_t layer, int64_t e, bool refill) {
  if (trace_on_) trace_.push_back(StreamEvent{stats_.lends, (int32_t)layer, (int32_t)e, refill});
  // The copy overwrites the slot only after the compute work that last read it.
  be_.wait(Stream::Copy, last_use_[slot].id());
  ExpertCopy c[3];
  const int n = src_->copies(layer, e, c);
  if (stages_.empty()) {
    for (int i = 0; i < n; ++i)
      be_.upload_async(slot_ptr(slot) + c[i].dst_off, c[i].src, c[i].bytes, Stream::Copy);
  } else {
    Stage& st = stages_[next_stage_++ % stages_.size()];
    st.done.sync();  // the copy that last read this buffer
    stage_copy(*stage_pool_, st.buf.get(), c, n);
    be_.upload_async(slot_ptr(slot), st.buf.get(), layout_.layers[layer].bytes, Stream::Copy);
    st.done.record(Stream::Copy);
  }
  ready_[slot].record(Stream::Copy);
  landing_[slot] = 1;
  stats_.bytes_streamed += layout_.layers[layer].bytes;
  key_[slot] = layer * layout_.E + e;
  set_index(key_[slot], slot);
}

int32_t ExpertCache::find_victim() const {
  // An empty slot before evicting anything.
  for (int32_t s = 0; s < n_slots_; ++s)
    if (usable(s) && key_[s] < 0) return s;
  for (int32_t s = 0; s < n_slots_; ++s) evictable_[s] = usable(s);
  return policy_->victim(evictable_);
}

int64_t ExpertCache::prepare(int64_t layer, const int32_t* experts, int64_t n) {
  STRATA_CHECK(layer >= 0 && layer < layout_.L, Error, "prepare: layer ", layer, " out of range");
  to_host();
  if (!src_) {
    stats_.hits += (uint64_t)n;
    return n;
  }
  policy_->on_layer(layer);
  int64_t done = 0;
  for (; done < n; ++done) {
    const int64_t e = experts[done];
    STRATA_CHECK(e >= 0 && e < layout_.E, Error, "prepare: expert ", e, " out of range");
    int32_t s = slot_of(layer, e);
    if (s >= 0) {
      if (held_[s]) continue;  // named twice in one batch
      ++stats_.hits;
      if (ahead_[s]) {
        ++stats_.prefetch_used;
        ahead_[s] = 0;
      }
    } else {
      s = find_victim();
      if (s < 0) break;
      ++stats_.misses;
      evict(s);
      fill(s, layer, e, false);
    }
    held_[s] = 1;
    held_list_.push_back(s);
    policy_->on_use(s);
  }
  STRATA_CHECK(done > 0 || n == 0, MemoryError, "expert cache has no free slot for layer ", layer, " expert ",
               experts[0], ": all ", n_slots_,
               " slots are lent or pinned; raise --expert-cache or lower --prefill");
  if (table_dirty_[layer]) {
    // The compute stream's kernels of this layer read the current row.
    const size_t row = (size_t)layer * layout_.E;
    be_.upload_async(table_dev_.as<int32_t>() + row, reinterpret_cast<int32_t*>(table_host_.get()) + row,
                     layout_.E * sizeof(int32_t), Stream::Compute);
    table_dirty_[layer] = 0;
  }
  return done;
}

ExpertView ExpertCache::wait(int64_t layer, int64_t e) {
  if (!src_) {
    const auto& ll = layout_.layers[layer];
    return ExpertView{resident_[layer * 3].as<uint8_t>() + (size_t)e * ll.gate.bytes,
                      resident_[layer * 3 + 1].as<uint8_t>() + (size_t)e * ll.up.bytes,
                      resident_[layer * 3 + 2].as<uint8_t>() + (size_t)e * ll.down.bytes};
  }
  const int32_t s = slot_of(layer, e);
  STRATA_CHECK(s >= 0 && held_[s], Error, "internal error: expert ", e, " of layer ", layer,
               " was not prepared before use");
  if (landing_[s]) {
    be_.wait(Stream::Compute, ready_[s].id());
    landing_[s] = 0;
  }
  return view(layer, slot_ptr(s));
}

bool ExpertCache::in_flight(int64_t layer, int64_t e) const {
  if (!src_ || on_device_) return false;
  const int32_t s = slot_of(layer, e);
  return s >= 0 && landing_[s];
}

int64_t ExpertCache::prefetch_layer(int64_t layer, const int32_t* experts, int64_t n) {
  STRATA_CHECK(layer >= 0 && layer < layout_.L, Error, "prefetch_layer: layer ", layer, " out of range");
  if (!src_ || !lru_ || n <= 0) return 0;
  to_host();
  int64_t free = 0;
  for (int32_t s = 0; s < n_slots_; ++s) free += usable(s);
  if (free < 2 * layout_.E) return 0;
  policy_->on_layer(layer);
  for (int64_t i = 0; i < n; ++i) {
    STRATA_CHECK(experts[i] >= 0 && experts[i] < layout_.E, Error, "prefetch_layer: expert ", experts[i],
                 " out of range");
    if (const int32_t s = slot_of(layer, experts[i]); s >= 0) policy_->on_use(s);
  }
  int64_t filled = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (slot_of(layer, experts[i]) >= 0) continue;  // resident, or named twice
    const int32_t s = find_victim();
    if (s < 0) break;
    evict(s);
    fill(s, layer, experts[i], false);
    policy_->on_use(s);
    ahead_[s] = 1;
    ++filled;
  }
  stats_.prefetch_fills += (uint64_t)filled;
  stats_.prefetch_bytes += (uint64_t)filled * layout_.layers[layer].bytes;
  return filled;
}

void ExpertCache::release(int64_t /*layer*/) {
  for (int32_t s : held_list_) {
    last_use_[s].record(Stream::Compute);
    held_[s] = 0;
  }
  held_list_.clear();
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
  to_host();
  const int32_t id = (int32_t)e;
  prepare(layer, &id, 1);
  release(layer);
  pinned_[slot_of(layer, e)] = 1;
}

std::pair<uint8_t*, size_t> ExpertCache::lend(int32_t n) {
  STRATA_CHECK(src_ != nullptr, Error, "lend: an all-resident expert cache has no slots to lend");
  to_host();
  STRATA_CHECK(lent_n_ == 0, Error, "lend: slots are already lent; give them back first");
  STRATA_CHECK(held_list_.empty(), Error, "lend: experts are prepared and not released");
  STRATA_CHECK(n >= 1 && n <= n_slots_, MemoryError, "the prompt chunk needs ", n,
               " slots but the cache has ", n_slots_);
  // The run whose residents are least valuable; runs over pinned slots are not candidates.
  int32_t best = -1;
  uint64_t best_cost = UINT64_MAX;
  for (int32_t b = 0; b + n <= n_slots_; ++b) {
    uint64_t cost = 0;
    bool ok = true;
    for (int32_t s = b; s < b + n && ok; ++s) {
      if (pinned_[s])
        ok = false;
      else if (key_[s] >= 0)
        cost += policy_->value(s) + 1;
    }
    if (ok && cost < best_cost) best = b, best_cost = cost;
  }
  STRATA_CHECK(best >= 0, MemoryError, "no run of ", n, " unpinned slots in the expert cache");
  evicted_by_lend_.clear();
  for (int32_t s = best; s < best + n; ++s) {
    if (key_[s] >= 0) evicted_by_lend_.emplace_back(policy_->value(s), key_[s]);
    evict(s);
    // The prompt's kernels write here only after copies still landing in the slot.
    if (landing_[s]) be_.wait(Stream::Compute, ready_[s].id());
    landing_[s] = 0;
    lent_[s] = 1;
  }
  lent_begin_ = best;
  lent_n_ = n;
  ++stats_.lends;
  stats_.slots_lent = n;
  return {slot_ptr(best), (size_t)n * layout_.slot_bytes};
}

void ExpertCache::give_back() {
  if (lent_n_ == 0) return;
  for (int32_t s = lent_begin_; s < lent_begin_ + lent_n_; ++s) {
    lent_[s] = 0;
    last_use_[s].record(Stream::Compute);  // the chunk's last read of its scratch
  }
  // Refill the most valuable of the evicted experts into the returned slots.
  std::sort(evicted_by_lend_.begin(), evicted_by_lend_.end(), std::greater<>());
  int32_t s = lent_begin_;
  for (const auto& [value, key] : evicted_by_lend_) {
    if (index_[key] >= 0) continue;  // streamed back in already by the chunk
    while (s < lent_begin_ + lent_n_ && key_[s] >= 0) ++s;
    if (s >= lent_begin_ + lent_n_) break;
    fill(s, key / layout_.E, key % layout_.E, true);
    policy_->on_layer(key / layout_.E);
    policy_->on_use(s);
    ++stats_.refills;
  }
  evicted_by_lend_.clear();
  lent_begin_ = -1;
  lent_n_ = 0;
  stats_.slots_lent = 0;
}

}  // namespace strata
