// What attention.cu and attention_tile.cu share: the kernels' constants, the staged loads, the fold of
// a key block, the shape of a launch and the decode kernel's helpers (which the tile kernel reuses).
// Both files build with -fmad=false (attention.cu's comment says which float operations they do).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/common.cuh"

namespace strata::cuda::attn {

constexpr int kKeyBlock = 128;  // keys per softmax block, by absolute position
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;
constexpr int kAccPerThread = 16;                            // output elements per thread, in registers
constexpr int kMaxRows = 16;                                 // (query, head) rows per block
constexpr int64_t kMaxRowFloats = kThreads * kAccPerThread;  // rows * head_dim per block
constexpr int64_t kStageFloats = 4096;                       // staged K or V floats per block
constexpr int64_t kSplitHeads = 2;                           // query heads per decode block
constexpr int64_t kSmemFloats = 48 * 1024 / 4;               // a block's shared memory without opt-in

__device__ __forceinline__ float kv_load(const float* p) { return *p; }
__device__ __forceinline__ float kv_load(const uint16_t* p) { return __half2float(__ushort_as_half(*p)); }
// Elements p[0] and p[1] (p 2-element aligned) in one load.
__device__ __forceinline__ float2 kv_load2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float2 kv_load2(const uint16_t* p) {
  return __half22float2(*reinterpret_cast<const __half2*>(p));
}

// Keys (or values) s0 .. s0 + ns of kv head kvh into kv ([ns][hd] floats). Where rows are whole
// 16-byte pieces, each thread first loads up to kStageLoads pieces through the read-only path (no
// store between them, so they are all in flight at once), then converts and stores them.
constexpr int kStageLoads = 8;
__device__ __forceinline__ void widen(const uint4& raw, const float*, float* d) {
  *reinterpret_cast<uint4*>(d) = raw;
}
__device__ __forceinline__ void widen(const uint4& raw, const uint16_t*, float* d) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    d[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[i] & 0xFFFF)));
    d[2 * i + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w[i] >> 16)));
  }
}
template <class KvT>
__device__ __forceinline__ void stage_kv(float* kv, const KvT* src, int64_t s0, int ns, int64_t KV,
                                         int64_t kvh, int64_t hd) {
  constexpr int kPer = 16 / sizeof(KvT);  // elements of a piece
  const bool vec = hd % kPer == 0 && (KV * hd) % kPer == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0;
  if (!vec) {
    for (int64_t e = threadIdx.x; e < ns * hd; e += kThreads)
      kv[e] = kv_load(src + ((s0 + e / hd) * KV + kvh) * hd + e % hd);
    return;
  }
  const int64_t per_row = hd / kPer, total = ns * per_row;
  for (int64_t base = 0; base < total; base += (int64_t)kStageLoads * kThreads) {
    uint4 raw[kStageLoads];
#pragma unroll
    for (int i = 0; i < kStageLoads; ++i) {
      const int64_t e = base + i * kThreads + threadIdx.x;
      if (e < total)
        raw[i] =
            __ldg(reinterpret_cast<const uint4*>(src + ((s0 + e / per_row) * KV + kvh) * hd) + e % per_row);
    }
#pragma unroll
    for (int i = 0; i < kStageLoads; ++i) {
      const int64_t e = base + i * kThreads + threadIdx.x;
      if (e < total) widen(raw[i], src, kv + (e / per_row) * hd + (e % per_row) * kPer);
    }
  }
}

// The fold of one block into a row's state (see the file comment); returns the factors a, b.
struct Fold {
  float a, b;
};
__device__ __forceinline__ Fold fold(float& m, float& l, float m_b, float l_b) {
  const float m_new = fmaxf(m, m_b);
  const Fold f{expf(m - m_new), expf(m_b - m_new)};
  l = l * f.a + l_b * f.b;
  m = m_new;
  return f;
}

struct Shape {
  int64_t T, pos0, H, KV, hd;
  const int32_t* pos_dev;  // added to pos0 when set (PosSource)
  int64_t group;           // query heads per kv head
  int gr;                  // of them in one block (grid z splits the rest)
  int qt;                  // queries in one block
  int ksub;                // keys staged in shared memory at a time
  float scale;
  // The tensor-core family's gpt-oss options (launch_mma_sinks): a query at position p sees keys
  // window_lo(p, window) .. p, and a head's sink logit joins its softmax's denominator (no value).
  int64_t window = 0;
  const float* sinks = nullptr;
};

// The first key a query at position p sees under a sliding window of `window` keys (0: no window).
__host__ __device__ __forceinline__ int64_t window_lo(int64_t p, int64_t window) {
  return window > 0 && p + 1 > window ? p + 1 - window : 0;
}

// ---- decode (one query): attention_decode_kernel ----
// The same float operations as attention_kernel<., true> laid out for one query: a block per (key
// block, kv head) stages the block's keys, then its values, in their stored type (16-byte loads, as
// many keys at a time as kStageBytes holds), shared by the group's query heads. Its 16 warps split the
// work three ways, each part exactly as the prompt kernel takes it:
//   scores: a task is (head, 32 keys): lane l forms the 32 keys' dot partials over dims l, l + 32, ..
//     in order, and a transposed butterfly sums them with warp_sum's additions, leaving key k's
//     score (times scale) on lane k, from where it goes to shared memory;
//   softmax: a warp per head, lane l taking keys l, l + 32, .. in order for the max and the sum;
//   a_b: a task is (head, 32 dims), one dim a lane, its fma chain over the keys in order.
constexpr int kDecWarps = 16, kDecThreads = kDecWarps * kWarp, kPiece = 32, kDecMaxGroup = 16;
constexpr int kStageBytes = 32 * 1024;

// v[k] (k < 32): this lane's partial of key k. Returns key `lane`'s total: at offset o the lanes with
// bit o set keep the upper o keys, the others the lower, each adding its partner's partial of the
// keys it keeps, which is warp_sum's pairing at every step. (A template per offset: every index is a
// constant, so v stays in registers.)
template <int O>
__device__ __forceinline__ void transposed_step(float v[kWarp], int lane) {
  const bool up = (lane & O) != 0;
#pragma unroll
  for (int i = 0; i < O; ++i) {
    const float send = up ? v[i] : v[i + O], keep = up ? v[i + O] : v[i];
    v[i] = keep + __shfl_xor_sync(kFullMask, send, O);
  }
  if constexpr (O > 1) transposed_step<O / 2>(v, lane);
}
__device__ __forceinline__ float transposed_sum(float v[kWarp], int lane) {
  transposed_step<kWarp / 2>(v, lane);
  return v[0];
}

// Keys the decode kernel stages at a time at head dim hd: as many as kStageBytes holds, up to a key
// block, and never fewer than a piece (a 576-dim f16 row, MLA's latent: 32 keys, 36 KiB).
template <class KvT>
__host__ __device__ constexpr int decode_round(int64_t hd) {
  const int64_t fit = kStageBytes / (hd * (int64_t)sizeof(KvT));
  return (int)(fit < kPiece ? kPiece : fit < kKeyBlock ? fit : kKeyBlock);
}

// Keys (or values) j0 + k, k < nk, of kv head kvh as stored: loaded into this thread's registers
// (all its loads in flight together), then into buf ([nk][hd]).
template <class KvT, int kBytes = kStageBytes>
struct Staged {
  static constexpr int kPer = 16 / sizeof(KvT), kLoads = (kBytes / 16 + kDecThreads - 1) / kDecThreads;
  uint4 raw[kLoads];
};
template <class KvT, int kBytes>
__device__ __forceinline__ void load_keys(Staged<KvT, kBytes>& st, const KvT* src, int64_t j0, int nk,
                                          int64_t KV, int64_t kvh, int64_t hd) {
  const int64_t per_row = hd / Staged<KvT, kBytes>::kPer, total = nk * per_row;
#pragma unroll
  for (int i = 0; i < Staged<KvT, kBytes>::kLoads; ++i) {
    const int64_t e = i * kDecThreads + threadIdx.x;
    if (e < total)
      st.raw[i] =
          __ldg(reinterpret_cast<const uint4*>(src + ((j0 + e / per_row) * KV + kvh) * hd) + e % per_row);
  }
}
template <class KvT, int kBytes>
__device__ __forceinline__ void store_keys(KvT* buf, const Staged<KvT, kBytes>& st, int nk, int64_t hd) {
  const int64_t per_row = hd / Staged<KvT, kBytes>::kPer, total = nk * per_row;
#pragma unroll
  for (int i = 0; i < Staged<KvT, kBytes>::kLoads; ++i) {
    const int64_t e = i * kDecThreads + threadIdx.x;
    if (e < total) reinterpret_cast<uint4*>(buf + (e / per_row) * hd)[e % per_row] = st.raw[i];
  }
}

// The decode combine of head h, dim d: the key blocks' partials folded in key order (loads past L1:
// the fused combine reads what other blocks wrote).
// Blocks [jb_lo, nb) (a sliding window's first block on); then, with `sink` (gpt-oss), the head's sink logit
// folded as a block of l_b = 1 and no value, as the prompt kernel folds it after its last block.
__device__ __forceinline__ float combine_one(const float* part_ml, const float* part_acc, int64_t nb,
                                             int64_t H, int64_t hd, int64_t h, int64_t d, int64_t jb_lo = 0,
                                             const float* sink = nullptr) {
  float m = -INFINITY, l = 0.0f, acc = 0.0f;
#pragma unroll 8  // the partials' loads of several blocks in flight at once
  for (int64_t jb = jb_lo; jb < nb; ++jb) {
    const int64_t p = jb * H + h;
    const Fold f = fold(m, l, __ldcg(part_ml + p * 2), __ldcg(part_ml + p * 2 + 1));
    acc = acc * f.a + __ldcg(part_acc + p * hd + d) * f.b;
  }
  if (sink) {
    const Fold f = fold(m, l, *sink, 1.0f);
    acc = acc * f.a + 0.0f * f.b;
  }
  return acc * (1.0f / l);
}

// The softmax of one row's key block, by one warp: sr[0 .. nv) scores in, p_j = expf(s_j - m_b) out; lane l
// takes j = l, l + 32, .. in order for the max and the sum (the file comment's m_b and l_b), returned on
// every lane as (m_b, l_b).
__device__ __forceinline__ float2 block_softmax(float* sr, int nv, int lane) {
  float m = -INFINITY;
  for (int j = lane; j < nv; j += kWarp) m = fmaxf(m, sr[j]);
  m = warp_max(m);
  float l = 0.0f;
  for (int j = lane; j < nv; j += kWarp) {
    const float p = expf(sr[j] - m);
    sr[j] = p;
    l = l + p;
  }
  return make_float2(m, warp_sum(l));
}

// attention_tile_kernel (attention_tile.cu) where its shape allows (head dims 64, 128 or 256, 16-byte
// aligned caches); false otherwise (attention_kernel runs). STRATA_CUDA_ATTN_TILE=0 keeps attention_kernel
// (read at each launch: the A/B of bench/NOTES.md and the harness's check that both give the same bits).
template <class KvT>
bool launch_tile(const float* q, const KvT* kc, const KvT* vc, const Shape& s, float* out, cudaStream_t st);

// ---- the tensor-core kernels (attention_mma.cu): an f16 cache at head dims 64 and 128 ----
constexpr int kMmaKeyBlock = 64;  // keys per softmax block of those kernels, by absolute position
// Whether they run for this shape (16-byte aligned caches; STRATA_CUDA_ATTN_MMA=0 keeps the CUDA-core
// kernels, read at each launch: the A/B of bench/NOTES.md). The choice depends on neither T nor pos0,
// so a token's prompt and decode steps take the same family.
bool mma_usable(int64_t hd, const void* kc, const void* vc);
void launch_mma_prompt(const float* q, const uint16_t* kc, const uint16_t* vc, const Shape& s, float* out,
                       cudaStream_t st);
// Key blocks [0, nb) (those past the position, or below its window, return): partials for the combine,
// with kMmaKeyBlock.
void launch_mma_decode(const float* q, const uint16_t* kc, const uint16_t* vc, const Shape& s, int64_t nb,
                       float* part_ml, float* part_acc, cudaStream_t st);

// ---- multi-head latent attention on the tensor cores (attention_mla.cu): 576-dim rows of one f16 cache
// read as both keys and values (deepseek2's absorbed form), the mma family's float operations ----
constexpr int64_t kMlaHeadDim = 576;
// Whether they run (head dim 576, one cache for keys and values, 16-byte aligned; STRATA_CUDA_ATTN_MMA=0
// keeps the CUDA-core kernels). As mma_usable: the choice depends on neither T nor pos0.
bool mla_usable(int64_t hd, const void* kc, const void* vc);
void launch_mla_prompt(const float* q, const uint16_t* kc, const Shape& s, float* out, cudaStream_t st);
// Key blocks [0, nb) of kMmaKeyBlock keys (those past the position return): partials for the combine.
void launch_mla_decode(const float* q, const uint16_t* kc, const Shape& s, int64_t nb, float* part_ml,
                       float* part_acc, cudaStream_t st);

}  // namespace strata::cuda::attn
