// The integer kernels of matmul_q8 (the MMQ layout: q8_0 activations): per 32-element block the sums
// of int8 weight and activation lanes by dp4a (exact), then the block's float steps of quant.h's
// formula in column order on one accumulator per output, so results equal the CPU's bit for bit.
//
// A block of 256 threads owns kRB rows by kTB tokens and walks their 32-blocks kNB at a time: the
// chunk's weight bytes of the rows and activation bytes of the tokens go to shared memory by
// cp.async; in phase 1 thread (block b, kRPT rows, kTPT tokens) unpacks its rows' block b into int8
// lanes once and forms the integer sums against each of its tokens' block b; in phase 2 one thread
// per output applies the float steps of the chunk's blocks in order. Tiles: 8 rows by 2 to 8 tokens,
// 32 rows by 16 tokens beyond; one token (decode) runs the MMVQ kernel (vec below), same steps.
#pragma once
#include "backend/cuda/common.cuh"
#include "backend/cuda/matmul_kernels.cuh"
#include "backend/cuda/matmul_q8_mma.cuh"
#include "backend/cuda/tile.cuh"

namespace strata::cuda {
namespace mmq {

constexpr int kThreads = 256;
constexpr int kQK = kQK8_0;  // elements of a block of the integer kernels
constexpr int kXBlock = kQ8_0Bytes;
constexpr int64_t kMaxGridY = 65535;

template <int RB, int TB, int NB, int RPT, int TPT>
struct Tile {
  static constexpr int kRB = RB, kTB = TB, kNB = NB, kRPT = RPT, kTPT = TPT;
  static constexpr int kRowGroups = RB / RPT, kTokGroups = TB / TPT;
  static constexpr int kOutPerThread = (RB * TB + kThreads - 1) / kThreads;
  static_assert(NB * kRowGroups * kTokGroups == kThreads, "one thread per (block, row group, token group)");
};
constexpr int kSmallMaxT = 8;
template <int Tn>
using SmallTile = Tile<8, Tn, 32, 1, Tn>;
using LargeTile = Tile<32, 16, 8, 4, 4>;

template <class F, class Tl>
struct Cfg {
  static constexpr int kCols = Tl::kNB * kQK;  // columns a chunk
  static_assert(kCols % F::kBlock == 0, "a chunk holds whole weight blocks");
  static constexpr int kWPieces = stage_pieces(kCols / F::kBlock * F::kBytes), kWStride = 16 * kWPieces;
  static constexpr int kXPieces = stage_pieces(Tl::kNB * kXBlock), kXStride = 16 * kXPieces;
  // Integer sums at iv[(b * kPairs + p) * kIvRows + tok * kRB + row] + b: consecutive rows side by
  // side for phase 2, and the odd stride between blocks spreads phase 1's lanes over the banks.
  static constexpr int kIvRows = Tl::kTB * Tl::kRB;
  static constexpr int kIvBlock = F::kPairs * kIvRows + 1;
  static constexpr int kWdBlock = Tl::kRB + 1;  // weight scales of block b at b * kWdBlock + row
};

// One block's work: rows r0.. by tokens t0.. of the matmul a.
template <class F, class Tl>
__device__ __forceinline__ void mmq_block(const MatmulQ8Args& a, int64_t r0, int64_t t0) {
  using C = Cfg<F, Tl>;
  __shared__ __align__(16) uint8_t wraw[Tl::kRB * C::kWStride];
  __shared__ __align__(16) uint8_t xraw[Tl::kTB * C::kXStride];
  __shared__ int iv[Tl::kNB * C::kIvBlock];
  __shared__ float wd[Tl::kNB * C::kWdBlock], wdmin[Tl::kNB * C::kWdBlock];
  const int tid = threadIdx.x;
  const int nrows = static_cast<int>(min64(Tl::kRB, a.rows - r0));
  const int ntok = static_cast<int>(min64(Tl::kTB, a.T - t0));
  const int64_t nblk = a.cols / kQK, nchunks = ceil_div(nblk, Tl::kNB);
  const uint8_t* wrows = a.W + r0 * a.rb;
  const uint8_t* xrows = a.Xq + t0 * a.xrb;
  const uint8_t* whi = a.W + a.rows * a.rb;
  const uint8_t* xhi = a.Xq + (a.T - 1) * a.xrb + nblk * kXBlock;  // the end of the last row
  // Phase 1's (block, row group, token group) and phase 2's outputs: fixed for the whole row.
  const int b = tid % Tl::kNB, rg = tid / Tl::kNB % Tl::kRowGroups, tg = tid / Tl::kNB / Tl::kRowGroups;
  float acc[Tl::kOutPerThread] = {};

  for (int64_t c = 0; c < nchunks; ++c) {
    const int nb = static_cast<int>(min64(Tl::kNB, nblk - c * Tl::kNB));
    const size_t woff = static_cast<size_t>(c * C::kCols / F::kBlock * F::kBytes);
    const size_t xoff = static_cast<size_t>(c * Tl::kNB * kXBlock);
    stage_rows<C::kWPieces>(wraw, wrows, a.rb, nrows, woff, nb * kQK / F::kBlock * F::kBytes, a.W, whi, tid,
                            kThreads);
    stage_rows<C::kXPieces>(xraw, xrows, a.xrb, ntok, xoff, nb * kXBlock, a.Xq, xhi, tid, kThreads);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    // Phase 1: integer sums.
    if (b < nb) {
      unit::Q8Weights wq[Tl::kRPT];
#pragma unroll
      for (int j = 0; j < Tl::kRPT; ++j) {
        const int row = rg * Tl::kRPT + j;
        if (row >= nrows) continue;
        const uint8_t* wr = wraw + row * C::kWStride + stage_head(wrows + row * a.rb + woff);
        F::q8_weights(wr + b * kQK / F::kBlock * F::kBytes, b * kQK % F::kBlock / kQK, wq[j]);
        if (tg == 0) {
          wd[b * C::kWdBlock + row] = wq[j].d;
          wdmin[b * C::kWdBlock + row] = wq[j].dmin;
        }
      }
#pragma unroll
      for (int tt = 0; tt < Tl::kTPT; ++tt) {
        const int tok = tg * Tl::kTPT + tt;
        if (tok >= ntok) continue;
        const uint8_t* xr = xraw + tok * C::kXStride + stage_head(xrows + tok * a.xrb + xoff);
        unit::Q8Act xa;
        unit::q8_act<F>(xr + b * kXBlock, xa);
#pragma unroll
        for (int j = 0; j < Tl::kRPT; ++j) {
          const int row = rg * Tl::kRPT + j;
          if (row >= nrows) continue;
          int v[F::kPairs];
          F::q8_ints(wq[j], xa, v);
#pragma unroll
          for (int p = 0; p < F::kPairs; ++p)
            iv[b * C::kIvBlock + p * C::kIvRows + tok * Tl::kRB + row] = v[p];
        }
      }
    }
    __syncthreads();

    // Phase 2: the float steps, block by block in column order.
#pragma unroll
    for (int k = 0; k < Tl::kOutPerThread; ++k) {
      const int o = tid + k * kThreads, row = o % Tl::kRB, tok = o / Tl::kRB;
      if (o >= Tl::kRB * Tl::kTB || row >= nrows || tok >= ntok) continue;
      const uint8_t* xr = xraw + tok * C::kXStride + stage_head(xrows + tok * a.xrb + xoff);
      for (int bb = 0; bb < nb; ++bb) {
        unit::Q8Weights w;
        w.d = wd[bb * C::kWdBlock + row];
        w.dmin = wdmin[bb * C::kWdBlock + row];
        int v[F::kPairs];
#pragma unroll
        for (int p = 0; p < F::kPairs; ++p)
          v[p] = iv[bb * C::kIvBlock + p * C::kIvRows + tok * Tl::kRB + row];
        const float dx = unit::half_float(unit::ld16(xr + bb * kXBlock + offsetof(BlockQ8_0, d)));
        acc[k] = F::q8_fma(w, dx, v, acc[k]);
      }
    }
    __syncthreads();  // the next chunk overwrites the staged bytes and the sums
  }

#pragma unroll
  for (int k = 0; k < Tl::kOutPerThread; ++k) {
    const int o = tid + k * kThreads, row = o % Tl::kRB, tok = o / Tl::kRB;
    if (o < Tl::kRB * Tl::kTB && row < nrows && tok < ntok) a.Y[(t0 + tok) * a.ldy + r0 + row] = acc[k];
  }
}

template <class F, class Tl>
__global__ void __launch_bounds__(kThreads) mmq_kernel(MatmulQ8Args a) {
  grid_start();
  mmq_block<F, Tl>(a, static_cast<int64_t>(blockIdx.x) * Tl::kRB, static_cast<int64_t>(blockIdx.y) * Tl::kTB);
}

// matmul_q8_runs: block (x, y, z) is mmq_kernel's block (x, tile) of the run holding grid row y, on its
// matrix W (z 0) or W2 (z 1). Each output gets the large tile's float steps, so the result is matmul_q8's
// of that run bit for bit (every tile and the MMVQ kernel apply the same steps in the same order).
static_assert(LargeTile::kTB == kRunsTileRows && mmq_mma::kTB == kRunsMmaTileRows,
              "the launcher's tiles are the kernels'");
template <class F>
__global__ void __launch_bounds__(kThreads) mmq_runs_kernel(const __grid_constant__ RunsQ8Args g) {
  grid_start();
  const int y = static_cast<int>(blockIdx.y), j = run_of(g, y);
  mmq_block<F, LargeTile>(run_args(g, j, blockIdx.z != 0), static_cast<int64_t>(blockIdx.x) * LargeTile::kRB,
                          static_cast<int64_t>(y - g.tile0[j]) * LargeTile::kTB);
}

// ---- one token (decode): the MMVQ kernel ----
// Per output the same float steps in the same order as mmq_block (the blocks' q8_fma in column order
// on one accumulator from 0), so results are bit for bit the CPU's and the tile kernel's; the work is
// laid out for a single activation row instead. A block of 128 threads owns kRows rows (16, or 8 for
// formats of many bytes a block) and walks their columns 64 blocks (2048 columns) at a time: the
// chunk's weight bytes of its rows and the activation's q8_0 bytes go to shared memory by 16-byte
// cp.async (coalesced, all in flight at once); phase 1: thread (b, g) decodes the activation's block b
// once and forms its integer sums against block b of its share of the rows, from shared memory; phase 2:
// thread r applies row r's float steps in column order.
namespace vec {
constexpr int kThreads = 128, kNB = 64;

template <class F>
struct Cfg {
  static_assert(kNB * kQK % F::kBlock == 0, "a chunk holds whole weight blocks");
  static constexpr int kRowBytes = kNB * kQK / F::kBlock * F::kBytes;  // weight bytes of a row in a chunk
  static constexpr int kRows = kRowBytes <= 1792 ? 16 : 8;             // static shared memory under 48 KB
  static constexpr int kWPieces = stage_pieces(kRowBytes), kWStride = 16 * kWPieces;
  static constexpr int kXPieces = stage_pieces(kNB * kXBlock), kXStride = 16 * kXPieces;
  static constexpr int kIvRow = kNB * F::kPairs + 1;  // odd strides: phase 2's threads on distinct banks
  static constexpr int kWdRow = kNB + 1;
  static_assert(kThreads % kNB == 0 && kRows <= kThreads, "phase 1's and 2's threads");
};
template <class F>
__host__ __device__ constexpr int64_t rows_per_block() {
  return Cfg<F>::kRows;
}
// Whether F's phase 1 goes a superblock a thread in mmvq_kernel (one token against a dense matrix: Q4_K
// attention projections; STRATA_CUDA_MMVQ_SB=0 turns it off, to measure).
template <class F>
bool sb_on() {
  if constexpr (F::kType == QType::Q4_K) {
    return mmvq_sb_on();
  } else {
    return false;
  }
}

// Q4_K's phase 1 a superblock a thread (mmvq_block with SB): the generic phase 1 decodes each 32-element
// block's scales, d and dmin and reads its quants from unaligned words once per (row, block), ~100
// instructions a block; ncu had the expert GEMV issue-bound (0.57 issued a cycle, DRAM idle half the
// time). Here thread (row, superblock) decodes the superblock's d, dmin and 8 scale pairs once and
// reads its 128 quant bytes as 16-byte words, against the activation blocks restaged once a chunk as
// aligned words with their sums (xal, xsum: kXsbStride words a superblock, the padding spreading the
// superblocks' reads over the banks). The integer sums are exact, so they are those of the generic
// phase 1, and d, dmin and the activation scales are the same halves made floats the same way: phase
// 2 applies the same float steps to the same values. Needs the staged rows 16-byte aligned (rows and
// their stride a multiple of 16 bytes, as expert slots and GGUF tensors are); otherwise the generic
// phase 1 runs.
constexpr int kXsbStride = 8 * 8 + 4;  // words of a superblock's 8 activation blocks, padded
__device__ __forceinline__ void q4k_superblock(const uint8_t* blk, const uint32_t* xal, const int* xsum,
                                               int* iv, float* wd, float* wdmin) {
  const float d = unit::half_float(unit::ld16(blk + unit::Q4_K::kD));
  const float dmin = unit::half_float(unit::ld16(blk + unit::Q4_K::kDmin));
  uint8_t scs[8], mins[8];
  q4_k_scales_mins(blk + unit::Q4_K::kScales, scs, mins);
#pragma unroll
  for (int p = 0; p < 4; ++p) {  // quant bytes 32 p ..: sub-blocks 2 p (low nibbles) and 2 p + 1 (high)
    const uint4* qp = reinterpret_cast<const uint4*>(blk + unit::Q4_K::kQs + 32 * p);
    const uint4 qa = qp[0], qb = qp[1];
    const uint32_t q[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = 2 * p + h;
      const uint4* xw = reinterpret_cast<const uint4*>(xal + j * 8);
      const uint4 xa = xw[0], xb = xw[1];
      const uint32_t xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
      int acc = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc = unit::dp4a((q[i] >> (4 * h)) & unit::Q4_K::kMask, xv[i], acc);
      iv[2 * j] = scs[j] * acc;
      iv[2 * j + 1] = mins[j] * xsum[j];
      wd[j] = d;
      wdmin[j] = dmin;
    }
  }
}

// Rows r0 .. r0 + kRows of W (rows x cols, rows rb bytes apart, readable up to W + rows * rb) against
// the q8_0 row xq, whose readable extent is [xlo, xhi). SB: Q4_K's phase 1 a superblock a thread where
// the rows allow (q4k_superblock). through (write-through): W is the source in host memory, and the staged
// rows also go to the same bytes of `through` (the slot); kLd: such rows staged by register loads
// (stage_rows_ld), not cp.async.
template <class F, bool SB = false, bool kLd = false>
__device__ __forceinline__ void mmvq_block(const uint8_t* W, size_t rb, int64_t rows, int64_t cols,
                                           const uint8_t* xq, const uint8_t* xlo, const uint8_t* xhi,
                                           float* y, int64_t r0, uint8_t* through = nullptr) {
  using C = Cfg<F>;
  __shared__ __align__(16) uint8_t wraw[C::kRows * C::kWStride];
  __shared__ __align__(16) uint8_t xraw[C::kXStride];
  __shared__ int iv[C::kRows * C::kIvRow];
  __shared__ float wd[C::kRows * C::kWdRow], wdmin[C::kRows * C::kWdRow], dxs[kNB];
  const int tid = threadIdx.x;
  const int nrows = static_cast<int>(min64(C::kRows, rows - r0));
  const int64_t nblk = cols / kQK;
  const uint8_t* wrows = W + r0 * rb;
  const uint8_t* whi = W + rows * rb;
  // SB's condition: every staged row starts 16-byte aligned (stage_head 0), so its quants are words.
  const bool sb_rows = SB && (reinterpret_cast<uintptr_t>(wrows) % 16 == 0) && rb % 16 == 0;
  float acc = 0.0f;
  for (int64_t c0 = 0; c0 < nblk; c0 += kNB) {
    const int nb = static_cast<int>(min64(kNB, nblk - c0));
    const size_t woff = static_cast<size_t>(c0 * kQK / F::kBlock * F::kBytes);
    const size_t xoff = static_cast<size_t>(c0 * kXBlock);
    if (kLd && through)
      stage_rows_ld<C::kWPieces, 8>(wraw, wrows, rb, nrows, woff, nb * kQK / F::kBlock * F::kBytes, W, whi,
                                    tid, kThreads);
    else
      stage_rows<C::kWPieces>(wraw, wrows, rb, nrows, woff, nb * kQK / F::kBlock * F::kBytes, W, whi, tid,
                              kThreads);
    stage_rows<C::kXPieces>(xraw, xq, 0, 1, xoff, nb * kXBlock, xlo, xhi, tid, kThreads);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    if (through)
      write_back_rows<C::kWPieces>(wraw, through + r0 * rb, wrows, rb, nrows, woff,
                                   nb * kQK / F::kBlock * F::kBytes, tid, kThreads);

    bool phase1_done = false;
    if constexpr (SB) {
      if (sb_rows) {
        __shared__ __align__(16) uint32_t xal[kNB / 8 * kXsbStride];
        __shared__ int xsum[kNB];
        for (int b = tid; b < nb; b += kThreads) {
          unit::Q8Act xa;
          dxs[b] = unit::q8_act<F>(xraw + stage_head(xq + xoff) + b * kXBlock, xa);
          xsum[b] = xa.sum;
          uint4* d = reinterpret_cast<uint4*>(xal + b / 8 * kXsbStride + b % 8 * 8);
          d[0] = make_uint4(xa.q[0], xa.q[1], xa.q[2], xa.q[3]);
          d[1] = make_uint4(xa.q[4], xa.q[5], xa.q[6], xa.q[7]);
        }
        __syncthreads();
        const int nsb = nb / 8;
        for (int it = tid; it < nrows * nsb; it += kThreads) {
          const int row = it / nsb, sb = it % nsb;
          q4k_superblock(wraw + row * C::kWStride + sb * F::kBytes, xal + sb * kXsbStride, xsum + 8 * sb,
                         iv + row * C::kIvRow + 16 * sb, wd + row * C::kWdRow + 8 * sb,
                         wdmin + row * C::kWdRow + 8 * sb);
        }
        phase1_done = true;
      }
    }
    if (!phase1_done) {
      // Thread (b, g): block b of the activation, decoded once, against rows g * per .. of it. A chunk of
      // fewer than kNB blocks (a short row) spreads its rows over more groups, so no thread idles while
      // another decodes many rows.
      const int groups = min(kThreads / nb, nrows), per = (nrows + groups - 1) / groups;
      const int b = tid % nb, g = tid / nb;
      if (g < groups) {
        unit::Q8Act xa;
        const float dx = unit::q8_act<F>(xraw + stage_head(xq + xoff) + b * kXBlock, xa);
        if (g == 0) dxs[b] = dx;
#pragma unroll 2
        for (int j = 0; j < per; ++j) {
          const int row = g * per + j;
          if (row >= nrows) break;
          const uint8_t* wr = wraw + row * C::kWStride + stage_head(wrows + row * rb + woff);
          unit::Q8Weights w;
          F::q8_weights(wr + b * kQK / F::kBlock * F::kBytes, b * kQK % F::kBlock / kQK, w);
          int v[F::kPairs];
          F::q8_ints(w, xa, v);
#pragma unroll
          for (int q = 0; q < F::kPairs; ++q) iv[row * C::kIvRow + b * F::kPairs + q] = v[q];
          wd[row * C::kWdRow + b] = w.d;
          wdmin[row * C::kWdRow + b] = w.dmin;
        }
      }
    }
    __syncthreads();
    if (tid < nrows) {
#pragma unroll 4  // the shared-memory loads of several blocks ahead of the one accumulator's chain
      for (int b = 0; b < nb; ++b) {
        unit::Q8Weights w;
        w.d = wd[tid * C::kWdRow + b];
        w.dmin = wdmin[tid * C::kWdRow + b];
        int v[F::kPairs];
#pragma unroll
        for (int q = 0; q < F::kPairs; ++q) v[q] = iv[tid * C::kIvRow + b * F::kPairs + q];
        acc = F::q8_fma(w, dxs[b], v, acc);
      }
    }
    __syncthreads();  // the next chunk overwrites the staged bytes and the sums
  }
  if (tid < nrows) y[r0 + tid] = acc;
}

template <class F, bool SB>
__global__ void __launch_bounds__(kThreads) mmvq_kernel(MatmulQ8Args a) {
  grid_start();
  const int64_t nblk = a.cols / kQK;
  mmvq_block<F, SB>(a.W, a.rb, a.rows, a.cols, a.Xq, a.Xq, a.Xq + nblk * kXBlock, a.Y,
                    static_cast<int64_t>(blockIdx.x) * rows_per_block<F>());
}

// matmul_q8_experts: block (x, i) is mmvq_kernel's block x on row i's expert matrix against q8_0 row i.
template <class F, bool SB = false, bool kLd = false>
__global__ void __launch_bounds__(kThreads) mmvq_experts_kernel(ExpertsArgs g) {
  grid_start();
  const bool second = blockIdx.y >= g.n;  // grid rows n .. 2 n - 1: matrix m2 (a pair launch)
  const int64_t i = second ? blockIdx.y - g.n : blockIdx.y;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block<F>();
  float* Y = (second ? g.Y2 : g.Y) + i * g.ldy;
  const int m = second ? g.m2 : g.m;
  const int32_t e = g.ids[g.order[i]];
  const uint8_t* W = expert_matrix_dev(g.t, m, e);
  if (!W) {  // not resident: computed on the host (leave_absent), else a caller's bug, made loud
    if (!g.t.leave_absent)
      for (int64_t r = r0 + threadIdx.x; r < min64(g.rows, r0 + rows_per_block<F>()); r += kThreads)
        Y[r] = __int_as_float(0x7fc00000);
    return;
  }
  const int64_t nblk = g.cols / kQK;
  // A slot whose expert has not landed (write-through): its rows come from the source in host memory,
  // staged as the slot's would be, and go on to the slot; the same bytes, so the same products.
  const bool pending = g.t.pending && g.t.pending[g.t.slots[e]];
  const uint8_t* src = pending ? g.t.src[m] + static_cast<size_t>(e) * g.t.src_stride[m] : W;
  mmvq_block<F, SB, kLd>(src, g.rb, g.rows, g.cols, g.Xq + i * g.xrb, g.Xq,
                         g.Xq + (g.n - 1) * g.xrb + nblk * kXBlock, Y, r0,
                         pending ? const_cast<uint8_t*>(W) : nullptr);
}
}  // namespace vec

template <class F, class Tl>
void launch_tile(const MatmulQ8Args& a, cudaStream_t s) {
  const int64_t per_launch = kMaxGridY * Tl::kTB;  // tokens within CUDA's grid y limit
  for (int64_t t0 = 0; t0 < a.T; t0 += per_launch) {
    MatmulQ8Args g = a;
    g.Xq = a.Xq + t0 * a.xrb;
    g.Y = a.Y + t0 * a.ldy;
    g.T = min64(per_launch, a.T - t0);
    const dim3 grid(grid_x(ceil_div(a.rows, Tl::kRB)), static_cast<unsigned>(ceil_div(g.T, Tl::kTB)));
    launch_kernel(mmq_kernel<F, Tl>, grid, kThreads, 0, s, g);
    STRATA_CUDA_LAUNCH_CHECK();
  }
}

template <class F>
void launch_mma_tile(const MatmulQ8Args& a, cudaStream_t s) {
  const int64_t per_launch = kMaxGridY * mmq_mma::kTB;
  for (int64_t t0 = 0; t0 < a.T; t0 += per_launch) {
    MatmulQ8Args g = a;
    g.Xq = a.Xq + t0 * a.xrb;
    g.Y = a.Y + t0 * a.ldy;
    g.T = min64(per_launch, a.T - t0);
    const dim3 grid(grid_x(ceil_div(a.rows, mmq_mma::kRB)),
                    static_cast<unsigned>(ceil_div(g.T, mmq_mma::kTB)));
    launch_kernel(mmq_mma::mma_kernel<F>, grid, mmq_mma::kThreads, 0, s, g);
    STRATA_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace mmq

template <class F>
void launch_mmq_runs(const RunsQ8Args& g, cudaStream_t s) {
  using namespace mmq;
  const unsigned y = static_cast<unsigned>(g.tile0[g.n_runs]), z = g.Y2 ? 2u : 1u;
  if (g.mma)
    launch_kernel(mmq_mma::mma_runs_kernel<F>, dim3(grid_x(ceil_div(g.rows, mmq_mma::kRB)), y, z),
                  mmq_mma::kThreads, 0, s, g);
  else
    launch_kernel(mmq_runs_kernel<F>, dim3(grid_x(ceil_div(g.rows, LargeTile::kRB)), y, z), kThreads, 0, s,
                  g);
  STRATA_CUDA_LAUNCH_CHECK();
}

template <class F>
void launch_mmq(const MatmulQ8Args& a, cudaStream_t s) {
  using namespace mmq;
  if (a.T == 1) {
    launch_kernel(vec::sb_on<F>() ? vec::mmvq_kernel<F, true> : vec::mmvq_kernel<F, false>,
                  grid_x(ceil_div(a.rows, vec::rows_per_block<F>())), vec::kThreads, 0, s, a);
    STRATA_CUDA_LAUNCH_CHECK();
  } else if (a.T == 2)
    launch_tile<F, SmallTile<2>>(a, s);
  else if (a.T <= 4)
    launch_tile<F, SmallTile<4>>(a, s);
  else if (a.T <= kSmallMaxT)
    launch_tile<F, SmallTile<8>>(a, s);
  else if (mma_q8_on())
    launch_mma_tile<F>(a, s);
  else
    launch_tile<F, LargeTile>(a, s);
}

template <class F>
void launch_mmq_experts(const ExpertsArgs& g, cudaStream_t s) {
  using namespace mmq;
  const dim3 grid(grid_x(ceil_div(g.rows, vec::rows_per_block<F>())),
                  static_cast<unsigned>(g.m2 >= 0 ? 2 * g.n : g.n));
  // The experts' GEMV keeps the generic phase 1: with SB its extra shared memory costs a block an SM and
  // the 30B decode measured ~1% slower (bench/NOTES.md, 2026-12-06 evening).
  // A table with pending slots (the write-through) under STRATA_CUDA_WT_LD=1: their rows staged by register
  // loads (stage_rows_ld), a kernel of its own so that the loads' registers cost the other launches nothing.
  if (g.t.pending && wt_ld_on())
    launch_kernel(vec::mmvq_experts_kernel<F, false, true>, grid, vec::kThreads, 0, s, g);
  else
    launch_kernel(vec::mmvq_experts_kernel<F, false>, grid, vec::kThreads, 0, s, g);
  STRATA_CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
