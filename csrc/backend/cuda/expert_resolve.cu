// resolve_experts on the GPU (see expert_resolve.cuh and Backend::resolve_experts for the contract).
//
// resolve_kernel: one block walks the experts in order as the host's prepare does. A hit stamps its
// slot with the next tick (and, under the scan policy, the pass and layer); a miss takes the slot with
// the smallest (key, slot) among those neither pinned nor held (LRU: the key is the tick; scan: its
// scan_key), found by the whole block (each thread scans a stride, then a tree), and thread 0 updates
// the table, the slot's key and stamps, the counters and the job list. Every step ends in a barrier, so
// the next expert sees it (global memory is coherent within a block across __syncthreads).
//
// With write_through a miss gets no job: its slot is marked pending and the layer's matmul_experts
// read its bytes from the source and write them into the slot (matmul_gemv.cuh: write_through_row).
//
// fill_kernel: a few blocks copy each job's segments from host memory (device views of pinned or
// registered pages) to the slot, each thread keeping 8 16-byte loads in flight: the device notes
// measured ~50 GB/s from 8-16 such blocks on the H200's PCIe Gen5 link.
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/expert_resolve.cuh"
#include "core/env.h"
#include "expert_cache/scan_rank.h"

namespace strata::cuda {
namespace {

constexpr int kResolveThreads = 256;
constexpr int kFillBlocks = 16, kFillThreads = 256, kInFlight = 8;

// The fill's blocks: kFillBlocks, or STRATA_CUDA_FILL_BLOCKS (1-1024) for the A/B. A zero-copy read's
// throughput is the bytes in flight over the host memory's latency, which differs from host to host
// (an H100 host decoded V3 at ~28 GB/s of fill where another H100 and the H200 reached ~42-50).
int fill_blocks() {
  static const int n =
      static_cast<int>(env_int("STRATA_CUDA_FILL_BLOCKS", kFillBlocks, 1, 1024, "a number of blocks"));
  return n;
}

// (key, slot) ordered lexicographically; slot < 0 is "none", larger than any candidate.
__device__ __forceinline__ bool better(ScanKey v, int32_t s, ScanKey bv, int32_t bs) {
  if (s < 0) return false;
  if (bs < 0) return true;
  return scan_less(v, bv) || (!scan_less(bv, v) && s < bs);
}

// The victim for a miss, found by the whole block (each thread scans a stride of the slots, then a tree): the
// slot with the smallest (key, slot) among those neither pinned nor held, or -1; thread 0's value is the
// answer. Every thread must call it; it ends after a barrier.
__device__ int32_t find_victim(const ExpertResolve& r, bool scan, uint64_t pass_now, ScanKey* red_v,
                               int32_t* red_s) {
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  ScanKey bv{};
  int32_t bs = -1;
  for (int32_t s = tid; s < r.n_slots; s += kResolveThreads) {
    if (r.pinned[s] || r.held[s]) continue;
    const ScanKey k =
        scan ? scan_key(r.last[s], r.pass[s], r.pass_layer[s], pass_now, r.layer) : ScanKey{r.last[s], 0};
    if (better(k, s, bv, bs)) bv = k, bs = s;
  }
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const ScanKey ov{__shfl_down_sync(0xffffffffu, bv.a, o), __shfl_down_sync(0xffffffffu, bv.b, o)};
    const int32_t os = __shfl_down_sync(0xffffffffu, bs, o);
    if (better(ov, os, bv, bs)) bv = ov, bs = os;
  }
  if (lane == 0) red_v[warp] = bv, red_s[warp] = bs;
  __syncthreads();
  if (tid == 0)
    for (int w = 1; w < kResolveThreads / kWarp; ++w)
      if (better(red_v[w], red_s[w], bv, bs)) bv = red_v[w], bs = red_s[w];
  return bs;
}

// Thread 0's start of a call: under the scan policy, a call (not a prefetch) for a layer no later than the
// last call's begins a pass; returns the pass now (0 under LRU).
__device__ __forceinline__ uint64_t begin_call(const ExpertResolve& r) {
  if (!r.pass) return 0;
  if (!r.prefetch) {
    if (static_cast<int64_t>(r.scan_now[1]) >= r.layer) ++r.scan_now[0];
    r.scan_now[1] = static_cast<uint64_t>(r.layer);
  }
  return r.scan_now[0];
}

// Thread 0's part of a miss of expert e that found slot bs: the slot's expert (if any) evicted, the slot
// taken for e and held, the counters c (kResolveCounters) counted, and its fill queued in the job list (or,
// written through, its pending flag set). Returns the evicted key (-1: the slot was empty). The caller stamps
// the slot.
__device__ int32_t take_slot(const ExpertResolve& r, int32_t bs, int32_t e, int64_t base, uint64_t* c,
                             int32_t& jobs) {
  const int32_t old = r.key[bs];
  if (old >= 0) {
    r.table[old] = -1;
    ++c[3];
  }
  if (r.pref) {
    if (r.pref[bs]) ++c[7];
    r.pref[bs] = r.prefetch ? 1 : 0;
  }
  r.key[bs] = static_cast<int32_t>(base + e);
  r.table[base + e] = bs;
  if (r.prefetch) {
    ++c[5];
    c[8] += r.layer_bytes;
  } else {
    ++c[1];
  }
  c[2] += r.layer_bytes;
  const bool through = r.write_through && !r.prefetch;
  if (r.pending) r.pending[bs] = through ? 1 : 0;
  if (!through) {
    r.jobs[1 + 2 * jobs] = bs;
    r.jobs[2 + 2 * jobs] = e;
    ++jobs;
  }
  r.held[bs] = 1;
  return old;
}

__global__ void __launch_bounds__(kResolveThreads) resolve_kernel(ExpertResolve r) {
  grid_start();
  __shared__ ScanKey red_v[kResolveThreads / kWarp];
  __shared__ int32_t red_s[kResolveThreads / kWarp];
  __shared__ int32_t jobs;
  __shared__ uint64_t pass_now;
  const int tid = threadIdx.x;
  const int64_t base = r.layer * r.E;
  const bool scan = r.pass != nullptr;
  if (tid == 0) {
    jobs = 0;
    pass_now = begin_call(r);
  }
  __syncthreads();
  auto stamp = [&](int32_t s) {
    r.last[s] = ++*r.tick;
    if (scan) r.pass[s] = pass_now, r.pass_layer[s] = r.layer;
  };
  for (int64_t i = 0; i < r.n; ++i) {
    __syncthreads();  // the previous expert's updates are visible to every thread
    const int32_t e = r.ids[r.ranked ? i : r.order[i]];
    if (e < 0 || e >= r.E) {
      if (tid == 0 && !r.prefetch) ++r.counters[4];
      continue;
    }
    const int32_t hit = r.table[base + e];
    if (hit >= 0) {
      if (tid == 0 && !r.held[hit]) {  // a second mention in the call counts nothing
        r.held[hit] = 1;
        if (r.pending) r.pending[hit] = 0;  // its write-through, if any, was earlier work
        if (!r.prefetch) {  // a prefetch leaves a resident expert as it is (held: no victim of this call)
          ++r.counters[0];
          stamp(hit);
          if (r.pref && r.pref[hit]) {
            ++r.counters[6];
            r.pref[hit] = 0;
          }
        }
      }
      continue;
    }
    if (r.max_fills > 0 && jobs >= r.max_fills) continue;  // the prefetch's budget is spent
    const int32_t bs = find_victim(r, scan, pass_now, red_v, red_s);
    if (tid == 0) {
      if (bs < 0) {
        if (!r.prefetch) ++r.counters[4];
      } else {
        take_slot(r, bs, e, base, r.counters, jobs);
        stamp(bs);
      }
    }
  }
  __syncthreads();
  if (tid == 0) r.jobs[0] = jobs;
  for (int64_t i = tid; i < r.n; i += kResolveThreads) {
    const int32_t e = r.ids[r.ranked ? i : r.order[i]];
    if (e >= 0 && e < r.E) {
      const int32_t s = r.table[base + e];
      if (s >= 0) r.held[s] = 0;
    }
  }
}

// resolve_kernel's walk with what it reads of each expert loaded first by the whole block, at once: a
// decode step's hits then cost thread 0 a few shared-memory reads each instead of a chain of dependent global
// loads and a barrier (ncu-free estimate: ~2 us an expert, 48 layers x 8 on the 30B shape), and only a miss
// stops the walk for the block's victim search. The same decisions in the same order, so the same table,
// keys, ticks, counters and jobs: an expert's slot as the walk would read it is its preloaded slot, patched
// whenever the walk changes that expert's table entry (an earlier miss took it a slot, or evicted it); a slot
// held by the call is held by an earlier mention of the same expert (a slot taken from another expert first
// loses that expert's entry). Up to kPreloadItems experts a call (a decode step of up to 32 sequences of 8).
constexpr int kPreloadItems = 256;

__global__ void __launch_bounds__(kResolveThreads) resolve_preload_kernel(ExpertResolve r) {
  grid_start();
  __shared__ ScanKey red_v[kResolveThreads / kWarp];
  __shared__ int32_t red_s[kResolveThreads / kWarp];
  __shared__ int32_t se[kPreloadItems], st[kPreloadItems];  // expert (-1: not of the layer), slot now
  __shared__ uint8_t sh0[kPreloadItems], spf[kPreloadItems], sdup[kPreloadItems];
  __shared__ int64_t next_i;
  __shared__ uint64_t pass_now;
  const int tid = threadIdx.x;
  const int64_t base = r.layer * r.E, n = r.n;
  const bool scan = r.pass != nullptr;
  if (tid == 0) {
    pass_now = begin_call(r);
  }
  for (int64_t i = tid; i < n; i += kResolveThreads) {
    const int32_t e = r.ids[r.ranked ? i : r.order[i]];
    const bool ok = e >= 0 && e < r.E;
    const int32_t t = ok ? r.table[base + e] : -1;
    se[i] = ok ? e : -1;
    st[i] = t;
    sh0[i] = t >= 0 ? r.held[t] : 0;
    spf[i] = t >= 0 && r.pref ? r.pref[t] : 0;
  }
  __syncthreads();
  for (int64_t i = tid; i < n; i += kResolveThreads) {
    bool dup = false;
    for (int64_t j = 0; j < i && !dup && se[i] >= 0; ++j) dup = se[j] == se[i];
    sdup[i] = dup;
  }
  __syncthreads();
  // Thread 0's running state: the clock, the counters' increments, the jobs.
  uint64_t tick = 0, c[kResolveCounters] = {};
  int32_t jobs = 0;
  if (tid == 0) tick = *r.tick;
  // Later mentions of expert e see `slot` as its table entry.
  auto patch = [&](int64_t after, int32_t e, int32_t slot) {
    for (int64_t j = after + 1; j < n; ++j)
      if (se[j] == e) st[j] = slot;
  };
  auto stamp = [&](int32_t s) {
    r.last[s] = ++tick;
    if (scan) r.pass[s] = pass_now, r.pass_layer[s] = r.layer;
  };
  int64_t i = 0;
  for (;;) {
    if (tid == 0) {
      for (; i < n; ++i) {
        const int32_t e = se[i];
        if (e < 0) {
          if (!r.prefetch) ++c[4];
          continue;
        }
        const int32_t hit = st[i];
        if (hit >= 0) {
          if (sdup[i] || sh0[i]) continue;  // held: a second mention counts nothing
          r.held[hit] = 1;
          if (r.pending) r.pending[hit] = 0;  // its write-through, if any, was earlier work
          if (!r.prefetch) {
            ++c[0];
            stamp(hit);
            if (spf[i]) {
              ++c[6];
              r.pref[hit] = 0;
            }
          }
          continue;
        }
        if (r.max_fills > 0 && jobs >= r.max_fills) continue;  // the prefetch's budget is spent
        break;                                                 // a miss: the block finds its victim
      }
      next_i = i;
    }
    __syncthreads();  // thread 0's stores (held, ticks) are visible to the search
    i = next_i;
    if (i >= n) break;
    const int32_t bs = find_victim(r, scan, pass_now, red_v, red_s);
    if (tid == 0) {
      const int32_t e = se[i];
      if (bs < 0) {
        if (!r.prefetch) ++c[4];
      } else {
        const int32_t old = take_slot(r, bs, e, base, c, jobs);
        if (old >= base && old < base + r.E) patch(i, static_cast<int32_t>(old - base), -1);
        patch(i, e, bs);
        stamp(bs);
      }
      ++i;
    }
    __syncthreads();  // next_i is read again only after thread 0 wrote it
  }
  if (tid == 0) {
    r.jobs[0] = jobs;
    *r.tick = tick;
    for (int k = 0; k < kResolveCounters; ++k) r.counters[k] += c[k];
  }
  __syncthreads();
  for (int64_t j = tid; j < n; j += kResolveThreads) {
    const int32_t e = se[j];
    if (e >= 0) {
      const int32_t s = r.table[base + e];
      if (s >= 0) r.held[s] = 0;
    }
  }
}

__global__ void __launch_bounds__(kFillThreads) fill_kernel(ExpertResolve r, bool vec) {
  grid_start();
  const int32_t nj = r.jobs[0];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int32_t j = 0; j < nj; ++j) {
    uint8_t* slot = r.arena + static_cast<size_t>(r.jobs[1 + 2 * j]) * r.slot_bytes;
    const size_t e = static_cast<size_t>(r.jobs[2 + 2 * j]);
    for (int m = 0; m < 3; ++m) {
      const int64_t n = static_cast<int64_t>(r.bytes[m]);
      if (n == 0) continue;
      uint8_t* dst = slot + r.off[m];
      const uint8_t* src = r.src[m] + e * r.src_stride[m];
      if (vec) {
        const int64_t n16 = n / 16;
        const uint4* s4 = reinterpret_cast<const uint4*>(src);
        uint4* d4 = reinterpret_cast<uint4*>(dst);
        for (int64_t i0 = first; i0 < n16; i0 += stride * kInFlight) {
          uint4 v[kInFlight];
#pragma unroll
          for (int k = 0; k < kInFlight; ++k)
            if (i0 + k * stride < n16) v[k] = s4[i0 + k * stride];
#pragma unroll
          for (int k = 0; k < kInFlight; ++k)
            if (i0 + k * stride < n16) d4[i0 + k * stride] = v[k];
        }
      } else {
        for (int64_t i = first; i < n; i += stride) dst[i] = src[i];
      }
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void launch_resolve_experts(const ExpertResolve& r, cudaStream_t s, cudaStream_t fill_stream,
                            cudaEvent_t forked) {
  STRATA_CHECK(r.n >= 0 && r.n_slots >= 0 && r.E > 0, ConfigError, "resolve_experts: bad shape n=", r.n,
               " slots=", r.n_slots, " E=", r.E);
  STRATA_CHECK(!r.write_through || (r.pending && !r.prefetch), Error,
               "internal error: a write-through resolution without pending flags, or of a prefetch");
  STRATA_CHECK(r.max_fills >= 0 && (r.prefetch || (r.max_fills == 0 && !r.ranked)), Error,
               "internal error: a fill budget or a ranked walk outside a prefetch");
  if (r.n == 0) return;
  bool vec = aligned16(r.arena) && r.slot_bytes % 16 == 0;
  for (int m = 0; m < 3; ++m)
    vec =
        vec && aligned16(r.src[m]) && r.src_stride[m] % 16 == 0 && r.bytes[m] % 16 == 0 && r.off[m] % 16 == 0;
  if (r.n <= kPreloadItems && env_switch("STRATA_CUDA_RESOLVE_PRELOAD", true))
    launch_kernel(resolve_preload_kernel, 1, kResolveThreads, 0, s, r);
  else
    launch_kernel(resolve_kernel, 1, kResolveThreads, 0, s, r);
  STRATA_CUDA_LAUNCH_CHECK();
  if (r.write_through) return;  // no jobs: the layer's matmul_experts write the misses through
  if (fill_stream != s) {       // the fill beside what follows on s (a prefetch): s's work so far first
    STRATA_CUDA_CHECK(cudaEventRecord(forked, s));
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(fill_stream, forked, 0));
  }
  launch_kernel(fill_kernel, fill_blocks(), kFillThreads, 0, fill_stream, r, vec);
  STRATA_CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
