// The matmul kernels for Q5_K weights (one instance file per format keeps each compile small).
#include "backend/cuda/matmul_gemv.cuh"
#include "backend/cuda/matmul_mma.cuh"
#include "backend/cuda/matmul_q8.cuh"

namespace strata::cuda {

template void launch_gemv<unit::Q5_K>(const MatmulArgs&, cudaStream_t);
template void launch_gemv_multi<unit::Q5_K>(const GemvMultiArgs&, cudaStream_t);
template void launch_gemv_experts<unit::Q5_K>(const ExpertsArgs&, cudaStream_t);
template void launch_mma<unit::Q5_K>(const MatmulArgs&, cudaStream_t);
template void launch_mma_multi<unit::Q5_K>(const MmaMultiArgs&, cudaStream_t);
template void launch_mma_runs<unit::Q5_K>(const RunsF32Args&, cudaStream_t);
template void launch_mmq<unit::Q5_K>(const MatmulQ8Args&, cudaStream_t);
template void launch_mmq_experts<unit::Q5_K>(const ExpertsArgs&, cudaStream_t);
template void launch_mmq_runs<unit::Q5_K>(const RunsQ8Args&, cudaStream_t);

}  // namespace strata::cuda
