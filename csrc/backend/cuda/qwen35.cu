// qwen35moe's ops on CUDA (qwen35.cuh). Each output element is computed the same way whatever T is and
// however a sequence's positions are split into passes: the delta rule runs a block per value head over
// its positions in order, each position from the chunk's state and the chunk's earlier rows only, with
// reductions whose shape depends on the dims alone. Against the CPU's ops they agree within the op
// harness's bounds (the reductions' order and the transcendentals differ).
#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "backend/cuda/common.cuh"
#include "backend/cuda/qwen35.cuh"
#include "core/env.h"
#include "core/error.h"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256, kDeltaThreads = 128;

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float siluf(float x) { return x * sigmoidf(x); }
// torch's softplus (beta 1, threshold 20).
__device__ __forceinline__ float softplusf(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// The sum of v over the block (every thread gets it); red holds a float per warp. Ends in a barrier.
__device__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nw = blockDim.x / kWarp;
  __syncthreads();  // red's previous readers are done
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < nw; ++w) s += red[w];
  return s;
}

// conv1d_silu_at's choice: copy[0] set, the state copies of position pos0 + *pos_dev (pos_dev null: pos0).
struct ConvAt {
  float* copy[2];
  int64_t pos0;
  const int32_t* pos_dev;
};

// Thread e of T x C outputs and then (Kc - 1) x C state rows, grid-stride: output (t, c) over its Kc taps in
// order (each output its own thread: a prompt's T x C outputs spread over the GPU, not its C channels' T each
// on one thread), then state_out's element. state_out overlaps neither x nor state_in (the op's contract).
__global__ void __launch_bounds__(kThreads)
    conv1d_silu_kernel(const float* x, int64_t T, int64_t C, int64_t Kc, const float* w,
                       const float* state_in, float* state_out, float* y, ConvAt at) {
  grid_start();
  if (at.copy[0]) {
    const int64_t p = at.pos0 + (at.pos_dev ? *at.pos_dev : 0);
    state_in = p == 0 ? nullptr : at.copy[p % 2];
    state_out = at.copy[(p + 1) % 2];
  }
  const int64_t S = Kc - 1, n = T * C, total = n + S * C;
  const auto xx = [&](int64_t r, int64_t c) {
    return r < S ? (state_in ? state_in[r * C + c] : 0.0f) : x[(r - S) * C + c];
  };
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
       e += (int64_t)gridDim.x * blockDim.x) {
    if (e < n) {
      const int64_t t = e / C, c = e % C;
      const float* wc = w + c * Kc;
      float acc = 0.0f;
      for (int64_t j = 0; j < Kc; ++j) acc = __fadd_rn(acc, __fmul_rn(wc[j], xx(t + j, c)));
      y[e] = siluf(acc);
    } else {
      const int64_t r = (e - n) / C, c = (e - n) % C;
      state_out[r * C + c] = xx(T + r, c);
    }
  }
}

struct DeltaArgs {
  const float *qkv, *a, *b, *A, *dt_bias;
  int64_t T, pos0, C, Hk, Hv, dk, dv;
  bool fresh;
  float *s_cur, *s_other, *rows_k, *rows_d, *rows_g, *out;
  // gated_delta_at: state[0] set, the position is pos0 + *pos_dev (pos_dev null: pos0), fresh at 0, and
  // s_cur state[(position / C) % 2], s_other the other.
  float* state[2] = {nullptr, nullptr};
  const int32_t* pos_dev = nullptr;
  unsigned* counters = nullptr;  // the split form's: a per-head count of blocks past their first reads
};

// The sums of a and b over the block (block_sum's order for each, one pair of barriers for both); red holds
// two floats per warp. Ends in a barrier.
__device__ float2 block_sum2(float a, float b, float* red) {
  a = warp_sum(a);
  b = warp_sum(b);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nw = blockDim.x / kWarp;
  __syncthreads();
  if (lane == 0) {
    red[warp] = a;
    red[nw + warp] = b;
  }
  __syncthreads();
  float sa = 0.0f, sb = 0.0f;
  for (int w = 0; w < nw; ++w) sa += red[w];
  for (int w = 0; w < nw; ++w) sb += red[nw + w];
  return make_float2(sa, sb);
}

// A pass of head h: its first position and its state in the two buffers (the current chunk's, the next's);
// gated_delta_at's from the position (chunk c's state in copy c % 2, fresh at 0), the chunked form's as
// given.
struct DeltaPass {
  int64_t pos0;
  bool fresh;
  float *S, *S_next;
};
__device__ __forceinline__ DeltaPass delta_pass(const DeltaArgs& g, int64_t h) {
  DeltaPass p{g.pos0, g.fresh, g.s_cur, g.s_other};
  if (g.state[0]) {
    p.pos0 += g.pos_dev ? *g.pos_dev : 0;
    p.fresh = p.pos0 == 0;
    const int odd = static_cast<int>(p.pos0 / g.C % 2);
    p.S = g.state[odd];
    p.S_next = g.state[1 - odd];
  }
  p.S += h * g.dk * g.dv;
  p.S_next += h * g.dk * g.dv;
  return p;
}

// Entry (i, j) of the next chunk's state at the chunk's last position `slot`: Gp s + the sum over m <= slot
// of (m < slot ? em[m] : 1) k_m[i] d_m[j], in order of m (key_i(m) = k_m[i], delta_j(m) = d_m[j]).
template <class KeyI, class DeltaJ>
__device__ __forceinline__ float next_state(float Gp, float s, const float* em, int64_t slot, KeyI&& key_i,
                                            DeltaJ&& delta_j) {
  float sn = __fmul_rn(Gp, s);
  for (int64_t m = 0; m <= slot; ++m) {
    const float w = __fmul_rn(m < slot ? em[m] : 1.0f, key_i(m));
    sn = __fadd_rn(sn, __fmul_rn(w, delta_j(m)));
  }
  return sn;
}

// k_p . k_m and q_p . k_m over dims [i0, i1), each summed in order of i.
__device__ __forceinline__ float2 key_overlaps(const float* kn, const float* qn, const float* km, int64_t i0,
                                               int64_t i1) {
  float dkk = 0.0f, dqk = 0.0f;
  for (int64_t i = i0; i < i1; ++i) {
    dkk = __fadd_rn(dkk, __fmul_rn(kn[i], km[i]));
    dqk = __fadd_rn(dqk, __fmul_rn(qn[i], km[i]));
  }
  return make_float2(dkk, dqk);
}

// A thread's partial sums of squares of q and k (elements i = first, first + step, .. below dk, in order).
__device__ __forceinline__ float2 sq_partials(const float* q, const float* k, int64_t dk, int64_t first,
                                              int64_t step) {
  float pq = 0.0f, pk = 0.0f;
  for (int64_t i = first; i < dk; i += step) {
    pq = __fadd_rn(pq, __fmul_rn(q[i], q[i]));
    pk = __fadd_rn(pk, __fmul_rn(k[i], k[i]));
  }
  return make_float2(pq, pk);
}

// Position t's query and key rows of key head kh, each over its norm (the query also over sqrt(dk)), into
// qn and kn by the block (each thread the elements i = tid, tid + nt, ..); returns the position's value row
// of head h. Ends in a barrier.
__device__ __forceinline__ const float* delta_norms(const DeltaArgs& g, int64_t t, int64_t h, int64_t kh,
                                                    float* qn, float* kn, float* red) {
  const int64_t dk = g.dk, W = 2 * g.Hk * dk + g.Hv * g.dv;
  const int tid = threadIdx.x, nt = blockDim.x;
  const float* q = g.qkv + t * W + kh * dk;
  const float* k = g.qkv + t * W + g.Hk * dk + kh * dk;
  const float2 p = sq_partials(q, k, dk, tid, nt);
  const float2 sqk = block_sum2(p.x, p.y, red);
  const float rq = 1.0f / sqrtf(sqk.x + 1e-6f), rk = 1.0f / sqrtf(sqk.y + 1e-6f);
  const float scale = 1.0f / sqrtf(static_cast<float>(dk));
  for (int64_t i = tid; i < dk; i += nt) {
    qn[i] = __fmul_rn(__fmul_rn(q[i], rq), scale);
    kn[i] = __fmul_rn(k[i], rk);
  }
  return g.qkv + t * W + 2 * g.Hk * dk + h * g.dv;
}

// Block h: value head h's positions in order (backend/qwen35_ops.h's chunked form). Shared memory: qn, kn
// (dk each), em, wk, wq (C each), the reductions' per-warp sums (two a warp) and two scalars; with kRows
// also the chunk's gates (C), key rows (C x (dk + 1), the padding spreading a column over the banks) and
// delta rows (C x dv), which each position reads n times: the rows of the positions before the pass come
// from global memory once, the pass's own are written to both. Without kRows every read goes to global
// memory (a device whose shared memory cannot hold them). The float operations and their order are the
// same either way, so are the bits.
template <bool kRows>
__global__ void __launch_bounds__(kDeltaThreads) gated_delta_kernel(DeltaArgs g) {
  grid_start();
  extern __shared__ float sm[];
  const int64_t dk = g.dk, dv = g.dv, C = g.C, Hv = g.Hv, h = blockIdx.x, kh = h % g.Hk;
  float* qn = sm;
  float* kn = qn + dk;
  float* em = kn + dk;
  float* wk = em + C;
  float* wq = wk + C;
  float* red = wq + C;
  float* scal = red + 2 * (kDeltaThreads / kWarp);
  float* gsm = scal + 2;  // kRows
  const int64_t kst = dk + 1;
  float* ksm = gsm + C;
  float* dsm = ksm + C * kst;
  const int tid = threadIdx.x, nt = blockDim.x;
  const DeltaPass ps = delta_pass(g, h);
  const int64_t pos0 = ps.pos0;
  const bool fresh = ps.fresh;
  float* S = ps.S;  // S_a of the current chunk; the other buffer takes the next one
  float* S_next = ps.S_next;
  if (fresh)
    for (int64_t i = tid; i < dk * dv; i += nt) S[i] = 0.0f;
  const auto key_g = [&](int64_t s) { return g.rows_k + (s * Hv + h) * dk; };
  const auto delta_g = [&](int64_t s) { return g.rows_d + (s * Hv + h) * dv; };
  const auto key = [&](int64_t s) -> const float* {
    if constexpr (kRows) return ksm + s * kst;
    return key_g(s);
  };
  const auto delta = [&](int64_t s) -> const float* {
    if constexpr (kRows) return dsm + s * dv;
    return delta_g(s);
  };
  const auto gate = [&](int64_t m) {
    if constexpr (kRows) return gsm[m];
    return g.rows_g[m * Hv + h];
  };
  if constexpr (kRows) {  // the chunk's rows before this pass
    const int64_t n0 = pos0 % C;
    for (int64_t e = tid; e < n0 * dk; e += nt) ksm[e / dk * kst + e % dk] = key_g(e / dk)[e % dk];
    for (int64_t e = tid; e < n0 * dv; e += nt) dsm[e] = delta_g(e / dv)[e % dv];
    for (int64_t m = tid; m < n0; m += nt) gsm[m] = g.rows_g[m * Hv + h];
    __syncthreads();
  }
  for (int64_t t = 0; t < g.T; ++t) {
    const int64_t p = pos0 + t, slot = p % C, n = slot;
    const float* v = delta_norms(g, t, h, kh, qn, kn, red);
    float* ks = key_g(slot);
    for (int64_t i = tid; i < dk; i += nt) {  // this thread's own elements of kn
      ks[i] = kn[i];
      if constexpr (kRows) ksm[slot * kst + i] = kn[i];
    }
    if (tid == 0) {
      const float gg = __fmul_rn(g.A[h], softplusf(__fadd_rn(g.a[t * Hv + h], g.dt_bias[h])));
      // The decay from each earlier position m to p, exp(g_{m+1} + ... + g_p), summed back from p: the sums
      // here, their exponentials by every thread below.
      float acc = gg;
      for (int64_t m = n - 1; m >= 0; --m) {
        em[m] = acc;
        acc = __fadd_rn(acc, gate(m));
      }
      g.rows_g[slot * Hv + h] = gg;
      if constexpr (kRows) gsm[slot] = gg;
      scal[0] = expf(acc);  // from the chunk's start
      scal[1] = sigmoidf(g.b[t * Hv + h]);
    }
    __syncthreads();
    const float Gp = scal[0], beta = scal[1];
    // The chunk's earlier positions, each weighted by its decay to p and its key's overlap.
    for (int64_t m = tid; m < n; m += nt) {
      const float e = expf(em[m]);
      em[m] = e;
      const float2 o = key_overlaps(kn, qn, key(m), 0, dk);
      wk[m] = __fmul_rn(e, o.x);
      wq[m] = __fmul_rn(e, o.y);
    }
    float pqk = 0.0f;
    for (int64_t i = tid; i < dk; i += nt) pqk = __fadd_rn(pqk, __fmul_rn(qn[i], kn[i]));
    const float qk = block_sum(pqk, red);  // its barriers also publish em, wk, wq
    float* dps = delta_g(slot);
    float* o = g.out + (t * Hv + h) * dv;
    for (int64_t j = tid; j < dv; j += nt) {
      float kS = 0.0f, qS = 0.0f;
      for (int64_t i = 0; i < dk; ++i) {
        const float sij = S[i * dv + j];
        kS = __fadd_rn(kS, __fmul_rn(sij, kn[i]));
        qS = __fadd_rn(qS, __fmul_rn(sij, qn[i]));
      }
      float d = __fsub_rn(v[j], __fmul_rn(Gp, kS));
      for (int64_t m = 0; m < n; ++m) d = __fsub_rn(d, __fmul_rn(wk[m], delta(m)[j]));
      const float dp = __fmul_rn(d, beta);
      dps[j] = dp;
      if constexpr (kRows) dsm[slot * dv + j] = dp;
      float oj = __fmul_rn(Gp, qS);
      for (int64_t m = 0; m < n; ++m) oj = __fadd_rn(oj, __fmul_rn(wq[m], delta(m)[j]));
      o[j] = __fadd_rn(oj, __fmul_rn(qk, dp));
    }
    __syncthreads();  // this position's key and delta rows are written; the next one's reads follow
    if (slot != C - 1) continue;
    // The chunk's last position: the next chunk's state, then the buffers swap roles.
    for (int64_t e = tid; e < dk * dv; e += nt) {
      const int64_t i = e / dv, j = e % dv;
      const float sn = next_state(
          Gp, S[e], em, slot, [&](int64_t m) { return key(m)[i]; }, [&](int64_t m) { return delta(m)[j]; });
      S_next[e] = sn;
    }
    __syncthreads();
    float* tmp = S;
    S = S_next;
    S_next = tmp;
  }
}

// ---- the delta rule with a head's value columns over several blocks (the default) ----
// gated_delta_kernel runs a head's positions on one block of 128 threads, a value column a thread: each
// position is a chain of ~dk + 2 n dependent steps a thread, on 32 blocks for q36 (ncu: 24% of the SMs
// active, 4 warps on each; 27 ms a layer for 2048 positions). Here block (h, g) takes value columns
// g * kSplitCols .. of head h, its 4 warps the 4 parts of each sum: warp r forms the partial sums over its
// quarter of i (S's rows against kn and qn) and of m (the chunk's earlier delta rows against wk and wq),
// lane l is column l of the group, and warp 0 adds the 4 partials in order of r and finishes the column. The
// chunk's state columns of the group, its key rows, its delta columns and its gates stay in shared memory.
// Every block of a head forms the position's norms, decays and key overlaps itself (the same values: the
// same operations on the same inputs). The float operations of an output depend on n (the position in its
// chunk) and the dims only, so any split into passes gives the same bits, and a decode step's the prompt's;
// against gated_delta_kernel they differ in the order of the sums (the op harness's bound against the CPU).
constexpr int kSplitCols = 32, kSplitParts = kDeltaThreads / kWarp;

// The start of a column-group kernel's pass (gated_delta_split_kernel, gated_delta_chunk_kernel): the state's
// columns j0 .. j0 + kSplitCols of head h into ssm (dk x kSplitCols; zeros past dv, and the state zeroed
// where the pass is fresh), the chunk's rows before the pass (its first n0 = pos0 % C positions: key rows
// into ksm at stride kst, the group's delta columns into dsm, gates into gsm), then a barrier and the block's
// count in counters[h] (group_rows_end's writer waits for every block's).
__device__ __forceinline__ void group_rows_begin(const DeltaArgs& g, int64_t h, int64_t j0,
                                                 const DeltaPass& ps, float* ssm, float* ksm, int64_t kst,
                                                 float* dsm, float* gsm) {
  const int64_t dk = g.dk, dv = g.dv, Hv = g.Hv, ncols = min(static_cast<int64_t>(kSplitCols), dv - j0);
  const int tid = threadIdx.x, nt = blockDim.x;
  for (int64_t e = tid; e < dk * kSplitCols; e += nt) {
    const int64_t i = e / kSplitCols, c = e % kSplitCols;
    float v = 0.0f;
    if (c < ncols) {
      if (ps.fresh)
        ps.S[i * dv + j0 + c] = 0.0f;
      else
        v = ps.S[i * dv + j0 + c];
    }
    ssm[e] = v;
  }
  const int64_t n0 = ps.pos0 % g.C;
  for (int64_t e = tid; e < n0 * dk; e += nt)
    ksm[e / dk * kst + e % dk] = g.rows_k[(e / dk * Hv + h) * dk + e % dk];
  for (int64_t e = tid; e < n0 * kSplitCols; e += nt) {
    const int64_t m = e / kSplitCols, c = e % kSplitCols;
    dsm[e] = c < ncols ? g.rows_d[(m * Hv + h) * dv + j0 + c] : 0.0f;
  }
  for (int64_t m = tid; m < n0; m += nt) gsm[m] = g.rows_g[m * Hv + h];
  __syncthreads();
  // The head's key rows and gates, the same in every block, go to global memory once, from its last block and
  // only at the end: a pass that crosses a chunk end rewrites rows that the head's other blocks read above,
  // so the writer first waits until all of them are past those reads (counters[h]). Blocks start in order of
  // their index (as CUDA's single-pass scans rely on), so the others were started before the last one and
  // the wait never waits on a block that cannot run.
  if (tid == 0) {
    __threadfence();
    atomicAdd(g.counters + h, 1u);
  }
}

// At the chunk's last position `slot`: the next chunk's state columns of the group (next_state with the
// decays em to that position, the chunk's key rows and the group's delta columns), into ssm and the other
// buffer; ends in a barrier.
__device__ __forceinline__ void group_next_state(const DeltaArgs& g, float Gp, const float* em, int64_t slot,
                                                 const float* ksm, int64_t kst, const float* dsm, int64_t j0,
                                                 float* ssm, float* S_next) {
  const int64_t dk = g.dk, dv = g.dv, ncols = min(static_cast<int64_t>(kSplitCols), dv - j0);
  for (int64_t e = threadIdx.x; e < dk * kSplitCols; e += blockDim.x) {
    const int64_t i = e / kSplitCols, cc = e % kSplitCols;
    const float sn = next_state(
        Gp, ssm[e], em, slot, [&](int64_t m) { return ksm[m * kst + i]; },
        [&](int64_t m) { return dsm[m * kSplitCols + cc]; });
    ssm[e] = sn;
    if (cc < ncols) S_next[i * dv + j0 + cc] = sn;
  }
  __syncthreads();
}

// The end of the pass, in the head's last block (the writer) only: the rows the next pass reads that this
// pass wrote (its last chunk's positions, slots lo .. (pos0 + T) % C; lo: the pass's first slot if it stayed
// in one chunk; a decode step writes one row), from ksm and gsm, once every block of the head has counted.
__device__ __forceinline__ void group_rows_end(const DeltaArgs& g, int64_t h, int64_t pos0, const float* ksm,
                                               int64_t kst, const float* gsm) {
  if (blockIdx.y != gridDim.y - 1) return;
  const int64_t dk = g.dk, C = g.C, Hv = g.Hv;
  const int tid = threadIdx.x, nt = blockDim.x;
  if (tid == 0) {
    while (atomicAdd(g.counters + h, 0u) < gridDim.y) __nanosleep(64);
    g.counters[h] = 0;  // every block of the head has counted: the next launch starts from zero
  }
  __syncthreads();
  const int64_t n0 = pos0 % C, n_end = (pos0 + g.T) % C, lo = (pos0 + g.T) / C == pos0 / C ? n0 : 0;
  for (int64_t e = lo * dk + tid; e < n_end * dk; e += nt)
    g.rows_k[(e / dk * Hv + h) * dk + e % dk] = ksm[e / dk * kst + e % dk];
  for (int64_t m = lo + tid; m < n_end; m += nt) g.rows_g[m * Hv + h] = gsm[m];
}

template <int kParts>
__device__ __forceinline__ int64_t part_begin(int64_t n, int r) {
  return static_cast<int64_t>(r) * ((n + kParts - 1) / kParts);
}

__global__ void __launch_bounds__(kDeltaThreads) gated_delta_split_kernel(DeltaArgs g) {
  grid_start();
  extern __shared__ float sm[];
  const int64_t dk = g.dk, dv = g.dv, C = g.C, Hv = g.Hv, h = blockIdx.x, kh = h % g.Hk;
  const int64_t j0 = static_cast<int64_t>(blockIdx.y) * kSplitCols;
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid % kWarp, part = tid / kWarp;
  const int64_t kst = dk + 1;
  float* qn = sm;                                      // dk
  float* kn = qn + dk;                                 // dk
  float* em = kn + dk;                                 // C
  float* wk = em + C;                                  // C
  float* wq = wk + C;                                  // C
  float* gsm = wq + C;                                 // C: the chunk's gates
  float* pkk = gsm + C;                                // 2 C: the key overlaps' halves
  float* pqk = pkk + 2 * C;                            // 2 C
  float* red = pqk + 2 * C;                            // 2 a warp
  float* scal = red + 2 * kSplitParts;                 // 2
  float* part_s = scal + 2;                            // 4 sums x kSplitParts x kSplitCols
  float* ssm = part_s + 4 * kSplitParts * kSplitCols;  // dk x kSplitCols: the group's state columns
  float* ksm = ssm + dk * kSplitCols;                  // C x (dk + 1): the chunk's key rows
  float* dsm = ksm + C * kst;                          // C x kSplitCols: the group's delta columns
  const DeltaPass ps = delta_pass(g, h);
  const int64_t pos0 = ps.pos0;
  float* S = ps.S;  // the current chunk's state in global memory; the other buffer the next's
  float* S_next = ps.S_next;
  const int64_t ncols = min(static_cast<int64_t>(kSplitCols), dv - j0);
  const auto delta_g = [&](int64_t s) { return g.rows_d + (s * Hv + h) * dv; };
  // The group's state columns, and the chunk's rows before this pass.
  group_rows_begin(g, h, j0, ps, ssm, ksm, kst, dsm, gsm);
  for (int64_t t = 0; t < g.T; ++t) {
    const int64_t p = pos0 + t, slot = p % C, n = slot;
    const float* v = delta_norms(g, t, h, kh, qn, kn, red);
    for (int64_t i = tid; i < dk; i += nt) ksm[slot * kst + i] = kn[i];  // this thread's own elements
    if (tid == 0) {
      const float gg = __fmul_rn(g.A[h], softplusf(__fadd_rn(g.a[t * Hv + h], g.dt_bias[h])));
      float acc = gg;  // the decays' exponents, summed back from p
      for (int64_t m = n - 1; m >= 0; --m) {
        em[m] = acc;
        acc = __fadd_rn(acc, gsm[m]);
      }
      gsm[slot] = gg;
      scal[0] = expf(acc);
      scal[1] = sigmoidf(g.b[t * Hv + h]);
    }
    __syncthreads();
    const float Gp = scal[0], beta = scal[1];
    // The earlier positions' key overlaps, each over half of dk (halves added in order below).
    const int64_t half = (dk + 1) / 2;
    for (int64_t e = tid; e < 2 * C; e += nt) {
      const int64_t m = e % C, hf = e / C;
      if (m >= n) continue;
      const float2 o = key_overlaps(kn, qn, ksm + m * kst, hf * half, min(dk, (hf + 1) * half));
      pkk[hf * C + m] = o.x;
      pqk[hf * C + m] = o.y;
    }
    for (int64_t m = tid; m < n; m += nt) em[m] = expf(em[m]);
    float pqq = 0.0f;
    for (int64_t i = tid; i < dk; i += nt) pqq = __fadd_rn(pqq, __fmul_rn(qn[i], kn[i]));
    const float qk = block_sum(pqq, red);  // its barriers publish em and the overlaps' halves
    for (int64_t m = tid; m < n; m += nt) {
      wk[m] = __fmul_rn(em[m], __fadd_rn(pkk[m], pkk[C + m]));
      wq[m] = __fmul_rn(em[m], __fadd_rn(pqk[m], pqk[C + m]));
    }
    // Warp `part`'s partial sums for column `lane`: S's rows i of its quarter of dk against kn and qn.
    const int64_t c = lane;
    {
      float kS = 0.0f, qS = 0.0f;
      const int64_t i1 = min(dk, part_begin<kSplitParts>(dk, part + 1));
      for (int64_t i = part_begin<kSplitParts>(dk, part); i < i1; ++i) {
        const float sij = ssm[i * kSplitCols + c];
        kS = __fadd_rn(kS, __fmul_rn(sij, kn[i]));
        qS = __fadd_rn(qS, __fmul_rn(sij, qn[i]));
      }
      part_s[(0 * kSplitParts + part) * kSplitCols + c] = kS;
      part_s[(1 * kSplitParts + part) * kSplitCols + c] = qS;
    }
    __syncthreads();  // wk, wq
    {                 // the earlier positions of its quarter of [0, n) against wk and wq
      float pd = 0.0f, po = 0.0f;
      const int64_t m1 = min(n, part_begin<kSplitParts>(n, part + 1));
      for (int64_t m = part_begin<kSplitParts>(n, part); m < m1; ++m) {
        const float dm = dsm[m * kSplitCols + c];
        pd = __fadd_rn(pd, __fmul_rn(wk[m], dm));
        po = __fadd_rn(po, __fmul_rn(wq[m], dm));
      }
      part_s[(2 * kSplitParts + part) * kSplitCols + c] = pd;
      part_s[(3 * kSplitParts + part) * kSplitCols + c] = po;
    }
    __syncthreads();
    if (part == 0 && c < ncols) {
      const int64_t j = j0 + c;
      float sum[4];
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        float a = part_s[(w * kSplitParts + 0) * kSplitCols + c];
        for (int r = 1; r < kSplitParts; ++r)
          a = __fadd_rn(a, part_s[(w * kSplitParts + r) * kSplitCols + c]);
        sum[w] = a;
      }
      const float d = __fsub_rn(__fsub_rn(v[j], __fmul_rn(Gp, sum[0])), sum[2]);
      const float dp = __fmul_rn(d, beta);
      dsm[slot * kSplitCols + c] = dp;
      delta_g(slot)[j] = dp;
      g.out[(t * Hv + h) * dv + j] = __fadd_rn(__fadd_rn(__fmul_rn(Gp, sum[1]), sum[3]), __fmul_rn(qk, dp));
    } else if (part == 0) {
      dsm[slot * kSplitCols + c] = 0.0f;
    }
    __syncthreads();  // this position's rows are written; the next position's reads follow
    if (slot != C - 1) continue;
    // The chunk's last position: the next chunk's state columns, in shared memory and in the other buffer.
    group_next_state(g, Gp, em, slot, ksm, kst, dsm, j0, ssm, S_next);
    float* tmp = S;
    S = S_next;
    S_next = tmp;
  }
  group_rows_end(g, h, pos0, ksm, kst, gsm);
}

// ---- the delta rule a chunk at a time (the default; STRATA_CUDA_DELTA_CHUNK=0 for the split kernel) ----
// The kernels above run each position's whole chain (its norms, decays, key overlaps, S against its key and
// query, then the sums over the chunk's earlier delta rows) between barriers, one position after another
// (ncu, q36's 2048-token prompt: gated_delta_split_kernel 11.9 ms a layer, 5.8 us a position). Of that chain
// only the delta rows depend on earlier positions of the chunk; the rest depends on the chunk's start state
// and the positions' own inputs. Here block (h, g) (value head h, columns g * kChunkCols ..) takes the pass a
// chunk segment at a time: (1) every position of the segment at once, 8 warps: its norms (a warp a position),
// gates, decay exponents summed back from it, their exponentials, its key overlaps with the chunk's earlier
// keys (wk, wq: a thread a pair), q . k, and S's columns against its key and query (a thread a (position,
// column)); (2) warp 0, lane c for column c, the positions in order: the delta row and the output from (1)
// and the earlier delta rows of its own column (no barrier); (3) at the chunk's end, the next state's columns
// (a thread an entry). Each value is one thread's sum in a fixed order (the norms a warp's), which depends on
// the position in its chunk and the dims only, so any split into passes gives the same bits and a decode step
// (a segment of one position) the prompt's; against the other kernels they differ in the order of the norms'
// sums. The head's key rows and gates go to global memory as gated_delta_split_kernel's do (its writer and
// counter).
constexpr int kChunkThreads = 256, kChunkWarps = kChunkThreads / kWarp, kChunkCols = kWarp;
static_assert(kChunkCols == kSplitCols, "group_rows_begin / group_rows_end take kSplitCols columns a block");

// gated_delta_chunk_kernel's dynamic shared memory (its layout in the kernel) for sub-segments of P
// positions.
size_t delta_chunk_smem(int64_t dk, int64_t C, int64_t P) {
  const size_t kst = static_cast<size_t>(dk) + 1, c = static_cast<size_t>(C), p = static_cast<size_t>(P);
  return (c * kst + p * kst + 2 * p * c + 2 * p * kChunkCols + static_cast<size_t>(dk) * kChunkCols +
          c * kChunkCols + 5 * c) *
         sizeof(float);
}

// A segment goes in sub-segments of P positions (phase 1 then 2 for each; the chunk's end after the last):
// P = C where the device gives the bytes (141 KiB a block for Qwen3.6: Hopper), else 32 (98 KiB: an RTX
// card's 99), 16 or 8. Each value's operations do not depend on P, so neither do the bits.
__global__ void __launch_bounds__(kChunkThreads) gated_delta_chunk_kernel(DeltaArgs g, int64_t P) {
  grid_start();
  extern __shared__ float sm[];
  const int64_t dk = g.dk, dv = g.dv, C = g.C, Hv = g.Hv, h = blockIdx.x, kh = h % g.Hk;
  const int64_t j0 = static_cast<int64_t>(blockIdx.y) * kChunkCols, W = 2 * g.Hk * dk + Hv * dv, kst = dk + 1;
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid % kWarp, warp = tid / kWarp;
  float* ksm = sm;                     // C x (dk + 1): the chunk's normalized key rows
  float* qsm = ksm + C * kst;          // P x (dk + 1): the sub-segment's normalized query rows
  float* wk = qsm + P * kst;           // P x C: [s - s0][m] the decay exponent, then decay x k_s . k_m
  float* wq = wk + P * C;              // P x C: [s - s0][m] decay x q_s . k_m
  float* kS = wq + P * C;              // P x kChunkCols: k_s against the state's columns
  float* qS = kS + P * kChunkCols;     // P x kChunkCols: q_s likewise
  float* ssm = qS + P * kChunkCols;    // dk x kChunkCols: the chunk's state, the group's columns
  float* dsm = ssm + dk * kChunkCols;  // C x kChunkCols: the chunk's delta rows, the group's columns
  float* gsm = dsm + C * kChunkCols;   // C: the chunk's gates
  float* Gsm = gsm + C;                // C: the decay from the chunk's start to s
  float* bsm = Gsm + C;                // C: beta
  float* qksm = bsm + C;               // C: q_s . k_s
  float* elast = qksm + C;             // C: the decays to the chunk's last position (its next state's)
  const DeltaPass ps = delta_pass(g, h);
  const int64_t pos0 = ps.pos0;
  float* S = ps.S;
  float* S_next = ps.S_next;
  const int64_t ncols = min(static_cast<int64_t>(kChunkCols), dv - j0);
  const auto delta_g = [&](int64_t s) { return g.rows_d + (s * Hv + h) * dv; };
  group_rows_begin(g, h, j0, ps, ssm, ksm, kst, dsm, gsm);
  const float scale = 1.0f / sqrtf(static_cast<float>(dk));
  for (int64_t t0 = 0; t0 < g.T;) {
    const int64_t a = (pos0 + t0) % C, b = a + min(C - a, g.T - t0);
    const bool last = b - a == g.T - t0;  // the pass's last segment
    for (int64_t s0 = a; s0 < b; s0 += P) {
      const int64_t s1 = min(b, s0 + P), n = s1 - s0;
      // (1) the sub-segment's positions: norms and rows, a warp a position; gates and beta.
      for (int64_t s = s0 + warp; s < s1; s += kChunkWarps) {
        const int64_t t = t0 + s - a;
        const float* q = g.qkv + t * W + kh * dk;
        const float* k = g.qkv + t * W + g.Hk * dk + kh * dk;
        const float2 p = sq_partials(q, k, dk, lane, kWarp);
        const float pq = warp_sum(p.x), pk = warp_sum(p.y);  // every lane the same sums (xor butterflies)
        const float rq = 1.0f / sqrtf(pq + 1e-6f), rk = 1.0f / sqrtf(pk + 1e-6f);
        for (int64_t i = lane; i < dk; i += kWarp) {
          qsm[(s - s0) * kst + i] = __fmul_rn(__fmul_rn(q[i], rq), scale);
          ksm[s * kst + i] = __fmul_rn(k[i], rk);
        }
        if (lane == 0) {
          gsm[s] = __fmul_rn(g.A[h], softplusf(__fadd_rn(g.a[t * Hv + h], g.dt_bias[h])));
          bsm[s] = sigmoidf(g.b[t * Hv + h]);
        }
      }
      __syncthreads();
      // Each position's decay exponents, summed back from it over the chunk's earlier gates (into wk for
      // now); the decay from the chunk's start; q . k.
      for (int64_t s = s0 + tid; s < s1; s += nt) {
        float* ex = wk + (s - s0) * C;
        float acc = gsm[s];
        for (int64_t m = s - 1; m >= 0; --m) {
          ex[m] = acc;
          acc = __fadd_rn(acc, gsm[m]);
        }
        Gsm[s] = expf(acc);
        const float* qn = qsm + (s - s0) * kst;
        const float* kn = ksm + s * kst;
        float qk = 0.0f;
        for (int64_t i = 0; i < dk; ++i) qk = __fadd_rn(qk, __fmul_rn(qn[i], kn[i]));
        qksm[s] = qk;
      }
      __syncthreads();
      // The key overlaps with the chunk's earlier positions, weighted by their decays: a thread a pair (it
      // alone reads and then writes its pair's entries).
      for (int64_t e = tid; e < n * C; e += nt) {
        const int64_t s = s0 + e / C, m = e % C;
        if (m >= s) continue;
        const float ex = expf(wk[e]);
        if (s == C - 1) elast[m] = ex;
        const float2 o = key_overlaps(ksm + s * kst, qsm + (s - s0) * kst, ksm + m * kst, 0, dk);
        wk[e] = __fmul_rn(ex, o.x);
        wq[e] = __fmul_rn(ex, o.y);
      }
      // The state's columns against each position's key and query: a thread a (position, column).
      for (int64_t e = tid; e < n * kChunkCols; e += nt) {
        const int64_t s = s0 + e / kChunkCols, c = e % kChunkCols;
        const float* kn = ksm + s * kst;
        const float* qn = qsm + (s - s0) * kst;
        float ks = 0.0f, qs = 0.0f;
        for (int64_t i = 0; i < dk; ++i) {
          const float sij = ssm[i * kChunkCols + c];
          ks = __fadd_rn(ks, __fmul_rn(sij, kn[i]));
          qs = __fadd_rn(qs, __fmul_rn(sij, qn[i]));
        }
        kS[e] = ks;
        qS[e] = qs;
      }
      __syncthreads();
      // (2) the delta rows, lane c for column c, positions in order: each reads only its own column's earlier
      // rows (no barrier); then the outputs, a thread a (position, column), from the rows.
      if (warp == 0) {
        const int64_t c = lane, j = j0 + c;
        for (int64_t s = s0; s < s1; ++s) {
          float dp = 0.0f;
          if (c < ncols) {
            const int64_t t = t0 + s - a, r = s - s0;
            float d = __fsub_rn(g.qkv[t * W + 2 * g.Hk * dk + h * dv + j],
                                __fmul_rn(Gsm[s], kS[r * kChunkCols + c]));
            for (int64_t m = 0; m < s; ++m)
              d = __fsub_rn(d, __fmul_rn(wk[r * C + m], dsm[m * kChunkCols + c]));
            dp = __fmul_rn(d, bsm[s]);
            if (last && b < C) delta_g(s)[j] = dp;  // the rows a later pass of this chunk reads
          }
          dsm[s * kChunkCols + c] = dp;
        }
      }
      __syncthreads();
      for (int64_t e = tid; e < n * kChunkCols; e += nt) {
        const int64_t r = e / kChunkCols, s = s0 + r, c = e % kChunkCols;
        if (c >= ncols) continue;
        float o = __fmul_rn(Gsm[s], qS[e]);
        for (int64_t m = 0; m < s; ++m) o = __fadd_rn(o, __fmul_rn(wq[r * C + m], dsm[m * kChunkCols + c]));
        g.out[((t0 + s - a) * Hv + h) * dv + j0 + c] =
            __fadd_rn(o, __fmul_rn(qksm[s], dsm[s * kChunkCols + c]));
      }
      __syncthreads();
    }
    if (b == C) {  // (3) the chunk's end: the next state's columns, in shared memory and in the other buffer
      const float Gp = Gsm[C - 1];
      group_next_state(g, Gp, elast, C - 1, ksm, kst, dsm, j0, ssm, S_next);
      float* tmp = S;
      S = S_next;
      S_next = tmp;
    }
    t0 += b - a;
  }
  group_rows_end(g, h, pos0, ksm, kst, gsm);
}

// Block r: row r.
__global__ void __launch_bounds__(kThreads)
    gated_rms_norm_kernel(float* x, const float* z, const float* w, int64_t n, float eps) {
  grid_start();
  __shared__ float red[kThreads / kWarp];
  float* xr = x + blockIdx.x * n;
  const float* zr = z + blockIdx.x * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss = __fadd_rn(ss, __fmul_rn(xr[i], xr[i]));
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(__fadd_rn(ss / static_cast<float>(n), eps));
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    xr[i] = __fmul_rn(__fmul_rn(__fmul_rn(xr[i], inv), w[i]), siluf(zr[i]));
}

__global__ void __launch_bounds__(kThreads)
    split_q_gate_kernel(const float* qg, int64_t rows, int64_t hd, float* q, float* gate) {
  grid_start();
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < rows * 2 * hd;
       e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = e / (2 * hd), i = e % (2 * hd);
    (i < hd ? q[r * hd + i] : gate[r * hd + i - hd]) = qg[e];
  }
}

__global__ void __launch_bounds__(kThreads) sigmoid_mul_kernel(float* x, const float* g, int64_t n) {
  grid_start();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    x[i] = __fmul_rn(x[i], sigmoidf(g[i]));
}

__global__ void __launch_bounds__(kThreads)
    add_sigmoid_scaled_kernel(float* y, const float* x, const float* sc, int64_t T, int64_t D) {
  grid_start();
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < T * D;
       e += (int64_t)gridDim.x * blockDim.x)
    y[e] = __fadd_rn(y[e], __fmul_rn(sigmoidf(sc[e / D]), x[e]));
}

}  // namespace

void launch_conv1d_silu(const float* x, int64_t T, int64_t C, int64_t Kc, const float* w,
                        const float* state_in, float* state_out, float* y, cudaStream_t s) {
  STRATA_CHECK(T >= 0 && C >= 0 && Kc >= 1, ConfigError, "conv1d_silu: bad shape T=", T, " C=", C,
               " Kc=", Kc);
  if (C == 0) return;
  launch_kernel(conv1d_silu_kernel, stride_blocks((T + Kc - 1) * C, kThreads), kThreads, 0, s, x, T, C, Kc, w,
                state_in, state_out, y, ConvAt{{nullptr, nullptr}, 0, nullptr});
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_conv1d_silu_at(const float* x, int64_t C, int64_t Kc, const float* w, float* conv0, float* conv1,
                           int64_t pos0, const int32_t* pos_dev, float* y, cudaStream_t s) {
  STRATA_CHECK(C >= 0 && Kc >= 1 && pos0 >= 0 && conv0 && conv1, ConfigError,
               "conv1d_silu_at: bad shape C=", C, " Kc=", Kc, " pos0=", pos0);
  if (C == 0) return;
  launch_kernel(conv1d_silu_kernel, stride_blocks(Kc * C, kThreads), kThreads, 0, s, x, int64_t{1}, C, Kc, w,
                static_cast<const float*>(nullptr), static_cast<float*>(nullptr), y,
                ConvAt{{conv0, conv1}, pos0, pos_dev});
  STRATA_CUDA_LAUNCH_CHECK();
}

namespace {

// gated_delta_kernel's dynamic shared memory (its comment lists it): without the chunk's rows, refused past
// 48 KiB.
size_t delta_smem(int64_t dk, int64_t dv, int64_t C, bool rows, const char* what) {
  const size_t base = (2 * (size_t)dk + 3 * (size_t)C + 2 * (kDeltaThreads / kWarp) + 2) * sizeof(float);
  STRATA_CHECK(base <= 48 * 1024, UnsupportedError, what, ": key dim ", dk, " and chunk ", C, " need ", base,
               " bytes of shared memory, more than 48 KiB");
  return rows ? base + ((size_t)C * (1 + (size_t)dk + 1 + (size_t)dv)) * sizeof(float) : base;
}

// gated_delta_split_kernel's dynamic shared memory (its layout in the kernel).
size_t delta_split_smem(int64_t dk, int64_t C) {
  return ((size_t)2 * dk + 8 * (size_t)C + 2 * kSplitParts + 2 + 4 * kSplitParts * kSplitCols +
          (size_t)dk * kSplitCols + (size_t)C * (dk + 1) + (size_t)C * kSplitCols) *
         sizeof(float);
}

// The most dynamic shared memory a block of this device may take (opted in).
size_t smem_optin_max() {
  int dev = 0, max_optin = 0;
  STRATA_CUDA_CHECK(cudaGetDevice(&dev));
  STRATA_CUDA_CHECK(cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return static_cast<size_t>(max_optin);
}

// Kernel opted in to `bytes` of dynamic shared memory (at most smem_optin_max()), once a larger size.
template <auto Kernel>
void allow_smem(size_t bytes) {
  static std::mutex mu;
  static size_t allowed = 48 * 1024;
  std::lock_guard<std::mutex> lock(mu);
  if (bytes > allowed) {
    STRATA_CUDA_CHECK(
        cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    allowed = bytes;
  }
}

// Whether the delta rule runs split over value columns (gated_delta_split_kernel): the default where the
// device gives its shared memory (the Qwen3.6 shape takes 63 KiB: every RTX 30/40/50 card and Hopper do),
// else the one-block kernel, the same choice for every call of the process. Measured on an H100 (q36, all
// resident): the prompt 1,744 -> 3,429 tok/s at 2048 tokens, decode 158.7 -> 170.5. STRATA_CUDA_DELTA_SPLIT=0
// runs the one-block kernel for the A/B; =1 makes a device without the bytes an error.
bool delta_split(int64_t dk, int64_t C) {
  if (!env_switch("STRATA_CUDA_DELTA_SPLIT", true)) return false;
  const size_t bytes = delta_split_smem(dk, C), most = smem_optin_max();
  if (bytes > most) {
    const char* v = std::getenv("STRATA_CUDA_DELTA_SPLIT");
    STRATA_CHECK(!(v && *v), UnsupportedError, "STRATA_CUDA_DELTA_SPLIT=1: the delta rule's key dim ", dk,
                 " and chunk ", C, " need ", bytes, " bytes of shared memory a block; this GPU gives ", most,
                 " (unset it for the one-block kernel)");
    return false;
  }
  allow_smem<gated_delta_split_kernel>(bytes);
  return true;
}

// Whether the chunk's rows go through shared memory (gated_delta_kernel<true>): the device gives the bytes
// (an RTX 30/40/50 card ~99 KiB a block, an H100 227; the Qwen3.6 shape takes 68), opted in once a size.
// STRATA_CUDA_DELTA_ROWS=0 reads them from global memory, for the A/B (the same bits). Only a pass of several
// tokens: a one-token step reads each row once anyway, and staging them first cost its decode 10% (H100, q36:
// 158.7 -> 173.9 tok/s without).
bool delta_rows_smem(int64_t T, int64_t dk, int64_t dv, int64_t C, const char* what) {
  if (T <= 1 || !env_switch("STRATA_CUDA_DELTA_ROWS", true)) return false;
  const size_t bytes = delta_smem(dk, dv, C, true, what);
  if (bytes > smem_optin_max()) return false;
  allow_smem<gated_delta_kernel<true>>(bytes);
  return true;
}

// The positions a sub-segment of gated_delta_chunk_kernel takes where the delta rule runs a chunk at a time
// (the default: H100, q36 all resident, 2026-12-07: the prompt 3,463 -> 5,770 tok/s at 2048 tokens, decode
// 174.9 -> 185.7), else 0: the chunk where the device gives the bytes, else 32, 16 or 8 (the same bits
// whichever). A device without even that's bytes, or a model with more value heads than counters, takes the
// split kernel, the same choice for every call of the process; STRATA_CUDA_DELTA_CHUNK=1 makes that an error,
// =0 runs the split kernel for the A/B.
int64_t delta_chunk(const DeltaArgs& g) {
  if (!env_switch("STRATA_CUDA_DELTA_CHUNK", true)) return 0;
  const size_t most = smem_optin_max();
  // STRATA_CUDA_DELTA_CHUNK_SUB=N: at most N positions a sub-segment (the op harness checks the bits do not
  // move).
  int64_t P = std::min(g.C, env_int("STRATA_CUDA_DELTA_CHUNK_SUB", g.C, 1, 1 << 20, "a number of positions"));
  while (P > 8 && delta_chunk_smem(g.dk, g.C, P) > most) P = P > 32 ? 32 : P / 2;
  const size_t bytes = delta_chunk_smem(g.dk, g.C, P);
  if (bytes > most || !g.counters) {
    const char* v = std::getenv("STRATA_CUDA_DELTA_CHUNK");
    if (!(v && *v)) return 0;
  }
  STRATA_CHECK(bytes <= most && g.counters, UnsupportedError,
               "STRATA_CUDA_DELTA_CHUNK=1: the delta rule's key dim ", g.dk, " and chunk ", g.C, " need ",
               bytes, " bytes of shared memory a block (this GPU gives ", most,
               ") and a counter per value head; unset it");
  allow_smem<gated_delta_chunk_kernel>(bytes);
  return P;
}

void launch_delta(const DeltaArgs& g, const char* what, cudaStream_t s) {
  if (const int64_t P = delta_chunk(g)) {
    STRATA_CHECK(g.Hv <= 0x7fffffff && ceil_div(g.dv, kChunkCols) <= 65535, UnsupportedError, what,
                 ": value heads ", g.Hv, " of ", g.dv, " dims exceed one launch");
    launch_kernel(gated_delta_chunk_kernel,
                  dim3(grid_x(g.Hv), static_cast<unsigned>(ceil_div(g.dv, kChunkCols))), kChunkThreads,
                  delta_chunk_smem(g.dk, g.C, P), s, g, P);
  } else if (g.counters && delta_split(g.dk, g.C)) {
    const unsigned groups = static_cast<unsigned>(ceil_div(g.dv, kSplitCols));
    STRATA_CHECK(g.Hv <= 0x7fffffff && ceil_div(g.dv, kSplitCols) <= 65535, UnsupportedError, what,
                 ": value heads ", g.Hv, " of ", g.dv, " dims exceed one launch");
    launch_kernel(gated_delta_split_kernel, dim3(grid_x(g.Hv), groups), kDeltaThreads,
                  delta_split_smem(g.dk, g.C), s, g);
  } else if (delta_rows_smem(g.T, g.dk, g.dv, g.C, what))
    launch_kernel(gated_delta_kernel<true>, grid_x(g.Hv), kDeltaThreads,
                  delta_smem(g.dk, g.dv, g.C, true, what), s, g);
  else
    launch_kernel(gated_delta_kernel<false>, grid_x(g.Hv), kDeltaThreads,
                  delta_smem(g.dk, g.dv, g.C, false, what), s, g);
  STRATA_CUDA_LAUNCH_CHECK();
}

}  // namespace

void launch_gated_delta_chunked(const float* qkv, const float* a, const float* b, int64_t T, int64_t pos0,
                                int64_t C, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, const float* A,
                                const float* dt_bias, bool fresh, float* s_cur, float* s_other, float* rows_k,
                                float* rows_d, float* rows_g, float* out, unsigned* counters,
                                int64_t n_counters, cudaStream_t s) {
  STRATA_CHECK(T >= 0 && pos0 >= 0 && C >= 1 && Hk >= 1 && Hv >= 1 && dk >= 1 && dv >= 1, ConfigError,
               "gated_delta_chunked: bad shape T=", T, " C=", C, " Hk=", Hk, " Hv=", Hv, " dk=", dk,
               " dv=", dv);
  delta_smem(dk, dv, C, false, "gated_delta_chunked");
  if (T == 0 && !fresh) return;
  DeltaArgs g{qkv, a,  b,     A,     dt_bias, T,      pos0,   C,      Hk, Hv,
              dk,  dv, fresh, s_cur, s_other, rows_k, rows_d, rows_g, out};
  g.counters = Hv <= n_counters ? counters : nullptr;
  launch_delta(g, "gated_delta_chunked", s);
}

void launch_gated_delta_at(const float* qkv, const float* a, const float* b, int64_t pos0,
                           const int32_t* pos_dev, int64_t C, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv,
                           const float* A, const float* dt_bias, float* state0, float* state1, float* rows_k,
                           float* rows_d, float* rows_g, float* out, unsigned* counters, int64_t n_counters,
                           cudaStream_t s) {
  STRATA_CHECK(pos0 >= 0 && C >= 1 && Hk >= 1 && Hv >= 1 && dk >= 1 && dv >= 1 && state0 && state1,
               ConfigError, "gated_delta_at: bad shape C=", C, " Hk=", Hk, " Hv=", Hv, " dk=", dk,
               " dv=", dv);
  delta_smem(dk, dv, C, false, "gated_delta_at");
  DeltaArgs g{qkv, a,  b,     A,       dt_bias, 1,      pos0,   C,      Hk, Hv,
              dk,  dv, false, nullptr, nullptr, rows_k, rows_d, rows_g, out};
  g.state[0] = state0;
  g.state[1] = state1;
  g.pos_dev = pos_dev;
  g.counters = Hv <= n_counters ? counters : nullptr;
  launch_delta(g, "gated_delta_at", s);
}

void launch_gated_rms_norm(float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps,
                           cudaStream_t s) {
  STRATA_CHECK(rows >= 0 && n >= 1, ConfigError, "gated_rms_norm: bad shape rows=", rows, " n=", n);
  if (rows == 0) return;
  launch_kernel(gated_rms_norm_kernel, grid_x(rows), kThreads, 0, s, x, z, w, n, eps);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_split_q_gate(const float* qg, int64_t T, int64_t H, int64_t hd, float* q, float* gate,
                         cudaStream_t s) {
  if (T * H * hd == 0) return;
  launch_kernel(split_q_gate_kernel, stride_blocks(T * H * 2 * hd, kThreads), kThreads, 0, s, qg, T * H, hd,
                q, gate);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_sigmoid_mul(float* x, const float* g, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  launch_kernel(sigmoid_mul_kernel, stride_blocks(n, kThreads), kThreads, 0, s, x, g, n);
  STRATA_CUDA_LAUNCH_CHECK();
}

void launch_add_sigmoid_scaled(float* y, const float* x, const float* sc, int64_t T, int64_t D,
                               cudaStream_t s) {
  if (T * D == 0) return;
  launch_kernel(add_sigmoid_scaled_kernel, stride_blocks(T * D, kThreads), kThreads, 0, s, y, x, sc, T, D);
  STRATA_CUDA_LAUNCH_CHECK();
}

}  // namespace strata::cuda
