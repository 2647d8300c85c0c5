// Launchers of the dequantization ops: embed (rows picked by token id) and dequant_rows.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace strata::cuda {

// out[t, :] = dequantized row ids[t] of a [rows, D] table of ggml type `type`.
void launch_embed(uint32_t type, const void* table, int64_t D, const int32_t* ids, int64_t T, float* out,
                  cudaStream_t s);
// out[i, :] = dequantized row i (src_row_bytes apart) of n rows of D elements of ggml type `type`.
void launch_dequant_rows(uint32_t type, const void* src, size_t src_row_bytes, int64_t D, int64_t n,
                         float* out, cudaStream_t s);

}  // namespace strata::cuda
