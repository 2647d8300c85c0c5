// The matmul kernels for MXFP4 weights (one instance file per format keeps each compile small).
#include "backend/cuda/matmul_gemv.cuh"
#include "backend/cuda/matmul_mma.cuh"
#include "backend/cuda/matmul_q8.cuh"

namespace strata::cuda {

template void launch_gemv<unit::MXFP4>(const MatmulArgs&, cudaStream_t);
template void launch_gemv_multi<unit::MXFP4>(const GemvMultiArgs&, cudaStream_t);
template void launch_gemv_experts<unit::MXFP4>(const ExpertsArgs&, cudaStream_t);
template void launch_mma<unit::MXFP4>(const MatmulArgs&, cudaStream_t);
template void launch_mma_multi<unit::MXFP4>(const MmaMultiArgs&, cudaStream_t);
template void launch_mma_runs<unit::MXFP4>(const RunsF32Args&, cudaStream_t);
template void launch_mmq<unit::MXFP4>(const MatmulQ8Args&, cudaStream_t);
template void launch_mmq_experts<unit::MXFP4>(const ExpertsArgs&, cudaStream_t);
template void launch_mmq_runs<unit::MXFP4>(const RunsQ8Args&, cudaStream_t);

}  // namespace strata::cuda
