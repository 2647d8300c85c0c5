// CPU matmul of quantized weights with float32 activations: rows are dequantized a tile at a
// time and multiplied by register-blocked micro-kernels, in the one order quant.h defines; a
// single token (decode) instead dequantizes into registers and multiplies in place.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "core/memory.h"
#include "quant/decode_avx2.h"
#include "quant/kernels.h"
#include "quant/quant.h"
#include "quant/simd.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace strata {
namespace {

// Micro-kernel shape: kMR rows x kNT tokens, each element with its own accumulator. 4 x 3 keeps
// 12 accumulators and 3 activation vectors in the 16 AVX2 registers.
constexpr int kMR = 4;
constexpr int kNT = 3;
// A tile of dequantized rows should stay in L2 while many tokens sweep it (64 KiB); with one
// token group it is read once right after it is written, so it should stay in L1 (16 KiB).
constexpr int64_t kTileFloatsL2 = 16384;
constexpr int64_t kTileFloatsL1 = 4096;

// y[t*ldy + r] for r < MR, t < NT, over `cols` columns of w (rows ldw apart) and x (ldx apart).
using TileFn = void (*)(const float* w, int64_t ldw, const float* x, int64_t ldx, int64_t cols, float* y,
                        int64_t ldy);

template <int MR, int NT>
void tile_scalar(const float* w, int64_t ldw, const float* x, int64_t ldx, int64_t cols, float* y,
                 int64_t ldy) {
  float a[NT][MR][8] = {};
  const int64_t c8 = cols / 8 * 8;
  for (int64_t c = 0; c < c8; c += 8)
    for (int t = 0; t < NT; ++t)
      for (int r = 0; r < MR; ++r)
        for (int j = 0; j < 8; ++j) a[t][r][j] = std::fma(w[r * ldw + c + j], x[t * ldx + c + j], a[t][r][j]);
  for (int t = 0; t < NT; ++t) {
    for (int r = 0; r < MR; ++r) {
      const float* l = a[t][r];
      float s = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
      for (int64_t c = c8; c < cols; ++c) s = std::fma(w[r * ldw + c], x[t * ldx + c], s);
      y[t * ldy + r] = s;
    }
  }
}

#if defined(__x86_64__)
template <int MR, int NT>
STRATA_SIMD void tile_avx2(const float* w, int64_t ldw, const float* x, int64_t ldx, int64_t cols, float* y,
                           int64_t ldy) {
  __m256 a[NT][MR];
  for (int t = 0; t < NT; ++t)
    for (int r = 0; r < MR; ++r) a[t][r] = _mm256_setzero_ps();
  const int64_t c8 = cols / 8 * 8;
  for (int64_t c = 0; c < c8; c += 8) {
    __m256 xv[NT];
    for (int t = 0; t < NT; ++t) xv[t] = _mm256_loadu_ps(x + t * ldx + c);
    for (int r = 0; r < MR; ++r) {
      const __m256 wv = _mm256_loadu_ps(w + r * ldw + c);
      for (int t = 0; t < NT; ++t) a[t][r] = _mm256_fmadd_ps(wv, xv[t], a[t][r]);
    }
  }
  for (int t = 0; t < NT; ++t) {
    for (int r = 0; r < MR; ++r) {
      float s = quant_detail::hsum_ps(a[t][r]);  // the order tile_scalar writes out
      for (int64_t c = c8; c < cols; ++c) s = std::fma(w[r * ldw + c], x[t * ldx + c], s);
      y[t * ldy + r] = s;
    }
  }
}
#endif

struct Kernels {
  TileFn tile[kMR][kNT];  // [rows - 1][tokens - 1]
  bool simd_dequant;
};

template <template <int, int> class K>
constexpr Kernels make_kernels(bool simd_dequant) {
  return Kernels{{{K<1, 1>::fn, K<1, 2>::fn, K<1, 3>::fn},
                  {K<2, 1>::fn, K<2, 2>::fn, K<2, 3>::fn},
                  {K<3, 1>::fn, K<3, 2>::fn, K<3, 3>::fn},
                  {K<4, 1>::fn, K<4, 2>::fn, K<4, 3>::fn}},
                 simd_dequant};
}
static_assert(kMR == 4 && kNT == 3, "make_kernels lists every micro-kernel shape");

template <int MR, int NT>
struct ScalarK {
  static constexpr TileFn fn = tile_scalar<MR, NT>;
};
constexpr Kernels kScalar = make_kernels<ScalarK>(false);
#if defined(__x86_64__)
template <int MR, int NT>
struct Avx2K {
  static constexpr TileFn fn = tile_avx2<MR, NT>;
};
constexpr Kernels kAvx2 = make_kernels<Avx2K>(true);
#endif

// Per-thread tile of dequantized rows; grows to the largest tile seen and is then reused, so
// steady-state calls allocate nothing.
float* tile_scratch(size_t floats) {
  thread_local HostBuffer buf;
  thread_local size_t cap = 0;
  if (floats > cap) {
    buf = host_alloc(floats * sizeof(float), "matmul dequantization tile");
    cap = floats;
  }
  return reinterpret_cast<float*>(buf.get());
}

// Output rows [r0, r1) for all T tokens.
void rows_range(const Kernels& k, const QuantTraits& q, const uint8_t* W, size_t rbytes, int64_t r0,
                int64_t r1, int64_t cols, const float* X, int64_t ldx, int64_t T, float* Y, int64_t ldy,
                int64_t tile_rows) {
  if (T == 1 && k.simd_dequant && q.gemv_simd) {
    q.gemv_simd(W + r0 * rbytes, rbytes, r1 - r0, cols, X, Y + r0);
    return;
  }
  const DequantRowFn dq = k.simd_dequant ? q.dequant_row_simd : q.dequant_row;
  float* buf = q.rows_are_f32 ? nullptr : tile_scratch(static_cast<size_t>(tile_rows * cols));
  for (int64_t rb = r0; rb < r1; rb += tile_rows) {
    const int64_t nr = std::min(tile_rows, r1 - rb);
    const float* tile;
    int64_t ldw;
    if (q.rows_are_f32) {
      tile = reinterpret_cast<const float*>(W + rb * rbytes);
      ldw = static_cast<int64_t>(rbytes / sizeof(float));
    } else {
      for (int64_t i = 0; i < nr; ++i) dq(W + (rb + i) * rbytes, buf + i * cols, cols);
      tile = buf;
      ldw = cols;
    }
    // Tokens outer: a few activation rows stay in L1 while the tile streams from L2.
    for (int64_t t0 = 0; t0 < T; t0 += kNT) {
      const int64_t nt = std::min<int64_t>(kNT, T - t0);
      for (int64_t i = 0; i < nr; i += kMR) {
        const int64_t mr = std::min<int64_t>(kMR, nr - i);
        k.tile[mr - 1][nt - 1](tile + i * ldw, ldw, X + t0 * ldx, ldx, cols, Y + t0 * ldy + rb + i, ldy);
      }
    }
  }
}

}  // namespace

namespace {

Isa cpu_isa() {
#if defined(__x86_64__)
  // F16C through cpuid: clang before 19 rejects __builtin_cpu_supports("f16c").
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
  if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c)) return Isa::Scalar;
  const bool vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  return vnni ? Isa::Avx512Vnni : Isa::Avx2;
#else
  return Isa::Scalar;
#endif
}

}  // namespace

Isa best_isa() {
  static const Isa best = [] {
    const Isa cpu = cpu_isa();
    const char* e = std::getenv("STRATA_CPU_ISA");
    if (!e || !*e) return cpu;
    const std::string v = e;
    const Isa cap = v == "scalar"       ? Isa::Scalar
                    : v == "avx2"       ? Isa::Avx2
                    : v == "avx512vnni" ? Isa::Avx512Vnni
                                        : cpu;
    STRATA_CHECK(v == "scalar" || v == "avx2" || v == "avx512vnni", ConfigError, "STRATA_CPU_ISA=", v,
                 " is not a CPU kernel set; use scalar, avx2 or avx512vnni (or unset it)");
    return std::min(cpu, cap);
  }();
  return best;
}

const char* isa_name(Isa isa) {
  return isa == Isa::Avx512Vnni ? "AVX-512 VNNI" : isa == Isa::Avx2 ? "AVX2" : "scalar";
}

void matmul(Isa isa, QType t, const void* W, int64_t rows, int64_t cols, const float* X, int64_t ldx,
            int64_t T, float* Y, int64_t ldy, ThreadPool& pool) {
  const QuantTraits& q = quant_traits(t);
  const size_t rbytes = row_bytes(t, cols);
  STRATA_CHECK(rows >= 0 && T >= 0, ConfigError, "matmul: negative shape rows=", rows, " T=", T);
  STRATA_CHECK(ldx >= cols && ldy >= rows, ConfigError, "matmul: leading dimensions ldx=", ldx, " ldy=", ldy,
               " are smaller than cols=", cols, " rows=", rows);
  if (rows == 0 || T == 0) return;
#if defined(__x86_64__)
  STRATA_CHECK(isa <= best_isa(), UnsupportedError, "matmul: this CPU (or STRATA_CPU_ISA) does not run ",
               isa_name(isa), " kernels");
  const Kernels& k = isa == Isa::Scalar ? kScalar : kAvx2;  // no AVX-512 kernels of its own
#else
  STRATA_CHECK(isa == Isa::Scalar, UnsupportedError, "matmul: AVX2 kernels exist only on x86-64");
  const Kernels& k = kScalar;
#endif
  const int64_t budget = T <= kNT ? kTileFloatsL1 : kTileFloatsL2;
  const int64_t tile_rows = std::clamp<int64_t>(budget / std::max<int64_t>(cols, 1) / kMR * kMR, kMR, 64);
  // About four chunks per thread balance uneven finishing without many trips to the pool's lock.
  const int64_t per = (rows + 4 * pool.size() - 1) / (4 * pool.size());
  const int64_t grain = std::max<int64_t>(kMR, (per + kMR - 1) / kMR * kMR);
  const uint8_t* w = static_cast<const uint8_t*>(W);
  pool.parallel_for(rows, grain, [&](int64_t r0, int64_t r1, int) {
    rows_range(k, q, w, rbytes, r0, r1, cols, X, ldx, T, Y, ldy, tile_rows);
  });
}

void matmul(QType t, const void* W, int64_t rows, int64_t cols, const float* X, int64_t ldx, int64_t T,
            float* Y, int64_t ldy, ThreadPool& pool) {
  matmul(best_isa(), t, W, rows, cols, X, ldx, T, Y, ldy, pool);
}

#if defined(__x86_64__)
namespace quant_detail {
namespace {

// Decode kernels: a decoder (decode_avx2.h) yields a row's elements eight at a time, as the same
// float32 operations dequant_row_simd performs, and gemv_rows multiplies them into the eight
// lanes that tile_avx2 would have used, so y is bit-identical to the tile path.

// MR rows at once: independent accumulator chains, and x loaded once per group for all of them.
template <class D, int MR>
STRATA_SIMD void gemv_rows(const uint8_t* w, size_t rbytes, int64_t cols, const float* x, float* y) {
  __m256 a[MR];
  for (int r = 0; r < MR; ++r) a[r] = _mm256_setzero_ps();
  const int64_t nblk = cols / D::kBlock;
  for (int64_t blk = 0; blk < nblk; ++blk) {
    for (int s = 0; s < D::kSubs; ++s) {
      typename D::Sub sub[MR];
      for (int r = 0; r < MR; ++r) sub[r] = D::sub(w + r * rbytes, blk, s);
      const float* xs = x + blk * D::kBlock + s * D::kGroups * 8;
      for (int g = 0; g < D::kGroups; ++g) {
        const __m256 xv = _mm256_loadu_ps(xs + 8 * g);
        for (int r = 0; r < MR; ++r) a[r] = _mm256_fmadd_ps(D::group(sub[r], g), xv, a[r]);
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    float s = hsum_ps(a[r]);  // tile_avx2's horizontal sum and scalar tail
    for (int64_t c = nblk * D::kBlock; c < cols; ++c) s = std::fma(D::tail(w + r * rbytes, c), x[c], s);
    y[r] = s;
  }
}

template <class D>
void gemv(const void* W, size_t rbytes, int64_t rows, int64_t cols, const float* x, float* y) {
  const uint8_t* w = static_cast<const uint8_t*>(W);
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) gemv_rows<D, 4>(w + r * rbytes, rbytes, cols, x, y + r);
  for (; r < rows; ++r) gemv_rows<D, 1>(w + r * rbytes, rbytes, cols, x, y + r);
}

}  // namespace

void gemv_f16_avx2(const void* W, size_t rb, int64_t rows, int64_t cols, const float* x, float* y) {
  gemv<DecF16>(W, rb, rows, cols, x, y);
}
void gemv_bf16_avx2(const void* W, size_t rb, int64_t rows, int64_t cols, const float* x, float* y) {
  gemv<DecBF16>(W, rb, rows, cols, x, y);
}
void gemv_q8_0_avx2(const void* W, size_t rb, int64_t rows, int64_t cols, const float* x, float* y) {
  gemv<DecQ8_0>(W, rb, rows, cols, x, y);
}
void gemv_q4_k_avx2(const void* W, size_t rb, int64_t rows, int64_t cols, const float* x, float* y) {
  gemv<DecQ4_K>(W, rb, rows, cols, x, y);
}
void gemv_q6_k_avx2(const void* W, size_t rb, int64_t rows, int64_t cols, const float* x, float* y) {
  gemv<DecQ6_K>(W, rb, rows, cols, x, y);
}
void gemv_iq2_xs_avx2(const void* W, size_t rb, int64_t rows, int64_t cols, const float* x, float* y) {
  gemv<DecIQ2_XS>(W, rb, rows, cols, x, y);
}
#define STRATA_GEMV(name, D)                                                                                \
  void gemv_##name##_avx2(const void* W, size_t rb, int64_t rows, int64_t cols, const float* x, float* y) { \
    gemv<D>(W, rb, rows, cols, x, y);                                                                       \
  }
STRATA_GEMV(q4_0, DecQ4_0)
STRATA_GEMV(q4_1, DecQ4_1)
STRATA_GEMV(q5_0, DecQ5_0)
STRATA_GEMV(q5_1, DecQ5_1)
STRATA_GEMV(iq4_nl, DecIQ4_NL)
STRATA_GEMV(mxfp4, DecMXFP4)
STRATA_GEMV(q3_k, DecQ3_K)
STRATA_GEMV(q5_k, DecQ5_K)
STRATA_GEMV(iq4_xs, DecIQ4_XS)
STRATA_GEMV(iq3_xxs, DecIQ3_XXS)
STRATA_GEMV(iq3_s, DecIQ3_S)
STRATA_GEMV(iq2_s, DecIQ2_S)
STRATA_GEMV(iq1_s, DecIQ1_S)
STRATA_GEMV(iq1_m, DecIQ1_M)
STRATA_GEMV(q2_k, DecQ2_K)
STRATA_GEMV(iq2_xxs, DecIQ2_XXS)
#undef STRATA_GEMV

}  // namespace quant_detail
#endif

}  // namespace strata
