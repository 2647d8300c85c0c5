// The integer matmul's tensor-core tile (sm_80 and later): matmul_q8 of many tokens with the sums of
// each 32-block formed by int8 mma.sync instead of dp4a, and the same float steps in the same order as
// the dp4a tiles and the CPU, so every output is theirs bit for bit.
//
// The exactness argument: mma.sync m16n8k16 (s8 x s8 -> s32) forms the dot product of 16 int8 lanes of
// a weight row and of a token exactly (at most 16 * 128 * 128 in magnitude), whatever its internal
// order. One mma per half of a 32-block gives lo (lanes 0-15) and hi (16-31); the format's q8_iv turns
// them, with the activation halves' lane sums, into the integers its q8_ints would give (quant/
// unit_decode.h; the CPU test IntegerBlocksRebuildMatmulQ8 holds the two equal), and q8_fma applies the
// block's float steps onto the output's one accumulator, blocks in column order.
//
// A block of 256 threads (8 warps) owns 64 rows by 32 tokens and walks the columns 8 blocks (256) at a
// time. Per chunk every thread decodes two (row, block) pairs of weights (q8_weights) and one (token,
// block) of activations into shared memory: int8 lanes, rows kLaneStride bytes apart, and the scales;
// then warp (wr, wt) takes rows 16 wr.. by tokens 16 wt.. (two 16 x 8 mma tiles) block by block. Lane
// (g, t) holds rows g and g + 8 of the tile by tokens 2 t and 2 t + 1 of each 8-token half (mma.sync's
// accumulator layout): 8 outputs.
#pragma once
#include <cstddef>

#include "backend/cuda/common.cuh"
#include "backend/cuda/matmul_kernels.cuh"

namespace strata::cuda {
namespace mmq_mma {

constexpr int kThreads = 256;
constexpr int kRB = 64, kTB = 32, kNB = 8;
constexpr int kQK = kQK8_0;
// Bytes between two rows' lanes: a multiple of 16 (whole uint4 stores) that puts the 8 rows a fragment
// load touches 4 banks apart, so the 32 lanes of a warp read 32 distinct banks.
constexpr int kLaneStride = kNB * kQK + 16;
static_assert(kLaneStride % 16 == 0 && (kLaneStride / 4) % 32 == 4, "rows 4 banks apart");
static_assert(kTB == 32 && kRB == 64 && kThreads == 256,
              "8 warps: 4 row groups of 16 by 2 token groups of 16");

struct WScale {
  float d, dmin;
  int k0, k1, m, m1;
};
struct XScale {
  float dx;
  int lo, hi;  // the sums of the activation block's lanes 0-15 and 16-31
};

// d[0..4) = A (16 x 16 int8, rows g / g + 8 in a0 / a1, lanes 4 t .. 4 t + 3) times B (16 x 8 int8, token
// g's lanes 4 t .. 4 t + 3 in b): rows g (d0, d1) and g + 8 (d2, d3) by tokens 2 t, 2 t + 1.
__device__ __forceinline__ void mma_s8_k16(int d[4], uint32_t a0, uint32_t a1, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(b), "r"(0));
#else
  __trap();  // the launcher never chooses this kernel below sm_80
#endif
}

__device__ __forceinline__ uint32_t lds32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Rows r0.. by tokens t0.. of the matmul a (as mmq::mmq_block, same outputs).
template <class F>
__device__ __forceinline__ void mma_block(const MatmulQ8Args& a, int64_t r0, int64_t t0) {
  __shared__ __align__(16) uint8_t wl[kRB * kLaneStride];
  __shared__ __align__(16) uint8_t xl[kTB * kLaneStride];
  __shared__ WScale ws[kRB * kNB];
  __shared__ XScale xs[kTB * kNB];
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int g = lane / 4, t = lane % 4;
  const int wr = warp % 4, wt = warp / 4;
  const int nrows = static_cast<int>(min64(kRB, a.rows - r0));
  const int ntok = static_cast<int>(min64(kTB, a.T - t0));
  const int64_t nblk = a.cols / kQK;
  float acc[2][4] = {};

  for (int64_t c0 = 0; c0 < nblk; c0 += kNB) {
    const int nb = static_cast<int>(min64(kNB, nblk - c0));
    // Weights: (row, block) pairs, the 8 blocks of a row side by side (one K-quant super-block).
    for (int item = tid; item < kRB * kNB; item += kThreads) {
      const int row = item / kNB, b = item % kNB;
      unit::Q8Weights w;
      if (row < nrows && b < nb) {
        const int64_t col = (c0 + b) * kQK;
        F::q8_weights(a.W + (r0 + row) * a.rb + col / F::kBlock * F::kBytes,
                      static_cast<int>(col % F::kBlock / kQK), w);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) w.q[i] = 0;
      }
      uint4* dst = reinterpret_cast<uint4*>(wl + row * kLaneStride + b * kQK);
      dst[0] = make_uint4(w.q[0], w.q[1], w.q[2], w.q[3]);
      dst[1] = make_uint4(w.q[4], w.q[5], w.q[6], w.q[7]);
      ws[item] = WScale{w.d, w.dmin, w.k0, w.k1, w.m, w.m1};
    }
    // Activations: (token, block) pairs of the q8_0 rows.
    for (int item = tid; item < kTB * kNB; item += kThreads) {
      const int tok = item / kNB, b = item % kNB;
      uint32_t q[8] = {};
      XScale x{0.0f, 0, 0};
      if (tok < ntok && b < nb) {
        const uint8_t* p = a.Xq + (t0 + tok) * a.xrb + (c0 + b) * kQ8_0Bytes;
        unit::ld_words<8>(p + offsetof(BlockQ8_0, qs), q);
        x.dx = unit::half_float(unit::ld16(p + offsetof(BlockQ8_0, d)));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          x.lo = unit::dp4a(unit::kOnes, q[i], x.lo);
          x.hi = unit::dp4a(unit::kOnes, q[i + 4], x.hi);
        }
      }
      uint4* dst = reinterpret_cast<uint4*>(xl + tok * kLaneStride + b * kQK);
      dst[0] = make_uint4(q[0], q[1], q[2], q[3]);
      dst[1] = make_uint4(q[4], q[5], q[6], q[7]);
      xs[item] = x;
    }
    __syncthreads();

    const int row0 = wr * 16 + g;
    for (int b = 0; b < nb; ++b) {
      const uint8_t* wa = wl + row0 * kLaneStride + b * kQK + 4 * t;
      const uint32_t lo0 = lds32(wa), lo1 = lds32(wa + 8 * kLaneStride);
      const uint32_t hi0 = lds32(wa + 16), hi1 = lds32(wa + 8 * kLaneStride + 16);
      const WScale s[2] = {ws[row0 * kNB + b], ws[(row0 + 8) * kNB + b]};
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // the 8-token halves of the warp's 16 tokens
        const int tok0 = wt * 16 + h * 8;
        const uint8_t* xa = xl + (tok0 + g) * kLaneStride + b * kQK + 4 * t;
        int lo[4], hi[4];
        mma_s8_k16(lo, lo0, lo1, lds32(xa));
        mma_s8_k16(hi, hi0, hi1, lds32(xa + 16));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const WScale& sw = s[i / 2];
          const XScale x = xs[(tok0 + 2 * t + i % 2) * kNB + b];
          unit::Q8Weights w;
          w.d = sw.d;
          w.dmin = sw.dmin;
          w.k0 = sw.k0;
          w.k1 = sw.k1;
          w.m = sw.m;
          w.m1 = sw.m1;
          int iv[F::kPairs];
          F::q8_iv(w, lo[i], hi[i], x.lo, x.hi, iv);
          acc[h][i] = F::q8_fma(w, x.dx, iv, acc[h][i]);
        }
      }
    }
    __syncthreads();  // the next chunk overwrites the lanes and scales
  }

#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = wr * 16 + g + (i / 2) * 8, tok = wt * 16 + h * 8 + 2 * t + i % 2;
      if (row < nrows && tok < ntok) a.Y[(t0 + tok) * a.ldy + r0 + row] = acc[h][i];
    }
}

template <class F>
__global__ void __launch_bounds__(kThreads) mma_kernel(MatmulQ8Args a) {
  grid_start();
  mma_block<F>(a, static_cast<int64_t>(blockIdx.x) * kRB, static_cast<int64_t>(blockIdx.y) * kTB);
}

// matmul_q8_runs on tensor cores: as mmq::mmq_runs_kernel with this tile.
template <class F>
__global__ void __launch_bounds__(kThreads) mma_runs_kernel(const __grid_constant__ RunsQ8Args g) {
  grid_start();
  const int y = static_cast<int>(blockIdx.y), j = run_of(g, y);
  mma_block<F>(run_args(g, j, blockIdx.z != 0), static_cast<int64_t>(blockIdx.x) * kRB,
               static_cast<int64_t>(y - g.tile0[j]) * kTB);
}

}  // namespace mmq_mma
}  // namespace strata::cuda
