// STRATA_HD marks small functions that host and CUDA device code share (the fp16/bf16
// conversions, the quant block decoders): __host__ __device__ under nvcc, nothing elsewhere.
#pragma once

#if defined(__CUDACC__)
#define STRATA_HD __host__ __device__
#else
#define STRATA_HD
#endif
