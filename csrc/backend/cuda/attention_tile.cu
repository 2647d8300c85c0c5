// The prompt attention's tile kernel: attention.cu's float operations (see its comment) for a tile of
// queries, laid out as the decode kernel lays out its work. Builds with -fmad=false.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>

#include "backend/cuda/attention_impl.cuh"

namespace strata::cuda::attn {
namespace {

// ---- prompt (many queries): attention_tile_kernel ----
// The same float operations as attention_kernel<., false>, laid out as the decode kernel lays out its
// work, for a tile of kRows (query, head) rows of one kv head: rows r = tq * gr + gi are query t0 + tq at
// head kvh * group + g0 + gi. Per key block (128 keys by absolute position, in order), its keys are
// staged in rounds in their stored type and shared by every row of the tile:
//   scores: a task is (kTaskRows rows, 32 keys): lane l forms each row's 32 dot partials over dims
//     l, l + 32, .. in order (one load of a key's element serves the task's rows), and the transposed
//     butterfly leaves key k's score on lane k; keys past a row's position are neither formed nor kept;
//   softmax: a warp per row, lane l taking keys l, l + 32, .. in order for the max and the sum;
//   a_b: a task is (kPvRows rows, 64 dims), lane l taking dims 2 l and 2 l + 1 of each row, every
//     (row, dim) its own fma chain over the row's keys in order (one load of a value pair serves the rows);
// then each row folds the block into its (m, l) and its accumulators (registers, the same thread's
// across blocks) as attention_kernel does. The tile's rows share each key block's loads: a block of
// keys crosses from memory once per kRows rows (16 in attention_kernel), and a score costs a fma and
// a shared load per dim pair of rows instead of a load of each operand and a butterfly.
constexpr int kTileStageBytes = 16 * 1024, kTaskRows = 2, kPvRows = 4;
constexpr int64_t kTileMaxSmem = 48 * 1024;

template <class KvT, int kDims>
struct TileShape {
  static constexpr int64_t hd = kDims * kWarp;
  // Keys a staging round holds: whole 32-key pieces that divide the 128-key block.
  static constexpr int64_t kFit = kTileStageBytes / (hd * (int64_t)sizeof(KvT));
  static constexpr int kRound = (int)(kFit >= kKeyBlock ? kKeyBlock : kFit >= 64 ? 64 : 32);
  static constexpr int kStage = kRound * (int)hd * (int)sizeof(KvT);
  // Rows a block: what shared memory holds beside the stage (scores and 7 row words a row), at most 32.
  static constexpr int64_t kRowBytes = (kKeyBlock + 7) * 4;
  static constexpr int kRowsFit = (int)((kTileMaxSmem - kStage) / kRowBytes);
  static constexpr int kRows = kRowsFit >= 32 ? 32 : 16;
  static_assert(kRowsFit >= 16, "a tile of at least 16 rows");
  static_assert(kRound % kPiece == 0 && kKeyBlock % kRound == 0, "whole pieces, whole rounds");
  static_assert(kStage / 16 % kDecThreads == 0, "whole loads per thread");
};

template <class KvT, int kDims>
__global__ void __launch_bounds__(kDecThreads)
    attention_tile_kernel(const float* q, const KvT* kc, const KvT* vc, Shape sh, float* out) {
  grid_start();
  using TS = TileShape<KvT, kDims>;
  constexpr int64_t hd = TS::hd;
  constexpr int kRound = TS::kRound, kRows = TS::kRows, kRoundPieces = kRound / kPiece;
  constexpr int kPairDims = kDims / 2;  // 64-dim groups of a row
  constexpr int kPvTasks = (kRows / kPvRows * kPairDims + kDecWarps - 1) / kDecWarps;
  static_assert(kDims % 2 == 0, "head dims of whole 64-dim groups");
  __shared__ __align__(16) KvT buf[kRound * hd];
  __shared__ float sc[kRows * kKeyBlock];  // scores, then p, per row
  __shared__ float row_m[kRows], row_l[kRows], row_mb[kRows], row_lb[kRows], row_a[kRows], row_b[kRows];
  __shared__ int row_nv[kRows];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t pos0 = sh.pos0 + (sh.pos_dev ? *sh.pos_dev : 0);
  const int64_t kvh = blockIdx.y;
  const int gr = sh.gr, g0 = (int)blockIdx.z * gr;
  const int ng = (int)min((int64_t)gr, sh.group - g0);
  const int64_t t0 = (int64_t)blockIdx.x * sh.qt;
  const int nq = (int)min((int64_t)sh.qt, sh.T - t0);
  const int R = ng * nq;
  const auto token = [&](int r) { return t0 + r / ng; };
  const auto head = [&](int r) { return kvh * sh.group + g0 + r % ng; };
  const auto n_keys = [&](int r) { return pos0 + token(r) + 1; };

  for (int r = threadIdx.x; r < kRows; r += kDecThreads) {
    row_m[r] = -INFINITY;
    row_l[r] = 0.0f;
  }
  float acc[kPvTasks][kPvRows][2] = {};
  const int64_t keys = pos0 + t0 + nq;  // the most any row sees
  for (int64_t j0 = 0; j0 < keys; j0 += kKeyBlock) {
    const int nb = (int)min((int64_t)kKeyBlock, keys - j0);  // keys of this block any row sees
    // Scores.
    for (int r0 = 0; r0 < nb; r0 += kRound) {
      const int nk = min(kRound, nb - r0);
      __syncthreads();  // buf is free
      {
        Staged<KvT, TS::kStage> kst;
        load_keys(kst, kc, j0 + r0, nk, sh.KV, kvh, hd);
        store_keys(buf, kst, nk, hd);
      }
      __syncthreads();
      for (int task = warp; task < kRows / kTaskRows * kRoundPieces; task += kDecWarps) {
        const int rt = task / kRoundPieces * kTaskRows, k0 = task % kRoundPieces * kPiece;
        if (rt >= R || k0 >= nk) continue;
        float qr[kTaskRows][kDims];
        int lim[kTaskRows];  // keys k0 + k < lim[i] of this round are row rt + i's
#pragma unroll
        for (int i = 0; i < kTaskRows; ++i) {
          const int r = min(rt + i, R - 1);
          const float* qp = q + (token(r) * sh.H + head(r)) * hd + lane;
#pragma unroll
          for (int d = 0; d < kDims; ++d) qr[i][d] = qp[kWarp * d];
          lim[i] = rt + i < R ? (int)min((int64_t)nk, n_keys(r) - j0 - r0) : 0;
        }
        float part[kTaskRows][kWarp];
#pragma unroll
        for (int k = 0; k < kWarp; ++k) {
          float d[kTaskRows];
#pragma unroll
          for (int i = 0; i < kTaskRows; ++i) d[i] = 0.0f;
          if (k0 + k < nk)
#pragma unroll
            for (int dd = 0; dd < kDims; ++dd) {
              const float kv = kv_load(buf + (k0 + k) * hd + lane + kWarp * dd);
#pragma unroll
              for (int i = 0; i < kTaskRows; ++i) d[i] = fmaf(qr[i][dd], kv, d[i]);
            }
#pragma unroll
          for (int i = 0; i < kTaskRows; ++i) part[i][k] = k0 + k < lim[i] ? d[i] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < kTaskRows; ++i) {
          const float score = transposed_sum(part[i], lane) * sh.scale;
          if (k0 + lane < lim[i]) sc[(rt + i) * kKeyBlock + r0 + k0 + lane] = score;
        }
      }
    }
    __syncthreads();
    // Softmax of the block, a warp per row: m_b, p_j, l_b.
    for (int r = warp; r < R; r += kDecWarps) {
      const int nv = (int)max((int64_t)0, min((int64_t)kKeyBlock, n_keys(r) - j0));
      const float2 ml = block_softmax(sc + r * kKeyBlock, nv, lane);
      if (lane == 0) {
        row_nv[r] = nv;
        row_mb[r] = ml.x;
        row_lb[r] = ml.y;
      }
    }
    // a_b = sum_j p_j v_j, keys in order.
    float accb[kPvTasks][kPvRows][2] = {};
    for (int r0 = 0; r0 < nb; r0 += kRound) {
      const int nk = min(kRound, nb - r0);
      __syncthreads();  // buf is free; the softmax's p and row_nv are visible
      {
        Staged<KvT, TS::kStage> vst;
        load_keys(vst, vc, j0 + r0, nk, sh.KV, kvh, hd);
        store_keys(buf, vst, nk, hd);
      }
      __syncthreads();
#pragma unroll
      for (int t = 0; t < kPvTasks; ++t) {
        const int task = warp + t * kDecWarps, rq = task / kPairDims * kPvRows, dg = task % kPairDims;
        if (rq >= R) continue;
        int lim[kPvRows], kmax = 0;  // keys r0 + k < lim[i] are row rq + i's
#pragma unroll
        for (int i = 0; i < kPvRows; ++i) {
          lim[i] = rq + i < R ? min(nk, row_nv[rq + i] - r0) : 0;
          kmax = max(kmax, lim[i]);
        }
        const KvT* col = buf + dg * 2 * kWarp + 2 * lane;
#pragma unroll 2
        for (int k = 0; k < kmax; ++k) {
          const float2 v = kv_load2(col + k * hd);
#pragma unroll
          for (int i = 0; i < kPvRows; ++i)
            if (k < lim[i]) {
              const float p = sc[(rq + i) * kKeyBlock + r0 + k];
              accb[t][i][0] = fmaf(p, v.x, accb[t][i][0]);
              accb[t][i][1] = fmaf(p, v.y, accb[t][i][1]);
            }
        }
      }
    }
    // The fold of the block into each row's state, then into its accumulators.
    for (int r = threadIdx.x; r < R; r += kDecThreads) {
      if (row_nv[r] == 0) continue;
      const Fold f = fold(row_m[r], row_l[r], row_mb[r], row_lb[r]);
      row_a[r] = f.a;
      row_b[r] = f.b;
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < kPvTasks; ++t) {
      const int task = warp + t * kDecWarps, rq = task / kPairDims * kPvRows;
      if (rq >= R) continue;
#pragma unroll
      for (int i = 0; i < kPvRows; ++i)
        if (rq + i < R && row_nv[rq + i] > 0)
#pragma unroll
          for (int c = 0; c < 2; ++c)
            acc[t][i][c] = acc[t][i][c] * row_a[rq + i] + accb[t][i][c] * row_b[rq + i];
    }
  }
#pragma unroll
  for (int t = 0; t < kPvTasks; ++t) {
    const int task = warp + t * kDecWarps, rq = task / kPairDims * kPvRows, dg = task % kPairDims;
    if (rq >= R) continue;
#pragma unroll
    for (int i = 0; i < kPvRows; ++i) {
      const int r = rq + i;
      if (r >= R) continue;
      const float inv = 1.0f / row_l[r];
      *reinterpret_cast<float2*>(out + (token(r) * sh.H + head(r)) * hd + dg * 2 * kWarp + 2 * lane) =
          make_float2(acc[t][i][0] * inv, acc[t][i][1] * inv);
    }
  }
}

bool tile_enabled() {
  const char* e = std::getenv("STRATA_CUDA_ATTN_TILE");
  return !(e && e[0] == '0' && e[1] == '\0');
}
template <class KvT, int kDims>
void launch_tile_dims(const float* q, const KvT* kc, const KvT* vc, Shape s, float* out, cudaStream_t st) {
  constexpr int kRows = TileShape<KvT, kDims>::kRows;
  s.gr = (int)std::min<int64_t>(s.group, kRows);
  s.qt = kRows / s.gr;
  launch_kernel(attention_tile_kernel<KvT, kDims>,
                dim3(grid_x(ceil_div(s.T, s.qt)), (unsigned)s.KV, (unsigned)ceil_div(s.group, s.gr)),
                kDecThreads, 0, st, q, kc, vc, s, out);
}

}  // namespace

template <class KvT>
bool launch_tile(const float* q, const KvT* kc, const KvT* vc, const Shape& s, float* out, cudaStream_t st) {
  const bool aligned = reinterpret_cast<uintptr_t>(kc) % 16 == 0 && reinterpret_cast<uintptr_t>(vc) % 16 == 0;
  if (!aligned || !tile_enabled()) return false;
  switch (s.hd) {
    case 64:
      launch_tile_dims<KvT, 2>(q, kc, vc, s, out, st);
      return true;
    case 128:
      launch_tile_dims<KvT, 4>(q, kc, vc, s, out, st);
      return true;
    case 256:
      launch_tile_dims<KvT, 8>(q, kc, vc, s, out, st);
      return true;
    default:
      return false;
  }
}

template bool launch_tile<float>(const float*, const float*, const float*, const Shape&, float*,
                                 cudaStream_t);
template bool launch_tile<uint16_t>(const float*, const uint16_t*, const uint16_t*, const Shape&, float*,
                                    cudaStream_t);

}  // namespace strata::cuda::attn
