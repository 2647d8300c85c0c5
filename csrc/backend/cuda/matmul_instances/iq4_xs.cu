// The matmul kernels for IQ4_XS weights (one instance file per format keeps each compile small).
#include "backend/cuda/matmul_gemv.cuh"
#include "backend/cuda/matmul_mma.cuh"
#include "backend/cuda/matmul_q8.cuh"

namespace strata::cuda {

template void launch_gemv<unit::IQ4_XS>(const MatmulArgs&, cudaStream_t);
template void launch_gemv_multi<unit::IQ4_XS>(const GemvMultiArgs&, cudaStream_t);
template void launch_gemv_experts<unit::IQ4_XS>(const ExpertsArgs&, cudaStream_t);
template void launch_mma<unit::IQ4_XS>(const MatmulArgs&, cudaStream_t);
template void launch_mma_multi<unit::IQ4_XS>(const MmaMultiArgs&, cudaStream_t);
template void launch_mma_runs<unit::IQ4_XS>(const RunsF32Args&, cudaStream_t);
template void launch_mmq<unit::IQ4_XS>(const MatmulQ8Args&, cudaStream_t);
template void launch_mmq_experts<unit::IQ4_XS>(const ExpertsArgs&, cudaStream_t);
template void launch_mmq_runs<unit::IQ4_XS>(const RunsQ8Args&, cudaStream_t);

}  // namespace strata::cuda
