// The dense matmul kernels for Q8_0 as prepare_dense rearranges it (unit::Q8_0R): GEMV, the multi-matrix
// GEMV and the tensor-core tiles (no experts, no integer path: only resident dense matrices take it).
#include "backend/cuda/matmul_gemv.cuh"
#include "backend/cuda/matmul_mma.cuh"

namespace strata::cuda {

template void launch_gemv<unit::Q8_0R>(const MatmulArgs&, cudaStream_t);
template void launch_gemv_multi<unit::Q8_0R>(const GemvMultiArgs&, cudaStream_t);
template void launch_mma<unit::Q8_0R>(const MatmulArgs&, cudaStream_t);

}  // namespace strata::cuda
