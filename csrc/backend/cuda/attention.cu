// KV cache store and causal GQA attention over an f32 or f16 cache: a prompt kernel (a tile of
// queries against 128-key blocks, online softmax) and a split-K decode kernel whose per-block partials
// a second kernel combines in key order. Both compute every (query, head) in the same float operations:
//
//   keys are taken in blocks of 128 by absolute position; per block, over the keys the query sees:
//     s_j  = dot(q, k_j) * scale         dot: lane l of a warp sums d = l, l + 32, ... with fmaf,
//                                         then the warp's butterfly sum
//     m_b  = max_j s_j,  p_j = expf(s_j - m_b)
//     l_b  = sum_j p_j                    lane l adds j = l, l + 32, ... in order, then butterfly
//     a_b  = sum_j p_j v_j                per dimension, fmaf over j in order
//   blocks fold in order into (m, l, acc), from (-inf, 0, 0):
//     m' = max(m, m_b), a = expf(m - m'), b = expf(m_b - m'), l = l*a + l_b*b, acc = acc*a + a_b*b
//   out = acc * (1 / l)
//
// so a token's output does not depend on the prompt chunking nor on which kernel ran it. This file
// builds with -fmad=false: nothing is fused but the fmaf written above.
// The prompt's tile kernel is in attention_tile.cu; what the two files share, in attention_impl.cuh.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/attention_impl.cuh"
#include "backend/cuda/common.cuh"
#include "core/env.h"

namespace strata::cuda {
namespace {
using namespace attn;

// The blocks of one (query tile, kv head, head chunk): rows r = tq * ng + gi are query t0 + tq at
// head kvh * group + g0 + gi. kSplit: the block handles key block blockIdx.x of the single query
// and writes its partial (m_b, l_b, a_b) to part_ml / part_acc; otherwise it runs over all the key
// blocks of its queries and writes out.
template <class KvT, bool kSplit>
__global__ void __launch_bounds__(kThreads)
    attention_kernel(const float* q, const KvT* kc, const KvT* vc, Shape sh, float* out, float* part_ml,
                     float* part_acc) {
  grid_start();
  extern __shared__ float smem[];
  const int64_t pos0 = sh.pos0 + (sh.pos_dev ? *sh.pos_dev : 0);
  // A launch sized for the largest position (a recorded graph) has key blocks past this one's keys.
  if (kSplit && (int64_t)blockIdx.x >= ceil_div(pos0 + 1, kKeyBlock)) return;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t hd = sh.hd, kvh = blockIdx.y;
  const int g0 = blockIdx.z * sh.gr;
  const int ng = (int)min((int64_t)sh.gr, sh.group - g0);
  const int64_t t0 = kSplit ? 0 : (int64_t)blockIdx.x * sh.qt;
  const int nq = kSplit ? 1 : (int)min((int64_t)sh.qt, sh.T - t0);
  const int R = ng * nq;
  const int64_t RH = R * hd;

  float* qs = smem;                           // [R][hd]
  float* sc = qs + RH;                        // [R][kKeyBlock]: scores, then p
  float* kv = sc + (int64_t)R * kKeyBlock;    // [ksub][hd]: K or V rows
  float* row_m = kv + (int64_t)sh.ksub * hd;  // running max and sum
  float* row_l = row_m + R;
  float* row_mb = row_l + R;  // this block's max and sum
  float* row_lb = row_mb + R;
  float* row_a = row_lb + R;  // fold factors
  float* row_b = row_a + R;
  int* row_nv = reinterpret_cast<int*>(row_b + R);  // keys of this block the row sees

  auto token = [&](int r) { return t0 + r / ng; };
  auto head = [&](int r) { return kvh * sh.group + g0 + r % ng; };
  auto n_keys = [&](int r) { return pos0 + token(r) + 1; };

  for (int64_t e = threadIdx.x; e < RH; e += kThreads) {
    const int r = (int)(e / hd);
    qs[e] = q[(token(r) * sh.H + head(r)) * hd + e % hd];
  }
  // This thread's output elements e = threadIdx.x + i * kThreads: row and dimension.
  float acc[kAccPerThread], accb[kAccPerThread];
  int er[kAccPerThread], ed[kAccPerThread];
#pragma unroll
  for (int i = 0; i < kAccPerThread; ++i) {
    const int64_t e = threadIdx.x + (int64_t)i * kThreads;
    er[i] = e < RH ? (int)(e / hd) : -1;
    ed[i] = e < RH ? (int)(e % hd) : 0;
    acc[i] = 0.0f;
  }
  for (int r = threadIdx.x; r < R; r += kThreads) {
    row_m[r] = -INFINITY;
    row_l[r] = 0.0f;
  }

  const int64_t keys = kSplit ? pos0 + 1 : pos0 + t0 + nq;  // the most any row sees
  const int64_t jb_begin = kSplit ? blockIdx.x : 0,
                jb_end = kSplit ? jb_begin + 1 : ceil_div(keys, kKeyBlock);
  for (int64_t jb = jb_begin; jb < jb_end; ++jb) {
    const int64_t j0 = jb * kKeyBlock, j1 = min(j0 + kKeyBlock, keys);
    // Scores: one warp per (row, key).
    for (int64_t s0 = j0; s0 < j1; s0 += sh.ksub) {
      const int ns = (int)min((int64_t)sh.ksub, j1 - s0);
      __syncthreads();  // kv is free again
      stage_kv(kv, kc, s0, ns, sh.KV, kvh, hd);
      __syncthreads();
      for (int p = warp; p < R * ns; p += kWarps) {
        const int r = p / ns, jj = p % ns;
        if (s0 + jj >= n_keys(r)) continue;
        const float* qr = qs + r * hd;
        const float* kr = kv + jj * hd;
        float d = 0.0f;
        for (int64_t i = lane; i < hd; i += kWarp) d = fmaf(qr[i], kr[i], d);
        d = warp_sum(d);
        if (lane == 0) sc[r * kKeyBlock + (s0 + jj - j0)] = d * sh.scale;
      }
    }
    __syncthreads();
    // Softmax of the block: one warp per row.
    for (int r = warp; r < R; r += kWarps) {
      const int nv = (int)max((int64_t)0, min((int64_t)kKeyBlock, n_keys(r) - j0));
      const float2 ml = block_softmax(sc + r * kKeyBlock, nv, lane);
      if (lane == 0) {
        row_nv[r] = nv;
        row_mb[r] = ml.x;
        row_lb[r] = ml.y;
      }
    }
    // a_b = sum_j p_j v_j, keys in order.
#pragma unroll
    for (int i = 0; i < kAccPerThread; ++i) accb[i] = 0.0f;
    for (int64_t s0 = j0; s0 < j1; s0 += sh.ksub) {
      const int ns = (int)min((int64_t)sh.ksub, j1 - s0);
      __syncthreads();  // kv is free again; the softmax's row_nv and p are visible
      stage_kv(kv, vc, s0, ns, sh.KV, kvh, hd);
      __syncthreads();
      for (int jj = 0; jj < ns; ++jj) {
        const int j = (int)(s0 - j0) + jj;
#pragma unroll
        for (int i = 0; i < kAccPerThread; ++i)
          if (er[i] >= 0 && j < row_nv[er[i]])
            accb[i] = fmaf(sc[er[i] * kKeyBlock + j], kv[jj * hd + ed[i]], accb[i]);
      }
    }
    if constexpr (kSplit) {
      const int64_t part = jb * sh.H;
      for (int r = threadIdx.x; r < R; r += kThreads) {
        part_ml[(part + head(r)) * 2] = row_mb[r];
        part_ml[(part + head(r)) * 2 + 1] = row_lb[r];
      }
#pragma unroll
      for (int i = 0; i < kAccPerThread; ++i)
        if (er[i] >= 0) part_acc[(part + head(er[i])) * hd + ed[i]] = accb[i];
    } else {
      for (int r = threadIdx.x; r < R; r += kThreads) {
        if (row_nv[r] == 0) continue;
        const Fold f = fold(row_m[r], row_l[r], row_mb[r], row_lb[r]);
        row_a[r] = f.a;
        row_b[r] = f.b;
      }
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kAccPerThread; ++i)
        if (er[i] >= 0 && row_nv[er[i]] > 0) acc[i] = acc[i] * row_a[er[i]] + accb[i] * row_b[er[i]];
    }
  }
  if constexpr (!kSplit) {
#pragma unroll
    for (int i = 0; i < kAccPerThread; ++i)
      if (er[i] >= 0) out[(token(er[i]) * sh.H + head(er[i])) * hd + ed[i]] = acc[i] * (1.0f / row_l[er[i]]);
  }
}

template <class KvT, int kDims>
__global__ void __launch_bounds__(kDecThreads)
    attention_decode_kernel(const float* q, const KvT* kc, const KvT* vc, Shape sh, float* part_ml,
                            float* part_acc, float* out, unsigned* tickets) {
  grid_start();
  constexpr int64_t hd = kDims * kWarp;
  constexpr int kRound = decode_round<KvT>(hd);  // keys staged at a time
  constexpr int kRoundPieces = kRound / kPiece;
  constexpr int kBufBytes = kRound * (int)hd * (int)sizeof(KvT);
  static_assert(kRound % kPiece == 0 && kKeyBlock % kRound == 0, "whole pieces, whole rounds");
  static_assert(kBufBytes + (kDecMaxGroup * kKeyBlock + 2 * kDecMaxGroup) * 4 + 16 <= 48 * 1024,
                "static shared memory of a decode block");
  __shared__ __align__(16) KvT buf[kRound * hd];
  __shared__ float sc[kDecMaxGroup * kKeyBlock];  // scores, then p, per head
  __shared__ float row_m[kDecMaxGroup], row_l[kDecMaxGroup];
  const int64_t pos0 = sh.pos0 + (sh.pos_dev ? *sh.pos_dev : 0);
  const int64_t jb = blockIdx.x;
  if (jb >= ceil_div(pos0 + 1, kKeyBlock)) return;  // a launch sized for the largest position
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  // Grid z: the kv head's query heads kDecMaxGroup at a time (the heads g0 .. g0 + group - 1).
  const int64_t g0 = (int64_t)blockIdx.z * kDecMaxGroup;
  const int group = (int)min((int64_t)kDecMaxGroup, sh.group - g0);
  const int64_t kvh = blockIdx.y, j0 = jb * kKeyBlock, h0 = kvh * sh.group + g0;
  const int nv = (int)min((int64_t)kKeyBlock, pos0 + 1 - j0);  // keys of this block the query sees
  const float* qg = q + h0 * hd;

  // Scores. The first round of values is loaded meanwhile, its wait overlapping the keys' work.
  Staged<KvT, kBufBytes> vst;
  load_keys(vst, vc, j0, min(kRound, nv), sh.KV, kvh, hd);
  for (int r0 = 0; r0 < nv; r0 += kRound) {
    const int nk = min(kRound, nv - r0);
    __syncthreads();  // buf is free
    Staged<KvT, kBufBytes> kst;
    load_keys(kst, kc, j0 + r0, nk, sh.KV, kvh, hd);
    store_keys(buf, kst, nk, hd);
    __syncthreads();
    for (int task = warp; task < group * kRoundPieces; task += kDecWarps) {
      const int h = task / kRoundPieces, k0 = task % kRoundPieces * kPiece;
      if (k0 >= nk) continue;
      float qr[kDims];
#pragma unroll
      for (int d = 0; d < kDims; ++d) qr[d] = qg[h * hd + lane + kWarp * d];
      float part[kWarp];
#pragma unroll
      for (int k = 0; k < kWarp; ++k) {
        float d = 0.0f;
        if (k0 + k < nk)
#pragma unroll
          for (int dd = 0; dd < kDims; ++dd)
            d = fmaf(qr[dd], kv_load(buf + (k0 + k) * hd + lane + kWarp * dd), d);
        part[k] = d;
      }
      const float score = transposed_sum(part, lane) * sh.scale;
      if (k0 + lane < nk) sc[h * kKeyBlock + r0 + k0 + lane] = score;
    }
  }
  __syncthreads();
  // Softmax of the block, a warp per head: m_b, p_j, l_b.
  for (int h = warp; h < group; h += kDecWarps) {
    const float2 ml = block_softmax(sc + h * kKeyBlock, nv, lane);
    if (lane == 0) {
      row_m[h] = ml.x;
      row_l[h] = ml.y;
    }
  }
  // a_b = sum_j p_j v_j, keys in order: a task is (head, 64 dims), lane l taking dims 2 l and 2 l + 1
  // (one load for both; each dim its own fma chain, as one dim a thread in the prompt kernel).
  constexpr int kPairDims = kDims / 2;  // 64-dim groups of a head
  static_assert(kDims % 2 == 0, "head dims of whole 64-dim groups");
  constexpr int kTasks = (kDecMaxGroup * kPairDims + kDecWarps - 1) / kDecWarps;
  float acc[kTasks][2] = {};
  for (int r0 = 0; r0 < nv; r0 += kRound) {
    const int nk = min(kRound, nv - r0);
    __syncthreads();  // buf is free; the softmax's p are visible
    if (r0 > 0) load_keys(vst, vc, j0 + r0, nk, sh.KV, kvh, hd);
    store_keys(buf, vst, nk, hd);
    __syncthreads();
#pragma unroll
    for (int t = 0; t < kTasks; ++t) {
      const int task = warp + t * kDecWarps, h = task / kPairDims, dg = task % kPairDims;
      if (h >= group) continue;
      const float* sr = sc + h * kKeyBlock + r0;
      const KvT* col = buf + dg * 2 * kWarp + 2 * lane;
#pragma unroll 4
      for (int k = 0; k < nk; ++k) {
        const float2 v = kv_load2(col + k * hd);
        const float p = sr[k];
        acc[t][0] = fmaf(p, v.x, acc[t][0]);
        acc[t][1] = fmaf(p, v.y, acc[t][1]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kTasks; ++t) {
    const int task = warp + t * kDecWarps, h = task / kPairDims, dg = task % kPairDims;
    if (h >= group) continue;
    const int64_t part = jb * sh.H + h0 + h;
    *reinterpret_cast<float2*>(part_acc + part * hd + dg * 2 * kWarp + 2 * lane) =
        make_float2(acc[t][0], acc[t][1]);
    if (dg == 0 && lane == 0) {
      part_ml[part * 2] = row_m[h];
      part_ml[part * 2 + 1] = row_l[h];
    }
  }
  if (!tickets) return;  // combine_kernel folds the partials
  // The last of this (kv head, head chunk)'s key blocks to finish folds its heads' partials
  // (combine_kernel's steps) and leaves its ticket zeroed for the next launch.
  __shared__ bool last;
  const int64_t nb = ceil_div(pos0 + 1, kKeyBlock);
  unsigned* ticket = tickets + kvh * gridDim.z + blockIdx.z;
  __threadfence();  // the partials before the ticket
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == nb - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int64_t o = threadIdx.x; o < group * hd; o += kDecThreads) {
    const int64_t h = h0 + o / hd, d = o % hd;
    out[h * hd + d] = combine_one(part_ml, part_acc, nb, sh.H, hd, h, d);
  }
  if (threadIdx.x == 0) *ticket = 0;
}

// The decode combine: per head, the key blocks' partials folded in key order, one thread per dim (from the
// window's first block; the head's sink last).
__global__ void __launch_bounds__(kThreads)
    combine_kernel(const float* part_ml, const float* part_acc, int64_t pos0, const int32_t* pos_dev,
                   int64_t H, int64_t hd, int64_t key_block, int64_t window, const float* sinks, float* out) {
  grid_start();
  const int64_t h = blockIdx.x;
  const int64_t p = pos0 + (pos_dev ? *pos_dev : 0);
  const int64_t nb = ceil_div(p + 1, key_block), jb_lo = window_lo(p, window) / key_block;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x)
    out[h * hd + d] = combine_one(part_ml, part_acc, nb, H, hd, h, d, jb_lo, sinks ? sinks + h : nullptr);
}

// combine_kernel's fold with its serial chains shortened, the same float operations: fold() at block j
// computes M_j = fmaxf(M_{j-1}, m_j) (from M_{-1} = -inf), a_j = expf(M_{j-1} - M_j), b_j = expf(m_j - M_j),
// then l = l a_j + l_j b_j and acc = acc a_j + x_j b_j. The running max is exact in any grouping (a zero's
// sign, the one thing a grouping could change, changes no difference fed to expf; fmaxf drops a NaN in any
// grouping): warp 0 scans it 32 blocks at a time with shuffles. Every (a_j, b_j) is then computed at once, by
// a thread each, and only the l and acc chains stay serial: one thread per dim (threads hd .. hd + 31: the
// extra warp, its lane 0 taking l). A thread's partials arrive in two register batches of kCombineBatch, the
// next batch's loads issued before the current one's fold, so 2 kCombineBatch loads are in flight where
// one batch at a time paid a memory round trip per 16 key blocks (14.8 us a call at 8K keys on an H100).
// Shared memory: 5 nb_max floats. Under a sliding window the blocks from the window's first on (j counts
// from it); with sinks the head's sink folds last, as combine_one folds it.
constexpr int kCombineBatch = 32;  // part_acc loads a register batch
__global__ void __launch_bounds__(kThreads + kWarp)
    combine_scan_kernel(const float* part_ml, const float* part_acc, int64_t pos0, const int32_t* pos_dev,
                        int64_t H, int64_t hd, int64_t key_block, int64_t window, const float* sinks,
                        float* out) {
  grid_start();
  extern __shared__ float sm[];
  const int64_t h = blockIdx.x;
  const int64_t pos = pos0 + (pos_dev ? *pos_dev : 0);
  const int64_t jb_lo = window_lo(pos, window) / key_block;
  const int nb = (int)(ceil_div(pos + 1, key_block) - jb_lo);
  part_ml += jb_lo * H * 2;  // block jb_lo's partials first
  part_acc += jb_lo * H * hd;
  float *mb = sm, *lb = sm + nb, *mx = sm + 2 * nb, *fa = sm + 3 * nb, *fb = sm + 4 * nb;
  const int tid = threadIdx.x, nt = blockDim.x;
  for (int j = tid; j < nb; j += nt) {
    const int64_t p = (int64_t)j * H + h;
    mb[j] = __ldcg(part_ml + p * 2);
    lb[j] = __ldcg(part_ml + p * 2 + 1);
  }
  __syncthreads();
  if (tid < kWarp) {  // the running max: an inclusive max-scan of 32 blocks at a time, carried over
    float carry = -INFINITY;
    for (int j0 = 0; j0 < nb; j0 += kWarp) {
      float v = j0 + tid < nb ? mb[j0 + tid] : -INFINITY;
#pragma unroll
      for (int o = 1; o < kWarp; o <<= 1) {
        const float u = __shfl_up_sync(0xffffffffu, v, o);
        if (tid >= o) v = fmaxf(v, u);
      }
      v = fmaxf(carry, v);
      if (j0 + tid < nb) mx[j0 + tid] = v;
      carry = __shfl_sync(0xffffffffu, v, kWarp - 1);
    }
  }
  __syncthreads();
  for (int j = tid; j < nb; j += nt) {
    const float prev = j > 0 ? mx[j - 1] : -INFINITY;
    fa[j] = expf(prev - mx[j]);
    fb[j] = expf(mb[j] - mx[j]);
  }
  __syncthreads();
  // The sink's step (fold(m, l, sink, 1) after the last block): its two factors.
  float sa = 1.0f, sb = 0.0f;
  if (sinks) {
    const float m = mx[nb - 1], sink = sinks[h], m_new = fmaxf(m, sink);
    sa = expf(m - m_new);
    sb = expf(sink - m_new);
  }
  __shared__ float l_all;
  if (tid == hd) {
    float l = 0.0f;
    for (int j = 0; j < nb; ++j) l = l * fa[j] + lb[j] * fb[j];
    if (sinks) l = l * sa + 1.0f * sb;
    l_all = l;
  }
  float acc = 0.0f;
  if (tid < hd) {
    const float* x = part_acc + h * hd + tid;
    const int64_t step = H * hd;
    auto load = [&](float (&v)[kCombineBatch], int j0) {
#pragma unroll
      for (int k = 0; k < kCombineBatch; ++k)
        v[k] = j0 + k < nb ? __ldcg(x + (int64_t)(j0 + k) * step) : 0.0f;
    };
    auto fold = [&](const float (&v)[kCombineBatch], int j0) {
#pragma unroll
      for (int k = 0; k < kCombineBatch; ++k)
        if (j0 + k < nb) acc = acc * fa[j0 + k] + v[k] * fb[j0 + k];
    };
    float va[kCombineBatch], vb[kCombineBatch];
    load(va, 0);
    load(vb, kCombineBatch);
    for (int j0 = 0; j0 < nb; j0 += 2 * kCombineBatch) {
      fold(va, j0);
      if (j0 + 2 * kCombineBatch < nb) load(va, j0 + 2 * kCombineBatch);
      if (j0 + kCombineBatch < nb) fold(vb, j0 + kCombineBatch);
      if (j0 + 3 * kCombineBatch < nb) load(vb, j0 + 3 * kCombineBatch);
    }
    if (sinks) acc = acc * sa + 0.0f * sb;
  }
  __syncthreads();
  if (tid < hd) out[h * hd + tid] = acc * (1.0f / l_all);
}

// The decode combine of H heads over up to nb_max key blocks of key_block keys: combine_scan_kernel where its
// shared memory fits (contexts up to ~150K keys), else combine_kernel.
void launch_combine(const float* part_ml, const float* part_acc, int64_t pos0, const int32_t* pos_dev,
                    int64_t H, int64_t hd, int64_t key_block, int64_t nb_max, float* out, cudaStream_t st,
                    int64_t window = 0, const float* sinks = nullptr) {
  const size_t smem = (size_t)nb_max * 5 * sizeof(float);
  if (hd <= kThreads && smem <= 48 * 1024) {
    launch_kernel(combine_scan_kernel, grid_x(H), (unsigned)(ceil_div(hd, kWarp) * kWarp + kWarp), smem, st,
                  part_ml, part_acc, pos0, pos_dev, H, hd, key_block, window, sinks, out);
  } else {
    launch_kernel(combine_kernel, grid_x(H),
                  (unsigned)std::min<int64_t>(kThreads, ceil_div(hd, kWarp) * kWarp), 0, st, part_ml,
                  part_acc, pos0, pos_dev, H, hd, key_block, window, sinks, out);
  }
}

// The tensor-core family (attention_mma.cu) for shape s: the prompt kernel, or a decode step's key blocks and
// the combine (with s.window and s.sinks: gpt-oss's attention).
void launch_mma_family(const float* q, const uint16_t* kc, const uint16_t* vc, const Shape& s,
                       const PosSource& ps, bool split, void* scratch, float* out, cudaStream_t st) {
  if (!split) {
    launch_mma_prompt(q, kc, vc, s, out, st);
    STRATA_CUDA_LAUNCH_CHECK();
    return;
  }
  const int64_t nb = ps.dev ? ceil_div(ps.max_pos, kMmaKeyBlock) : ceil_div(s.pos0 + 1, kMmaKeyBlock);
  float* part_ml = static_cast<float*>(scratch);
  float* part_acc = part_ml + nb * s.H * 2;
  launch_mma_decode(q, kc, vc, s, nb, part_ml, part_acc, st);
  STRATA_CUDA_LAUNCH_CHECK();
  launch_combine(part_ml, part_acc, s.pos0, ps.dev, s.H, s.hd, (int64_t)kMmaKeyBlock, nb, out, st, s.window,
                 s.sinks);
  STRATA_CUDA_LAUNCH_CHECK();
}

__global__ void kv_store_f32_kernel(float* dst, const int32_t* pos_dev, int64_t width, const float* src,
                                    int64_t n) {
  grid_start();
  if (pos_dev) dst += (int64_t)*pos_dev * width;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

__global__ void kv_store_f16_kernel(uint16_t* dst, const int32_t* pos_dev, int64_t width, const float* src,
                                    int64_t n) {
  grid_start();
  if (pos_dev) dst += (int64_t)*pos_dev * width;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = __half_as_ushort(__float2half_rn(src[i]));
}

// The kernel choice: a single query (decode) splits its keys over blocks, since its one tile of
// queries per kv head could not fill the GPU; a prompt's query tiles do.
bool attention_should_split(int64_t T) { return T == 1; }

// Rows per block and queries per block: at most kMaxRows rows and kMaxRowFloats row floats.
Shape make_shape(int64_t T, int64_t pos0, const int32_t* pos_dev, int64_t H, int64_t KV, int64_t hd,
                 float scale, bool split) {
  STRATA_CHECK(H > 0 && KV > 0 && H % KV == 0, ConfigError, "attention: ", H,
               " query heads are not a multiple of ", KV, " kv heads");
  STRATA_CHECK(hd > 0 && hd <= kMaxRowFloats, UnsupportedError, "attention: head_dim ", hd,
               " is larger than the CUDA kernel's ", kMaxRowFloats);
  Shape s{};
  s.T = T;
  s.pos0 = pos0;
  s.pos_dev = pos_dev;
  s.H = H;
  s.KV = KV;
  s.hd = hd;
  s.group = H / KV;
  s.scale = scale;
  const int64_t max_rows = std::min<int64_t>(kMaxRows, kMaxRowFloats / hd);
  // Decode: kSplitHeads query heads a block (grid z takes the rest of the group), so that even a short
  // context has a few blocks per kv head and key block; its keys are staged as many at a time as
  // shared memory holds (fewer waits on memory). Neither changes a float operation.
  s.gr = (int)std::min(s.group, split ? (hd <= 1024 ? kSplitHeads : 1) : max_rows);
  s.qt = split ? 1 : (int)std::max<int64_t>(1, max_rows / s.gr);
  if (split) {
    const int64_t R = s.gr, fixed = R * hd + R * kKeyBlock + 7 * R;
    s.ksub = (int)std::clamp<int64_t>((kSmemFloats - fixed) / hd, 1, kKeyBlock);
  } else {
    s.ksub = (int)std::clamp<int64_t>(kStageFloats / hd, 1, kKeyBlock);
  }
  return s;
}

size_t smem_bytes(const Shape& s) {
  const int64_t R = (int64_t)s.gr * s.qt;
  return (size_t)(R * s.hd + R * kKeyBlock + (int64_t)s.ksub * s.hd + 7 * R) * sizeof(float);
}

// attention_decode_kernel where its shape allows (head dims 64, 128 and 256, and on an f16 cache 512 and
// 576: gemma4's global layers, MLA's latent rows; any query heads per kv head, kDecMaxGroup a block;
// 16-byte aligned caches); false otherwise (the general split kernel then runs).
template <class KvT, int kDims>
void launch_decode_dims(const float* q, const KvT* kc, const KvT* vc, const Shape& s, int64_t nb,
                        float* part_ml, float* part_acc, float* out, unsigned* tickets, cudaStream_t st) {
  launch_kernel(attention_decode_kernel<KvT, kDims>,
                dim3(grid_x(nb), (unsigned)s.KV, (unsigned)ceil_div(s.group, kDecMaxGroup)), kDecThreads, 0,
                st, q, kc, vc, s, part_ml, part_acc, out, tickets);
}
// With tickets (zeroed words, one per kv head and head chunk) the kernel also folds the partials into out.
template <class KvT>
bool launch_decode(const float* q, const KvT* kc, const KvT* vc, const Shape& s, int64_t nb, float* part_ml,
                   float* part_acc, float* out, unsigned* tickets, cudaStream_t st) {
  const bool aligned = reinterpret_cast<uintptr_t>(kc) % 16 == 0 && reinterpret_cast<uintptr_t>(vc) % 16 == 0;
  if (!aligned) return false;
  switch (s.hd) {
    case 64:
      launch_decode_dims<KvT, 2>(q, kc, vc, s, nb, part_ml, part_acc, out, tickets, st);
      return true;
    case 128:
      launch_decode_dims<KvT, 4>(q, kc, vc, s, nb, part_ml, part_acc, out, tickets, st);
      return true;
    case 256:
      launch_decode_dims<KvT, 8>(q, kc, vc, s, nb, part_ml, part_acc, out, tickets, st);
      return true;
    default:
      break;
  }
  if constexpr (std::is_same_v<KvT, uint16_t>) {  // an f32 round of these would not fit shared memory
    if (s.hd == 512) {
      launch_decode_dims<KvT, 16>(q, kc, vc, s, nb, part_ml, part_acc, out, tickets, st);
      return true;
    }
    if (s.hd == 576) {
      launch_decode_dims<KvT, 18>(q, kc, vc, s, nb, part_ml, part_acc, out, tickets, st);
      return true;
    }
  }
  return false;
}

template <class KvT>
void launch_typed(const float* q, const KvT* kc, const KvT* vc, int64_t T, int64_t pos0, const PosSource& ps,
                  int64_t H, int64_t KV, int64_t hd, float scale, float* out, void* scratch,
                  const AttentionTickets& tk, cudaStream_t st) {
  const bool split = attention_should_split(T);
  const Shape s = make_shape(T, pos0, ps.dev, H, KV, hd, scale, split);
  const size_t smem = smem_bytes(s);
  const unsigned chunks = (unsigned)ceil_div(s.group, s.gr);
  if constexpr (std::is_same_v<KvT, uint16_t>) {
    if (mla_usable(hd, kc, vc)) {  // MLA's latent rows: prompt and decode alike
      if (!split) {
        launch_mla_prompt(q, kc, s, out, st);
        STRATA_CUDA_LAUNCH_CHECK();
        return;
      }
      const int64_t nb = ps.dev ? ceil_div(ps.max_pos, kMmaKeyBlock) : ceil_div(pos0 + 1, kMmaKeyBlock);
      float* part_ml = static_cast<float*>(scratch);
      float* part_acc = part_ml + nb * H * 2;
      launch_mla_decode(q, kc, s, nb, part_ml, part_acc, st);
      STRATA_CUDA_LAUNCH_CHECK();
      launch_combine(part_ml, part_acc, pos0, ps.dev, H, hd, (int64_t)kMmaKeyBlock, nb, out, st);
      STRATA_CUDA_LAUNCH_CHECK();
      return;
    }
    if (mma_usable(hd, kc, vc)) {  // the tensor-core family, prompt and decode alike
      launch_mma_family(q, kc, vc, s, ps, split, scratch, out, st);
      return;
    }
  }
  if (split) {
    // With a position source the grid covers every position below max_pos; blocks past the keys return.
    const int64_t nb = ps.dev ? ceil_div(ps.max_pos, kKeyBlock) : ceil_div(pos0 + 1, kKeyBlock);
    float* part_ml = static_cast<float*>(scratch);
    float* part_acc = part_ml + nb * H * 2;
    unsigned* tickets = KV * ceil_div(s.group, kDecMaxGroup) <= tk.count ? tk.words : nullptr;
    if (launch_decode(q, kc, vc, s, nb, part_ml, part_acc, out, tickets, st)) {
      STRATA_CUDA_LAUNCH_CHECK();
      if (tickets) return;  // combined by the kernel's last blocks
    } else {
      launch_kernel(attention_kernel<KvT, true>, dim3(grid_x(nb), (unsigned)KV, chunks), kThreads, smem, st,
                    q, kc, vc, s, out, part_ml, part_acc);
      STRATA_CUDA_LAUNCH_CHECK();
    }
    launch_combine(part_ml, part_acc, pos0, ps.dev, H, hd, (int64_t)kKeyBlock, nb, out, st);
    STRATA_CUDA_LAUNCH_CHECK();
  } else if (launch_tile(q, kc, vc, s, out, st)) {
    STRATA_CUDA_LAUNCH_CHECK();
  } else {
    launch_kernel(attention_kernel<KvT, false>, dim3(grid_x(ceil_div(T, s.qt)), (unsigned)KV, chunks),
                  kThreads, smem, st, q, kc, vc, s, out, nullptr, nullptr);
    STRATA_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace

void launch_kv_store(void* cache, KvType t, int64_t pos0, const PosSource& ps, int64_t T, int64_t width,
                     const float* src, cudaStream_t s) {
  const int64_t n = T * width;
  if (n <= 0) return;
  const unsigned blocks = (unsigned)std::min<int64_t>(ceil_div(n, kThreads), 4096);
  if (t == KvType::F32) {
    launch_kernel(kv_store_f32_kernel, blocks, kThreads, 0, s, static_cast<float*>(cache) + pos0 * width,
                  ps.dev, width, src, n);
  } else {
    launch_kernel(kv_store_f16_kernel, blocks, kThreads, 0, s, static_cast<uint16_t*>(cache) + pos0 * width,
                  ps.dev, width, src, n);
  }
  STRATA_CUDA_LAUNCH_CHECK();
}

size_t attention_scratch_bytes(int64_t T, int64_t pos0, int64_t n_head, int64_t head_dim) {
  if (!attention_should_split(T)) return 0;
  // Partials of the smaller of the two families' key blocks.
  static_assert(kMmaKeyBlock <= kKeyBlock, "the scratch holds the finer blocks' partials");
  return (size_t)(ceil_div(pos0 + 1, kMmaKeyBlock) * n_head * (head_dim + 2)) * sizeof(float);
}

size_t attention_scratch_max_bytes(int64_t max_pos, int64_t n_head, int64_t head_dim) {
  return attention_scratch_bytes(1, std::max<int64_t>(max_pos, 1) - 1, n_head, head_dim);
}

void launch_attention(const float* q, const void* kc, const void* vc, KvType t, int64_t T, int64_t pos0,
                      const PosSource& ps, int64_t n_head, int64_t n_kv_head, int64_t head_dim, float scale,
                      float* out, void* scratch, const AttentionTickets& tickets, cudaStream_t s) {
  if (T <= 0) return;
  if (t == KvType::F32)
    launch_typed(q, static_cast<const float*>(kc), static_cast<const float*>(vc), T, pos0, ps, n_head,
                 n_kv_head, head_dim, scale, out, scratch, tickets, s);
  else
    launch_typed(q, static_cast<const uint16_t*>(kc), static_cast<const uint16_t*>(vc), T, pos0, ps, n_head,
                 n_kv_head, head_dim, scale, out, scratch, tickets, s);
}

bool attention_mma_sinks_usable(KvType t, int64_t head_dim, const void* kc, const void* vc) {
  return t == KvType::F16 && env_switch("STRATA_CUDA_SINKS_MMA", true) && mma_usable(head_dim, kc, vc);
}

void launch_attention_mma_sinks(const float* q, const void* kc, const void* vc, int64_t T, int64_t pos0,
                                const PosSource& ps, int64_t n_head, int64_t n_kv_head, int64_t head_dim,
                                float scale, const float* sinks, int64_t window, float* out, void* scratch,
                                cudaStream_t s) {
  STRATA_CHECK(window >= 0, ConfigError, "attention: window ", window, " is negative");
  if (T <= 0) return;
  const bool split = attention_should_split(T);
  Shape sh = make_shape(T, pos0, ps.dev, n_head, n_kv_head, head_dim, scale, split);
  sh.window = window;
  sh.sinks = sinks;
  launch_mma_family(q, static_cast<const uint16_t*>(kc), static_cast<const uint16_t*>(vc), sh, ps, split,
                    scratch, out, s);
}

}  // namespace strata::cuda
