// The Backend surface's defaults for what only some backends have (graphs, a position source).
#include "backend/backend.h"

#include "core/error.h"
#include "expert_cache/scan_rank.h"

namespace strata {

void Backend::capture_begin() {
  throw UnsupportedError(str("the ", name(), " backend does not record graphs"));
}
GraphId Backend::capture_end() {
  throw UnsupportedError(str("the ", name(), " backend does not record graphs"));
}
void Backend::graph_launch(GraphId) {
  throw UnsupportedError(str("the ", name(), " backend does not record graphs"));
}
void Backend::set_position_source(const int32_t* dev, int64_t) {
  STRATA_CHECK(dev == nullptr, UnsupportedError, "the ", name(),
               " backend reads positions from the host only (no position source)");
}

const uint8_t* expert_matrix(const ExpertTable& t, int m, int64_t e) {
  if (t.slots) {
    const int32_t s = t.slots[e];
    return s < 0 ? nullptr : t.arena + (size_t)s * t.slot_bytes + t.off[m];
  }
  return t.base[m] + (size_t)e * t.stride[m];
}

void resolve_experts_reference(const ExpertResolve& r, void (*copy)(void*, const void*, size_t)) {
  STRATA_CHECK(!r.write_through || (r.pending && !r.prefetch), Error,
               "internal error: a write-through resolution without pending flags, or of a prefetch");
  STRATA_CHECK(r.max_fills >= 0 && (r.prefetch || (r.max_fills == 0 && !r.ranked)), Error,
               "internal error: a fill budget or a ranked walk outside a prefetch");
  const int64_t base = r.layer * r.E;
  const bool scan = r.pass != nullptr;
  if (scan && !r.prefetch) {
    if ((int64_t)r.scan_now[1] >= r.layer) ++r.scan_now[0];
    r.scan_now[1] = (uint64_t)r.layer;
  }
  auto key = [&](int32_t s) {
    return scan ? scan_key(r.last[s], r.pass[s], r.pass_layer[s], r.scan_now[0], r.layer)
                : ScanKey{r.last[s], 0};
  };
  auto victim = [&]() {
    int32_t best = -1;
    ScanKey kb{};
    for (int32_t s = 0; s < (int32_t)r.n_slots; ++s) {
      if (r.pinned[s] || r.held[s]) continue;
      const ScanKey k = key(s);
      if (best < 0 || scan_less(k, kb)) best = s, kb = k;
    }
    return best;
  };
  auto stamp = [&](int32_t s) {
    r.last[s] = ++*r.tick;
    if (scan) r.pass[s] = r.scan_now[0], r.pass_layer[s] = r.layer;
  };
  int32_t& jobs = r.jobs[0];
  jobs = 0;
  auto expert = [&](int64_t i) { return r.ids[r.ranked ? i : r.order[i]]; };
  for (int64_t i = 0; i < r.n; ++i) {
    const int32_t e = expert(i);
    if (e < 0 || e >= r.E) {
      if (!r.prefetch) ++r.counters[4];
      continue;
    }
    int32_t s = r.table[base + e];
    if (s >= 0) {
      if (r.held[s]) continue;          // named twice
      if (r.pending) r.pending[s] = 0;  // its write-through, if any, was earlier work
      if (r.prefetch) {                 // resident already: kept from this call's victims, nothing else
        r.held[s] = 1;
        continue;
      }
      ++r.counters[0];
      if (r.pref && r.pref[s]) {
        ++r.counters[6];
        r.pref[s] = 0;
      }
    } else {
      if (r.max_fills > 0 && jobs >= r.max_fills) continue;  // the prefetch's budget is spent
      s = victim();
      if (s < 0) {
        if (!r.prefetch) ++r.counters[4];
        continue;
      }
      if (r.key[s] >= 0) {
        r.table[r.key[s]] = -1;
        ++r.counters[3];
      }
      if (r.pref && r.pref[s]) ++r.counters[7];
      if (r.pref) r.pref[s] = r.prefetch ? 1 : 0;
      r.key[s] = (int32_t)(base + e);
      r.table[base + e] = s;
      if (r.prefetch) {
        ++r.counters[5];
        r.counters[8] += r.layer_bytes;
      } else {
        ++r.counters[1];
      }
      r.counters[2] += r.layer_bytes;
      const bool through = r.write_through && !r.prefetch;
      if (r.pending) r.pending[s] = through ? 1 : 0;
      if (!through) {
        r.jobs[1 + 2 * jobs] = s;
        r.jobs[2 + 2 * jobs] = e;
        ++jobs;
      }
    }
    r.held[s] = 1;
    stamp(s);
  }
  for (int32_t j = 0; j < jobs; ++j) {
    uint8_t* dst = r.arena + (size_t)r.jobs[1 + 2 * j] * r.slot_bytes;
    const size_t e = (size_t)r.jobs[2 + 2 * j];
    for (int m = 0; m < 3; ++m)
      if (r.bytes[m]) copy(dst + r.off[m], r.src[m] + e * r.src_stride[m], r.bytes[m]);
  }
  for (int64_t i = 0; i < r.n; ++i) {
    const int32_t e = expert(i);
    if (e >= 0 && e < r.E && r.table[base + e] >= 0) r.held[r.table[base + e]] = 0;
  }
}

}  // namespace strata
