// What the matmul kernel families share: their arguments, the list of formats the integer kernels are
// built for (the float kernels take every format of formats.cuh's list), its type switch, and the
// per-format launchers that the instance files of matmul_instances/ define.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/formats.cuh"
#include "backend/runs.h"
#include "core/error.h"
#include "quant/quant.h"
#include "quant/unit_decode.h"

// The formats of the integer kernels against q8_0 activations (uses_matmul_q8): every quantized one.
#define STRATA_CUDA_MATMUL_Q8_FORMATS(X) STRATA_CUDA_QUANT_FORMATS(X)

namespace strata::cuda {

// Y[t * ldy + r] = W[r, :] . X[t * ldx, :] for r < rows, t < T; W rows rb bytes apart.
struct MatmulArgs {
  const uint8_t* W;
  size_t rb;
  int64_t rows, cols;
  const float* X;
  int64_t ldx, T;
  float* Y;
  int64_t ldy;
  // One-token GEMV only: `batch` products of this shape, W, X and Y of product i at i * w_stride bytes,
  // i * x_stride and i * y_stride floats (grid y).
  int64_t batch = 1;
  size_t w_stride = 0;
  int64_t x_stride = 0, y_stride = 0;
  bool w_fixed = false;  // W is never written while work is queued: it may be read before grid_start
};

// Up to kGemvMulti matmuls of one activation row (T = 1) in one launch: rows [0, rows[0]) of the
// stacked row space are W[0]'s, the next rows[1] W[1]'s, ...; each W of cols elements, rows rb apart.
constexpr int kGemvMulti = 4;
struct GemvMultiArgs {
  const uint8_t* W[kGemvMulti];
  int64_t rows[kGemvMulti];
  float* Y[kGemvMulti];
  int n;
  size_t rb;
  int64_t cols, total;
  const float* X;
  bool w_fixed = false;  // as MatmulArgs::w_fixed, for every W
};

// The same matmuls on the tensor-core tile (a prompt's q, k and v): grid x walks the matrices' row tiles
// in order, matrix i's from tile0[i]; each block is launch_mma's block of that matrix.
struct MmaMultiArgs {
  const uint8_t* W[kGemvMulti];
  int64_t rows[kGemvMulti];
  float* Y[kGemvMulti];
  int64_t ldy[kGemvMulti];
  int32_t tile0[kGemvMulti + 1];
  int n;
  size_t rb;
  int64_t cols;
  const float* X;
  int64_t ldx, T;
};

// As MatmulArgs with q8_0 activation rows: Xq holds T rows of cols / 32 blocks, xrb bytes apart.
struct MatmulQ8Args {
  const uint8_t* W;
  size_t rb;
  int64_t rows, cols;
  const uint8_t* Xq;
  size_t xrb;
  int64_t T;
  float* Y;
  int64_t ldy;
};

// The routed experts' matmuls (matmul_experts, matmul_q8_experts): row i of X (or Xq) times matrix m
// of expert ids[order[i]], found through the table t, into row i of Y; W rows rb bytes apart.
struct ExpertsArgs {
  ExpertTable t;
  int m;
  size_t rb;
  int64_t rows, cols;
  const int32_t* ids;
  const int32_t* order;
  int64_t n;
  const float* X;
  int64_t ldx;
  const uint8_t* Xq;
  size_t xrb;
  float* Y;
  int64_t ldy;
  int m2 = -1;  // >= 0: the launch also multiplies matrix m2 into Y2 (grid rows n .. 2 n - 1)
  float* Y2 = nullptr;
};

// matmul_q8_runs as one launch: run j is rows row0[j] .. row0[j] + n[j] of Xq and Y against W[j] (and
// W2[j] into Y2 when Y2 is set, grid z 1); its token tiles are tile0[j] .. tile0[j + 1] of grid y. Passed
// by value (__grid_constant__): up to kMaxRuns runs a launch, the launcher splits longer lists.
constexpr int kMaxRuns = 112;
constexpr int64_t kRunsTileRows = 16;     // a run's rows a block (matmul_q8.cuh's LargeTile)
constexpr int64_t kRunsMmaTileRows = 64;  // the same on tensor cores (matmul_q8_mma.cuh)
struct RunsQ8Args {
  size_t rb;
  int64_t rows, cols;
  const uint8_t* Xq;
  size_t xrb;
  float* Y;
  float* Y2;
  int64_t ldy;
  int n_runs;
  bool mma;  // the tensor-core tile (matmul_q8_mma.cuh; its tiles are mmq_mma::kTB rows of a run)
  int32_t row0[kMaxRuns], n[kMaxRuns], tile0[kMaxRuns + 1];
  const uint8_t* W[kMaxRuns];
  const uint8_t* W2[kMaxRuns];
};
static_assert(sizeof(RunsQ8Args) <= 4000, "a kernel's parameters fit CUDA's 4 KB");

// matmul_runs on tensor cores as one launch: RunsQ8Args with float activation rows (X, ldx apart;
// x_vec: 16-byte aligned rows, read 16 bytes at a time).
constexpr int64_t kRunsF32TileRows = 128;  // a run's rows a block (matmul_mma.cuh's kBN)
constexpr int64_t kMmaTileRows = 64;       // the fp16 tile's weight rows a block (matmul_mma.cuh's kBM)
struct RunsF32Args {
  size_t rb;
  int64_t rows, cols;
  const float* X;
  int64_t ldx;
  bool x_vec;
  float* Y;
  float* Y2;
  int64_t ldy;
  int n_runs;
  int32_t row0[kMaxRuns], n[kMaxRuns], tile0[kMaxRuns + 1];
  const uint8_t* W[kMaxRuns];
  const uint8_t* W2[kMaxRuns];
};
static_assert(sizeof(RunsF32Args) <= 4000, "a kernel's parameters fit CUDA's 4 KB");

// Run j of a q8 runs launch as a plain matmul_q8 (its matrix W, or W2 into Y2 when `second`).
__device__ __forceinline__ MatmulQ8Args run_args(const RunsQ8Args& g, int j, bool second) {
  return MatmulQ8Args{second ? g.W2[j] : g.W[j],
                      g.rb,
                      g.rows,
                      g.cols,
                      g.Xq + static_cast<size_t>(g.row0[j]) * g.xrb,
                      g.xrb,
                      g.n[j],
                      (second ? g.Y2 : g.Y) + static_cast<int64_t>(g.row0[j]) * g.ldy,
                      g.ldy};
}

// The same for a float runs launch.
__device__ __forceinline__ MatmulArgs run_args(const RunsF32Args& g, int j, bool second) {
  return MatmulArgs{second ? g.W2[j] : g.W[j],
                    g.rb,
                    g.rows,
                    g.cols,
                    g.X + static_cast<int64_t>(g.row0[j]) * g.ldx,
                    g.ldx,
                    g.n[j],
                    (second ? g.Y2 : g.Y) + static_cast<int64_t>(g.row0[j]) * g.ldy,
                    g.ldy};
}

// Expert e's matrix m, or null when it is out of range or not resident (device side of expert_matrix).
__device__ __forceinline__ const uint8_t* expert_matrix_dev(const ExpertTable& t, int m, int32_t e) {
  if (e < 0 || e >= t.E) return nullptr;
  if (t.slots) {
    const int32_t s = t.slots[e];
    return s < 0 ? nullptr : t.arena + static_cast<size_t>(s) * t.slot_bytes + t.off[m];
  }
  return t.base[m] + static_cast<size_t>(e) * t.stride[m];
}

__host__ __device__ constexpr int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Activation rows 16-byte aligned (X and ldx): the kernels read them 16 bytes at a time.
// Whether one token's GEMV stages its activations in shared memory (gemv_row_xs_kernel; the same bits
// as gemv_row_kernel): STRATA_CUDA_GEMV_XS=0 turns it off, to measure the difference.
bool gemv_xs_on();
// matmul_experts' one-token GEMV with its activations staged once a block (STRATA_CUDA_EXPERTS_XS=1, opt-in).
bool gemv_experts_xs_on();
// STRATA_CUDA_GEMV_STAGE=0: the one-token GEMV decodes its weights from global memory, not a warp's copy
// in shared memory (gemv::WStage; the same bits either way), for the A/B.
bool gemv_stage_on();
// Whether one token's Q8_0 GEMV loads a lane's raw words of a row before decoding any
// (gemv_row_q8raw_kernel; the same bits): STRATA_CUDA_GEMV_RAW=1, read at each launch; opt-in until timed.
bool gemv_raw_on();
// Whether mmvq_experts stages a pending slot's rows (the write-through) by register loads instead of
// cp.async (STRATA_CUDA_WT_LD=1, read at each launch; the same bytes, so the same bits). Opt-in until a GPU
// has timed it.
bool wt_ld_on();
// Whether the Q4_K MMVQ kernel's integer phase goes a superblock a thread (the same bits):
// STRATA_CUDA_MMVQ_SB=0 turns it off, to measure the difference.
bool mmvq_sb_on();

inline bool x_rows_aligned(const float* X, int64_t ldx) {
  return reinterpret_cast<uintptr_t>(X) % 16 == 0 && ldx % 4 == 0;
}

// Launchers of one format (defined in matmul_gemv.cuh, matmul_mma.cuh and matmul_q8.cuh, instantiated
// per format in matmul_instances/). Arguments are checked; any T.
template <class F>
void launch_gemv(const MatmulArgs& a, cudaStream_t s);
template <class F>
void launch_gemv_multi(const GemvMultiArgs& g, cudaStream_t s);
template <class F>
void launch_mma(const MatmulArgs& a, cudaStream_t s);
template <class F>
void launch_mma_multi(const MmaMultiArgs& g, cudaStream_t s);
template <class F>
void launch_mmq(const MatmulQ8Args& a, cudaStream_t s);
template <class F>
void launch_gemv_experts(const ExpertsArgs& g, cudaStream_t s);
template <class F>
void launch_mmq_experts(const ExpertsArgs& g, cudaStream_t s);
// One launch of g.n_runs runs whose token tiles number tile0[n_runs].
template <class F>
void launch_mmq_runs(const RunsQ8Args& g, cudaStream_t s);
template <class F>
void launch_mma_runs(const RunsF32Args& g, cudaStream_t s);

// Whether matmul_q8 of many tokens (and matmul_q8_runs) runs on the tensor-core tile: a device of compute
// capability 8.0 or later, unless STRATA_CUDA_MMA_Q8=0 (read at each launch, so tests can run both tiles;
// the same bits either way).
bool mma_q8_on();

// As dispatch_format (formats.cuh), over the formats with an integer kernel.
template <class Fn>
void dispatch_matmul_q8_format(uint32_t type, const char* what, Fn&& fn) {
  switch (static_cast<QType>(type)) {
#define STRATA_CASE(N) \
  case QType::N:       \
    return fn(unit::N{});
    STRATA_CUDA_MATMUL_Q8_FORMATS(STRATA_CASE)
#undef STRATA_CASE
    default:
      break;
  }
  const QuantTraits& q = quant_traits(type, what);
  throw UnsupportedError(str(what, ": ggml type ", q.name,
                             " has no integer kernel; use matmul (uses_matmul_q8 is false for it)"));
}

}  // namespace strata::cuda
