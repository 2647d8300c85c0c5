// Multi-head latent attention (deepseek2's absorbed form) on the tensor cores: every query head over one
// f16 cache of 576-dim rows (the 512-dim kv latent and the 64-dim rope key), read as both the keys and the
// values. The mma family's float operations (attention_mma.cu's file comment), laid out for a row this
// wide, in blocks of kMmaKeyBlock keys by absolute position:
//
//   s_j = (q16 . k_j) * scale     q16: q rounded to fp16 (clamped to +-65504); the dot: one mma chain over
//                                 the 36 16-dim steps, in order, from 0
//   m_b = max s_j over the keys the row sees (the rest are -inf), p_j = __expf(s_j - m_b)
//   l_b = sum p_j                 lane l of a warp adds p_l + p_{l+32}, then warp_sum's butterfly
//   a_b = sum p16_j v_j           p16: p rounded to fp16; an mma chain over keys 16 at a time, in order
//
// and a row's blocks fold in key order as attention.cu's kernels fold theirs (attn::fold, then
// acc = acc a + a_b b, out = acc * (1 / l)).
//
// A CTA holds 16 query heads of one token (one mma row tile) and stages each key block once for all of
// them (64 rows of 576 halves, 73 KiB; the staged block is both K and V). Its 8 warps split the block's
// work: the scores a warp per 8-key tile (the whole dot, so each score is one chain), the softmax two rows
// a warp, a_b a warp per 72 dims. The prompt kernel folds every block up to its token's position in
// registers; the decode kernel computes one block a CTA and writes its partials, which attention.cu's
// combine folds with the same operations: a token's output is the same bits from any prompt chunking and
// as a decode step. This file builds with -fmad=false: nothing is fused but what the mma does.
#include <cuda_fp16.h>

#include <cstdlib>
#include <mutex>

#include "backend/cuda/attention_impl.cuh"
#include "backend/cuda/tile.cuh"

namespace strata::cuda::attn {
namespace {

constexpr int kMlaWarps = 8, kMlaThreads = kMlaWarps * kWarp;
constexpr int kMlaRows = 16;                 // query heads of a CTA
constexpr int kMlaStride = kMlaHeadDim + 8;  // halves of a staged row: ldmatrix's 8 rows on distinct banks
constexpr int kMlaSteps = kMlaHeadDim / 16;  // 16-dim steps of a dot
constexpr int kMlaOutTiles = kMlaHeadDim / 8 / kMlaWarps;  // 8-dim output tiles of a warp (9: 72 dims)
constexpr int kMlaPStride = kMmaKeyBlock + 8;              // halves of a row of p16
static_assert(kMmaKeyBlock == 8 * kMlaWarps, "a warp per 8-key tile of a block");
static_assert(kMlaSteps % 2 == 0 && kMmaKeyBlock == 64 && kMlaHeadDim % (8 * kMlaWarps) == 0,
              "the layout below");

// The CTA's dynamic shared memory, in bytes (every offset 16-byte aligned).
struct MlaSmem {
  static constexpr int kKeys = 0;                                   // [64][kMlaStride] halves
  static constexpr int kQ = kKeys + kMmaKeyBlock * kMlaStride * 2;  // [16][kMlaStride] halves
  static constexpr int kS = kQ + kMlaRows * kMlaStride * 2;         // [16][64] floats: scores
  static constexpr int kP = kS + kMlaRows * kMmaKeyBlock * 4;       // [16][kMlaPStride] halves: p16
  static constexpr int kMl = kP + kMlaRows * kMlaPStride * 2;       // [16][2] floats: m_b, l_b
  static constexpr int kBytes = kMl + kMlaRows * 2 * 4;
};
static_assert(MlaSmem::kQ % 16 == 0 && MlaSmem::kS % 16 == 0 && MlaSmem::kP % 16 == 0 &&
              MlaSmem::kMl % 16 == 0);
static_assert(MlaSmem::kBytes <= 99 * 1024, "fits one CTA of an sm_86 / sm_89 / sm_120 SM");

struct MlaViews {
  __half *ks, *qs, *ps;
  float *ss, *ml;
};
__device__ __forceinline__ MlaViews views(unsigned char* base) {
  return {reinterpret_cast<__half*>(base + MlaSmem::kKeys), reinterpret_cast<__half*>(base + MlaSmem::kQ),
          reinterpret_cast<__half*>(base + MlaSmem::kP), reinterpret_cast<float*>(base + MlaSmem::kS),
          reinterpret_cast<float*>(base + MlaSmem::kMl)};
}

// Keys j0 .. j0 + 63 of kv head kvh into ks by cp.async (the caller commits); keys at or past `keys` are
// zeros (never read from the cache; their p is 0).
__device__ __forceinline__ void stage_keys(__half* ks, const uint16_t* kc, int64_t j0, int64_t keys,
                                           int64_t KV, int64_t kvh) {
  constexpr int kPieces = kMlaHeadDim / 8;
  for (int it = threadIdx.x; it < kMmaKeyBlock * kPieces; it += kMlaThreads) {
    const int k = it / kPieces, c = it % kPieces;
    __half* d = ks + k * kMlaStride + c * 8;
    const int64_t j = j0 + k;
    if (j < keys)
      cp_async16(d, kc + (j * KV + kvh) * kMlaHeadDim + c * 8);
    else
      *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
  }
}

// The rows' queries (rows past ng zeros) rounded to fp16 into qs.
__device__ __forceinline__ void stage_q(__half* qs, const float* q, int ng) {
  constexpr int kPairs = kMlaHeadDim / 2;
  for (int it = threadIdx.x; it < kMlaRows * kPairs; it += kMlaThreads) {
    const int r = it / kPairs, c = it % kPairs;
    const float2 v = r < ng ? *reinterpret_cast<const float2*>(q + (int64_t)r * kMlaHeadDim + 2 * c)
                            : make_float2(0.f, 0.f);
    *reinterpret_cast<uint32_t*>(qs + r * kMlaStride + 2 * c) = pack_half2(v.x, v.y);
  }
}

// One staged key block (keys j0.., those below lim seen) for the CTA's 16 rows: the rows' m_b and l_b into
// ml, this warp's a_b fragments into ab (ab[n][2 h + e]: row lane / 4 + 8 h, dim 72 warp + 8 n + 2 (lane % 4)
// + e). Starts and ends with the block's shared memory free to read (the caller syncs before the next stage).
__device__ __forceinline__ void mla_block(const MlaViews& v, int64_t j0, int64_t lim, float scale, int warp,
                                          int lane, float (&ab)[kMlaOutTiles][4]) {
  // Scores of keys j0 + 8 warp ..: A is q16 (matrices rows 0-7 / 8-15 by dims 0-7 / 8-15 of a step), B is K^T
  // (matrices keys 0-7 of the tile by dims 0-7, 8-15 of step kk, then of step kk + 1).
  float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const __half* arow = v.qs + (lane % 8 + (lane / 8) % 2 * 8) * kMlaStride + (lane / 16) * 8;
  const __half* brow = v.ks + (warp * 8 + lane % 8) * kMlaStride + (lane / 8) * 8;
#pragma unroll 2
  for (int kk = 0; kk < kMlaSteps; kk += 2) {
    uint32_t a0[4], a1[4], b[4];
    ldmatrix_x4(a0, arow + kk * 16);
    ldmatrix_x4(a1, arow + kk * 16 + 16);
    ldmatrix_x4(b, brow + kk * 16);
    const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
    mma_16816(s, a0, b0);
    mma_16816(s, a1, b1);
  }
  const int g = lane / 4, c = 2 * (lane % 4);
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int k = warp * 8 + c + e;
      v.ss[(g + 8 * h) * kMmaKeyBlock + k] = j0 + k < lim ? s[2 * h + e] * scale : -INFINITY;
    }
  __syncthreads();
  // Softmax, rows 2 warp and 2 warp + 1: lane l takes keys l and l + 32.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = 2 * warp + i;
    const float s0 = v.ss[r * kMmaKeyBlock + lane], s1 = v.ss[r * kMmaKeyBlock + lane + 32];
    const float m = warp_max(fmaxf(s0, s1));
    const float p0 = m == -INFINITY ? 0.0f : __expf(s0 - m), p1 = m == -INFINITY ? 0.0f : __expf(s1 - m);
    const float l = warp_sum(p0 + p1);
    v.ps[r * kMlaPStride + lane] = __float2half_rn(p0);
    v.ps[r * kMlaPStride + lane + 32] = __float2half_rn(p1);
    if (lane == 0) {
      v.ml[2 * r] = m;
      v.ml[2 * r + 1] = l;
    }
  }
  __syncthreads();
  // a_b: A is p16 (16 keys a step), B is V = the staged keys read transposed (matrices keys 0-7, 8-15 of step
  // 2 k2, then of step 2 k2 + 1, by this tile's 8 dims); each tile's chain takes the 4 steps in order.
  uint32_t pa[kMmaKeyBlock / 16][4];
#pragma unroll
  for (int kk = 0; kk < kMmaKeyBlock / 16; ++kk)
    ldmatrix_x4(pa[kk], v.ps + (lane % 8 + (lane / 8) % 2 * 8) * kMlaPStride + kk * 16 + (lane / 16) * 8);
#pragma unroll
  for (int n = 0; n < kMlaOutTiles; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) ab[n][i] = 0.0f;
#pragma unroll
  for (int k2 = 0; k2 < kMmaKeyBlock / 32; ++k2)
#pragma unroll
    for (int n = 0; n < kMlaOutTiles; ++n) {
      uint32_t r[4];
      ldmatrix_x4_trans(r, v.ks + (k2 * 32 + lane) * kMlaStride + warp * (kMlaOutTiles * 8) + n * 8);
      const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      mma_16816(ab[n], pa[2 * k2], b0);
      mma_16816(ab[n], pa[2 * k2 + 1], b1);
    }
}

// ---- prompt: a CTA per (token blockIdx.x, kv head blockIdx.y, heads 16 blockIdx.z ..) ----
__global__ void __launch_bounds__(kMlaThreads, 2)  // two CTAs an SM where shared memory holds them
    attention_mla_kernel(const float* q, const uint16_t* kc, Shape sh, float* out) {
  grid_start();
  extern __shared__ __align__(16) unsigned char mla_smem[];
  const MlaViews v = views(mla_smem);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t pos0 = sh.pos0 + (sh.pos_dev ? *sh.pos_dev : 0);
  const int64_t t = blockIdx.x, kvh = blockIdx.y, g0 = (int64_t)blockIdx.z * kMlaRows;
  const int ng = (int)min((int64_t)kMlaRows, sh.group - g0);
  const int64_t h0 = kvh * sh.group + g0, lim = pos0 + t + 1;
  stage_q(v.qs, q + (t * sh.H + h0) * kMlaHeadDim, ng);
  float acc[kMlaOutTiles][4];
#pragma unroll
  for (int n = 0; n < kMlaOutTiles; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[n][i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int g = lane / 4, c = 2 * (lane % 4);
  const int64_t nblk = ceil_div(lim, kMmaKeyBlock);
  for (int64_t jb = 0; jb < nblk; ++jb) {
    stage_keys(v.ks, kc, jb * kMmaKeyBlock, lim, sh.KV, kvh);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    float ab[kMlaOutTiles][4];
    mla_block(v, jb * kMmaKeyBlock, lim, sh.scale, warp, lane, ab);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = g + 8 * h;
      const Fold f = fold(m[h], l[h], v.ml[2 * r], v.ml[2 * r + 1]);
#pragma unroll
      for (int n = 0; n < kMlaOutTiles; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) acc[n][2 * h + e] = acc[n][2 * h + e] * f.a + ab[n][2 * h + e] * f.b;
    }
    __syncthreads();  // the staged block, the scores and p are free for the next block
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = g + 8 * h;
    if (r >= ng) continue;
    const float inv = 1.0f / l[h];
    float* orow = out + (t * sh.H + h0 + r) * kMlaHeadDim + warp * (kMlaOutTiles * 8) + c;
#pragma unroll
    for (int n = 0; n < kMlaOutTiles; ++n)
      *reinterpret_cast<float2*>(orow + n * 8) = make_float2(acc[n][2 * h] * inv, acc[n][2 * h + 1] * inv);
  }
}

// ---- decode: a CTA per (key block blockIdx.x, kv head blockIdx.y, heads 16 blockIdx.z ..) of the single
// query, its partials (m_b, l_b, a_b) to part_ml / part_acc for the combine ----
__global__ void __launch_bounds__(kMlaThreads)
    attention_mla_decode_kernel(const float* q, const uint16_t* kc, Shape sh, float* part_ml,
                                float* part_acc) {
  grid_start();
  extern __shared__ __align__(16) unsigned char mla_smem[];
  const MlaViews v = views(mla_smem);
  const int64_t pos0 = sh.pos0 + (sh.pos_dev ? *sh.pos_dev : 0);
  const int64_t jb = blockIdx.x, j0 = jb * kMmaKeyBlock;
  if (j0 > pos0) return;  // a launch sized for the largest position
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t kvh = blockIdx.y, g0 = (int64_t)blockIdx.z * kMlaRows;
  const int ng = (int)min((int64_t)kMlaRows, sh.group - g0);
  const int64_t h0 = kvh * sh.group + g0, lim = pos0 + 1;
  stage_keys(v.ks, kc, j0, lim, sh.KV, kvh);
  cp_async_commit();
  stage_q(v.qs, q + h0 * kMlaHeadDim, ng);
  cp_async_wait<0>();
  __syncthreads();
  float ab[kMlaOutTiles][4];
  mla_block(v, j0, lim, sh.scale, warp, lane, ab);
  const int g = lane / 4, c = 2 * (lane % 4);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = g + 8 * h;
    if (r >= ng) continue;
    const int64_t part = jb * sh.H + h0 + r;
    float* prow = part_acc + part * kMlaHeadDim + warp * (kMlaOutTiles * 8) + c;
#pragma unroll
    for (int n = 0; n < kMlaOutTiles; ++n)
      *reinterpret_cast<float2*>(prow + n * 8) = make_float2(ab[n][2 * h], ab[n][2 * h + 1]);
    if (warp == 0 && c == 0) {
      part_ml[part * 2] = v.ml[2 * r];
      part_ml[part * 2 + 1] = v.ml[2 * r + 1];
    }
  }
}

// Both kernels take more than the default 48 KiB of dynamic shared memory: opted in once, before the first
// launch of either (a prompt always comes before a recorded decode step).
void opt_in() {
  static std::once_flag once;
  std::call_once(once, [] {
    STRATA_CUDA_CHECK(cudaFuncSetAttribute(attention_mla_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           MlaSmem::kBytes));
    STRATA_CUDA_CHECK(cudaFuncSetAttribute(attention_mla_decode_kernel,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, MlaSmem::kBytes));
  });
}

}  // namespace

bool mla_usable(int64_t hd, const void* kc, const void* vc) {
  const char* e = std::getenv("STRATA_CUDA_ATTN_MMA");
  if (e && e[0] == '0' && e[1] == '\0') return false;
  return hd == kMlaHeadDim && kc == vc && reinterpret_cast<uintptr_t>(kc) % 16 == 0;
}

void launch_mla_prompt(const float* q, const uint16_t* kc, const Shape& s, float* out, cudaStream_t st) {
  opt_in();
  launch_kernel(attention_mla_kernel,
                dim3(grid_x(s.T), (unsigned)s.KV, (unsigned)ceil_div(s.group, kMlaRows)), kMlaThreads,
                (size_t)MlaSmem::kBytes, st, q, kc, s, out);
}

void launch_mla_decode(const float* q, const uint16_t* kc, const Shape& s, int64_t nb, float* part_ml,
                       float* part_acc, cudaStream_t st) {
  opt_in();
  launch_kernel(attention_mla_decode_kernel,
                dim3(grid_x(nb), (unsigned)s.KV, (unsigned)ceil_div(s.group, kMlaRows)), kMlaThreads,
                (size_t)MlaSmem::kBytes, st, q, kc, s, part_ml, part_acc);
}

}  // namespace strata::cuda::attn
