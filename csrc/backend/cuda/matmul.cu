// The weight matmuls' launchers: argument checks, the kernel choice and the one type switch of each
// kernel family (matmul_kernels.cuh); the kernels are instantiated per format in matmul_instances/.
// matmul_q8 still runs the plain kernel of one warp per row here.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/matmul_kernels.cuh"

namespace strata::cuda {
namespace {

constexpr int64_t kGemvMaxT = 8;

constexpr int kWarps = 4;    // rows per block, one per warp
constexpr int kTokTile = 8;  // tokens per warp: each weight is decoded once for all of them
constexpr int64_t kMaxGridY = 65535;

// Lanes take 32-blocks lane, lane + 32, ...; per block the integer sums are exact and the float
// steps are quant.h's (Dec::fma32), so only the order of the blocks' terms differs from the CPU.
template <class Dec>
__global__ void __launch_bounds__(kWarps* kWarp)
    matmul_q8_kernel(const uint8_t* W, size_t rb, int64_t rows, int64_t nblk, const uint8_t* Xq, size_t xrb,
                     int64_t T, float* Y, int64_t ldy) {
  const int lane = threadIdx.x % kWarp;
  const int64_t r = (int64_t)blockIdx.x * kWarps + threadIdx.x / kWarp;
  const int64_t t0 = (int64_t)blockIdx.y * kTokTile;
  if (r >= rows) return;
  const int nt = T - t0 < kTokTile ? (int)(T - t0) : kTokTile;
  const uint8_t* w = W + r * rb;
  float acc[kTokTile] = {};
  for (int64_t b = lane; b < nblk; b += kWarp) {
    W32 wq;
    Dec::w32(w, b, wq);
#pragma unroll
    for (int t = 0; t < kTokTile; ++t) {
      if (t >= nt) continue;
      const uint8_t* xb = Xq + (size_t)(t0 + t) * xrb + b * kQ8Block;
      int s0 = 0, s1 = 0, sx = 0;
#pragma unroll
      for (int l = 0; l < 32; ++l) {
        const int xi = q8_0_q(xb, l);
        (l < 16 ? s0 : s1) += wq.q[l] * xi;
        sx += xi;
      }
      acc[t] = Dec::fma32(wq, s0, s1, sx, q8_0_d(xb), acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < kTokTile; ++t) {
    const float s = warp_sum(acc[t]);
    if (lane == 0 && t < nt) Y[(t0 + t) * ldy + r] = s;
  }
}

void check_shape(const char* op, int64_t rows, int64_t cols, int64_t T, int64_t ldy) {
  STRATA_CHECK(rows >= 0 && cols >= 0 && T >= 0, ConfigError, op, ": negative shape rows=", rows,
               " cols=", cols, " T=", T);
  STRATA_CHECK(ldy >= rows, ConfigError, op, ": ldy=", ldy, " is smaller than rows=", rows);
}

// The kernels read a float weight row by its elements and a quantized one by its 16-bit fields.
template <class F>
void check_weights(const void* W, size_t rb, const char* op) {
  constexpr size_t kAlign = F::kBlock == 1 ? F::kBytes : 2;
  STRATA_CHECK(reinterpret_cast<uintptr_t>(W) % kAlign == 0 && rb % kAlign == 0, ConfigError, op,
               ": weight rows at ", W, ", ", rb, " bytes apart, are not aligned to ", kAlign, " bytes");
}

// Calls launch(t0, nt, grid) for token tiles that fit CUDA's grid y limit.
template <class F>
void for_token_chunks(int64_t rows, int64_t T, F launch) {
  const int64_t chunk = kMaxGridY * kTokTile;
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t nt = std::min(chunk, T - t0);
    launch(t0, nt, dim3(grid_x(ceil_div(rows, kWarps)), (unsigned)ceil_div(nt, kTokTile)));
  }
}

}  // namespace

bool matmul_should_use_gemv(uint32_t, int64_t, int64_t, int64_t T) { return T <= kGemvMaxT; }

void launch_matmul_path(MatmulPath path, uint32_t type, const void* W, int64_t rows, int64_t cols,
                        const float* X, int64_t ldx, int64_t T, float* Y, int64_t ldy, cudaStream_t s) {
  dispatch_matmul_format(type, "matmul weight", [&](auto fmt) {
    using F = decltype(fmt);
    const size_t rb = row_bytes(F::kType, cols);
    check_shape("matmul", rows, cols, T, ldy);
    STRATA_CHECK(ldx >= cols, ConfigError, "matmul: ldx=", ldx, " is smaller than cols=", cols);
    check_weights<F>(W, rb, "matmul");
    STRATA_CHECK(reinterpret_cast<uintptr_t>(X) % 4 == 0, ConfigError, "matmul: activations at ", X,
                 " are not 4-byte aligned");
    if (rows == 0 || T == 0) return;
    const MatmulArgs a{static_cast<const uint8_t*>(W), rb, rows, cols, X, ldx, T, Y, ldy};
    if (path == MatmulPath::Gemv)
      launch_gemv<F>(a, s);
    else
      launch_mma<F>(a, s);
  });
}

void launch_matmul(uint32_t type, const void* W, int64_t rows, int64_t cols, const float* X, int64_t ldx,
                   int64_t T, float* Y, int64_t ldy, cudaStream_t s) {
  const MatmulPath path =
      matmul_should_use_gemv(type, rows, cols, T) ? MatmulPath::Gemv : MatmulPath::TensorCore;
  launch_matmul_path(path, type, W, rows, cols, X, ldx, T, Y, ldy, s);
}

void launch_matmul_q8(uint32_t type, const void* W, int64_t rows, int64_t cols, const uint8_t* Xq,
                      size_t xrow_bytes, int64_t T, float* Y, int64_t ldy, cudaStream_t s) {
  dispatch_q8_type(type, "matmul_q8 weight", [&](auto dec) {
    using Dec = decltype(dec);
    const size_t rb = row_bytes(Dec::kType, cols);
    check_shape("matmul_q8", rows, cols, T, ldy);
    STRATA_CHECK(xrow_bytes >= (size_t)(cols / 32 * kQ8Block), ConfigError,
                 "matmul_q8: xrow_bytes=", xrow_bytes, " is smaller than a row of ", cols / 32,
                 " q8_0 blocks");
    if (rows == 0 || T == 0) return;
    const uint8_t* w = static_cast<const uint8_t*>(W);
    for_token_chunks(rows, T, [&](int64_t t0, int64_t nt, dim3 grid) {
      matmul_q8_kernel<Dec><<<grid, kWarps * kWarp, 0, s>>>(w, rb, rows, cols / 32, Xq + t0 * xrow_bytes,
                                                            xrow_bytes, nt, Y + t0 * ldy, ldy);
      STRATA_CUDA_LAUNCH_CHECK();
    });
  });
}

}  // namespace strata::cuda
