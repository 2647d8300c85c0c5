// Launchers of the weight matmuls: float activations (matmul) and q8_0 activations (matmul_q8, the
// MMQ layout), and the kernel choice between GEMV and tensor cores. These signatures are the contract;
// the kernels are in matmul_gemv.cuh, matmul_mma.cuh and matmul_q8.cuh.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/backend.h"

namespace strata::cuda {

// Y[t * ldy + r] = W[r, :] . X[t * ldx, :] for r < rows, t < T; W holds `rows` rows of `cols`
// elements of ggml type `type`, row_bytes(type, cols) apart.
void launch_matmul(uint32_t type, const void* W, int64_t rows, int64_t cols, const float* X, int64_t ldx,
                   int64_t T, float* Y, int64_t ldy, cudaStream_t s);
// As launch_matmul against q8_0 activations: Xq holds T rows of cols / 32 blocks (34 bytes each),
// xrow_bytes apart; each 32-block adds what quant/quant.h's matmul_q8 comment defines for the type,
// so Y equals the CPU's matmul_q8 bit for bit.
void launch_matmul_q8(uint32_t type, const void* W, int64_t rows, int64_t cols, const uint8_t* Xq,
                      size_t xrow_bytes, int64_t T, float* Y, int64_t ldy, cudaStream_t s);

// The routed experts' matmuls (Backend::matmul_experts and the MMQ layout's q8_0 twin): row i of X
// (Xq) times matrix m of expert ids[order[i]] found through t, into row i of Y; per row the GEMV
// kernel's (the small-tile integer kernel's) float operations, so a row equals launch_matmul's
// decode result (launch_matmul_q8's) on that expert's matrix. NaN rows for an expert not resident.
void launch_matmul_experts(uint32_t type, const ExpertTable& t, int m, int64_t rows, int64_t cols,
                           const int32_t* ids, const int32_t* order, int64_t n, const float* X, int64_t ldx,
                           float* Y, int64_t ldy, cudaStream_t s);
// With m2 >= 0, also matrix m2 of the same experts into Y2 in the same launch.
void launch_matmul_q8_experts(uint32_t type, const ExpertTable& t, int m, int64_t rows, int64_t cols,
                              const int32_t* ids, const int32_t* order, int64_t n, const uint8_t* Xq,
                              size_t xrow_bytes, float* Y, int64_t ldy, cudaStream_t s, int m2 = -1,
                              float* Y2 = nullptr);

// Backend::matmul_q8_runs: every run in one launch (more only past 112 runs or 65535 token tiles), each
// output bit for bit launch_matmul_q8's on its run.
void launch_matmul_q8_runs(uint32_t type, const Backend::ExpertRun* runs, int64_t n_runs, int64_t rows,
                           int64_t cols, const uint8_t* Xq, size_t xrow_bytes, float* Y, float* Y2,
                           int64_t ldy, cudaStream_t s);

// Backend::matmul_runs on the tensor-core kernel (a prompt's matmuls), every run in one launch where the
// arguments hold them, each output bit for bit launch_matmul_path(TensorCore)'s on its run.
void launch_matmul_runs(uint32_t type, const Backend::ExpertRun* runs, int64_t n_runs, int64_t rows,
                        int64_t cols, const float* X, int64_t ldx, float* Y, float* Y2, int64_t ldy,
                        cudaStream_t s);

// The kernels of launch_matmul. Gemv: fp32 products of the exact weights, for few tokens (each weight
// byte read once, bound by memory). TensorCore: fp16 weights and activations on mma.sync with fp32
// sums, for many (bound by arithmetic; ~1e-3 of sum|w x| at worst, see matmul_mma.cuh).
enum class MatmulPath { Gemv, TensorCore };
// launch_matmul's choice: GEMV up to 8 tokens (decode, small batches), tensor cores beyond.
bool matmul_should_use_gemv(uint32_t type, int64_t rows, int64_t cols, int64_t T);
// matmul_n: n matmuls of one activation, as launch_matmul_path of each, in one launch where the path is
// GEMV and T is 1 (decode: the attention's q, k and v) or the path is the tensor-core tile (a prompt's:
// the small k and v no longer run as launches of their own that fill a fraction of the GPU).
// w_fixed (here and below): the weights are never written while work is queued (Backend::resident's
// memory): a one-token GEMV may then load them before it waits for the kernel before it (the raw-word
// Q8_0 GEMV does).
void launch_matmul_n(MatmulPath path, uint32_t type, int64_t cols, const float* X, int64_t ldx, int64_t T,
                     const Backend::MatmulOut* outs, int n, cudaStream_t s, bool w_fixed = false);
// Backend::matmul_strided: n products of one shape at fixed strides, as launch_matmul_path of each, in one
// GEMV launch (grid y) where the path is GEMV and T is 1 (decode: latent attention's per-head k_b, v_b).
void launch_matmul_strided(MatmulPath path, uint32_t type, const void* W, size_t w_stride, int64_t rows,
                           int64_t cols, const float* X, int64_t x_stride, int64_t ldx, int64_t T, float* Y,
                           int64_t y_stride, int64_t ldy, int64_t n, cudaStream_t s, bool w_fixed = false);
// launch_matmul with the kernel named rather than chosen (benchmarks; either takes any T).
void launch_matmul_path(MatmulPath path, uint32_t type, const void* W, int64_t rows, int64_t cols,
                        const float* X, int64_t ldx, int64_t T, float* Y, int64_t ldy, cudaStream_t s,
                        bool w_fixed = false);

}  // namespace strata::cuda
