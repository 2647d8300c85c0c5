// The expert cache's decode-step resolution on the device (Backend::resolve_experts): the LRU
// choice of ExpertCache::prepare in one block, then the misses' bytes read straight from page-locked
// host memory by a zero-copy fill kernel.
#pragma once
#include <cuda_runtime.h>

#include "backend/backend.h"

namespace strata::cuda {

void launch_resolve_experts(const ExpertResolve& r, cudaStream_t s);

}  // namespace strata::cuda
