// The matmul kernels for IQ1_M weights (one instance file per format keeps each compile small).
#include "backend/cuda/matmul_gemv.cuh"
#include "backend/cuda/matmul_mma.cuh"
#include "backend/cuda/matmul_q8.cuh"

namespace strata::cuda {

template void launch_gemv<unit::IQ1_M>(const MatmulArgs&, cudaStream_t);
template void launch_gemv_multi<unit::IQ1_M>(const GemvMultiArgs&, cudaStream_t);
template void launch_gemv_experts<unit::IQ1_M>(const ExpertsArgs&, cudaStream_t);
template void launch_mma<unit::IQ1_M>(const MatmulArgs&, cudaStream_t);
template void launch_mma_multi<unit::IQ1_M>(const MmaMultiArgs&, cudaStream_t);
template void launch_mma_runs<unit::IQ1_M>(const RunsF32Args&, cudaStream_t);
template void launch_mmq<unit::IQ1_M>(const MatmulQ8Args&, cudaStream_t);
template void launch_mmq_experts<unit::IQ1_M>(const ExpertsArgs&, cudaStream_t);
template void launch_mmq_runs<unit::IQ1_M>(const RunsQ8Args&, cudaStream_t);

}  // namespace strata::cuda
