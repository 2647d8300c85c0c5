// The matmul kernels for IQ2_XXS weights (one instance file per format keeps each compile small).
#include "backend/cuda/matmul_gemv.cuh"
#include "backend/cuda/matmul_mma.cuh"
#include "backend/cuda/matmul_q8.cuh"

namespace strata::cuda {

template void launch_gemv<unit::IQ2_XXS>(const MatmulArgs&, cudaStream_t);
template void launch_gemv_multi<unit::IQ2_XXS>(const GemvMultiArgs&, cudaStream_t);
template void launch_gemv_experts<unit::IQ2_XXS>(const ExpertsArgs&, cudaStream_t);
template void launch_mma<unit::IQ2_XXS>(const MatmulArgs&, cudaStream_t);
template void launch_mma_multi<unit::IQ2_XXS>(const MmaMultiArgs&, cudaStream_t);
template void launch_mma_runs<unit::IQ2_XXS>(const RunsF32Args&, cudaStream_t);
template void launch_mmq<unit::IQ2_XXS>(const MatmulQ8Args&, cudaStream_t);
template void launch_mmq_experts<unit::IQ2_XXS>(const ExpertsArgs&, cudaStream_t);
template void launch_mmq_runs<unit::IQ2_XXS>(const RunsQ8Args&, cudaStream_t);

}  // namespace strata::cuda
