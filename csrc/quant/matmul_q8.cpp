// matmul_q8: quantized weights times q8_0-quantized activations with integer dot products per
// 32-element block (llama.cpp's CPU path), in the one float order quant.h defines. The kernels live
// in one file per format family (mmq_legacy.cpp, mmq_k.cpp, mmq_iq.cpp, on mmq.h's machinery); this
// checks shapes and splits the rows between threads.
#include <algorithm>
#include <cstddef>

#include "core/error.h"
#include "quant/formats.h"
#include "quant/quant.h"

namespace strata {

bool has_matmul_q8(QType t) { return quant_traits(t).matmul_q8 != nullptr; }

bool uses_matmul_q8(uint32_t ggml_type) {
  const QuantTraits* q = find_quant(ggml_type);
  return q && q->matmul_q8 != nullptr;
}

void matmul_q8(Isa isa, QType t, const void* W, int64_t rows, int64_t cols, const uint8_t* Xq,
               int64_t xrow_bytes, int64_t T, float* Y, int64_t ldy, ThreadPool& pool) {
  const QuantTraits& q = quant_traits(t);
  STRATA_CHECK(q.matmul_q8, UnsupportedError, "matmul_q8: no integer kernel for ", q.name,
               " weights; use matmul (float activations) for this type");
  const size_t rbytes = row_bytes(t, cols);
  STRATA_CHECK(cols % kQK8_0 == 0, ConfigError, "matmul_q8: cols=", cols, " is not a multiple of ", kQK8_0);
  STRATA_CHECK(rows >= 0 && T >= 0, ConfigError, "matmul_q8: negative shape rows=", rows, " T=", T);
  STRATA_CHECK(xrow_bytes >= cols / kQK8_0 * kQ8_0Bytes && ldy >= rows, ConfigError,
               "matmul_q8: xrow_bytes=", xrow_bytes, " or ldy=", ldy, " is smaller than a row (",
               cols / kQK8_0 * kQ8_0Bytes, " bytes, ", rows, " floats)");
  if (rows == 0 || T == 0) return;
  MatmulQ8Fn fn = q.matmul_q8;
  if (isa != Isa::Scalar) {
    STRATA_CHECK(isa <= best_isa() && q.matmul_q8_simd, UnsupportedError,
                 "matmul_q8: this CPU (or STRATA_CPU_ISA) does not run ", isa_name(isa), " kernels");
    // Avx512Vnni: the type's VNNI kernel where it has one (it measured faster), else its AVX2 one.
    fn = isa == Isa::Avx512Vnni && q.matmul_q8_vnni ? q.matmul_q8_vnni : q.matmul_q8_simd;
  }
  // About four chunks per thread, whole 8-row tiles for decode.
  const int64_t per = (rows + 4 * pool.size() - 1) / (4 * pool.size());
  const int64_t grain = std::max<int64_t>(8, (per + 7) / 8 * 8);
  const uint8_t* w = static_cast<const uint8_t*>(W);
  pool.parallel_for(rows, grain, [&](int64_t r0, int64_t r1, int) {
    fn(w + r0 * rbytes, rbytes, r1 - r0, cols, Xq, xrow_bytes, T, Y + r0, ldy);
  });
}

void matmul_q8(QType t, const void* W, int64_t rows, int64_t cols, const uint8_t* Xq, int64_t xrow_bytes,
               int64_t T, float* Y, int64_t ldy, ThreadPool& pool) {
  matmul_q8(best_isa(), t, W, rows, cols, Xq, xrow_bytes, T, Y, ldy, pool);
}

}  // namespace strata
