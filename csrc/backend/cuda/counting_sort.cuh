// A stable counting sort run by one thread block: group_by_expert sorts (token, k) pairs by expert
// with it, scatter_add the rows of a pass by token. Deterministic: the counts are integers and the
// placement walks the items in order.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/common.cuh"
#include "core/env.h"

namespace strata::cuda {

constexpr int kSortThreads = 1024;
constexpr int kSortTile = 4096;  // items staged in shared memory at a time
constexpr int kPlaceWarps = 8;   // warps that place a tile's items, each a contiguous slice of it
static_assert(kSortTile <= 65535, "a tile's offsets within a bin fit 16 bits");

// Whether block_counting_sort's callers place with kPlaceWarps warps: the default (H100, 2026-12-07: the 30B
// shape's 2048-token prompt 10,066 -> 10,498 tok/s all resident, q36's 5,770 -> 5,975);
// STRATA_CUDA_SORT_PARALLEL=0 places with one warp for the A/B (read at each launch; the same output).
inline bool sort_parallel_on() { return env_switch("STRATA_CUDA_SORT_PARALLEL", true); }

// Shared memory block_counting_sort needs for nbins bins: the bins' next free positions (ints), the tile's
// keys and items (ints); placing with kPlaceWarps warps also the tile's totals per bin (ints) and each
// placing warp's offsets within the tile's share of a bin (uint16). The one-warp placement's size is the
// bound on nbins (4,096 bins in 48 KiB); the parallel one's more (682).
constexpr size_t counting_sort_smem(int64_t nbins, bool parallel) {
  return (size_t)(nbins + 2 * kSortTile) * sizeof(int) +
         (parallel ? (size_t)nbins * sizeof(int) + (size_t)kPlaceWarps * nbins * sizeof(uint16_t) : 0);
}

// The placement a sort of nbins bins takes: the parallel one (unless STRATA_CUDA_SORT_PARALLEL=0) where its
// shared memory fits 48 KiB, else one warp (the same output).
inline bool sort_parallel_for(int64_t nbins) {
  return sort_parallel_on() && counting_sort_smem(nbins, true) <= 48 * 1024;
}

// out[...] = item_of(p) for p < n, ordered by key_of(p) in [0, nbins) and, within a key, by p;
// items whose key is negative are left out. off (if not null) gets nbins + 1 prefix counts.
// Called by all threads of one block of kSortThreads, with `smem` of counting_sort_smem(nbins, parallel)
// bytes. parallel: kPlaceWarps warps place each tile (sort_parallel_for), else one warp walks it; the same
// output.
template <class KeyOf, class ItemOf>
__device__ void block_counting_sort(int64_t n, int nbins, KeyOf key_of, ItemOf item_of, int32_t* out,
                                    int32_t* off, int* smem, bool parallel) {
  int* count = smem;              // [nbins]: counts, then the next free position of each bin
  int* tile_key = count + nbins;  // [kSortTile]
  int* tile_item = tile_key + kSortTile;
  int* total = tile_item + kSortTile;  // [nbins], parallel only: a tile's items a bin
  uint16_t* woff = reinterpret_cast<uint16_t*>(total + nbins);  // [kPlaceWarps][nbins], parallel only
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  for (int b = threadIdx.x; b < nbins; b += blockDim.x) count[b] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < n; p += blockDim.x) {
    const int k = key_of(p);
    if (k >= 0) atomicAdd(&count[k], 1);  // integer sums: the same in any order
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int running = 0;
    for (int b = 0; b < nbins; ++b) {
      const int c = count[b];
      count[b] = running;
      if (off) off[b] = running;
      running += c;
    }
    if (off) off[nbins] = running;
  }
  __syncthreads();
  // Placement, a tile at a time: kPlaceWarps warps each count their contiguous slice's items per bin (lanes
  // with equal keys grouped by match_any), the bins' threads turn those counts into each warp's offset
  // within the tile's share of the bin (warps in order), then each warp places its items there, lanes with
  // equal keys in lane order. So a bin's items keep the order of p: by slice, then by 32-item step, then by
  // lane.
  constexpr int warps = kPlaceWarps, slice = kSortTile / warps;
  const auto walk = [&](int m, bool place) {
    const int p_end = min(m, (warp + 1) * slice);
    uint16_t* wo = woff + warp * nbins;
    for (int p0 = warp * slice; p0 < p_end; p0 += kWarp) {
      const int p = p0 + lane;
      const int key = p < p_end ? tile_key[p] : -1;
      const unsigned same = __match_any_sync(kFullMask, key);
      const int rank = __popc(same & ((1u << lane) - 1u));
      if (place && key >= 0) out[count[key] + wo[key] + rank] = tile_item[p];
      __syncwarp();
      if (key >= 0 && rank == 0) wo[key] = static_cast<uint16_t>(wo[key] + __popc(same));
      __syncwarp();
    }
  };
  if (!parallel) {  // one warp walks each tile 32 items at a time, lanes with equal keys in lane order
    for (int64_t base = 0; base < n; base += kSortTile) {
      const int m = (int)min((int64_t)kSortTile, n - base);
      for (int p = threadIdx.x; p < m; p += blockDim.x) {
        tile_key[p] = key_of(base + p);
        tile_item[p] = item_of(base + p);
      }
      __syncthreads();
      if (threadIdx.x < kWarp) {
        for (int p0 = 0; p0 < m; p0 += kWarp) {
          const int p = p0 + lane;
          const int key = p < m ? tile_key[p] : -1;
          const unsigned same = __match_any_sync(kFullMask, key);
          const int rank = __popc(same & ((1u << lane) - 1u));
          const int pos = key >= 0 ? count[key] + rank : 0;
          __syncwarp();
          if (key >= 0 && rank == 0) count[key] += __popc(same);
          __syncwarp();
          if (key >= 0) out[pos] = tile_item[p];
        }
      }
      __syncthreads();
    }
    return;
  }
  for (int64_t base = 0; base < n; base += kSortTile) {
    const int m = (int)min((int64_t)kSortTile, n - base);
    for (int p = threadIdx.x; p < m; p += blockDim.x) {
      tile_key[p] = key_of(base + p);
      tile_item[p] = item_of(base + p);
    }
    for (int e = threadIdx.x; e < kPlaceWarps * nbins; e += blockDim.x) woff[e] = 0;
    __syncthreads();
    if (warp < warps) walk(m, false);
    __syncthreads();
    for (int b = threadIdx.x; b < nbins; b += blockDim.x) {
      int running = 0;
      for (int w = 0; w < warps; ++w) {
        const int c = woff[w * nbins + b];
        woff[w * nbins + b] = static_cast<uint16_t>(running);
        running += c;
      }
      total[b] = running;
    }
    __syncthreads();
    if (warp < warps) walk(m, true);
    __syncthreads();
    for (int b = threadIdx.x; b < nbins; b += blockDim.x) count[b] += total[b];
    __syncthreads();
  }
}

}  // namespace strata::cuda
