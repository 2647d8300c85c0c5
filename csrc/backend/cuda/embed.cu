// Dequantization on the device: embed and dequant_rows through the formats' one description
// (quant/unit_decode.h's unit decoders, which the CPU tests hold bit for bit against dequant_row; this
// file builds with -fmad=false besides).
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/embed.cuh"
#include "backend/cuda/formats.cuh"

namespace strata::cuda {
namespace {

using unit::kUnit;

constexpr int kThreads = 128;           // units a block decodes per step
constexpr int kPitch = kUnit + 1;       // a unit's floats in the transpose, padded off the bank stride
constexpr int64_t kMaxBlocksY = 65535;  // CUDA's limit on gridDim.y

// Unit u (kUnit elements) of a row of format F into v.
template <class F>
__device__ __forceinline__ void decode_unit(const uint8_t* row, int64_t u, float v[kUnit]) {
  if constexpr (F::kBlock == 1) {
    F::decode(row + u * kUnit * F::kBytes, 0, v);
  } else {
    constexpr int kPerBlock = F::kBlock / kUnit;
    F::decode(row + (u / kPerBlock) * F::kBytes, static_cast<int>(u % kPerBlock), v);
  }
}

// Blocks (output row i, group of its units): a thread decodes a unit into shared memory, then the block
// stores the group's floats in order, so consecutive threads write consecutive addresses. `ids` picks
// the source row (nullptr: row i itself). A float row's last D % kUnit elements (quantized rows are whole
// blocks of whole units) are decoded by one thread from a zero-padded copy, the same decode.
template <class F>
__global__ void __launch_bounds__(kThreads)
    dequant_rows_kernel(const uint8_t* src, size_t src_row_bytes, const int32_t* ids, int64_t D, float* out) {
  grid_start();
  __shared__ float tile[kThreads * kPitch];
  const int64_t i = blockIdx.x;
  const uint8_t* row = src + static_cast<size_t>(ids ? ids[i] : i) * src_row_bytes;
  float* o = out + i * D;
  const int64_t units = D / kUnit;
  for (int64_t u0 = blockIdx.y * (int64_t)kThreads; u0 < units; u0 += (int64_t)gridDim.y * kThreads) {
    const int64_t u = u0 + threadIdx.x;
    if (u < units) {
      float v[kUnit];
      decode_unit<F>(row, u, v);
#pragma unroll
      for (int k = 0; k < kUnit; ++k) tile[threadIdx.x * kPitch + k] = v[k];
    }
    __syncthreads();
    const int n = static_cast<int>(units - u0 < kThreads ? units - u0 : kThreads) * kUnit;
    for (int e = threadIdx.x; e < n; e += kThreads)
      o[u0 * kUnit + e] = tile[(e / kUnit) * kPitch + e % kUnit];
    __syncthreads();  // the tile is written again in the next step
  }
  if constexpr (F::kBlock == 1) {
    const int tail = static_cast<int>(D % kUnit);
    if (tail > 0 && blockIdx.y == 0 && threadIdx.x == 0) {
      alignas(4) uint8_t pad[kUnit * F::kBytes] = {};
      const uint8_t* t = row + units * kUnit * F::kBytes;
      for (int b = 0; b < tail * F::kBytes; ++b) pad[b] = t[b];
      float v[kUnit];
      F::decode(pad, 0, v);
      for (int k = 0; k < tail; ++k) o[units * kUnit + k] = v[k];
    }
  }
}

void launch(uint32_t type, const void* src, size_t src_row_bytes, const int32_t* ids, int64_t D, int64_t n,
            float* out, cudaStream_t s, const char* what) {
  dispatch_format(type, what, [&](auto fmt) {
    using F = decltype(fmt);
    constexpr size_t kAlign = unit::block_align<F>();
    static_assert(F::kBytes % kAlign == 0, "a row of aligned blocks keeps them aligned");
    row_bytes(F::kType, D);  // ConfigError unless D is a whole number of blocks
    STRATA_CHECK(reinterpret_cast<uintptr_t>(src) % kAlign == 0 && src_row_bytes % kAlign == 0, ConfigError,
                 what, ": ", quant_traits(F::kType).name, " rows at ", src, ", ", src_row_bytes,
                 " bytes apart, are not aligned to ", kAlign,
                 " bytes, the alignment the CUDA decoders read its blocks at (unit::block_align); place the ",
                 "rows at a multiple of it");
    if (n <= 0 || D <= 0) return;
    const int64_t groups = std::max<int64_t>(1, std::min(ceil_div(D / kUnit, kThreads), kMaxBlocksY));
    launch_kernel(dequant_rows_kernel<F>, dim3(grid_x(n), static_cast<unsigned>(groups)), kThreads, 0, s,
                  static_cast<const uint8_t*>(src), src_row_bytes, ids, D, out);
    STRATA_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace

void launch_embed(uint32_t type, const void* table, int64_t D, const int32_t* ids, int64_t T, float* out,
                  cudaStream_t s) {
  const QuantTraits& q = quant_traits(type, "token embedding");
  launch(type, table, row_bytes(q.type, D), ids, D, T, out, s, "token embedding");
}

void launch_dequant_rows(uint32_t type, const void* src, size_t src_row_bytes, int64_t D, int64_t n,
                         float* out, cudaStream_t s) {
  launch(type, src, src_row_bytes, nullptr, D, n, out, s, "dequant_rows");
}

}  // namespace strata::cuda
