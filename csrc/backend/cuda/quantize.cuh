// Launcher of the MMQ gather: activation rows (optionally normed and picked by row index) quantized
// to q8_0 with the CPU's rule, bit for bit; and the store of q8_0 rows that it and swiglu_q8_0 share.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/common.cuh"
#include "quant/quant.h"

namespace strata::cuda {

// Lane l of a warp stores quant l of a q8_0 block (BlockQ8_0: fp16 d, then 32 int8); lane 0 also its
// scale (fp16 bits). Byte stores: activation rows may be any number of bytes apart.
__device__ __forceinline__ void q8_0_store(uint8_t* blk, int l, uint16_t d_bits, int q) {
  if (l == 0) {
    blk[offsetof(BlockQ8_0, d)] = static_cast<uint8_t>(d_bits & 0xFF);
    blk[offsetof(BlockQ8_0, d) + 1] = static_cast<uint8_t>(d_bits >> 8);
  }
  blk[offsetof(BlockQ8_0, qs) + l] = static_cast<uint8_t>(static_cast<int8_t>(q));
}

// One q8_0 block by one warp, lane l holding element l (every lane calls): d = max|v| / 127 (the max is exact
// in any order), id = 1 / d (0 for an all-zero block), q = lroundf(v * id), d stored as fp16 rounded to
// nearest even: the CPU's quantize_row_q8_0, bit for bit, wherever a kernel quantizes its own values.
__device__ __forceinline__ void q8_0_quantize_store(uint8_t* blk, int lane, float v) {
  const float amax = warp_max(fabsf(v));
  const float d = __fdiv_rn(amax, 127.f);
  const float id = d != 0.f ? __fdiv_rn(1.0f, d) : 0.f;
  q8_0_store(blk, lane, __half_as_ushort(__float2half_rn(d)), (int)lroundf(__fmul_rn(v, id)));
}

void launch_quantize_q8_0(const float* x, const float* grs, const float* w, int64_t D, const int32_t* rows,
                          int64_t div, int64_t n, uint8_t* out, size_t out_row_bytes, cudaStream_t s);

}  // namespace strata::cuda
