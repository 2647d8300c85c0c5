// The weight matmuls' launchers: argument checks, the kernel choice and the one type switch of each
// kernel family (formats.cuh, matmul_kernels.cuh); the kernels are instantiated per format in
// matmul_instances/.
#include <climits>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/common.cuh"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/matmul_kernels.cuh"
#include "backend/runs.h"
#include "core/env.h"

namespace strata::cuda {
namespace {

constexpr int64_t kGemvMaxT = 8;

void check_shape(const char* op, int64_t rows, int64_t cols, int64_t T, int64_t ldy) {
  STRATA_CHECK(rows >= 0 && cols >= 0 && T >= 0, ConfigError, op, ": negative shape rows=", rows,
               " cols=", cols, " T=", T);
  STRATA_CHECK(ldy >= rows, ConfigError, op, ": ldy=", ldy, " is smaller than rows=", rows);
}

template <class F>
void check_weights(const void* W, size_t rb, const char* op) {
  constexpr size_t kAlign = unit::block_align<F>();  // what the decoders read the blocks by
  STRATA_CHECK(reinterpret_cast<uintptr_t>(W) % kAlign == 0 && rb % kAlign == 0, ConfigError, op,
               ": weight rows at ", W, ", ", rb, " bytes apart, are not aligned to ", kAlign, " bytes");
}

// pack_runs's check of a run: its matrices aligned as the decoders read them, a second one where Y2 is set.
template <class F>
auto checked_run(const char* op, size_t rb, const float* Y2) {
  return [=](const Backend::ExpertRun& r) {
    check_weights<F>(r.W, rb, op);
    STRATA_CHECK(!Y2 || r.W2, ConfigError, op, ": a run has no second matrix for Y2");
    if (Y2) check_weights<F>(r.W2, rb, op);
  };
}

// A matmul's arguments as launch_matmul_path and launch_matmul_strided take them: shape, row strides, the
// weights' alignment as the decoders read them, the activations' 4-byte alignment.
template <class F>
void check_matmul(const char* op, const void* W, size_t rb, int64_t rows, int64_t cols, const float* X,
                  int64_t ldx, int64_t T, int64_t ldy) {
  check_shape(op, rows, cols, T, ldy);
  STRATA_CHECK(ldx >= cols, ConfigError, op, ": ldx=", ldx, " is smaller than cols=", cols);
  check_weights<F>(W, rb, op);
  STRATA_CHECK(reinterpret_cast<uintptr_t>(X) % 4 == 0, ConfigError, op, ": activations at ", X,
               " are not 4-byte aligned");
}

}  // namespace

bool mma_q8_on() {
  static const bool capable = [] {
    int dev = 0, major = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
           major >= 8;
  }();
  const char* e = std::getenv("STRATA_CUDA_MMA_Q8");
  return capable && !(e && std::strcmp(e, "0") == 0);
}

namespace {
// Whether matmul_n's matrices share one tensor-core launch (unless STRATA_CUDA_MMA_MULTI=0: the A/B
// switch; the same bits either way). A decode step's one-token matmul_n is always one GEMV launch.
bool mma_multi_on() {
  const char* e = std::getenv("STRATA_CUDA_MMA_MULTI");
  return !(e && std::strcmp(e, "0") == 0);
}
}  // namespace

bool mmvq_sb_on() {
  static const bool on = [] {
    const char* e = std::getenv("STRATA_CUDA_MMVQ_SB");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

bool gemv_xs_on() {
  static const bool on = [] {
    const char* e = std::getenv("STRATA_CUDA_GEMV_XS");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

// Read at each launch (the op harness runs both in one process). Opt-in (STRATA_CUDA_EXPERTS_XS=1) until a
// GPU run has checked and timed it: written after stop 42's device time ran out.
bool gemv_experts_xs_on() { return env_switch("STRATA_CUDA_EXPERTS_XS", false); }

bool gemv_raw_on() { return env_switch("STRATA_CUDA_GEMV_RAW", false); }

bool wt_ld_on() { return env_switch("STRATA_CUDA_WT_LD", false); }

bool gemv_stage_on() {
  static const bool on = [] {
    const char* e = std::getenv("STRATA_CUDA_GEMV_STAGE");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

bool matmul_should_use_gemv(uint32_t, int64_t, int64_t, int64_t T) { return T <= kGemvMaxT; }

void launch_matmul_path(MatmulPath path, uint32_t type, const void* W, int64_t rows, int64_t cols,
                        const float* X, int64_t ldx, int64_t T, float* Y, int64_t ldy, cudaStream_t s,
                        bool w_fixed) {
  dispatch_format(type, "matmul weight", [&](auto fmt) {
    using F = decltype(fmt);
    const size_t rb = row_bytes(F::kType, cols);
    check_matmul<F>("matmul", W, rb, rows, cols, X, ldx, T, ldy);
    if (rows == 0 || T == 0) return;
    MatmulArgs a{static_cast<const uint8_t*>(W), rb, rows, cols, X, ldx, T, Y, ldy};
    a.w_fixed = w_fixed;
    if (path == MatmulPath::Gemv)
      launch_gemv<F>(a, s);
    else
      launch_mma<F>(a, s);
  });
}

void launch_matmul_n(MatmulPath path, uint32_t type, int64_t cols, const float* X, int64_t ldx, int64_t T,
                     const Backend::MatmulOut* outs, int n, cudaStream_t s, bool w_fixed) {
  int64_t total = 0;
  for (int i = 0; i < n; ++i) total += outs[i].rows;
  const bool one_launch =
      n >= 1 && n <= kGemvMulti && total > 0 && cols > 0 && T > 0 &&
      ((path == MatmulPath::Gemv && T == 1) || (path == MatmulPath::TensorCore && mma_multi_on()));
  if (!one_launch) {
    for (int i = 0; i < n; ++i)
      launch_matmul_path(path, type, outs[i].W, outs[i].rows, cols, X, ldx, T, outs[i].Y, outs[i].ldy, s,
                         w_fixed);
    return;
  }
  dispatch_format(type, "matmul weight", [&](auto fmt) {
    using F = decltype(fmt);
    STRATA_CHECK(ldx >= cols, ConfigError, "matmul: ldx=", ldx, " is smaller than cols=", cols);
    STRATA_CHECK(reinterpret_cast<uintptr_t>(X) % 4 == 0, ConfigError, "matmul: activations at ", X,
                 " are not 4-byte aligned");
    const size_t rb = row_bytes(F::kType, cols);
    for (int i = 0; i < n; ++i) {
      check_shape("matmul", outs[i].rows, cols, T, outs[i].ldy);
      check_weights<F>(outs[i].W, rb, "matmul");
    }
    if (path == MatmulPath::Gemv) {
      GemvMultiArgs g{};
      g.n = n;
      g.rb = rb;
      g.cols = cols;
      g.X = X;
      g.total = total;
      g.w_fixed = w_fixed;
      for (int i = 0; i < n; ++i) {
        g.W[i] = static_cast<const uint8_t*>(outs[i].W);
        g.rows[i] = outs[i].rows;
        g.Y[i] = outs[i].Y;
      }
      launch_gemv_multi<F>(g, s);
      return;
    }
    MmaMultiArgs g{};
    g.n = n;
    g.rb = rb;
    g.cols = cols;
    g.X = X;
    g.ldx = ldx;
    g.T = T;
    int64_t tiles = 0;
    for (int i = 0; i < n; ++i) {
      g.W[i] = static_cast<const uint8_t*>(outs[i].W);
      g.rows[i] = outs[i].rows;
      g.Y[i] = outs[i].Y;
      g.ldy[i] = outs[i].ldy;
      g.tile0[i] = static_cast<int32_t>(tiles);
      tiles += ceil_div(outs[i].rows, kMmaTileRows);
      STRATA_CHECK(tiles <= INT32_MAX, ConfigError, "matmul: ", total, " rows exceed one launch");
    }
    g.tile0[n] = static_cast<int32_t>(tiles);
    launch_mma_multi<F>(g, s);
  });
}

void launch_matmul_strided(MatmulPath path, uint32_t type, const void* W, size_t w_stride, int64_t rows,
                           int64_t cols, const float* X, int64_t x_stride, int64_t ldx, int64_t T, float* Y,
                           int64_t y_stride, int64_t ldy, int64_t n, cudaStream_t s, bool w_fixed) {
  STRATA_CHECK(n >= 0, ConfigError, "matmul_strided: ", n, " products");
  // One launch over the products (grid y for one token's GEMV, grid z for the tensor-core tile); a few
  // tokens' GEMV (2-8): their own launches.
  const bool one_launch = n > 1 && n <= 65535 && (path == MatmulPath::TensorCore || T == 1);
  if (!one_launch) {
    for (int64_t i = 0; i < n; ++i)
      launch_matmul_path(path, type, static_cast<const uint8_t*>(W) + i * w_stride, rows, cols,
                         X + i * x_stride, ldx, T, Y + i * y_stride, ldy, s, w_fixed);
    return;
  }
  dispatch_format(type, "matmul weight", [&](auto fmt) {
    using F = decltype(fmt);
    const size_t rb = row_bytes(F::kType, cols);
    check_matmul<F>("matmul_strided", W, rb, rows, cols, X, ldx, T, ldy);
    check_weights<F>(W, w_stride, "matmul_strided (the products' stride)");
    if (rows == 0) return;
    MatmulArgs a{static_cast<const uint8_t*>(W), rb, rows, cols, X, ldx, T, Y, ldy};
    a.batch = n;
    a.w_stride = w_stride;
    a.w_fixed = w_fixed;
    a.x_stride = x_stride;
    a.y_stride = y_stride;
    if (path == MatmulPath::Gemv)
      launch_gemv<F>(a, s);
    else
      launch_mma<F>(a, s);
  });
}

void launch_matmul(uint32_t type, const void* W, int64_t rows, int64_t cols, const float* X, int64_t ldx,
                   int64_t T, float* Y, int64_t ldy, cudaStream_t s) {
  const MatmulPath path =
      matmul_should_use_gemv(type, rows, cols, T) ? MatmulPath::Gemv : MatmulPath::TensorCore;
  launch_matmul_path(path, type, W, rows, cols, X, ldx, T, Y, ldy, s);
}

void launch_matmul_experts(uint32_t type, const ExpertTable& t, int m, int64_t rows, int64_t cols,
                           const int32_t* ids, const int32_t* order, int64_t n, const float* X, int64_t ldx,
                           float* Y, int64_t ldy, cudaStream_t s) {
  dispatch_format(type, "matmul_experts weight", [&](auto fmt) {
    using F = decltype(fmt);
    check_shape("matmul_experts", rows, cols, n, ldy);
    STRATA_CHECK(m >= 0 && m < 3, ConfigError, "matmul_experts: matrix ", m, " is not 0, 1 or 2");
    STRATA_CHECK(ldx >= cols, ConfigError, "matmul_experts: ldx=", ldx, " is smaller than cols=", cols);
    STRATA_CHECK(n <= 65535, ConfigError, "matmul_experts: ", n, " rows exceed one launch (65535)");
    STRATA_CHECK(reinterpret_cast<uintptr_t>(X) % 4 == 0, ConfigError, "matmul_experts: activations at ", X,
                 " are not 4-byte aligned");
    if (rows == 0 || n == 0) return;
    ExpertsArgs g{t, m, row_bytes(F::kType, cols), rows, cols, ids, order, n, X, ldx, nullptr, 0, Y, ldy};
    launch_gemv_experts<F>(g, s);
  });
}

void launch_matmul_q8_experts(uint32_t type, const ExpertTable& t, int m, int64_t rows, int64_t cols,
                              const int32_t* ids, const int32_t* order, int64_t n, const uint8_t* Xq,
                              size_t xrow_bytes, float* Y, int64_t ldy, cudaStream_t s, int m2, float* Y2) {
  dispatch_matmul_q8_format(type, "matmul_q8_experts weight", [&](auto fmt) {
    using F = decltype(fmt);
    check_shape("matmul_q8_experts", rows, cols, n, ldy);
    STRATA_CHECK(m >= 0 && m < 3, ConfigError, "matmul_q8_experts: matrix ", m, " is not 0, 1 or 2");
    STRATA_CHECK(m2 < 0 || (m2 < 3 && Y2), ConfigError, "matmul_q8_experts: second matrix ", m2,
                 " is not 0, 1 or 2 with an output");
    // Write-through: the staged source rows go to the slot in 16-byte pieces, so the source lies as the
    // slots modulo 16 (ExpertCache::write_through's condition).
    for (const int mm : {m, m2}) {
      if (!t.pending || mm < 0) continue;
      const uintptr_t src = reinterpret_cast<uintptr_t>(t.src[mm]),
                      dst = reinterpret_cast<uintptr_t>(t.arena) + t.off[mm];
      STRATA_CHECK(t.slots && (src - dst) % 16 == 0 && t.src_stride[mm] % 16 == 0 && t.slot_bytes % 16 == 0,
                   Error,
                   "internal error: matmul_q8_experts writes through slots only, the source aligned as "
                   "the slots modulo 16");
    }
    STRATA_CHECK(m2 < 0 || n <= 65535 / 2, ConfigError, "matmul_q8_experts: ", n,
                 " rows of two matrices exceed one launch (32767)");
    STRATA_CHECK(xrow_bytes >= static_cast<size_t>(cols / kQK8_0 * kQ8_0Bytes), ConfigError,
                 "matmul_q8_experts: xrow_bytes=", xrow_bytes, " is smaller than a row of ", cols / kQK8_0,
                 " q8_0 blocks");
    STRATA_CHECK(n <= 65535, ConfigError, "matmul_q8_experts: ", n, " rows exceed one launch (65535)");
    STRATA_CHECK(reinterpret_cast<uintptr_t>(Xq) % 2 == 0 && xrow_bytes % 2 == 0, ConfigError,
                 "matmul_q8_experts: q8_0 activation rows are not 2-byte aligned");
    if (rows == 0 || n == 0) return;
    ExpertsArgs g{
        t,  m, row_bytes(F::kType, cols), rows, cols, ids, order, n, nullptr, 0, Xq, xrow_bytes, Y, ldy,
        m2, Y2};
    launch_mmq_experts<F>(g, s);
  });
}

void launch_matmul_q8_runs(uint32_t type, const Backend::ExpertRun* runs, int64_t n_runs, int64_t rows,
                           int64_t cols, const uint8_t* Xq, size_t xrow_bytes, float* Y, float* Y2,
                           int64_t ldy, cudaStream_t s) {
  dispatch_matmul_q8_format(type, "matmul_q8_runs weight", [&](auto fmt) {
    using F = decltype(fmt);
    const size_t rb = row_bytes(F::kType, cols);
    check_shape("matmul_q8_runs", rows, cols, 0, ldy);
    STRATA_CHECK(xrow_bytes >= static_cast<size_t>(cols / kQK8_0 * kQ8_0Bytes), ConfigError,
                 "matmul_q8_runs: xrow_bytes=", xrow_bytes, " is smaller than a row of ", cols / kQK8_0,
                 " q8_0 blocks");
    STRATA_CHECK(reinterpret_cast<uintptr_t>(Xq) % 2 == 0 && xrow_bytes % 2 == 0, ConfigError,
                 "matmul_q8_runs: q8_0 activation rows at ", static_cast<const void*>(Xq), ", ", xrow_bytes,
                 " bytes apart, are not 2-byte aligned");
    if (rows == 0) return;
    RunsQ8Args g{};
    g.rb = rb;
    g.rows = rows;
    g.cols = cols;
    g.Xq = Xq;
    g.xrb = xrow_bytes;
    g.Y = Y;
    g.Y2 = Y2;
    g.ldy = ldy;
    g.mma = mma_q8_on();
    pack_runs("matmul_q8_runs", g, runs, n_runs, g.mma ? kRunsMmaTileRows : kRunsTileRows, kMaxRuns,
              checked_run<F>("matmul_q8_runs", rb, Y2), [&] { launch_mmq_runs<F>(g, s); });
  });
}

void launch_matmul_runs(uint32_t type, const Backend::ExpertRun* runs, int64_t n_runs, int64_t rows,
                        int64_t cols, const float* X, int64_t ldx, float* Y, float* Y2, int64_t ldy,
                        cudaStream_t s) {
  dispatch_format(type, "matmul_runs weight", [&](auto fmt) {
    using F = decltype(fmt);
    const size_t rb = row_bytes(F::kType, cols);
    check_shape("matmul_runs", rows, cols, 0, ldy);
    STRATA_CHECK(ldx >= cols, ConfigError, "matmul_runs: ldx=", ldx, " is smaller than cols=", cols);
    STRATA_CHECK(reinterpret_cast<uintptr_t>(X) % 4 == 0, ConfigError, "matmul_runs: activations at ", X,
                 " are not 4-byte aligned");
    if (rows == 0) return;
    RunsF32Args g{};
    g.rb = rb;
    g.rows = rows;
    g.cols = cols;
    g.X = X;
    g.ldx = ldx;
    g.x_vec = x_rows_aligned(X, ldx);
    g.Y = Y;
    g.Y2 = Y2;
    g.ldy = ldy;
    pack_runs("matmul_runs", g, runs, n_runs, kRunsF32TileRows, kMaxRuns,
              checked_run<F>("matmul_runs", rb, Y2), [&] { launch_mma_runs<F>(g, s); });
  });
}

void launch_matmul_q8(uint32_t type, const void* W, int64_t rows, int64_t cols, const uint8_t* Xq,
                      size_t xrow_bytes, int64_t T, float* Y, int64_t ldy, cudaStream_t s) {
  dispatch_matmul_q8_format(type, "matmul_q8 weight", [&](auto fmt) {
    using F = decltype(fmt);
    const size_t rb = row_bytes(F::kType, cols);
    check_shape("matmul_q8", rows, cols, T, ldy);
    STRATA_CHECK(xrow_bytes >= static_cast<size_t>(cols / kQK8_0 * kQ8_0Bytes), ConfigError,
                 "matmul_q8: xrow_bytes=", xrow_bytes, " is smaller than a row of ", cols / kQK8_0,
                 " q8_0 blocks");
    check_weights<F>(W, rb, "matmul_q8");
    STRATA_CHECK(reinterpret_cast<uintptr_t>(Xq) % 2 == 0 && xrow_bytes % 2 == 0, ConfigError,
                 "matmul_q8: q8_0 activation rows at ", static_cast<const void*>(Xq), ", ", xrow_bytes,
                 " bytes apart, are not 2-byte aligned");
    if (rows == 0 || T == 0) return;
    launch_mmq<F>(MatmulQ8Args{static_cast<const uint8_t*>(W), rb, rows, cols, Xq, xrow_bytes, T, Y, ldy}, s);
  });
}

}  // namespace strata::cuda
