// The integer matmul's tensor-core tile (sm_80 and later): matmul_q8 of many tokens with the sums of
// each 32-block formed by int8 mma.sync instead of dp4a, and the same float steps in the same order as
// the dp4a tiles and the CPU, so every output is theirs bit for bit.
//
// The exactness argument: mma.sync (s8 x s8 -> s32) forms the dot product of int8 lanes of a weight row
// and of a token exactly (at most 32 * 128 * 128 in magnitude), whatever its internal order. A format
// whose q8_iv reads only the whole block's sums (kWholeSums: one scale a block) gets them from one
// m16n8k32 product; the others (the halves scaled apart: Q6_K, Q3_K, Q2_K, IQ2_XS, ...) from one
// m16n8k16 product per half, lo (lanes 0-15) and hi (16-31). The format's q8_iv turns them, with the
// activation's lane sums, into the integers its q8_ints would give (quant/unit_decode.h; the CPU test
// IntegerBlocksRebuildMatmulQ8 holds the forms equal), and q8_fma applies the block's float steps onto
// the output's one accumulator, blocks in column order.
//
// A block of 256 threads (8 warps) owns 64 rows by 64 tokens and walks the columns 8 blocks (256) at a
// time. Per chunk every thread decodes two (row, block) pairs of weights (q8_weights) and two (token,
// block) pairs of activations into shared memory: int8 lanes, rows kLaneStride bytes apart, and the
// scales, block-major so that a warp's scale loads are consecutive. Warp (wr, wt) then takes rows
// 32 wr .. by tokens 16 wt .. (two 16-row by two 8-token mma tiles) block by block: one ldmatrix.x4 a
// 16-row A fragment, one for both tokens' B fragments. Lane (g, t) holds rows g, g + 8 of each row tile
// by tokens 2 t, 2 t + 1 of each token tile (mma.sync's accumulator layout): 16 outputs. Token tiles past
// the run's tokens are skipped (a warp-uniform test), so a short run costs its own tokens' float steps.
// Per output and block the work is the format's q8_iv and q8_fma and a share of the fragment and scale
// loads: the float steps, not the tensor cores, set the pace.
#pragma once
#include <cstddef>

#include "backend/cuda/common.cuh"
#include "backend/cuda/matmul_kernels.cuh"
#include "backend/cuda/tile.cuh"

namespace strata::cuda {
namespace mmq_mma {

constexpr int kThreads = 256;
constexpr int kRB = 64, kTB = 64, kNB = 8;
constexpr int kQK = kQK8_0;
// Bytes between two rows' lanes: a multiple of 16 (whole uint4 stores and ldmatrix rows) that puts the
// 8 rows an ldmatrix phase reads 4 banks apart, so its 8 x 16 bytes fill 32 distinct banks.
constexpr int kLaneStride = kNB * kQK + 16;
static_assert(kLaneStride % 16 == 0 && (kLaneStride / 4) % 32 == 4, "rows 4 banks apart");
static_assert(kTB == 64 && kRB == 64 && kThreads == 256,
              "8 warps: 2 row groups of 32 by 4 token groups of 16");

// A (row, block)'s scales and a (token, block)'s: dx and its lanes' sums. A kWholeSums format keeps
// k0, m and the whole block's sum as ints; the others every integer scale (at most 8 bits in every
// format) and the halves' sums (|sum| <= 16 * 128) as 16-bit ints: 16 and 8 bytes either way.
template <bool Whole>
struct Scales;
template <>
struct Scales<true> {
  struct __align__(16) W {
    float d, dmin;
    int k0, m;
  };
  struct __align__(8) X {
    float dx;
    int sum;
  };
  __device__ static W pack(const unit::Q8Weights& w) { return W{w.d, w.dmin, w.k0, w.m}; }
  __device__ static void unpack(const W& s, unit::Q8Weights& w) {
    w.d = s.d;
    w.dmin = s.dmin;
    w.k0 = s.k0;
    w.m = s.m;
  }
  __device__ static X pack(float dx, int lo, int hi) { return X{dx, lo + hi}; }
  __device__ static int lo(const X& x) { return x.sum; }
  __device__ static int hi(const X&) { return 0; }
};
template <>
struct Scales<false> {
  struct __align__(16) W {
    float d, dmin;
    int16_t k0, k1, m, m1;
  };
  struct __align__(8) X {
    float dx;
    int16_t lo, hi;
  };
  __device__ static W pack(const unit::Q8Weights& w) {
    return W{w.d,
             w.dmin,
             static_cast<int16_t>(w.k0),
             static_cast<int16_t>(w.k1),
             static_cast<int16_t>(w.m),
             static_cast<int16_t>(w.m1)};
  }
  __device__ static void unpack(const W& s, unit::Q8Weights& w) {
    w.d = s.d;
    w.dmin = s.dmin;
    w.k0 = s.k0;
    w.k1 = s.k1;
    w.m = s.m;
    w.m1 = s.m1;
  }
  __device__ static X pack(float dx, int lo, int hi) {
    return X{dx, static_cast<int16_t>(lo), static_cast<int16_t>(hi)};
  }
  __device__ static int lo(const X& x) { return x.lo; }
  __device__ static int hi(const X& x) { return x.hi; }
};
static_assert(sizeof(Scales<true>::W) == 16 && sizeof(Scales<false>::W) == 16 &&
                  sizeof(Scales<true>::X) == 8 && sizeof(Scales<false>::X) == 8,
              "the shared-memory plan");

// d = A (16 x 32 int8: a[0] rows 0-7 lanes 0-15, a[1] rows 8-15, a[2] / a[3] lanes 16-31) times B (32 x 8:
// b0 lanes 0-15, b1 lanes 16-31).
__device__ __forceinline__ void mma_s8_k32(int d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
#else
  __trap();  // the launcher never chooses this kernel below sm_80
#endif
}
// The same for 16 lanes: A's rows 0-7 / 8-15 in a0 / a1, B in b.
__device__ __forceinline__ void mma_s8_k16(int d[4], uint32_t a0, uint32_t a1, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(b), "r"(0));
#else
  __trap();
#endif
}

// Rows r0.. by tokens t0.. of the matmul a (as mmq::mmq_block, same outputs).
template <class F>
__device__ __forceinline__ void mma_block(const MatmulQ8Args& a, int64_t r0, int64_t t0) {
  __shared__ __align__(16) uint8_t wl[kRB * kLaneStride];
  __shared__ __align__(16) uint8_t xl[kTB * kLaneStride];
  using Sc = Scales<F::kWholeSums>;
  __shared__ typename Sc::W ws[kNB * kRB];  // [block][row]
  __shared__ typename Sc::X xs[kNB * kTB];  // [block][token]
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int g = lane / 4, t = lane % 4;
  const int wr = warp % 2, wt = warp / 2;
  const int nrows = static_cast<int>(min64(kRB, a.rows - r0));
  const int ntok = static_cast<int>(min64(kTB, a.T - t0));
  const int wtok = ntok - wt * 16;  // this warp's tokens (warp-uniform; none when <= 0)
  const int64_t nblk = a.cols / kQK;
  // ldmatrix rows: lane L addresses row L % 8 of matrix L / 8. A: matrices (rows 0-7, 8-15) x (lanes
  // 0-15, 16-31) as a[0..3]; B: (lanes 0-15, 16-31) x (tokens 0-7, 8-15) as (b0, b1) of each token tile.
  const int lm = lane / 8, lr = lane % 8;
  const uint8_t* a_row = wl + (wr * 32 + lr + 8 * (lm % 2)) * kLaneStride + 16 * (lm / 2);
  const uint8_t* b_row = xl + (wt * 16 + lr + 8 * (lm / 2)) * kLaneStride + 16 * (lm % 2);
  float acc[2][2][4] = {};  // [row tile][token tile][mma.sync's accumulator]

  for (int64_t c0 = 0; c0 < nblk; c0 += kNB) {
    const int nb = static_cast<int>(min64(kNB, nblk - c0));
    // Weights: (row, block) pairs, the 8 blocks of a row side by side (one K-quant super-block).
#pragma unroll
    for (int k = 0; k < kRB * kNB / kThreads; ++k) {
      const int item = tid + k * kThreads;
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
      ws[b * kRB + row] = Sc::pack(w);
    }
    // Activations: (token, block) pairs of the q8_0 rows; past the run's tokens, zeros.
#pragma unroll
    for (int k = 0; k < kTB * kNB / kThreads; ++k) {
      const int item = tid + k * kThreads;
      const int tok = item / kNB, b = item % kNB;
      uint32_t q[8] = {};
      float dx = 0.0f;
      int lo = 0, hi = 0;
      if (tok < ntok && b < nb) {
        const uint8_t* p = a.Xq + (t0 + tok) * a.xrb + (c0 + b) * kQ8_0Bytes;
        unit::ld_words<8>(p + offsetof(BlockQ8_0, qs), q);
        dx = unit::half_float(unit::ld16(p + offsetof(BlockQ8_0, d)));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          lo = unit::dp4a(unit::kOnes, q[i], lo);
          hi = unit::dp4a(unit::kOnes, q[i + 4], hi);
        }
      }
      uint4* dst = reinterpret_cast<uint4*>(xl + tok * kLaneStride + b * kQK);
      dst[0] = make_uint4(q[0], q[1], q[2], q[3]);
      dst[1] = make_uint4(q[4], q[5], q[6], q[7]);
      xs[b * kTB + tok] = Sc::pack(dx, lo, hi);
    }
    __syncthreads();

    if (wtok > 0) {
      for (int b = 0; b < nb; ++b) {
        uint32_t af[2][4], bf[4];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) ldmatrix_x4(af[mi], a_row + mi * 16 * kLaneStride + b * kQK);
        ldmatrix_x4(bf, b_row + b * kQK);
        typename Sc::W sw[2][2];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) sw[mi][hh] = ws[b * kRB + wr * 32 + mi * 16 + hh * 8 + g];
#pragma unroll
        for (int ni = 0; ni < 2; ++ni) {
          if (ni * 8 >= wtok) break;  // warp-uniform: the token tile is past the run
          const int tok = wt * 16 + ni * 8 + 2 * t;
          const typename Sc::X x[2] = {xs[b * kTB + tok], xs[b * kTB + tok + 1]};
#pragma unroll
          for (int mi = 0; mi < 2; ++mi) {
            int lo[4], hi[4] = {0, 0, 0, 0};
            if constexpr (F::kWholeSums) {
              mma_s8_k32(lo, af[mi], bf[2 * ni], bf[2 * ni + 1]);
            } else {
              mma_s8_k16(lo, af[mi][0], af[mi][1], bf[2 * ni]);
              mma_s8_k16(hi, af[mi][2], af[mi][3], bf[2 * ni + 1]);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const auto& xv = x[i % 2];
              unit::Q8Weights w;
              Sc::unpack(sw[mi][i / 2], w);
              int iv[F::kPairs];
              F::q8_iv(w, lo[i], hi[i], Sc::lo(xv), Sc::hi(xv), iv);
              acc[mi][ni][i] = F::q8_fma(w, xv.dx, iv, acc[mi][ni][i]);
            }
          }
        }
      }
    }
    __syncthreads();  // the next chunk overwrites the lanes and scales
  }

  if (wtok <= 0) return;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 2; ++ni)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = wr * 32 + mi * 16 + g + (i / 2) * 8, tok = wt * 16 + ni * 8 + 2 * t + i % 2;
        if (row < nrows && tok < ntok) a.Y[(t0 + tok) * a.ldy + r0 + row] = acc[mi][ni][i];
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
