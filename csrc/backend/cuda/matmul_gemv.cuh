// The GEMV kernels of matmul (up to 8 tokens: decode and small batches, bound by memory): rows of
// weight bytes streamed into shared memory by 16-byte cp.async a few chunks ahead, decoded in
// registers 16 elements a lane (quant/unit_decode.h) and multiplied by every token at once.
//
// A block of 2 warps owns 8 rows (4 a warp) and walks their columns in chunks of 512: the chunk's
// weight bytes of the 8 rows and the tokens' 512 activations go to shared memory (up to 4 chunks in
// flight); lane l decodes unit l (columns 16 l ..) of each of its warp's rows and multiplies it by
// the tokens' activations, read once for the 4 rows. Per output the sum is fixed: each lane adds its
// units' products in column order (one fma chain), then the warp adds the 32 lanes in a fixed tree,
// so results depend on the shape and the data only, never on timing.
#pragma once
#include <mutex>

#include "backend/cuda/common.cuh"
#include "backend/cuda/matmul_kernels.cuh"
#include "backend/cuda/tile.cuh"

namespace strata::cuda {
namespace gemv {

constexpr int kMaxT = 8;  // tokens a launch of the kernel takes
constexpr int kWarps = 2, kRowsPerWarp = 4, kRows = kWarps * kRowsPerWarp, kThreads = kWarps * kWarp;
constexpr int kUnits = kWarp;                 // units of a row in a chunk: one a lane
constexpr int kChunk = kUnits * unit::kUnit;  // columns of a chunk
constexpr int kXStride = unit::kUnit + 4;     // floats a unit of activations takes in shared memory: the
                                              // padding keeps the lanes' 16-byte reads free of bank conflicts
constexpr int kSmemBudget = 48 * 1024;        // static shared memory of a block

template <class F, int Tn>
struct Cfg {
  static constexpr int kRowBytes = kChunk / F::kBlock * F::kBytes;  // weight bytes of a row in a chunk
  static constexpr int kPieces = stage_pieces(kRowBytes);
  static constexpr int kWStride = 16 * kPieces;
  static constexpr int kXBytes = Tn * kUnits * kXStride * 4;
  static constexpr int kStageBytes = kRows * kWStride + kXBytes;
  // Chunks in flight: enough to cover the memory latency where a block has little to compute.
  static constexpr int kWant = Tn <= 2 ? 4 : 2;
  static constexpr int kStages = kWant * kStageBytes <= kSmemBudget ? kWant : kSmemBudget / kStageBytes;
  static_assert(kStages >= 1, "a chunk does not fit in shared memory");
};

// The tokens' activations of chunk columns [k0, k0 + kChunk) into xs: unit u of token t at
// xs + (t * kUnits + u) * kXStride, zeros past the last column.
template <int Tn>
__device__ __forceinline__ void stage_x(float* xs, const MatmulArgs& a, int64_t k0, bool x_vec, int tid) {
  constexpr int kQuads = kUnits * unit::kUnit / 4;  // 4 floats each
  for (int it = tid; it < a.T * kQuads; it += kThreads) {
    const int t = it / kQuads, u = (it % kQuads) / 4, q = it % 4;
    float* d = xs + (t * kUnits + u) * kXStride + 4 * q;
    const int64_t c = k0 + u * unit::kUnit + 4 * q;
    const float* src = a.X + t * a.ldx + c;
    if (x_vec && c + 4 <= a.cols) {
      cp_async16(d, src);
    } else {
      for (int e = 0; e < 4; ++e) {
        if (c + e < a.cols)
          cp_async4(d + e, src + e);
        else
          d[e] = 0.0f;
      }
    }
  }
}

// One block's work: rows r0 .. r0 + kRows of the matmul a.
template <class F, int Tn>
__device__ __forceinline__ void gemv_block(const MatmulArgs& a, bool x_vec, int64_t r0) {
  using C = Cfg<F, Tn>;
  __shared__ __align__(16) uint8_t smem[C::kStages * C::kStageBytes];
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int nrows = static_cast<int>(min64(kRows, a.rows - r0));
  const int64_t nchunks = ceil_div(a.cols, kChunk);
  const uint8_t* wrows = a.W + r0 * a.rb;
  const uint8_t* whi = a.W + a.rows * a.rb;

  // Chunk c's weight bytes start at this offset of each row.
  auto row_off = [](int64_t c) { return static_cast<size_t>(c * kChunk / F::kBlock * F::kBytes); };
  auto issue = [&](int64_t c) {
    if (c < nchunks) {
      uint8_t* st = smem + (c % C::kStages) * C::kStageBytes;
      const int64_t k0 = c * kChunk, k1 = min64(a.cols, k0 + kChunk);
      const int n = static_cast<int>((k1 - k0) / F::kBlock * F::kBytes);
      stage_rows<C::kPieces>(st, wrows, a.rb, nrows, row_off(c), n, a.W, whi, tid, kThreads);
      stage_x<Tn>(reinterpret_cast<float*>(st + kRows * C::kWStride), a, k0, x_vec, tid);
    }
    cp_async_commit();  // past the end an empty group keeps the count in flight fixed
  };

  float acc[kRowsPerWarp][Tn] = {};
  for (int c = 0; c < C::kStages - 1; ++c) issue(c);
  for (int64_t c = 0; c < nchunks; ++c) {
    issue(c + C::kStages - 1);  // into the buffer of chunk c - 1, which every thread is done with
    cp_async_wait<C::kStages - 1>();
    __syncthreads();
    const uint8_t* st = smem + (c % C::kStages) * C::kStageBytes;
    const int64_t col = c * kChunk + lane * unit::kUnit;
    if (col < a.cols) {
      // Row j's unit of this lane, decoded; zeros past the last column of a float row (which ends
      // anywhere), where the staged activations are zeros too.
      auto decode = [&](int j, float w[unit::kUnit]) {
        const int i = warp * kRowsPerWarp + j;
        const uint8_t* row = st + i * C::kWStride + stage_head(wrows + i * a.rb + row_off(c));
        F::decode(row + lane * unit::kUnit / F::kBlock * F::kBytes,
                  lane * unit::kUnit % F::kBlock / unit::kUnit, w);
        if constexpr (F::kBlock == 1) {
#pragma unroll
          for (int e = 0; e < unit::kUnit; ++e)
            if (col + e >= a.cols) w[e] = 0.0f;
        }
      };
      const float* xs = reinterpret_cast<const float*>(st + kRows * C::kWStride) + lane * kXStride;
      auto load_x = [&](int t, float x[unit::kUnit]) {
#pragma unroll
        for (int q = 0; q < unit::kUnit / 4; ++q)
          *reinterpret_cast<float4*>(x + 4 * q) =
              reinterpret_cast<const float4*>(xs + t * kUnits * kXStride)[q];
      };
      if constexpr (Tn <= 2) {  // few tokens: their activations stay in registers, rows one at a time
        float x[Tn][unit::kUnit];
#pragma unroll
        for (int t = 0; t < Tn; ++t) load_x(t, x[t]);
#pragma unroll
        for (int j = 0; j < kRowsPerWarp; ++j) {
          if (warp * kRowsPerWarp + j >= nrows) continue;
          float w[unit::kUnit];
          decode(j, w);
#pragma unroll
          for (int t = 0; t < Tn; ++t)
#pragma unroll
            for (int e = 0; e < unit::kUnit; ++e) acc[j][t] = fmaf(w[e], x[t][e], acc[j][t]);
        }
      } else {  // more: the rows' weights stay in registers, tokens one at a time
        float w[kRowsPerWarp][unit::kUnit];
#pragma unroll
        for (int j = 0; j < kRowsPerWarp; ++j)
          if (warp * kRowsPerWarp + j < nrows) decode(j, w[j]);
#pragma unroll
        for (int t = 0; t < Tn; ++t) {
          float x[unit::kUnit];
          load_x(t, x);
#pragma unroll
          for (int j = 0; j < kRowsPerWarp; ++j)
#pragma unroll
            for (int e = 0; e < unit::kUnit; ++e) acc[j][t] = fmaf(w[j][e], x[e], acc[j][t]);
        }
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();  // the empty groups

#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j) {
    const int i = warp * kRowsPerWarp + j;
#pragma unroll
    for (int t = 0; t < Tn; ++t) {
      const float s = warp_sum(acc[j][t]);
      if (lane == 0 && i < nrows && t < a.T) a.Y[t * a.ldy + r0 + i] = s;
    }
  }
}

// ---- one token: a warp per row, weights read straight from memory ----
// The same float operations as gemv_block<F, 1> (lane l adds the products of units l, l + 32, .. of
// the row in column order on one fma chain, then warp_sum), so results are bit for bit those of the
// staged kernel; without the staging and its barriers, many more rows are in flight at once.
constexpr int kRowWarps = 4, kRowThreads = kRowWarps * kWarp;

// Unit u's 16 weights of the row: zeros past the last column of a float row, whose tail is copied
// first so that nothing past the row's end is read.
template <class F>
__device__ __forceinline__ void row_unit(const uint8_t* row, int64_t cols, int64_t col,
                                         float w[unit::kUnit]) {
  const uint8_t* p = row + col / F::kBlock * F::kBytes;
  if constexpr (F::kBlock == 1) {
    if (col + unit::kUnit > cols) {
      __align__(16) uint8_t tail[unit::kUnit * F::kBytes] = {};
      for (int64_t e = 0; e < cols - col; ++e)
        for (int b = 0; b < F::kBytes; ++b) tail[e * F::kBytes + b] = p[e * F::kBytes + b];
      F::decode(tail, 0, w);
#pragma unroll
      for (int e = 0; e < unit::kUnit; ++e)
        if (col + e >= cols) w[e] = 0.0f;
      return;
    }
  }
  F::decode(p, static_cast<int>(col % F::kBlock / unit::kUnit), w);
}

// The 16 activations of columns col..: zeros past the last column.
__device__ __forceinline__ void row_x(const float* x, int64_t cols, int64_t col, bool x_vec,
                                      float v[unit::kUnit]) {
  if (x_vec && col + unit::kUnit <= cols) {
#pragma unroll
    for (int q = 0; q < unit::kUnit / 4; ++q)
      *reinterpret_cast<float4*>(v + 4 * q) = __ldg(reinterpret_cast<const float4*>(x + col) + q);
  } else {
#pragma unroll
    for (int e = 0; e < unit::kUnit; ++e) v[e] = col + e < cols ? __ldg(x + col + e) : 0.0f;
  }
}

// F::decode of a whole unit; float weights 16-byte aligned as four 16-byte loads (F32::decode reads
// 4 bytes at a time: 16 loads a unit, the router's GEMV was bound by their issue). The same values.
// kGlobal: p is global memory (false: shared, where the read-only loads do not go).
template <class F, bool kGlobal = true>
__device__ __forceinline__ void decode_unit(const uint8_t* p, int idx, float w[unit::kUnit]) {
  if constexpr (F::kType == QType::F32 && kGlobal) {
    if ((reinterpret_cast<uintptr_t>(p) & 15) == 0) {
#pragma unroll
      for (int q = 0; q < unit::kUnit / 4; ++q)
        *reinterpret_cast<float4*>(w + 4 * q) = __ldg(reinterpret_cast<const float4*>(p) + q);
      return;
    }
  }
  F::decode(p, idx, w);
}

constexpr int kRowBatch = 4;  // units a lane decodes before its first product (row_dot_with)

// A warp's batch of weights through shared memory: kRowBatch x 32 units of a row are contiguous bytes
// (whole blocks), which the warp copies with coalesced 4-byte loads, all in flight at once, before each lane
// decodes its units from the copy, where decoding from global memory reads each unit as several 2- and
// 4-byte loads of lanes 17 or more bytes apart. The values decoded and their order are unchanged, so are
// the bits. Measured on an H100 (strata_bench_cuda_matmul, one token, us a call without and with): Q6_K
// 2048 x 4096 12.74 -> 10.27, 768 x 2048 8.06 -> 6.37, 4096 x 8192 28.45 -> 23.87; but Q8_0 (16-byte copies)
// 9.44 -> 9.79 and 23.14 -> 26.21, Q4_K and IQ2_XXS within 5% either way: only Q6_K (210-byte blocks) takes
// it.
template <class F>
struct WStage {
  static constexpr int kSpanUnits = kRowBatch * kWarp;  // units a warp's batch covers
  static constexpr bool kOn = F::kType == QType::Q6_K;
  static constexpr int kBytes = kOn ? kRowBatch * kWarp * unit::kUnit / F::kBlock * F::kBytes : 0;  // an area
  static constexpr int kAlloc = kBytes > 0 ? kBytes : 16;  // (no empty arrays)
  static_assert(!kOn || ((kWarp * unit::kUnit) % F::kBlock == 0 && kBytes % 4 == 0), "whole 4-byte words");
};

// src's kBytes bytes into dst by the 32 lanes of a warp, 4 bytes a load (src and dst 4-byte aligned).
template <int kBytes>
__device__ __forceinline__ void copy_warp(uint8_t* dst, const uint8_t* src, int lane) {
  constexpr int kN = kBytes / 4, kPer = (kN + kWarp - 1) / kWarp;
  uint32_t r[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (lane + i * kWarp < kN) r[i] = __ldg(reinterpret_cast<const uint32_t*>(src) + lane + i * kWarp);
#pragma unroll
  for (int i = 0; i < kPer; ++i)
    if (lane + i * kWarp < kN) reinterpret_cast<uint32_t*>(dst)[lane + i * kWarp] = r[i];
}

// W row . x, on every lane of the warp. The lane's whole units go kRowBatch at a time with all their
// weights decoded (their loads in flight together) before the first product: a branch-free batch
// costs one memory round trip where a unit at a time cost one each. The products are added in the
// same order either way; a float row's last, partial unit goes alone. st: the warp's WStage area
// (nullptr: decode from global memory); the batches whose 4 x 32 units are all whole go through it
// when the row is aligned for its loads, the rest as before.
// load_x(u, v): the 16 activations of unit u (zeros past the last column).
template <class F, bool kGlobal = true, class LoadX>
__device__ __forceinline__ float row_dot_with(const uint8_t* row, int64_t cols, int lane, LoadX&& load_x,
                                              uint8_t* st = nullptr) {
  float acc = 0.0f;
  const int64_t full = cols / unit::kUnit, units = ceil_div(cols, unit::kUnit);
  auto unit_at = [&](int64_t u) { return row + u * unit::kUnit / F::kBlock * F::kBytes; };
  auto unit_index = [](int64_t u) { return static_cast<int>(u * unit::kUnit % F::kBlock / unit::kUnit); };
  int64_t u = lane;
  if constexpr (WStage<F>::kOn) {
    using S = WStage<F>;
    if (st && reinterpret_cast<uintptr_t>(row) % 4 == 0) {
      int64_t base = 0;
      for (; base + S::kSpanUnits <= full; base += S::kSpanUnits) {
        const uint8_t* src = unit_at(base);
        __syncwarp();  // the previous batch's reads of st are done
        copy_warp<S::kBytes>(st, src, lane);
        __syncwarp();
        float w[kRowBatch][unit::kUnit];
#pragma unroll
        for (int i = 0; i < kRowBatch; ++i) {
          const int64_t ui = base + lane + i * kWarp;
          decode_unit<F>(st + (unit_at(ui) - src), unit_index(ui), w[i]);
        }
#pragma unroll
        for (int i = 0; i < kRowBatch; ++i) {
          float v[unit::kUnit];
          load_x(base + lane + i * kWarp, v);
#pragma unroll
          for (int e = 0; e < unit::kUnit; ++e) acc = fmaf(w[i][e], v[e], acc);
        }
      }
      u = base + lane;
    }
  }
  for (; u + (kRowBatch - 1) * kWarp < full; u += kRowBatch * kWarp) {
    float w[kRowBatch][unit::kUnit];
#pragma unroll
    for (int i = 0; i < kRowBatch; ++i)
      decode_unit<F, kGlobal>(unit_at(u + i * kWarp), unit_index(u + i * kWarp), w[i]);
#pragma unroll
    for (int i = 0; i < kRowBatch; ++i) {
      float v[unit::kUnit];
      load_x(u + i * kWarp, v);
#pragma unroll
      for (int e = 0; e < unit::kUnit; ++e) acc = fmaf(w[i][e], v[e], acc);
    }
  }
  for (; u < units; u += kWarp) {
    float w[unit::kUnit], v[unit::kUnit];
    row_unit<F>(row, cols, u * unit::kUnit, w);
    load_x(u, v);
#pragma unroll
    for (int e = 0; e < unit::kUnit; ++e) acc = fmaf(w[e], v[e], acc);
  }
  return warp_sum(acc);
}

template <class F, bool kGlobal = true>
__device__ __forceinline__ float row_dot(const uint8_t* row, const float* x, int64_t cols, bool x_vec,
                                         int lane, uint8_t* st = nullptr) {
  return row_dot_with<F, kGlobal>(
      row, cols, lane, [&](int64_t u, float* v) { row_x(x, cols, u * unit::kUnit, x_vec, v); }, st);
}

// The warp's WStage area in a block's array of them (nullptr: no staging).
template <class F>
__device__ __forceinline__ uint8_t* warp_stage(uint8_t* areas, bool stage) {
  return stage ? areas + (threadIdx.x / kWarp) * WStage<F>::kAlloc : nullptr;
}

template <class F>
__global__ void __launch_bounds__(kRowThreads) gemv_row_kernel(MatmulArgs a, bool x_vec, bool stage) {
  __shared__ __align__(16) uint8_t wst[kRowWarps * WStage<F>::kAlloc];
  grid_start();
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarp, b = blockIdx.y;
  if (r >= a.rows) return;
  const float s = row_dot<F>(a.W + b * a.w_stride + r * a.rb, a.X + b * a.x_stride, a.cols, x_vec,
                             threadIdx.x % kWarp, warp_stage<F>(wst, stage));
  if (threadIdx.x % kWarp == 0) a.Y[b * a.y_stride + r] = s;
}

// Several matrices' rows against one activation row (matmul_n): row r of the stacked row space.
template <class F>
__global__ void __launch_bounds__(kRowThreads) gemv_multi_kernel(GemvMultiArgs g, bool x_vec, bool stage) {
  __shared__ __align__(16) uint8_t wst[kRowWarps * WStage<F>::kAlloc];
  grid_start();
  int64_t r = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
  if (r >= g.total) return;
  int i = 0;
  while (i + 1 < g.n && r >= g.rows[i]) r -= g.rows[i++];
  const float s =
      row_dot<F>(g.W[i] + r * g.rb, g.X, g.cols, x_vec, threadIdx.x % kWarp, warp_stage<F>(wst, stage));
  if (threadIdx.x % kWarp == 0) g.Y[i][r] = s;
}

// matmul_experts, one token per row i: row r of row i's expert matrix against X row i.
template <class F>
__global__ void __launch_bounds__(kRowThreads)
    gemv_row_experts_kernel(ExpertsArgs g, bool x_vec, bool stage) {
  __shared__ __align__(16) uint8_t wst[kRowWarps * WStage<F>::kAlloc];
  grid_start();
  const int64_t i = blockIdx.y, r = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
  if (r >= g.rows) return;
  const int lane = threadIdx.x % kWarp;
  const uint8_t* W = expert_matrix_dev(g.t, g.m, g.ids[g.order[i]]);
  if (!W) {  // not resident: computed on the host (leave_absent), else a caller's bug, made loud
    if (lane == 0 && !g.t.leave_absent) g.Y[i * g.ldy + r] = __int_as_float(0x7fc00000);
    return;
  }
  const float s = row_dot<F>(W + r * g.rb, g.X + i * g.ldx, g.cols, x_vec, lane, warp_stage<F>(wst, stage));
  if (lane == 0) g.Y[i * g.ldy + r] = s;
}

// ---- matmul_experts writing missed experts through (ExpertTable::pending) ----
// A decode step resolved on the device leaves its misses' bytes in the source (page-locked host memory
// the device reads); the warp of a row of such an expert reads the row from there once, with all its
// 16-byte loads in flight, into its shared area and into the slot, then multiplies from the shared copy.
// The link's transfer thus overlaps the products of the resident experts in the same launch, and the
// miss costs no fill before the products. The float operations are row_dot's on the same bytes: the same
// bits as the products of a filled slot.
constexpr int kWtArea = static_cast<int>(kWriteThroughRowBytes) + 32;  // a row, its alignment head, a tail

// The n bytes at src (inside the readable [lo, hi)) into the warp's area sh (16-byte aligned; the row at
// sh + src % 16, so its units lie as aligned as in the slot) and to dst, which is aligned as src modulo 16
// (ExpertCache::write_through's condition); returns the row in sh.
__device__ __forceinline__ const uint8_t* write_through_row(uint8_t* sh, uint8_t* dst, const uint8_t* src,
                                                            size_t n, const uint8_t* lo, const uint8_t* hi,
                                                            int lane) {
  constexpr int kPer = (kWtArea / 16 + kWarp - 1) / kWarp;  // pieces a lane
  const uintptr_t s0 = reinterpret_cast<uintptr_t>(src), first = s0 & ~uintptr_t{15};
  const uintptr_t lo_a = reinterpret_cast<uintptr_t>(lo), hi_a = reinterpret_cast<uintptr_t>(hi);
  const int pieces = static_cast<int>((s0 + n - first + 15) / 16);
  uint4 v[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int idx = lane + k * kWarp;
    if (idx >= pieces) continue;
    v[k] = ld_piece16(first + 16 * static_cast<uintptr_t>(idx), lo_a, hi_a);
  }
#pragma unroll
  for (int k = 0; k < kPer; ++k)
    if (lane + k * kWarp < pieces) reinterpret_cast<uint4*>(sh)[lane + k * kWarp] = v[k];
  __syncwarp();
  const uint8_t* row = sh + (s0 - first);
#pragma unroll
  for (int k = 0; k < kPer; ++k) {  // whole pieces as they came, the row's ends byte by byte
    const int idx = lane + k * kWarp;
    if (idx >= pieces) continue;
    const uintptr_t p = first + 16 * static_cast<uintptr_t>(idx);
    if (p >= s0 && p + 16 <= s0 + n) {
      *reinterpret_cast<uint4*>(dst + (p - s0)) = v[k];
    } else {
      for (int j = 0; j < 16; ++j)
        if (p + j >= s0 && p + j < s0 + n) dst[p + j - s0] = sh[16 * idx + j];
    }
  }
  return row;
}

// gemv_row_experts_kernel for a table with pending slots: a row of a pending slot's matrix goes through
// write_through_row first; the others as there (WStage, where on, in the same area).
template <class F>
__global__ void __launch_bounds__(kRowThreads)
    gemv_row_experts_wt_kernel(ExpertsArgs g, bool x_vec, bool stage) {
  static_assert(WStage<F>::kAlloc <= kWtArea, "the WStage area inside the write-through area");
  __shared__ __align__(16) uint8_t area[kRowWarps * kWtArea];
  grid_start();
  const int64_t i = blockIdx.y, r = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
  if (r >= g.rows) return;
  const int lane = threadIdx.x % kWarp;
  uint8_t* sh = area + (threadIdx.x / kWarp) * kWtArea;
  const int32_t e = g.ids[g.order[i]];
  const uint8_t* W = expert_matrix_dev(g.t, g.m, e);
  if (!W) {  // not resident: computed on the host (leave_absent), else a caller's bug, made loud
    if (lane == 0 && !g.t.leave_absent) g.Y[i * g.ldy + r] = __int_as_float(0x7fc00000);
    return;
  }
  float s;
  if (g.t.pending[g.t.slots[e]]) {
    const uint8_t* src = g.t.src[g.m] + static_cast<size_t>(e) * g.t.src_stride[g.m];
    const uint8_t* row = write_through_row(sh, const_cast<uint8_t*>(W) + r * g.rb, src + r * g.rb, g.rb, src,
                                           src + g.rows * g.rb, lane);
    s = row_dot<F, false>(row, g.X + i * g.ldx, g.cols, x_vec, lane);
  } else {
    s = row_dot<F>(W + r * g.rb, g.X + i * g.ldx, g.cols, x_vec, lane, stage ? sh : nullptr);
  }
  if (lane == 0) g.Y[i * g.ldy + r] = s;
}

// ---- one token, its activations staged once a block ----
// row_dot reads each lane's 16 activations of a unit straight from memory: lanes 64 bytes apart, so a
// 16-byte load of the warp touches 16 cache lines and the activations cost L1 about twice what the
// weights do (ncu: Q8_0 GEMV L1-bound at ~85%, DRAM far from its peak). Here a block of kXsWarps warps
// copies the row of activations into shared memory once, unit u at xs + u * kXStride (the padding
// keeps the lanes' 16-byte reads free of bank conflicts), and each warp takes one weight row as
// row_dot does: the same units per lane in the same order, the same float operations, so the bits
// are gemv_row_kernel's (and gemv_block's). The warp's first weights are prefetched into L2 before
// grid_start: they do not depend on the kernel before it.
constexpr int kXsWarps = 8, kXsThreads = kXsWarps * kWarp;
constexpr int64_t kXsMaxUnits = kSmemBudget / (kXStride * 4);  // activations that fit: 614 units

inline bool xs_fits(int64_t cols) { return ceil_div(cols, unit::kUnit) <= kXsMaxUnits; }
__host__ __device__ inline size_t xs_bytes(int64_t cols) {
  return static_cast<size_t>(ceil_div(cols, unit::kUnit)) * kXStride * sizeof(float);
}
// The block's dynamic shared memory: the activations, then (stage) each warp's WStage area.
template <class F>
size_t xs_smem(int64_t cols, bool stage) {
  return xs_bytes(cols) + (stage && WStage<F>::kOn ? size_t{kXsWarps} * WStage<F>::kAlloc : 0);
}

// The row x (cols floats) into xs, zeros past the last column; every thread of the block takes part.
__device__ __forceinline__ void stage_x_row(float* xs, const float* x, int64_t cols, bool x_vec) {
  const int64_t quads = ceil_div(cols, unit::kUnit) * (unit::kUnit / 4);
  for (int64_t i = threadIdx.x; i < quads; i += blockDim.x) {
    const int64_t u = i / 4, c = 4 * i;
    float4 v;
    if (x_vec && c + 4 <= cols) {
      v = __ldg(reinterpret_cast<const float4*>(x + c));
    } else {
      v.x = c < cols ? x[c] : 0.0f;
      v.y = c + 1 < cols ? x[c + 1] : 0.0f;
      v.z = c + 2 < cols ? x[c + 2] : 0.0f;
      v.w = c + 3 < cols ? x[c + 3] : 0.0f;
    }
    *reinterpret_cast<float4*>(xs + u * kXStride + 4 * (i % 4)) = v;
  }
}

// The first kRowBatch units of the lane into L2 (no register is written: a hint).
template <class F>
__device__ __forceinline__ void prefetch_row(const uint8_t* row, int64_t cols, int lane) {
  const int64_t units = ceil_div(cols, unit::kUnit);
#pragma unroll
  for (int i = 0; i < kRowBatch; ++i) {
    const int64_t u = lane + i * kWarp;
    if (u < units) {
      const uint8_t* p = row + u * unit::kUnit / F::kBlock * F::kBytes;
      asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
    }
  }
}

// row_dot with the activations in shared memory (stage_x_row's layout); st as row_dot_with's.
template <class F>
__device__ __forceinline__ float row_dot_xs(const uint8_t* row, const float* xs, int64_t cols, int lane,
                                            uint8_t* st) {
  return row_dot_with<F>(
      row, cols, lane,
      [&](int64_t u, float* v) {
#pragma unroll
        for (int q = 0; q < unit::kUnit / 4; ++q)
          *reinterpret_cast<float4*>(v + 4 * q) = reinterpret_cast<const float4*>(xs + u * kXStride)[q];
      },
      st);
}

// The block's dynamic shared memory (xs_bytes(cols)).
extern __shared__ __align__(16) float gemv_xs[];

template <class F>
__global__ void __launch_bounds__(kXsThreads) gemv_row_xs_kernel(MatmulArgs a, bool x_vec, bool stage) {
  const int lane = threadIdx.x % kWarp;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kXsWarps + threadIdx.x / kWarp, b = blockIdx.y;
  const uint8_t* W = a.W + b * a.w_stride;
  if (r < a.rows) prefetch_row<F>(W + r * a.rb, a.cols, lane);
  grid_start();
  stage_x_row(gemv_xs, a.X + b * a.x_stride, a.cols, x_vec);
  __syncthreads();
  if (r >= a.rows) return;
  uint8_t* areas = reinterpret_cast<uint8_t*>(gemv_xs) + xs_bytes(a.cols);
  const float s = row_dot_xs<F>(W + r * a.rb, gemv_xs, a.cols, lane, warp_stage<F>(areas, stage));
  if (lane == 0) a.Y[b * a.y_stride + r] = s;
}

template <class F>
__global__ void __launch_bounds__(kXsThreads) gemv_multi_xs_kernel(GemvMultiArgs g, bool x_vec, bool stage) {
  const int lane = threadIdx.x % kWarp;
  int64_t r = static_cast<int64_t>(blockIdx.x) * kXsWarps + threadIdx.x / kWarp;
  int i = 0;
  const bool live = r < g.total;
  if (live) {
    while (i + 1 < g.n && r >= g.rows[i]) r -= g.rows[i++];
    prefetch_row<F>(g.W[i] + r * g.rb, g.cols, lane);
  }
  grid_start();
  stage_x_row(gemv_xs, g.X, g.cols, x_vec);
  __syncthreads();
  if (!live) return;
  uint8_t* areas = reinterpret_cast<uint8_t*>(gemv_xs) + xs_bytes(g.cols);
  const float s = row_dot_xs<F>(g.W[i] + r * g.rb, gemv_xs, g.cols, lane, warp_stage<F>(areas, stage));
  if (lane == 0) g.Y[i][r] = s;
}

// ---- one token's Q8_0 GEMV with all of a lane's loads of a row in flight at once ----
// gemv_row_xs_kernel decodes 4 units a lane before its first product, so a 4096-column row takes two
// memory round trips a warp after the activations' one; ncu on the H100 (2048 x 4096, stop 45): 11.1 us,
// DRAM 24% busy, 23% of the warps an SM could hold (the grid's 2,048 warps, one a row), stalls on the
// loads' scoreboard. Here a lane first loads the raw words of up to kG x 32 units of the row (each unit its
// scale's 2 bytes and its 16 quants as 4 words: 5 registers), issued before the activations are staged so
// that both round trips overlap, then decodes and multiplies them in order: the units each lane takes, their
// values (Q8_0::decode_words, which decode calls) and the order of the fma chain are row_dot_with's, so the
// bits are gemv_row_xs_kernel's. The whole row is prefetched into L2 before grid_start (the xs kernel: its
// first half), and where the launch says the weights are fixed (MatmulArgs::w_fixed: Backend::resident's
// memory) the first group's loads go before grid_start too. STRATA_CUDA_GEMV_RAW=1 (read at each launch)
// until a GPU has timed it.
template <int kG>
struct Q8Raw {
  uint32_t q[kG][4], d[kG];
  // Units u0 + lane + 32 k (k < kG) of the row, those below `units`.
  __device__ __forceinline__ void load(const uint8_t* row, int64_t u0, int64_t units, int lane) {
#pragma unroll
    for (int k = 0; k < kG; ++k) {
      const int64_t u = u0 + lane + k * kWarp;
      if (u >= units) continue;
      const uint8_t* b = row + (u >> 1) * unit::Q8_0::kBytes;
      d[k] = unit::ld16(b + unit::Q8_0::kD);
      unit::ld_words<4>(b + unit::Q8_0::kQs + unit::kUnit * (u & 1), q[k]);
    }
  }
  // acc += their products with the staged activations, unit by unit in column order.
  __device__ __forceinline__ void dot(const float* xs, int64_t u0, int64_t units, int lane,
                                      float& acc) const {
#pragma unroll
    for (int k = 0; k < kG; ++k) {
      const int64_t u = u0 + lane + k * kWarp;
      if (u >= units) continue;
      float w[unit::kUnit], v[unit::kUnit];
      unit::Q8_0::decode_words(d[k], q[k], w);
#pragma unroll
      for (int j = 0; j < unit::kUnit / 4; ++j)
        *reinterpret_cast<float4*>(v + 4 * j) = reinterpret_cast<const float4*>(xs + u * kXStride)[j];
#pragma unroll
      for (int e = 0; e < unit::kUnit; ++e) acc = fmaf(w[e], v[e], acc);
    }
  }
};

// The lines of a row of rb bytes into L2 (a hint: no register is written).
__device__ __forceinline__ void prefetch_bytes(const uint8_t* row, size_t rb, int lane) {
  for (size_t off = static_cast<size_t>(lane) * 128; off < rb; off += kWarp * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(row + off));
  if (lane == 0 && rb > 0) asm volatile("prefetch.global.L2 [%0];" ::"l"(row + rb - 1));
}

// A row's first group of raw words: before grid_start where the weights are fixed (w_fixed: never written
// while work is queued, so they may be read while the kernel before still runs; under programmatic
// dependent launch their round trip then overlaps that kernel), the row's lines into L2 otherwise and the
// loads after grid_start. Every thread of the block calls both halves (the barrier in q8raw_finish). kFixed
// is a template parameter so that each kernel has one load site: nvcc 13.0's cicc at -O1 (the CI's device
// optimization) crashed compiling a kernel with a load on either side of grid_start.
template <int kG, bool kFixed>
__device__ __forceinline__ void q8raw_start(Q8Raw<kG>& g, const uint8_t* row, size_t rb, int64_t cols,
                                            bool live, int lane) {
  if (live) {
    if constexpr (kFixed) g.load(row, 0, cols / unit::kUnit, lane);
    prefetch_bytes(row, rb, lane);
  }
  grid_start();
  if constexpr (!kFixed)
    if (live) g.load(row, 0, cols / unit::kUnit, lane);
}

// Row . x with the first group loaded (q8raw_start): the block stages x (cols, x_vec) while those loads
// are in flight, then each live warp multiplies group by group.
template <int kG>
__device__ __forceinline__ float q8raw_finish(Q8Raw<kG>& g, const uint8_t* row, bool live, const float* x,
                                              int64_t cols, bool x_vec, int lane) {
  const int64_t units = cols / unit::kUnit;  // Q8_0 rows: whole blocks, so whole units
  stage_x_row(gemv_xs, x, cols, x_vec);
  __syncthreads();
  if (!live) return 0.0f;
  float acc = 0.0f;
  g.dot(gemv_xs, 0, units, lane, acc);
  for (int64_t u0 = kG * kWarp; u0 < units; u0 += kG * kWarp) {
    g.load(row, u0, units, lane);
    g.dot(gemv_xs, u0, units, lane, acc);
  }
  return warp_sum(acc);
}

template <int kG, bool kFixed>
__global__ void __launch_bounds__(kXsThreads) gemv_row_q8raw_kernel(MatmulArgs a, bool x_vec) {
  const int lane = threadIdx.x % kWarp;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kXsWarps + threadIdx.x / kWarp, b = blockIdx.y;
  const bool live = r < a.rows;
  const uint8_t* row = a.W + b * a.w_stride + (live ? r : 0) * a.rb;
  Q8Raw<kG> g;
  q8raw_start<kG, kFixed>(g, row, a.rb, a.cols, live, lane);
  const float s = q8raw_finish(g, row, live, a.X + b * a.x_stride, a.cols, x_vec, lane);
  if (live && lane == 0) a.Y[b * a.y_stride + r] = s;
}

template <int kG, bool kFixed>
__global__ void __launch_bounds__(kXsThreads) gemv_multi_q8raw_kernel(GemvMultiArgs g, bool x_vec) {
  const int lane = threadIdx.x % kWarp;
  int64_t r = static_cast<int64_t>(blockIdx.x) * kXsWarps + threadIdx.x / kWarp;
  int i = 0;
  const bool live = r < g.total;
  if (live)
    while (i + 1 < g.n && r >= g.rows[i]) r -= g.rows[i++];
  const uint8_t* row = g.W[i] + (live ? r : 0) * g.rb;
  Q8Raw<kG> w;
  q8raw_start<kG, kFixed>(w, row, g.rb, g.cols, live, lane);
  const float s = q8raw_finish(w, row, live, g.X, g.cols, x_vec, lane);
  if (live && lane == 0) g.Y[i][r] = s;
}

// Groups of 4 rounds (2,048 columns) where the row has no more, else of 8: a lane's raw words, 20 or 40
// registers.
inline bool q8raw_small(int64_t cols) { return cols <= 4 * kWarp * unit::kUnit; }

// The raw-word kernels by [w_fixed][groups of 8], opted in to the xs kernels' shared memory once. F: Q8_0 (a
// template, so that only the Q8_0 unit instantiates the kernels).
template <class F>
struct Q8RawKernels {
  using Row = void (*)(MatmulArgs, bool);
  using Multi = void (*)(GemvMultiArgs, bool);
  static constexpr Row kRow[2][2] = {{gemv_row_q8raw_kernel<4, false>, gemv_row_q8raw_kernel<8, false>},
                                     {gemv_row_q8raw_kernel<4, true>, gemv_row_q8raw_kernel<8, true>}};
  static constexpr Multi kMulti[2][2] = {
      {gemv_multi_q8raw_kernel<4, false>, gemv_multi_q8raw_kernel<8, false>},
      {gemv_multi_q8raw_kernel<4, true>, gemv_multi_q8raw_kernel<8, true>}};
  static void opt_in() {
    static std::once_flag once;
    std::call_once(once, [] {
      const int most = static_cast<int>(xs_bytes(kXsMaxUnits * unit::kUnit));
      for (int f = 0; f < 2; ++f)
        for (int g = 0; g < 2; ++g) {
          STRATA_CUDA_CHECK(
              cudaFuncSetAttribute(kRow[f][g], cudaFuncAttributeMaxDynamicSharedMemorySize, most));
          STRATA_CUDA_CHECK(
              cudaFuncSetAttribute(kMulti[f][g], cudaFuncAttributeMaxDynamicSharedMemorySize, most));
        }
    });
  }
};

// matmul_experts with row i's activations staged once a block (gemv_row_xs_kernel's way): block (x, i) takes
// kXsWarps rows of row i's expert matrix; kWt: a table with pending slots (gemv_row_experts_wt_kernel's
// write-through, each warp's kWtArea after the activations). The experts' float-activation GEMV read each
// lane's 16 activations of a unit straight from memory, 64 bytes a lane apart, four times the bytes of its
// Q4_K weights (ncu, the 30B shape's decode with a bounded cache: 22 us a call, 0.3 TB/s). The same units per
// lane in the same order: the bits of gemv_row_experts_kernel.
template <class F, bool kWt>
__global__ void __launch_bounds__(kXsThreads)
    gemv_row_experts_xs_kernel(ExpertsArgs g, bool x_vec, bool stage) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t i = blockIdx.y, r = static_cast<int64_t>(blockIdx.x) * kXsWarps + warp;
  grid_start();
  stage_x_row(gemv_xs, g.X + i * g.ldx, g.cols, x_vec);
  __syncthreads();
  if (r >= g.rows) return;
  const int32_t e = g.ids[g.order[i]];
  const uint8_t* W = expert_matrix_dev(g.t, g.m, e);
  if (!W) {  // not resident: computed on the host (leave_absent), else a caller's bug, made loud
    if (lane == 0 && !g.t.leave_absent) g.Y[i * g.ldy + r] = __int_as_float(0x7fc00000);
    return;
  }
  uint8_t* area =
      reinterpret_cast<uint8_t*>(gemv_xs) + xs_bytes(g.cols) + warp * (kWt ? kWtArea : WStage<F>::kAlloc);
  const auto load_x = [&](int64_t u, float* v) {
#pragma unroll
    for (int q = 0; q < unit::kUnit / 4; ++q)
      *reinterpret_cast<float4*>(v + 4 * q) = reinterpret_cast<const float4*>(gemv_xs + u * kXStride)[q];
  };
  float s;
  if (kWt && g.t.pending[g.t.slots[e]]) {
    const uint8_t* src = g.t.src[g.m] + static_cast<size_t>(e) * g.t.src_stride[g.m];
    const uint8_t* row = write_through_row(area, const_cast<uint8_t*>(W) + r * g.rb, src + r * g.rb, g.rb,
                                           src, src + g.rows * g.rb, lane);
    s = row_dot_with<F, false>(row, g.cols, lane, load_x);
  } else {
    s = row_dot_with<F>(W + r * g.rb, g.cols, lane, load_x, stage ? area : nullptr);
  }
  if (lane == 0) g.Y[i * g.ldy + r] = s;
}

// The experts' xs kernels' dynamic shared memory: the activations, then each warp's area (WStage's; the
// write-through one's kWtArea).
template <class F>
size_t experts_xs_smem(int64_t cols, bool stage, bool wt) {
  return xs_bytes(cols) + (wt                        ? size_t{kXsWarps} * kWtArea
                           : stage && WStage<F>::kOn ? size_t{kXsWarps} * WStage<F>::kAlloc
                                                     : 0);
}

template <class F, int Tn>
__global__ void __launch_bounds__(kThreads) gemv_kernel(MatmulArgs a, bool x_vec) {
  grid_start();
  gemv_block<F, Tn>(a, x_vec, static_cast<int64_t>(blockIdx.x) * kRows);
}

// The xs kernels take up to kSmemBudget of activations plus the warps' WStage areas: past the default
// 48 KiB of dynamic shared memory, opted in once per format before the first launch.
template <class F>
void xs_opt_in() {
  static std::once_flag once;
  std::call_once(once, [] {
    const int most = static_cast<int>(xs_smem<F>(kXsMaxUnits * unit::kUnit, true));
    STRATA_CUDA_CHECK(
        cudaFuncSetAttribute(gemv_row_xs_kernel<F>, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
    STRATA_CUDA_CHECK(
        cudaFuncSetAttribute(gemv_multi_xs_kernel<F>, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
  });
}

}  // namespace gemv

template <class F>
void launch_gemv(const MatmulArgs& a, cudaStream_t s) {
  using namespace gemv;
  const bool stage = gemv_stage_on();
  const bool x_vec = x_rows_aligned(a.X, a.ldx) && a.x_stride % 4 == 0;
  const dim3 grid(grid_x(ceil_div(a.rows, kRows)));
  STRATA_CHECK(a.batch == 1 || (a.T == 1 && a.batch <= 65535), ConfigError, "gemv: a batch of ", a.batch,
               " products takes one token, got ", a.T);
  const auto batch = static_cast<unsigned>(a.batch);
  for (int64_t t0 = 0; t0 < a.T; t0 += kMaxT) {
    MatmulArgs g = a;
    g.X = a.X + t0 * a.ldx;
    g.Y = a.Y + t0 * a.ldy;
    g.T = min64(kMaxT, a.T - t0);
    if constexpr (F::kType == QType::Q8_0) {  // (instantiated in the Q8_0 unit alone)
      if (g.T == 1 && gemv_raw_on() && xs_fits(a.cols)) {
        using K = Q8RawKernels<F>;
        K::opt_in();
        const auto k = K::kRow[a.w_fixed][!q8raw_small(a.cols)];
        launch_kernel(k, dim3(grid_x(ceil_div(a.rows, kXsWarps)), batch), kXsThreads, xs_bytes(a.cols), s, g,
                      x_vec);
        STRATA_CUDA_LAUNCH_CHECK();
        continue;
      }
    }
    if (g.T == 1 && gemv_xs_on() && xs_fits(a.cols)) {
      xs_opt_in<F>();
      launch_kernel(gemv_row_xs_kernel<F>, dim3(grid_x(ceil_div(a.rows, kXsWarps)), batch), kXsThreads,
                    xs_smem<F>(a.cols, stage), s, g, x_vec, stage);
    } else if (g.T == 1) {
      launch_kernel(gemv_row_kernel<F>, dim3(grid_x(ceil_div(a.rows, kRowWarps)), batch), kRowThreads, 0, s,
                    g, x_vec, stage);
    } else if (g.T == 2)
      launch_kernel(gemv_kernel<F, 2>, grid, kThreads, 0, s, g, x_vec);
    else if (g.T <= 4)
      launch_kernel(gemv_kernel<F, 4>, grid, kThreads, 0, s, g, x_vec);
    else
      launch_kernel(gemv_kernel<F, 8>, grid, kThreads, 0, s, g, x_vec);
    STRATA_CUDA_LAUNCH_CHECK();
  }
}

template <class F>
void launch_gemv_multi(const GemvMultiArgs& g, cudaStream_t s) {
  using namespace gemv;
  const bool stage = gemv_stage_on();
  if constexpr (F::kType == QType::Q8_0) {
    if (gemv_raw_on() && xs_fits(g.cols)) {
      using K = Q8RawKernels<F>;
      K::opt_in();
      const auto k = K::kMulti[g.w_fixed][!q8raw_small(g.cols)];
      launch_kernel(k, grid_x(ceil_div(g.total, kXsWarps)), kXsThreads, xs_bytes(g.cols), s, g,
                    x_rows_aligned(g.X, 4));
      STRATA_CUDA_LAUNCH_CHECK();
      return;
    }
  }
  if (gemv_xs_on() && xs_fits(g.cols)) {
    xs_opt_in<F>();
    launch_kernel(gemv_multi_xs_kernel<F>, grid_x(ceil_div(g.total, kXsWarps)), kXsThreads,
                  xs_smem<F>(g.cols, stage), s, g, x_rows_aligned(g.X, 4), stage);
  } else {
    launch_kernel(gemv_multi_kernel<F>, grid_x(ceil_div(g.total, kRowWarps)), kRowThreads, 0, s, g,
                  x_rows_aligned(g.X, 4), stage);
  }
  STRATA_CUDA_LAUNCH_CHECK();
}

template <class F>
void launch_gemv_experts(const ExpertsArgs& g, cudaStream_t s) {
  using namespace gemv;
  const dim3 grid(grid_x(ceil_div(g.rows, kRowWarps)), static_cast<unsigned>(g.n));
  const bool xs = gemv_experts_xs_on() && xs_fits(g.cols);
  if (xs) {  // opted in once per format, to the most either kernel takes
    static std::once_flag once;
    std::call_once(once, [] {
      const int most = static_cast<int>(experts_xs_smem<F>(kXsMaxUnits * unit::kUnit, true, true));
      STRATA_CUDA_CHECK(cudaFuncSetAttribute(gemv_row_experts_xs_kernel<F, false>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, most));
      STRATA_CUDA_CHECK(cudaFuncSetAttribute(gemv_row_experts_xs_kernel<F, true>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, most));
    });
  }
  const dim3 xs_grid(grid_x(ceil_div(g.rows, kXsWarps)), static_cast<unsigned>(g.n));
  if (g.t.pending) {
    const uintptr_t src = reinterpret_cast<uintptr_t>(g.t.src[g.m]),
                    dst = reinterpret_cast<uintptr_t>(g.t.arena) + g.t.off[g.m];
    STRATA_CHECK(g.t.slots && g.rb <= kWriteThroughRowBytes && (src - dst) % 16 == 0 &&
                     g.t.src_stride[g.m] % 16 == 0 && g.t.slot_bytes % 16 == 0,
                 Error, "internal error: matmul_experts writes through rows of ", g.rb, " bytes (at most ",
                 kWriteThroughRowBytes, ", slots only, the source aligned as the slots modulo 16)");
    if (xs)
      launch_kernel(gemv_row_experts_xs_kernel<F, true>, xs_grid, kXsThreads,
                    experts_xs_smem<F>(g.cols, gemv_stage_on(), true), s, g, x_rows_aligned(g.X, g.ldx),
                    gemv_stage_on());
    else
      launch_kernel(gemv_row_experts_wt_kernel<F>, grid, kRowThreads, 0, s, g, x_rows_aligned(g.X, g.ldx),
                    gemv_stage_on());
  } else if (xs) {
    launch_kernel(gemv_row_experts_xs_kernel<F, false>, xs_grid, kXsThreads,
                  experts_xs_smem<F>(g.cols, gemv_stage_on(), false), s, g, x_rows_aligned(g.X, g.ldx),
                  gemv_stage_on());
  } else {
    launch_kernel(gemv_row_experts_kernel<F>, grid, kRowThreads, 0, s, g, x_rows_aligned(g.X, g.ldx),
                  gemv_stage_on());
  }
  STRATA_CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
