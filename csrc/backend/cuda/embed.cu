// Dequantization on the device: embed and dequant_rows, one thread per element, bit-identical to
// the CPU's dequant_row (dequant.cuh repeats its float operations; this file builds with -fmad=false).
#include "backend/cuda/common.cuh"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/embed.cuh"

namespace strata::cuda {
namespace {

constexpr int kThreads = 256;

// One block per output row; `ids` picks the source row (nullptr: row i itself).
template <class Dec>
__global__ void dequant_rows_kernel(const uint8_t* src, size_t src_row_bytes, const int32_t* ids, int64_t D,
                                    float* out) {
  const int64_t i = blockIdx.x;
  const uint8_t* row = src + (size_t)(ids ? ids[i] : i) * src_row_bytes;
  float* o = out + i * D;
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) o[c] = Dec::elem(row, c);
}

void launch(uint32_t type, const void* src, size_t src_row_bytes, const int32_t* ids, int64_t D, int64_t n,
            float* out, cudaStream_t s, const char* what) {
  dispatch_type(type, what, [&](auto dec) {
    using Dec = decltype(dec);
    row_bytes(Dec::kType, D);  // ConfigError unless D is a whole number of blocks
    check_row_alignment<Dec>(src, src_row_bytes, what);
    if (n <= 0 || D <= 0) return;
    dequant_rows_kernel<Dec>
        <<<grid_x(n), kThreads, 0, s>>>(static_cast<const uint8_t*>(src), src_row_bytes, ids, D, out);
    STRATA_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace

void launch_embed(uint32_t type, const void* table, int64_t D, const int32_t* ids, int64_t T, float* out,
                  cudaStream_t s) {
  const QuantTraits& q = quant_traits(type, "token embedding");
  launch(type, table, row_bytes(q.type, D), ids, D, T, out, s, "token embedding");
}

void launch_dequant_rows(uint32_t type, const void* src, size_t src_row_bytes, int64_t D, int64_t n,
                         float* out, cudaStream_t s) {
  launch(type, src, src_row_bytes, nullptr, D, n, out, s, "dequant_rows");
}

}  // namespace strata::cuda
