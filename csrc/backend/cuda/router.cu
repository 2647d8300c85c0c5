// MoE routing on the device: softmax top-K per token (ids bit-identical in choice and order to the
// CPU's given the same probabilities), the stable grouping of (token, k) pairs by expert, and the
// three with the router's matmul as one launch for a decode step (route).
#include "backend/cuda/common.cuh"
#include "backend/cuda/counting_sort.cuh"
#include "backend/cuda/matmul_gemv.cuh"
#include "backend/cuda/router.cuh"
#include "core/env.h"

namespace strata::cuda {
namespace {

// The top-K of one token's E logits lg by one warp; sm (topk_smem(E, K) bytes of shared memory) is
// its scratch and keeps the picked ids at topk_picked(sm, E). As the CPU: p = exp(l - max) / sum
// with the sum taken in id order; K rounds of a warp argmax (ties to the lower id) pick the top-K in
// order; the renormalizing sum runs in pick order. The picks stay in shared memory until the end
// (a read of what this warp just wrote to global memory would be a round trip each).
constexpr size_t topk_smem(int64_t E, int64_t K) { return static_cast<size_t>(E + 2 * K) * 4; }
__device__ __forceinline__ int32_t* topk_picked(float* sm, int64_t E) {
  return reinterpret_cast<int32_t*>(sm + E);
}
__device__ __forceinline__ void topk_warp(const float* lg, int64_t E, int64_t K, bool norm, int32_t* ids,
                                          float* weights, float* sm, int lane) {
  float* p = sm;
  int32_t* pid = topk_picked(sm, E);
  float* pw = sm + E + K;
  float mx = -INFINITY;
  for (int64_t e = lane; e < E; e += kWarp) mx = fmaxf(mx, lg[e]);
  mx = warp_max(mx);
  for (int64_t e = lane; e < E; e += kWarp) p[e] = expf(lg[e] - mx);
  __syncwarp();
  float sum = 0.0f;
  if (lane == 0)
    for (int64_t e = 0; e < E; ++e) sum += p[e];
  sum = __shfl_sync(kFullMask, sum, 0);
  for (int64_t e = lane; e < E; e += kWarp) p[e] /= sum;
  __syncwarp();
  float ws = 0.0f;  // lane 0: the sum of the picked probabilities, in pick order
  for (int64_t k = 0; k < K; ++k) {
    float best = -1.0f;  // below every probability: a lane with nothing left never wins
    int best_id = 0x7fffffff;
    for (int64_t e = lane; e < E; e += kWarp)
      if (p[e] > best) {  // strict: a lane keeps its lowest id among equals
        best = p[e];
        best_id = (int)e;
      }
    for (int o = kWarp / 2; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(kFullMask, best, o);
      const int oid = __shfl_xor_sync(kFullMask, best_id, o);
      if (ob > best || (ob == best && oid < best_id)) {
        best = ob;
        best_id = oid;
      }
    }
    if (lane == 0) {
      pid[k] = best_id;
      pw[k] = best;
      ws += best;
      p[best_id] = -2.0f;  // taken
    }
    __syncwarp();
  }
  ws = __shfl_sync(kFullMask, ws, 0);
  for (int64_t k = lane; k < K; k += kWarp) {
    ids[k] = pid[k];
    weights[k] = norm ? pw[k] / ws : pw[k];
  }
  __syncwarp();
}

// One warp per token, the probabilities in shared memory.
__global__ void __launch_bounds__(kWarp)
    router_topk_kernel(const float* logits, int64_t E, int64_t K, bool norm, int32_t* ids, float* weights) {
  grid_start();
  extern __shared__ float sm[];  // topk_smem(E, K)
  const int64_t t = blockIdx.x;
  topk_warp(logits + t * E, E, K, norm, ids + t * K, weights + t * K, sm, threadIdx.x);
}

// topk_warp's picks by the whole block (blockDim.x threads, whole warps): the same float operations
// (the max, p = exp(l - max) summed in id order by one thread, then divided; the renormalizing sum in
// pick order), but the picks are ranks: p_e takes slot #{j : p_j > p_e or (p_j == p_e and j < e)}, the
// order K argmax rounds with ties to the lower id produce, in one pass over E instead of K serial
// rounds. A NaN probability ranks below every number (the rounds never pick one while a number is
// left), so every slot gets a distinct id in [0, E). lg: E logits in shared memory; sm: topk_smem(E, K);
// red: 32 floats.
__device__ __forceinline__ float rank_key(float p) { return p == p ? p : -1.0f; }
__device__ __forceinline__ void topk_block(const float* lg, int64_t E, int64_t K, bool norm, int32_t* ids,
                                           float* weights, float* sm, float* red) {
  float* p = sm;
  int32_t* pid = topk_picked(sm, E);
  float* pw = sm + E + K;
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid % kWarp, warp = tid / kWarp;
  float mx = -INFINITY;
  for (int e = tid; e < E; e += nt) mx = fmaxf(mx, lg[e]);
  mx = warp_max(mx);
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  if (tid == 0) {
    for (int w = 1; w < nt / kWarp; ++w) mx = fmaxf(mx, red[w]);
    red[0] = mx;
  }
  __syncthreads();
  mx = red[0];
  for (int e = tid; e < E; e += nt) p[e] = expf(lg[e] - mx);
  __syncthreads();
  if (tid == 0) {
    float sum = 0.0f;
#pragma unroll 8
    for (int e = 0; e < E; ++e) sum += p[e];
    red[1] = sum;
  }
  __syncthreads();
  const float sum = red[1];
  for (int e = tid; e < E; e += nt) p[e] /= sum;
  __syncthreads();
  for (int e = tid; e < E; e += nt) {
    const float pe = rank_key(p[e]);
    int rank = 0;
#pragma unroll 8
    for (int j = 0; j < E; ++j) {
      const float pj = rank_key(p[j]);
      rank += pj > pe || (pj == pe && j < e);
    }
    if (rank < K) {
      pid[rank] = e;
      pw[rank] = p[e];
    }
  }
  __syncthreads();
  if (tid == 0) {
    float ws = 0.0f;
    for (int k = 0; k < K; ++k) ws += pw[k];
    red[2] = ws;
  }
  __syncthreads();
  const float ws = red[2];
  for (int k = tid; k < K; k += nt) {
    ids[k] = pid[k];
    weights[k] = norm ? pw[k] / ws : pw[k];
  }
}

// One token's K pairs grouped by expert as group_by_expert_kernel groups them (a stable sort of the
// pairs by id: off[e] = the pairs of lower ids, rows in id order), for K distinct ids in [0, E)
// (topk_block's), by the whole block.
__device__ __forceinline__ void group_distinct_block(const int32_t* ids, int64_t K, int64_t E, int32_t* off,
                                                     int32_t* rows) {
  for (int e = threadIdx.x; e <= E; e += blockDim.x) {
    int c = 0;
    for (int q = 0; q < K; ++q) c += ids[q] < e;
    off[e] = c;
  }
  for (int k = threadIdx.x; k < K; k += blockDim.x) {
    int pos = 0;
    for (int q = 0; q < K; ++q) pos += ids[q] < ids[k];
    rows[pos] = k;
  }
}

// route for one token: warp w of block b computes logit n b + w (n warps a block: 4, or
// STRATA_CUDA_ROUTE_WARPS) as gemv_row_kernel does (row_dot, the same bits as matmul); the last block to
// finish (a ticket, reset for the next call) picks the top-K from those logits and groups the pairs, all its
// threads at once. Fewer warps a block spread the router's rows over more SMs (E = 128 rows of 4 warps are
// 32 blocks: 32 of an H100's 132 SMs read the 2 MB of a 235B router) at the price of fewer threads for the
// last block's picks; the same bits either way.
template <class F>
__global__ void __launch_bounds__(gemv::kRowThreads)
    route_kernel(const uint8_t* W, size_t rb, int64_t E, int64_t D, const float* x, bool x_vec, int64_t K,
                 bool norm, float* logits, int32_t* ids, float* weights, int32_t* off, int32_t* rows,
                 unsigned* ticket) {
  grid_start();
  extern __shared__ float sm[];  // the logits (E), then topk_block's scratch (topk_smem(E, K))
  __shared__ float red[kWarp];
  __shared__ bool last;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + warp;
  if (r < E) {
    const float v = gemv::row_dot<F>(W + r * rb, x, D, x_vec, lane);
    if (lane == 0) logits[r] = v;
  }
  __threadfence();  // the logits before the ticket
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) sm[e] = __ldcg(logits + e);  // past this SM's L1
  __syncthreads();
  topk_block(sm, E, K, norm, ids, weights, sm + E, red);
  group_distinct_block(topk_picked(sm + E, E), K, E, off, rows);
  if (threadIdx.x == 0) *ticket = 0;
}

// The expert of pair p; an id outside [0, E) is left out rather than let it write outside the counts.
struct ExpertOf {
  const int32_t* ids;
  int E;
  __device__ int operator()(int64_t p) const { return (unsigned)ids[p] < (unsigned)E ? ids[p] : -1; }
};
struct PairIndex {
  __device__ int operator()(int64_t p) const { return (int)p; }
};

__global__ void __launch_bounds__(kSortThreads)
    group_by_expert_kernel(const int32_t* ids, int64_t n, int E, int32_t* off, int32_t* rows, bool parallel) {
  grid_start();
  extern __shared__ int smem[];
  block_counting_sort(n, E, ExpertOf{ids, E}, PairIndex{}, rows, off, smem, parallel);
}

}  // namespace

void launch_router_topk(const float* logits, int64_t T, int64_t E, int64_t K, bool norm, int32_t* ids,
                        float* weights, cudaStream_t s) {
  STRATA_CHECK(K >= 1 && K <= E, ConfigError, "router_topk: K=", K, " must be in [1, E=", E, "]");
  STRATA_CHECK(topk_smem(E, K) <= 48 * 1024, UnsupportedError, "router_topk: E=", E, " experts and K=", K,
               " exceed the CUDA kernel's shared memory (E + 2 K <= 12288)");
  if (T <= 0) return;
  launch_kernel(router_topk_kernel, grid_x(T), kWarp, topk_smem(E, K), s, logits, E, K, norm, ids, weights);
  STRATA_CUDA_LAUNCH_CHECK();
}

bool launch_route(uint32_t type, const void* W, int64_t E, int64_t D, const float* x, int64_t K, bool norm,
                  float* logits, int32_t* ids, float* weights, int32_t* off, int32_t* rows, unsigned* ticket,
                  cudaStream_t s) {
  constexpr int64_t kMaxE = 4096;  // 2 E + 2 K words of shared memory
  if (E < 1 || E > kMaxE || K < 1 || K > E || D < 1) return false;
  auto run = [&](auto fmt) {
    using F = decltype(fmt);
    const size_t rb = row_bytes(F::kType, D);
    STRATA_CHECK(reinterpret_cast<uintptr_t>(W) % F::kBytes == 0 && rb % F::kBytes == 0, ConfigError,
                 "route: router rows at ", W, ", ", rb, " bytes apart, are not aligned to ", F::kBytes,
                 " bytes");
    STRATA_CHECK(reinterpret_cast<uintptr_t>(x) % 4 == 0, ConfigError, "route: activations at ", x,
                 " are not 4-byte aligned");
    const int64_t warps =
        env_int("STRATA_CUDA_ROUTE_WARPS", gemv::kRowWarps, 1, gemv::kRowWarps, "a number of warps a block");
    launch_kernel(route_kernel<F>, grid_x(ceil_div(E, warps)), static_cast<unsigned>(warps * kWarp),
                  E * 4 + topk_smem(E, K), s, static_cast<const uint8_t*>(W), rb, E, D, x,
                  x_rows_aligned(x, D), K, norm, logits, ids, weights, off, rows, ticket);
    STRATA_CUDA_LAUNCH_CHECK();
  };
  switch (static_cast<QType>(type)) {
    case QType::F32:
      run(unit::F32{});
      return true;
    case QType::F16:
      run(unit::F16{});
      return true;
    case QType::BF16:
      run(unit::BF16{});
      return true;
    default:
      return false;  // the router's three launches
  }
}

void launch_group_by_expert(const int32_t* ids, int64_t T, int64_t K, int64_t E, int32_t* off, int32_t* rows,
                            cudaStream_t s) {
  STRATA_CHECK(E >= 1 && counting_sort_smem(E, false) <= 48 * 1024, UnsupportedError,
               "group_by_expert: E=", E, " experts exceed the CUDA kernel's shared memory");
  STRATA_CHECK(T * K < 0x7fffffff, ConfigError, "group_by_expert: ", T * K, " rows exceed int32");
  const bool parallel = sort_parallel_for(E);
  launch_kernel(group_by_expert_kernel, 1, kSortThreads, counting_sort_smem(E, parallel), s, ids, T * K,
                (int)E, off, rows, parallel);
  STRATA_CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
