// Causal GQA attention over an f16 cache on the tensor cores (mma.sync m16n8k16: fp16 operands, fp32
// accumulators), for head dims 64 and 128: the prompt kernel and the decode kernel compute every
// (query, head) row in the same float operations. A warp takes 16 rows against one block of
// kMmaKeyBlock keys (by absolute position):
//
//   s_j = (q16 . k_j) * scale     q16: q rounded to fp16 (clamped to +-65504); the dot: mma over dims
//                                 16 at a time, in order, from 0
//   m_b = max s_j over the keys the row sees (the rest are -inf), p_j = __expf(s_j - m_b)
//   l_b = sum p_j                 each thread adds its 16 values of the row in key order, then the
//                                 quad's two butterfly adds (lanes ^1, then ^2)
//   a_b = sum p16_j v_j           p16: p rounded to fp16; mma over keys 16 at a time, in order, from 0
//
// and a row's blocks fold in key order as attention.cu's kernels fold theirs (attn::fold, then
// acc = acc a + a_b b, out = acc * (1 / l)). The prompt kernel folds each warp's blocks in registers;
// the decode kernel computes one block a CTA and writes its partials, which attention.cu's combine folds
// with the same operations. The mma computes each output element from its own row and column alone, so
// a row's bits depend neither on the rows beside it in the warp nor on the chunk that brought it: a
// token's output is the same from any prompt chunking and as a decode step (the op harness checks
// both). Against the exact softmax the error is bounded by the two fp16 roundings (the harness derives
// the bound). This file builds with -fmad=false: nothing is fused but what the mma does.
#include <cuda_fp16.h>

#include <cstdlib>
#include <mutex>

#include "backend/cuda/attention_impl.cuh"
#include "backend/cuda/tile.cuh"

namespace strata::cuda::attn {
namespace {

constexpr int kRowsPerWarp = 16;
constexpr int kPromptWarps = 4;              // a prompt CTA: 64 rows sharing each key block
constexpr int kKeyTiles = kMmaKeyBlock / 8;  // the block's 8-key tiles of a score row
static_assert(kMmaKeyBlock % 16 == 0, "whole 16-key mma steps");

template <int kHd>
struct MmaDims {
  static constexpr int kSteps = kHd / 16;    // 16-dim steps of a dot
  static constexpr int kOutTiles = kHd / 8;  // 8-dim tiles of an output row
  static constexpr int kStride = kHd + 8;    // halves a staged row: ldmatrix's 8 rows on distinct banks
  static constexpr int kTile = kMmaKeyBlock * kStride;  // halves of one staged K or V block
  static constexpr int kPieces = kHd / 8;               // 16-byte pieces of a row
};

// Keys j0 .. j0 + kMmaKeyBlock - 1 of kv head kvh, K into ks and V into vs, by cp.async (the caller
// commits); keys at or past `keys` are zeros (never read from the cache; their p is 0).
template <int kHd>
__device__ __forceinline__ void stage_block(__half* ks, __half* vs, const uint16_t* kc, const uint16_t* vc,
                                            int64_t j0, int64_t keys, int64_t KV, int64_t kvh, int tid,
                                            int nthreads) {
  using M = MmaDims<kHd>;
  for (int it = tid; it < kMmaKeyBlock * M::kPieces; it += nthreads) {
    const int k = it / M::kPieces, c = it % M::kPieces;
    __half* kd = ks + k * M::kStride + c * 8;
    __half* vd = vs + k * M::kStride + c * 8;
    const int64_t j = j0 + k;
    if (j < keys) {
      const int64_t off = (j * KV + kvh) * kHd + c * 8;
      cp_async16(kd, kc + off);
      cp_async16(vd, vc + off);
    } else {
      *reinterpret_cast<uint4*>(kd) = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(vd) = make_uint4(0, 0, 0, 0);
    }
  }
}

// The A fragments of the warp's 16 queries rounded to fp16: this thread's rows g = lane / 4 (lo) and
// g + 8 (hi), either null for a row past the warp's (zeros).
template <int kHd>
__device__ __forceinline__ void load_q(uint32_t (&qf)[kHd / 16][4], const float* lo, const float* hi,
                                       int lane) {
  const int c = 2 * (lane % 4);
  const auto two = [](const float* r, int i) {
    return r ? *reinterpret_cast<const float2*>(r + i) : make_float2(0.0f, 0.0f);
  };
#pragma unroll
  for (int kk = 0; kk < kHd / 16; ++kk) {
    const float2 a = two(lo, kk * 16 + c), b = two(hi, kk * 16 + c), a8 = two(lo, kk * 16 + c + 8),
                 b8 = two(hi, kk * 16 + c + 8);
    qf[kk][0] = pack_half2(a.x, a.y);
    qf[kk][1] = pack_half2(b.x, b.y);
    qf[kk][2] = pack_half2(a8.x, a8.y);
    qf[kk][3] = pack_half2(b8.x, b8.y);
  }
}

// One warp's 16 rows against the staged block of keys j0..: for this thread's rows g and g + 8 (index h
// 0 and 1), which see the keys in [lo[h], lim[h]), the block's m_b and l_b (every lane of the quad holds
// the same) and the a_b fragments (ab[n][2 h + e]: dim 8 n + 2 (lane % 4) + e). The file comment's steps.
template <int kHd, bool kWin>
__device__ __forceinline__ void warp_block(const uint32_t (&qf)[kHd / 16][4], const __half* ks,
                                           const __half* vs, int64_t j0, const int64_t (&lo)[2],
                                           const int64_t (&lim)[2], float scale, int lane,
                                           float (&ab)[kHd / 8][4], float (&mb)[2], float (&lb)[2]) {
  using M = MmaDims<kHd>;
  float s[kKeyTiles][4];
#pragma unroll
  for (int nt = 0; nt < kKeyTiles; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) s[nt][i] = 0.0f;
  // Scores: B is K^T; ldmatrix's matrices are keys 0-7 by dims 0-7, by dims 8-15, keys 8-15 by dims
  // 0-7, by dims 8-15 of each 16-key pair of tiles.
#pragma unroll
  for (int kk = 0; kk < M::kSteps; ++kk)
#pragma unroll
    for (int np = 0; np < kKeyTiles / 2; ++np) {
      uint32_t r[4];
      ldmatrix_x4(r, ks + (np * 16 + lane % 8 + (lane / 16) * 8) * M::kStride + kk * 16 + (lane / 8) % 2 * 8);
      const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      mma_16816(s[2 * np], qf[kk], b0);
      mma_16816(s[2 * np + 1], qf[kk], b1);
    }
  // Scale, mask, the block's max and p, the sum.
  const int c = 2 * (lane % 4);
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < kKeyTiles; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t j = j0 + nt * 8 + c + e;
        const float v = j < lim[h] && (!kWin || j >= lo[h]) ? s[nt][2 * h + e] * scale : -INFINITY;
        s[nt][2 * h + e] = v;
        mx[h] = fmaxf(mx[h], v);
      }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(kFullMask, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(kFullMask, mx[h], 2));
  }
  float sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int nt = 0; nt < kKeyTiles; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = mx[h] == -INFINITY ? 0.0f : __expf(s[nt][2 * h + e] - mx[h]);
        s[nt][2 * h + e] = p;
        sum[h] = sum[h] + p;
      }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    sum[h] = sum[h] + __shfl_xor_sync(kFullMask, sum[h], 1);
    sum[h] = sum[h] + __shfl_xor_sync(kFullMask, sum[h], 2);
    mb[h] = mx[h];
    lb[h] = sum[h];
  }
  // a_b: the score tiles 2 kk and 2 kk + 1 are the A fragment of keys 16 kk..; B is V, read transposed
  // (matrices: keys 0-7 by dims 0-7, keys 8-15 by dims 0-7, keys 0-7 by dims 8-15, keys 8-15 by dims 8-15).
#pragma unroll
  for (int n = 0; n < M::kOutTiles; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) ab[n][i] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kKeyTiles / 2; ++kk) {
    const uint32_t pa[4] = {pack_half2(s[2 * kk][0], s[2 * kk][1]), pack_half2(s[2 * kk][2], s[2 * kk][3]),
                            pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                            pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
    for (int dp = 0; dp < M::kOutTiles / 2; ++dp) {
      uint32_t r[4];
      ldmatrix_x4_trans(
          r, vs + (kk * 16 + lane % 8 + (lane / 8) % 2 * 8) * M::kStride + dp * 16 + (lane / 16) * 8);
      const uint32_t b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      mma_16816(ab[2 * dp], pa, b0);
      mma_16816(ab[2 * dp + 1], pa, b1);
    }
  }
}

// ---- prompt: attention_mma_kernel ----
// A CTA: 4 warps of 16 rows of one kv head, rows r = tq * gr + gi being query t0 + tq at head
// kvh * group + g0 + gi (as attention_tile_kernel's); the key blocks up to the CTA's last query are
// staged two at a time (the next one's copy in flight while this one computes), each shared by the
// 64 rows, and each warp folds the blocks its rows see.
template <int kHd, bool kWin>
__global__ void __launch_bounds__(kPromptWarps* kWarp, 2)
    attention_mma_kernel(const float* q, const uint16_t* kc, const uint16_t* vc, Shape sh, float* out) {
  grid_start();
  using M = MmaDims<kHd>;
  extern __shared__ __align__(16) unsigned char mma_stage[];
  __half* stage = reinterpret_cast<__half*>(mma_stage);  // [2 buffers][K, V][kTile]
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t pos0 = sh.pos0 + (sh.pos_dev ? *sh.pos_dev : 0);
  const int64_t kvh = blockIdx.y;
  const int gr = sh.gr, g0 = (int)blockIdx.z * gr;
  const int ng = (int)min((int64_t)gr, sh.group - g0);
  const int64_t t0 = (int64_t)blockIdx.x * sh.qt;
  const int nq = (int)min((int64_t)sh.qt, sh.T - t0);
  const int R = ng * nq;
  int64_t lim[2], lo[2], head[2];
  const float* qrow[2];
  float* orow[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = warp * kRowsPerWarp + lane / 4 + 8 * h;
    if (r < R) {
      const int64_t t = t0 + r / ng;
      head[h] = kvh * sh.group + g0 + r % ng;
      lim[h] = pos0 + t + 1;
      lo[h] = kWin ? window_lo(pos0 + t, sh.window) : 0;
      qrow[h] = q + (t * sh.H + head[h]) * kHd;
      orow[h] = out + (t * sh.H + head[h]) * kHd;
    } else {
      lim[h] = 0;
      lo[h] = 0;
      head[h] = 0;
      qrow[h] = nullptr;
      orow[h] = nullptr;
    }
  }
  uint32_t qf[M::kSteps][4];
  load_q<kHd>(qf, qrow[0], qrow[1], lane);
  // The keys any row of this warp sees (positions fit in 31 bits: the cache's rows are int32 positions).
  const int64_t warp_keys = __reduce_max_sync(kFullMask, (unsigned)max(lim[0], lim[1]));
  const int64_t keys = pos0 + t0 + nq;  // the most any row of the CTA sees
  const int64_t nblk = ceil_div(keys, kMmaKeyBlock);
  // The first block any row of the CTA sees: its first query's window start (0 without a window).
  const int64_t jb0 = kWin ? window_lo(pos0 + t0, sh.window) / kMmaKeyBlock : 0;

  float acc[M::kOutTiles][4];
#pragma unroll
  for (int n = 0; n < M::kOutTiles; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[n][i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  stage_block<kHd>(stage, stage + M::kTile, kc, vc, jb0 * kMmaKeyBlock, keys, sh.KV, kvh, threadIdx.x,
                   blockDim.x);
  cp_async_commit();
  for (int64_t jb = jb0; jb < nblk; ++jb) {
    const int64_t i = jb - jb0;  // the block's buffer: i & 1
    if (jb + 1 < nblk) {
      __half* nx = stage + ((i + 1) & 1) * 2 * M::kTile;
      stage_block<kHd>(nx, nx + M::kTile, kc, vc, (jb + 1) * kMmaKeyBlock, keys, sh.KV, kvh, threadIdx.x,
                       blockDim.x);
    }
    cp_async_commit();  // past the last block an empty group, so that one wait serves every step
    cp_async_wait<1>();
    __syncthreads();
    const int64_t j0 = jb * kMmaKeyBlock;
    if (j0 < warp_keys) {
      const __half* ks = stage + (i & 1) * 2 * M::kTile;
      float ab[M::kOutTiles][4], mb[2], lb[2];
      warp_block<kHd, kWin>(qf, ks, ks + M::kTile, j0, lo, lim, sh.scale, lane, ab, mb, lb);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // The row sees no key of this block (past its position, or before its window): no fold (decode
        // has no such block).
        if (j0 >= lim[h] || (kWin && j0 + kMmaKeyBlock <= lo[h])) continue;
        const Fold f = fold(m[h], l[h], mb[h], lb[h]);
#pragma unroll
        for (int n = 0; n < M::kOutTiles; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) acc[n][2 * h + e] = acc[n][2 * h + e] * f.a + ab[n][2 * h + e] * f.b;
      }
    }
    __syncthreads();  // the buffer is free for block jb + 2
  }
  const int c = 2 * (lane % 4);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!orow[h]) continue;
    if (kWin && sh.sinks) {  // the head's sink after the last block: l_b = 1, no value (combine_one's step)
      const Fold f = fold(m[h], l[h], sh.sinks[head[h]], 1.0f);
#pragma unroll
      for (int n = 0; n < M::kOutTiles; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) acc[n][2 * h + e] = acc[n][2 * h + e] * f.a + 0.0f * f.b;
    }
    const float inv = 1.0f / l[h];
#pragma unroll
    for (int n = 0; n < M::kOutTiles; ++n)
      *reinterpret_cast<float2*>(orow[h] + n * 8 + c) =
          make_float2(acc[n][2 * h] * inv, acc[n][2 * h + 1] * inv);
  }
}

// ---- decode: attention_mma_decode_kernel ----
// A CTA is one warp: key block blockIdx.x of kv head blockIdx.y for the group's heads 16 blockIdx.z..
// (the single query's rows), its partials (m_b, l_b, a_b) to part_ml / part_acc for the combine.
template <int kHd, bool kWin>
__global__ void __launch_bounds__(kWarp)
    attention_mma_decode_kernel(const float* q, const uint16_t* kc, const uint16_t* vc, Shape sh,
                                float* part_ml, float* part_acc) {
  grid_start();
  using M = MmaDims<kHd>;
  __shared__ __align__(16) __half ks[M::kTile], vs[M::kTile];
  const int64_t pos0 = sh.pos0 + (sh.pos_dev ? *sh.pos_dev : 0);
  const int64_t jb = blockIdx.x, j0 = jb * kMmaKeyBlock;
  const int64_t key_lo = kWin ? window_lo(pos0, sh.window) : 0;
  // A launch sized for the largest position; a block before the window has no partials (the combine
  // starts at the window's first block).
  if (j0 > pos0 || j0 + kMmaKeyBlock <= key_lo) return;
  const int lane = threadIdx.x;
  const int64_t kvh = blockIdx.y;
  const int g0 = (int)blockIdx.z * kRowsPerWarp, ng = (int)min((int64_t)kRowsPerWarp, sh.group - g0);
  stage_block<kHd>(ks, vs, kc, vc, j0, pos0 + 1, sh.KV, kvh, lane, kWarp);
  cp_async_commit();
  int64_t lim[2], lo[2];
  const float* qrow[2];
  int64_t head[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = lane / 4 + 8 * h;
    head[h] = kvh * sh.group + g0 + r;
    lim[h] = r < ng ? pos0 + 1 : 0;
    lo[h] = key_lo;
    qrow[h] = r < ng ? q + head[h] * kHd : nullptr;
  }
  uint32_t qf[M::kSteps][4];
  load_q<kHd>(qf, qrow[0], qrow[1], lane);
  cp_async_wait<0>();
  __syncwarp();
  float ab[M::kOutTiles][4], mb[2], lb[2];
  warp_block<kHd, kWin>(qf, ks, vs, j0, lo, lim, sh.scale, lane, ab, mb, lb);
  const int c = 2 * (lane % 4);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!qrow[h]) continue;
    const int64_t part = jb * sh.H + head[h];
#pragma unroll
    for (int n = 0; n < M::kOutTiles; ++n)
      *reinterpret_cast<float2*>(part_acc + part * kHd + n * 8 + c) =
          make_float2(ab[n][2 * h], ab[n][2 * h + 1]);
    if (c == 0) {
      part_ml[part * 2] = mb[h];
      part_ml[part * 2 + 1] = lb[h];
    }
  }
}

template <int kHd, bool kWin>
void launch_prompt_dims(const float* q, const uint16_t* kc, const uint16_t* vc, Shape s, float* out,
                        cudaStream_t st) {
  constexpr int kRows = kPromptWarps * kRowsPerWarp;
  constexpr size_t kSmem = 2 * 2 * MmaDims<kHd>::kTile * sizeof(__half);
  static std::once_flag opt_in;  // more than the default 48 KiB of dynamic shared memory
  std::call_once(opt_in, [] {
    STRATA_CUDA_CHECK(cudaFuncSetAttribute(attention_mma_kernel<kHd, kWin>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kSmem));
  });
  s.gr = (int)std::min<int64_t>(s.group, kRows);
  s.qt = kRows / s.gr;
  launch_kernel(attention_mma_kernel<kHd, kWin>,
                dim3(grid_x(ceil_div(s.T, s.qt)), (unsigned)s.KV, (unsigned)ceil_div(s.group, s.gr)),
                kPromptWarps * kWarp, kSmem, st, q, kc, vc, s, out);
}

// The kernels with a window or sinks (gpt-oss) apart from those without, whose code stays as it was.
bool windowed(const Shape& s) { return s.window > 0 || s.sinks != nullptr; }

}  // namespace

bool mma_usable(int64_t hd, const void* kc, const void* vc) {
  const char* e = std::getenv("STRATA_CUDA_ATTN_MMA");
  if (e && e[0] == '0' && e[1] == '\0') return false;
  const bool aligned = reinterpret_cast<uintptr_t>(kc) % 16 == 0 && reinterpret_cast<uintptr_t>(vc) % 16 == 0;
  return aligned && (hd == 64 || hd == 128);
}

void launch_mma_prompt(const float* q, const uint16_t* kc, const uint16_t* vc, const Shape& s, float* out,
                       cudaStream_t st) {
  const bool w = windowed(s);
  if (s.hd == 64)
    w ? launch_prompt_dims<64, true>(q, kc, vc, s, out, st)
      : launch_prompt_dims<64, false>(q, kc, vc, s, out, st);
  else
    w ? launch_prompt_dims<128, true>(q, kc, vc, s, out, st)
      : launch_prompt_dims<128, false>(q, kc, vc, s, out, st);
}

void launch_mma_decode(const float* q, const uint16_t* kc, const uint16_t* vc, const Shape& s, int64_t nb,
                       float* part_ml, float* part_acc, cudaStream_t st) {
  const dim3 grid(grid_x(nb), (unsigned)s.KV, (unsigned)ceil_div(s.group, kRowsPerWarp));
  const auto kernel =
      s.hd == 64
          ? (windowed(s) ? attention_mma_decode_kernel<64, true> : attention_mma_decode_kernel<64, false>)
          : (windowed(s) ? attention_mma_decode_kernel<128, true> : attention_mma_decode_kernel<128, false>);
  launch_kernel(kernel, grid, kWarp, 0, st, q, kc, vc, s, part_ml, part_acc);
}

}  // namespace strata::cuda::attn
