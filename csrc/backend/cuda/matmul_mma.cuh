// The tensor-core kernel of matmul (more than 8 tokens: prompt chunks, bound by arithmetic): tiles of
// weights decoded to fp16 in shared memory, activations converted to fp16, mma.sync m16n8k16 with
// fp32 accumulation (sm_80 and later), over the whole K in order.
//
// A block of 8 warps computes a tile of 64 rows by 128 tokens. The rows' weight bytes of a whole
// number of blocks (256 columns for the k-quants and IQ2_XS, 64 for the others) go to shared memory
// by cp.async; each step of 64 columns, every thread decodes one 16-element unit into the fp16 tile
// A (64 x 64) and converts 32 activations (loaded into registers during the previous step's mma)
// into the fp16 tile B (128 x 64); warp (wm, wn) multiplies rows 32 wm.. by tokens 32 wn.. with
// 2 x 4 mma tiles, k in order. No split of K: each output is one fixed chain of mma steps.
//
// Accuracy: weights and activations are rounded to fp16 (relative error <= 2^-11 each, values past
// 65504 clamped there), products and sums are fp32, so |error| <= ~2^-10 sum|w x| plus fp32 summing
// (2^-23 a step) in the worst case, ~1e-3 of sum|w x|; random rounding makes it ~1e-4 in practice.
// fp16 rather than bf16: 3 more bits of mantissa, and the inputs fit its range: weights are small,
// activations are RMSNorm outputs or SwiGLU outputs (llama.cpp's dequantize + cuBLAS path is fp16 too).
#pragma once
#include "backend/cuda/common.cuh"
#include "backend/cuda/matmul_kernels.cuh"
#include "backend/cuda/tile.cuh"

namespace strata::cuda {
namespace mma {

constexpr int kBM = 64, kBN = 128, kBK = 64, kThreads = 256;
constexpr int kTileStride = kBK + 8;               // halves a row of an fp16 tile takes: 16 B of padding keep
                                                   // ldmatrix's eight rows in distinct banks
constexpr int kUnitsPerRow = kBK / unit::kUnit;    // 4: one unit a thread
constexpr int kXQuads = kBN * kBK / 4 / kThreads;  // 8 float4 of X a thread a step
constexpr int64_t kMaxGridY = 65535;
static_assert(kBM * kUnitsPerRow == kThreads);

template <class F>
struct Cfg {
  static constexpr int kRawK = F::kBlock > kBK ? F::kBlock : kBK;  // columns staged at a time: whole blocks
  static constexpr int kSteps = kRawK / kBK;
  static constexpr int kRowBytes = kRawK / F::kBlock * F::kBytes;
  static constexpr int kPieces = stage_pieces(kRowBytes);
  static constexpr int kRawStride = 16 * kPieces;
  static_assert(kRawK % kBK == 0);
};

// This thread's 32 activations of step columns [k0, k0 + kBK) of tokens n0.. (zeros past the last
// column and the last token): quad i is token (i * kThreads + tid) / 16, columns 4 ((..) % 16) ..
__device__ __forceinline__ void load_x(float4 xr[kXQuads], const MatmulArgs& a, int64_t n0, int ntok,
                                       int64_t k0, bool x_vec, int tid) {
#pragma unroll
  for (int i = 0; i < kXQuads; ++i) {
    const int e = i * kThreads + tid, n = e / (kBK / 4);
    const int64_t c = k0 + 4 * (e % (kBK / 4));
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (n < ntok) {
      const float* p = a.X + (n0 + n) * a.ldx + c;
      if (x_vec && c + 4 <= a.cols) {
        v = __ldg(reinterpret_cast<const float4*>(p));
      } else {
        if (c < a.cols) v.x = p[0];
        if (c + 1 < a.cols) v.y = p[1];
        if (c + 2 < a.cols) v.z = p[2];
        if (c + 3 < a.cols) v.w = p[3];
      }
    }
    xr[i] = v;
  }
}

__device__ __forceinline__ void store_x(__half* sb, const float4 xr[kXQuads], int tid) {
#pragma unroll
  for (int i = 0; i < kXQuads; ++i) {
    const int e = i * kThreads + tid, n = e / (kBK / 4), q = e % (kBK / 4);
    *reinterpret_cast<uint2*>(sb + n * kTileStride + 4 * q) =
        make_uint2(pack_half2(xr[i].x, xr[i].y), pack_half2(xr[i].z, xr[i].w));
  }
}

// Row tid / 4, unit tid % 4 of step s into the fp16 tile A (zeros past the last column and row).
template <class F>
__device__ __forceinline__ void decode_a(__half* sa, const uint8_t* raw, const MatmulArgs& a,
                                         const uint8_t* wrows, int nrows, int64_t s, int tid) {
  using C = Cfg<F>;
  const int i = tid / kUnitsPerRow, uq = tid % kUnitsPerRow;
  const int64_t col = s * kBK + uq * unit::kUnit;
  const int uc = static_cast<int>(s % C::kSteps) * kUnitsPerRow + uq;  // the unit within the staged columns
  float v[unit::kUnit];
  if (i < nrows && col < a.cols) {
    const size_t off = static_cast<size_t>(s / C::kSteps * C::kRawK / F::kBlock * F::kBytes);
    const uint8_t* row = raw + i * C::kRawStride + stage_head(wrows + i * a.rb + off);
    F::decode(row + uc * unit::kUnit / F::kBlock * F::kBytes, uc * unit::kUnit % F::kBlock / unit::kUnit, v);
    if constexpr (F::kBlock == 1) {
#pragma unroll
      for (int e = 0; e < unit::kUnit; ++e)
        if (col + e >= a.cols) v[e] = 0.0f;
    }
  } else {
#pragma unroll
    for (int e = 0; e < unit::kUnit; ++e) v[e] = 0.0f;
  }
  uint32_t h[unit::kUnit / 2];
#pragma unroll
  for (int e = 0; e < unit::kUnit / 2; ++e) h[e] = pack_half2(v[2 * e], v[2 * e + 1]);
  uint4* d = reinterpret_cast<uint4*>(sa + i * kTileStride + uq * unit::kUnit);
  d[0] = make_uint4(h[0], h[1], h[2], h[3]);
  d[1] = make_uint4(h[4], h[5], h[6], h[7]);
}

// acc += A (rows 32 wm..) times B (tokens 32 wn..) over the step's 64 columns, 16 at a time.
__device__ __forceinline__ void mma_step(const __half* sa, const __half* sb, float acc[2][4][4], int wm,
                                         int wn, int lane) {
#pragma unroll
  for (int kk = 0; kk < kBK; kk += 16) {
    uint32_t af[2][4], bf[4][2];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)  // matrices: rows 0-7 / 8-15 by k 0-7, then by k 8-15
      ldmatrix_x4(af[mi], sa + (wm * 32 + mi * 16 + lane % 16) * kTileStride + kk + (lane / 16) * 8);
#pragma unroll
    for (int nj = 0; nj < 2; ++nj) {  // matrices: tokens 0-7 by k 0-7 / 8-15, then tokens 8-15
      uint32_t r[4];
      ldmatrix_x4(
          r, sb + (wn * 32 + nj * 16 + lane % 8 + (lane / 16) * 8) * kTileStride + kk + (lane / 8) % 2 * 8);
      bf[2 * nj][0] = r[0];
      bf[2 * nj][1] = r[1];
      bf[2 * nj + 1][0] = r[2];
      bf[2 * nj + 1][1] = r[3];
    }
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) mma_16816(acc[mi][ni], af[mi], bf[ni]);
  }
}

// Rows m0.. by tokens n0.. of the matmul a: one block's tile.
template <class F>
__device__ __forceinline__ void mma_block(const MatmulArgs& a, bool x_vec, int64_t m0, int64_t n0) {
  using C = Cfg<F>;
  __shared__ __align__(16) uint8_t raw[kBM * C::kRawStride];
  __shared__ __align__(16) __half sa[kBM * kTileStride];
  __shared__ __align__(16) __half sb[kBN * kTileStride];
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp, wm = warp % 2, wn = warp / 2;
  const int nrows = static_cast<int>(min64(kBM, a.rows - m0));
  const int ntok = static_cast<int>(min64(kBN, a.T - n0));
  const uint8_t* wrows = a.W + m0 * a.rb;
  const uint8_t* whi = a.W + a.rows * a.rb;
  const int64_t nsteps = ceil_div(a.cols, kBK);
  static_assert(kBN == kRunsF32TileRows && kBM == kMmaTileRows, "the launchers' tiles are the kernel's");

  auto stage = [&](int64_t chunk) {  // the weight bytes of columns [chunk * kRawK, ..)
    const int64_t k0 = chunk * C::kRawK, k1 = min64(a.cols, k0 + C::kRawK);
    stage_rows<C::kPieces>(raw, wrows, a.rb, nrows, static_cast<size_t>(k0 / F::kBlock * F::kBytes),
                           static_cast<int>((k1 - k0) / F::kBlock * F::kBytes), a.W, whi, tid, kThreads);
    cp_async_commit();
  };

  float acc[2][4][4] = {};
  float4 xr[kXQuads];
  load_x(xr, a, n0, ntok, 0, x_vec, tid);
  stage(0);
  cp_async_wait<0>();
  __syncthreads();
  for (int64_t s = 0; s < nsteps; ++s) {
    decode_a<F>(sa, raw, a, wrows, nrows, s, tid);
    store_x(sb, xr, tid);
    __syncthreads();
    if (s + 1 < nsteps) load_x(xr, a, n0, ntok, (s + 1) * kBK, x_vec, tid);  // lands during the mma
    const bool next = (s + 1) % C::kSteps == 0 && s + 1 < nsteps;
    if (next) stage((s + 1) / C::kSteps);  // every thread has decoded the staged bytes
    mma_step(sa, sb, acc, wm, wn, lane);
    if (next) cp_async_wait<0>();
    __syncthreads();
  }

  const int g = lane / 4, q = lane % 4;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int row = wm * 32 + mi * 16 + g + 8 * h, tok = wn * 32 + ni * 8 + 2 * q + e;
          if (row < nrows && tok < ntok) a.Y[(n0 + tok) * a.ldy + m0 + row] = acc[mi][ni][2 * h + e];
        }
}

// Block (x, y, z): rows x, tokens y of product z (a.batch products at a.w_stride, x_stride, y_stride).
template <class F>
__global__ void __launch_bounds__(kThreads, 2) mma_kernel(MatmulArgs a, bool x_vec) {
  grid_start();
  if (blockIdx.z) {
    a.W += blockIdx.z * a.w_stride;
    a.X += blockIdx.z * a.x_stride;
    a.Y += blockIdx.z * a.y_stride;
  }
  mma_block<F>(a, x_vec, static_cast<int64_t>(blockIdx.x) * kBM, static_cast<int64_t>(blockIdx.y) * kBN);
}

// matmul_runs: block (x, y, z) is mma_kernel's block (x, tile) of the run holding grid row y, on its matrix
// W (z 0) or W2 (z 1); every output is one fixed chain of mma steps, so the result is the per-run call's.
template <class F>
__global__ void __launch_bounds__(kThreads, 2) mma_runs_kernel(const __grid_constant__ RunsF32Args g) {
  grid_start();
  const int y = static_cast<int>(blockIdx.y), j = run_of(g, y);
  mma_block<F>(run_args(g, j, blockIdx.z != 0), g.x_vec, static_cast<int64_t>(blockIdx.x) * kBM,
               static_cast<int64_t>(y - g.tile0[j]) * kBN);
}

// matmul_n: block x is mma_kernel's block (x - tile0[i], y) of matrix i, the one whose row tiles hold x;
// every output is the single call's chain of mma steps.
template <class F>
__global__ void __launch_bounds__(kThreads, 2)
    mma_multi_kernel(const __grid_constant__ MmaMultiArgs g, bool x_vec) {
  grid_start();
  const int x = static_cast<int>(blockIdx.x);
  int i = 0;
  while (i + 1 < g.n && x >= g.tile0[i + 1]) ++i;
  const MatmulArgs a{g.W[i], g.rb, g.rows[i], g.cols, g.X, g.ldx, g.T, g.Y[i], g.ldy[i]};
  mma_block<F>(a, x_vec, static_cast<int64_t>(x - g.tile0[i]) * kBM, static_cast<int64_t>(blockIdx.y) * kBN);
}

}  // namespace mma

template <class F>
void launch_mma_multi(const MmaMultiArgs& g, cudaStream_t s) {
  using namespace mma;
  const bool x_vec = x_rows_aligned(g.X, g.ldx);
  const int64_t per_launch = kMaxGridY * kBN;  // tokens within CUDA's grid y limit
  for (int64_t t0 = 0; t0 < g.T; t0 += per_launch) {
    MmaMultiArgs h = g;
    h.X = g.X + t0 * g.ldx;
    for (int i = 0; i < g.n; ++i) h.Y[i] = g.Y[i] + t0 * g.ldy[i];
    h.T = min64(per_launch, g.T - t0);
    const dim3 grid(static_cast<unsigned>(g.tile0[g.n]), static_cast<unsigned>(ceil_div(h.T, kBN)));
    launch_kernel(mma_multi_kernel<F>, grid, kThreads, 0, s, h, x_vec);
    STRATA_CUDA_LAUNCH_CHECK();
  }
}

template <class F>
void launch_mma_runs(const RunsF32Args& g, cudaStream_t s) {
  using namespace mma;
  const dim3 grid(grid_x(ceil_div(g.rows, kBM)), static_cast<unsigned>(g.tile0[g.n_runs]), g.Y2 ? 2u : 1u);
  launch_kernel(mma_runs_kernel<F>, grid, kThreads, 0, s, g);
  STRATA_CUDA_LAUNCH_CHECK();
}

template <class F>
void launch_mma(const MatmulArgs& a, cudaStream_t s) {
  using namespace mma;
  const bool x_vec = x_rows_aligned(a.X, a.ldx) && (a.batch == 1 || a.x_stride % 4 == 0);
  const int64_t per_launch = kMaxGridY * kBN;  // tokens within CUDA's grid y limit
  for (int64_t t0 = 0; t0 < a.T; t0 += per_launch) {
    MatmulArgs g = a;
    g.X = a.X + t0 * a.ldx;
    g.Y = a.Y + t0 * a.ldy;
    g.T = min64(per_launch, a.T - t0);
    const dim3 grid(grid_x(ceil_div(a.rows, kBM)), static_cast<unsigned>(ceil_div(g.T, kBN)),
                    static_cast<unsigned>(a.batch));
    launch_kernel(mma_kernel<F>, grid, kThreads, 0, s, g, x_vec);
    STRATA_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace strata::cuda
