// The matmul kernels for BF16 weights (one instance file per format keeps each compile small).
#include "backend/cuda/matmul_gemv.cuh"
#include "backend/cuda/matmul_mma.cuh"

namespace strata::cuda {

template void launch_gemv<unit::BF16>(const MatmulArgs&, cudaStream_t);
template void launch_gemv_multi<unit::BF16>(const GemvMultiArgs&, cudaStream_t);
template void launch_gemv_experts<unit::BF16>(const ExpertsArgs&, cudaStream_t);
template void launch_mma<unit::BF16>(const MatmulArgs&, cudaStream_t);
template void launch_mma_multi<unit::BF16>(const MmaMultiArgs&, cudaStream_t);
template void launch_mma_runs<unit::BF16>(const RunsF32Args&, cudaStream_t);

}  // namespace strata::cuda
