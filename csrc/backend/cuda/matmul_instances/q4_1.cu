// The matmul kernels for Q4_1 weights (one instance file per format keeps each compile small).
#include "backend/cuda/matmul_gemv.cuh"
#include "backend/cuda/matmul_mma.cuh"
#include "backend/cuda/matmul_q8.cuh"

namespace strata::cuda {

template void launch_gemv<unit::Q4_1>(const MatmulArgs&, cudaStream_t);
template void launch_gemv_multi<unit::Q4_1>(const GemvMultiArgs&, cudaStream_t);
template void launch_gemv_experts<unit::Q4_1>(const ExpertsArgs&, cudaStream_t);
template void launch_mma<unit::Q4_1>(const MatmulArgs&, cudaStream_t);
template void launch_mma_multi<unit::Q4_1>(const MmaMultiArgs&, cudaStream_t);
template void launch_mma_runs<unit::Q4_1>(const RunsF32Args&, cudaStream_t);
template void launch_mmq<unit::Q4_1>(const MatmulQ8Args&, cudaStream_t);
template void launch_mmq_experts<unit::Q4_1>(const ExpertsArgs&, cudaStream_t);
template void launch_mmq_runs<unit::Q4_1>(const RunsQ8Args&, cudaStream_t);

}  // namespace strata::cuda
