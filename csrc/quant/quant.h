// Quantized weight formats (their blocks: formats.h), their traits table, dequantization and the
// CPU matmul that every backend is checked against.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/thread_pool.h"
#include "quant/formats.h"  // the block structs

namespace strata {

// Values are ggml type ids, as stored in GGUF tensor infos.
enum class QType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  IQ1_M = 29,
  BF16 = 30,
  MXFP4 = 39
};

using DequantRowFn = void (*)(const void* src, float* dst, int64_t n);
// y[r] = row r of W (rows row_bytes apart) . x, for r < rows: matmul's order for T = 1.
using GemvFn = void (*)(const void* W, size_t row_bytes, int64_t rows, int64_t cols, const float* x,
                        float* y);
// matmul_q8 over all `rows` rows of W (row_bytes apart) and T tokens of Xq.
using MatmulQ8Fn = void (*)(const void* W, size_t row_bytes, int64_t rows, int64_t cols, const uint8_t* Xq,
                            int64_t xrow_bytes, int64_t T, float* Y, int64_t ldy);

struct QuantTraits {
  QType type;
  const char* name;
  int64_t block_size;  // elements per block
  size_t type_size;    // bytes per block
  // n % block_size == 0. Bit-identical to gguf.quants.dequantize (numpy float32 math).
  DequantRowFn dequant_row;
  // The same function compiled for AVX2 where the build targets x86-64 (same values, bit for
  // bit); equal to dequant_row elsewhere. matmul picks it when the CPU has AVX2+FMA+F16C.
  DequantRowFn dequant_row_simd;
  // Rows are float32 already, so matmul reads them in place instead of copying.
  bool rows_are_f32;
  // AVX2 decode kernel (T = 1): dequantizes 8 elements at a time into registers and multiplies
  // them in place, in matmul's order and with dequant_row's values. nullptr: the tile path.
  GemvFn gemv_simd;
  // matmul_q8's integer kernels, scalar and AVX2 (equal bit for bit); nullptr where the type has none.
  MatmulQ8Fn matmul_q8;
  MatmulQ8Fn matmul_q8_simd;
  // The AVX-512 VNNI integer kernel (the same values bit for bit) where it measured faster than the AVX2
  // one (bench/NOTES.md); nullptr: Isa::Avx512Vnni runs matmul_q8_simd for this type.
  MatmulQ8Fn matmul_q8_vnni;
};

// nullptr if strata does not compute with this ggml type.
const QuantTraits* find_quant(uint32_t ggml_type);
// As find_quant, but throws UnsupportedError naming `what`, the type and the supported ones.
const QuantTraits& quant_traits(uint32_t ggml_type, const std::string& what);
inline const QuantTraits& quant_traits(QType t) { return quant_traits(static_cast<uint32_t>(t), "quant"); }

// Bytes of one row of n elements; ConfigError if n is not a whole number of blocks.
size_t row_bytes(QType t, int64_t n);

// Dequantizes a whole tensor of n elements (n % block_size == 0) to float32.
void dequantize(QType t, const void* src, float* dst, int64_t n);

// Y[t*ldy + r] = sum_c W_r[c] * X[t*ldx + c] for t < T, r < rows. W holds `rows` rows of `cols`
// elements of type t, row_bytes(t, cols) apart. Threads split the rows only.
//
// Every Y element has one fixed accumulation order, whatever T, the thread count, the rows
// subset or W's offset: w = the row dequantized to float32; eight lanes a[j] = fma(w[c], x[c],
// a[j]) for c = 8i + j over the first cols/8*8 columns in order; s = ((a0+a4)+(a2+a6)) +
// ((a1+a5)+(a3+a7)); then s = fma(w[c], x[c], s) over the remaining columns. The AVX2 and the
// scalar kernels both compute exactly this, so results do not depend on the CPU either.
void matmul(QType t, const void* W, int64_t rows, int64_t cols, const float* X, int64_t ldx, int64_t T,
            float* Y, int64_t ldy, ThreadPool& pool);

// Kernel sets matmul and matmul_q8 can run, each a superset of the one before; tests use this to check
// that they agree bit for bit. Avx512Vnni adds matmul_q8's AVX-512 VNNI kernels (QuantTraits::matmul_q8_vnni)
// and otherwise runs the AVX2 kernels.
enum class Isa { Scalar, Avx2, Avx512Vnni };
// The best set this CPU runs: Avx2 when the build is x86-64 and the CPU has AVX2, FMA and F16C;
// Avx512Vnni when it also has AVX-512 F, BW, VL and VNNI. STRATA_CPU_ISA=scalar|avx2 caps it (read once;
// an A/B switch for tests and benchmarks); another value is a ConfigError.
Isa best_isa();
const char* isa_name(Isa isa);  // "scalar", "AVX2", "AVX-512 VNNI"
void matmul(Isa isa, QType t, const void* W, int64_t rows, int64_t cols, const float* X, int64_t ldx,
            int64_t T, float* Y, int64_t ldy, ThreadPool& pool);

// Integer matmul against q8_0 activations (the MMQ layout; llama.cpp's CPU path): Xq holds T rows
// of cols/32 q8_0 blocks (BlockQ8_0: fp16 d_x, 32 int8 in [-127, 127], as quantize_row_q8_0 writes
// them, kQ8_0Bytes apart), xrow_bytes apart; Y[t*ldy + r] for t < T, r < rows. Threads split the rows only.
//
// Per output element one float accumulator a = 0 runs over the row's 32-element blocks in column
// order; the integer sums are exact, and each block adds, with d the weight (super-)block's fp16
// scale, dx = d_x and S(v) = sum of v[i] * x_q[i] over the block (or its 16-element halves):
//   Q8_0:   a = fma(d * dx, (float)S(w_q), a)
//   Q4_K:   a = fma(d * dx, (float)(sc * S(q4)), a); a = fma(-(dmin * dx), (float)(m * S(1)), a)
//   Q5_K:   a = fma(d * dx, (float)(sc * S(q5)), a); a = fma(-(dmin * dx), (float)(m * S(1)), a)
//   Q3_K:   a = fma(d * dx, (float)(sc_lo * S_lo(q3) + sc_hi * S_hi(q3)), a)
//   Q4_0, Q5_0, IQ4_NL: a = fma(d * dx, (float)S(v), a)   (v = q - 8, q - 16, the codebook value)
//   MXFP4:  a = fma(e * dx, (float)S(v), a)   (e the block's halved E8M0 scale, v the doubled e2m1 value)
//   Q4_1, Q5_1: a = fma(d * dx, (float)S(q), a); a = fma(m * dx, (float)S(1), a)
//   IQ4_XS: a = fma(d * dx, (float)(sc * S(v)), a)
//   IQ3_XXS: a = fma((d * 0.25f) * dx, (float)((2 s + 1) S(g)), a)
//   IQ3_S:  a = fma(d * dx, (float)((2 s + 1) S(g)), a)
//   IQ2_S:  a = fma((d * 0.125f) * dx, (float)((2 s_lo + 1) S_lo(g) + (2 s_hi + 1) S_hi(g)), a)
//   IQ1_S:  a = fma((d * 0.125f) * dx, (float)((2 s + 1) S(v8)), a)   (v8 = 8 (g + delta), in [-9, 9])
//   IQ1_M:  a = fma((d * 0.125f) * dx, (float)((2 s_lo + 1) S_lo(v8) + (2 s_hi + 1) S_hi(v8)), a)
//   Q6_K:   a = fma(d * dx, (float)(sc_lo * S_lo(q6 - 32) + sc_hi * S_hi(q6 - 32)), a)
//   IQ2_XS: a = fma((d * dx) * 0.125f, (float)((2 s_lo + 1) S_lo(g) + (2 s_hi + 1) S_hi(g)), a)
//   IQ2_XXS: a = fma((d * dx) * 0.125f, (float)((2 s + 1) S(g)), a)
//   Q2_K:   a = fma(d * dx, (float)(sc_lo S_lo(q2) + sc_hi S_hi(q2)), a);
//           a = fma(-(dmin * dx), (float)(m_lo S_lo(1) + m_hi S_hi(1)), a)
// (sc, m: the 32-block's 6-bit scale and min (IQ4_XS: its scale minus 32); sc_lo/hi: the int8 scales of
// its halves (Q3_K: the 6-bit scales minus 32); g: grid
// magnitude times sign; s_lo/hi, s: 4-bit scales; Q2_K: the 4-bit scales and mins of its halves).
// So results do not depend on T, the thread count, the rows subset or the CPU.
bool has_matmul_q8(QType t);

// The kernel choice for a weight type, tried in this order by the MoE block: the integer kernel
// against q8_0 activations where the type has one (quantized weights: llama.cpp's path), else the
// float matmul on float activations (F32/F16/BF16 weights stay exact: their activations are never
// quantized). An unknown type is neither.
bool uses_matmul_q8(uint32_t ggml_type);
void matmul_q8(QType t, const void* W, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrow_bytes,
               int64_t T, float* Y, int64_t ldy, ThreadPool& pool);
void matmul_q8(Isa isa, QType t, const void* W, int64_t rows, int64_t cols, const uint8_t* Xq,
               int64_t xrow_bytes, int64_t T, float* Y, int64_t ldy, ThreadPool& pool);

}  // namespace strata
