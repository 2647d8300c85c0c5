// A stable counting sort run by one thread block: group_by_expert sorts (token, k) pairs by expert
// with it, scatter_add the rows of a pass by token. Deterministic: the counts are integers and the
// placement walks the items in order.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/common.cuh"

namespace strata::cuda {

constexpr int kSortThreads = 1024;
constexpr int kSortTile = 4096;  // items staged in shared memory at a time

// Shared memory block_counting_sort needs for nbins bins.
constexpr size_t counting_sort_smem(int64_t nbins) { return (size_t)(nbins + 2 * kSortTile) * sizeof(int); }

// out[...] = item_of(p) for p < n, ordered by key_of(p) in [0, nbins) and, within a key, by p;
// items whose key is negative are left out. off (if not null) gets nbins + 1 prefix counts.
// Called by all threads of one block of kSortThreads, with `smem` of counting_sort_smem(nbins) bytes.
template <class KeyOf, class ItemOf>
__device__ void block_counting_sort(int64_t n, int nbins, KeyOf key_of, ItemOf item_of, int32_t* out,
                                    int32_t* off, int* smem) {
  int* count = smem;             // [nbins]: counts, then the next free position of each bin
  int* tile_key = smem + nbins;  // [kSortTile]
  int* tile_item = tile_key + kSortTile;
  const int lane = threadIdx.x % kWarp;
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
  // Placement: the tile is staged by the whole block, then one warp walks it 32 items at a time;
  // lanes with equal keys take consecutive positions in lane order (match_any), so the order of
  // the items is kept.
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
}

}  // namespace strata::cuda
