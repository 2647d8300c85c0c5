// MoE routing on the device: softmax top-K per token (ids bit-identical in choice and order to the
// CPU's given the same probabilities) and the stable grouping of (token, k) pairs by expert.
#include "backend/cuda/common.cuh"
#include "backend/cuda/counting_sort.cuh"
#include "backend/cuda/router.cuh"

namespace strata::cuda {
namespace {

// One warp per token, the probabilities in shared memory. As the CPU: p = exp(l - max) / sum with
// the sum taken in id order; K rounds of a warp argmax (ties to the lower id) pick the top-K in
// order; the renormalizing sum runs in pick order.
__global__ void __launch_bounds__(kWarp)
    router_topk_kernel(const float* logits, int64_t E, int64_t K, bool norm, int32_t* ids, float* weights) {
  extern __shared__ float p[];  // E
  const int lane = threadIdx.x;
  const int64_t t = blockIdx.x;
  const float* lg = logits + t * E;
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
      ids[t * K + k] = best_id;
      weights[t * K + k] = best;  // renormalized below
      ws += best;
      p[best_id] = -2.0f;  // taken
    }
    __syncwarp();
  }
  if (lane == 0 && norm)
    for (int64_t k = 0; k < K; ++k) weights[t * K + k] = weights[t * K + k] / ws;
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
    group_by_expert_kernel(const int32_t* ids, int64_t n, int E, int32_t* off, int32_t* rows) {
  extern __shared__ int smem[];
  block_counting_sort(n, E, ExpertOf{ids, E}, PairIndex{}, rows, off, smem);
}

}  // namespace

void launch_router_topk(const float* logits, int64_t T, int64_t E, int64_t K, bool norm, int32_t* ids,
                        float* weights, cudaStream_t s) {
  STRATA_CHECK(K >= 1 && K <= E, ConfigError, "router_topk: K=", K, " must be in [1, E=", E, "]");
  STRATA_CHECK(E <= 12288, UnsupportedError, "router_topk: E=", E, " experts exceed the CUDA kernel's 12288");
  if (T <= 0) return;
  router_topk_kernel<<<grid_x(T), kWarp, E * sizeof(float), s>>>(logits, E, K, norm, ids, weights);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_group_by_expert(const int32_t* ids, int64_t T, int64_t K, int64_t E, int32_t* off, int32_t* rows,
                            cudaStream_t s) {
  STRATA_CHECK(E >= 1 && counting_sort_smem(E) <= 48 * 1024, UnsupportedError, "group_by_expert: E=", E,
               " experts exceed the CUDA kernel's shared memory");
  STRATA_CHECK(T * K < 0x7fffffff, ConfigError, "group_by_expert: ", T * K, " rows exceed int32");
  group_by_expert_kernel<<<1, kSortThreads, counting_sort_smem(E), s>>>(ids, T * K, (int)E, off, rows);
  STRATA_CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
