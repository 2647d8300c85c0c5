// The expert cache's decode-step resolution on the device (Backend::resolve_experts): the LRU
// choice of ExpertCache::prepare in one block, then the misses' bytes read straight from page-locked
// host memory by a zero-copy fill kernel.
#pragma once
#include <cuda_runtime.h>

#include "backend/backend.h"

namespace strata::cuda {

// The resolution on s, then the fill on fill_stream: s itself, or (a prefetch) another stream that
// first waits for s's work so far through the event `forked`.
void launch_resolve_experts(const ExpertResolve& r, cudaStream_t s, cudaStream_t fill_stream,
                            cudaEvent_t forked);

}  // namespace strata::cuda
