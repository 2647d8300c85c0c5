// The matmul kernels for Q2_K weights (one instance file per format keeps each compile small).
#include "backend/cuda/matmul_gemv.cuh"
#include "backend/cuda/matmul_mma.cuh"
#include "backend/cuda/matmul_q8.cuh"

namespace strata::cuda {

template void launch_gemv<unit::Q2_K>(const MatmulArgs&, cudaStream_t);
template void launch_gemv_multi<unit::Q2_K>(const GemvMultiArgs&, cudaStream_t);
template void launch_gemv_experts<unit::Q2_K>(const ExpertsArgs&, cudaStream_t);
template void launch_mma<unit::Q2_K>(const MatmulArgs&, cudaStream_t);
template void launch_mma_multi<unit::Q2_K>(const MmaMultiArgs&, cudaStream_t);
template void launch_mma_runs<unit::Q2_K>(const RunsF32Args&, cudaStream_t);
template void launch_mmq<unit::Q2_K>(const MatmulQ8Args&, cudaStream_t);
template void launch_mmq_experts<unit::Q2_K>(const ExpertsArgs&, cudaStream_t);
template void launch_mmq_runs<unit::Q2_K>(const RunsQ8Args&, cudaStream_t);

}  // namespace strata::cuda
