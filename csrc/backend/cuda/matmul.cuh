// Launchers of the weight matmuls: float activations (matmul) and q8_0 activations (matmul_q8, the
// MMQ layout). The kernels behind them may change; these two signatures are the contract.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace strata::cuda {

// Y[t * ldy + r] = W[r, :] . X[t * ldx, :] for r < rows, t < T; W holds `rows` rows of `cols`
// elements of ggml type `type`, row_bytes(type, cols) apart.
void launch_matmul(uint32_t type, const void* W, int64_t rows, int64_t cols, const float* X, int64_t ldx,
                   int64_t T, float* Y, int64_t ldy, cudaStream_t s);
// As launch_matmul against q8_0 activations: Xq holds T rows of cols / 32 blocks (34 bytes each),
// xrow_bytes apart; each 32-block adds what quant/quant.h's matmul_q8 comment defines for the type.
void launch_matmul_q8(uint32_t type, const void* W, int64_t rows, int64_t cols, const uint8_t* Xq,
                      size_t xrow_bytes, int64_t T, float* Y, int64_t ldy, cudaStream_t s);

}  // namespace strata::cuda
