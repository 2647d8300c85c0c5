// What every CUDA file of the backend shares: the error check that turns a CUDA status into a
// strata::Error naming the call, and the warp/block reductions (fixed trees, so deterministic).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "core/error.h"

namespace strata::cuda {

[[noreturn]] inline void fail(cudaError_t e, const char* call, const char* file, int line) {
  throw Error(
      str(file, ":", line, ": ", call, " failed: ", cudaGetErrorString(e), " (", cudaGetErrorName(e), ")"));
}

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A grid of n blocks, checked against CUDA's x limit rather than silently truncated.
inline unsigned grid_x(int64_t n) {
  STRATA_CHECK(n >= 0 && n <= 0x7fffffff, ConfigError, "kernel grid of ", n, " blocks exceeds CUDA's limit");
  return static_cast<unsigned>(n);
}

// Blocks of `threads` for a grid-stride loop over n elements: at least one, at most 4096 (the loop
// covers the rest).
inline unsigned stride_blocks(int64_t n, int threads) {
  return grid_x(std::max<int64_t>(1, std::min<int64_t>(ceil_div(n, threads), 4096)));
}

// Programmatic dependent launch (sm_90 and later). Every kernel of the backend is launched by
// launch_kernel with the attribute that lets it start while the kernel before it in the stream is
// still running, and every kernel's first statement is grid_start(): it waits until that kernel has
// finished and its writes are visible (griddepcontrol.wait), then lets the next kernel launch
// (griddepcontrol.launch_dependents). What overlaps is the launch and the blocks' setup, never a
// read or write of memory another kernel touches. Before sm_90 (and for code built as PTX for an
// older target) both are no-ops and launch_kernel leaves the attribute off: see pdl_on().
__device__ __forceinline__ void grid_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launches carry the programmatic-serialization attribute: the device's code was generated
// for sm_90 or later (a kernel's ptxVersion, so PTX JIT-compiled from an older target counts as
// older), and STRATA_CUDA_PDL is not "0" (a switch for measuring with and without). Decided once.
bool pdl_on();

// kernel<<<grid, block, smem, s>>>(args...), with programmatic dependent launch where pdl_on().
template <class... P, class... A>
void launch_kernel(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_on() ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
  if (e != cudaSuccess) fail(e, "cudaLaunchKernelEx", __FILE__, __LINE__);
}

// Sum over the warp; every lane gets the same bits (each butterfly step adds a + b on one lane and
// b + a on its partner), so whichever lane writes the result, it does not depend on the lane.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Whether (va, a) ranks before (vb, b): the higher value, ties to the lower index.
__device__ __forceinline__ bool ranks_before(float va, int a, float vb, int b) {
  return va > vb || (va == vb && a < b);
}

// The best (value, index) of a block of NT threads (every thread gets it), over the candidates each
// thread offers; rv and ri hold NT / 32 entries of shared memory.
template <int NT>
__device__ __forceinline__ void block_best(float& v, int& idx, float* rv, int* ri) {
  for (int o = kWarp / 2; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(kFullMask, v, o);
    const int oi = __shfl_xor_sync(kFullMask, idx, o);
    if (ranks_before(ov, oi, v, idx)) v = ov, idx = oi;
  }
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  __syncthreads();  // rv, ri free again
  if (lane == 0) rv[warp] = v, ri[warp] = idx;
  __syncthreads();
  v = rv[0];
  idx = ri[0];
  for (int w = 1; w < NT / kWarp; ++w)
    if (ranks_before(rv[w], ri[w], v, idx)) v = rv[w], idx = ri[w];
}

// Sum over a block of whole warps (blockDim.x <= 1024): per-warp sums, then warp 0 reduces those
// with the same fixed tree. `scratch` holds 32 floats of shared memory. Every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < nwarps ? scratch[lane] : 0.0f;
    v = warp_sum(v);
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  return scratch[0];
}

}  // namespace strata::cuda

// Throws strata::Error naming the call, file and line when a CUDA runtime call fails.
#define STRATA_CUDA_CHECK(call)                                                                             \
  do {                                                                                                      \
    const cudaError_t strata_cuda_err_ = (call);                                                            \
    if (strata_cuda_err_ != cudaSuccess) ::strata::cuda::fail(strata_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: a bad configuration surfaces here, not at some later call.
#define STRATA_CUDA_LAUNCH_CHECK() STRATA_CUDA_CHECK(cudaGetLastError())
