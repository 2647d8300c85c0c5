// Launchers of the KV cache store and of causal GQA attention over an f32 or f16 cache.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/backend.h"

namespace strata::cuda {

// cache rows [pos0, pos0 + T) (rows of `width` elements of type t) = src, rounded to nearest for f16.
void launch_kv_store(void* cache, KvType t, int64_t pos0, int64_t T, int64_t width, const float* src,
                     cudaStream_t s);

// Device scratch that launch_attention needs for these shapes (the decode kernel's per-key-block
// partials; 0 for a prompt).
size_t attention_scratch_bytes(int64_t T, int64_t pos0, int64_t n_head, int64_t head_dim);
// out[t, h, :] = softmax(q[t, h] . K[0 .. pos0 + t] * scale) V; kc/vc are [ctx, n_kv_head, head_dim]
// of type t. `scratch` holds attention_scratch_bytes(...) bytes, unused by any other queued work.
void launch_attention(const float* q, const void* kc, const void* vc, KvType t, int64_t T, int64_t pos0,
                      int64_t n_head, int64_t n_kv_head, int64_t head_dim, float scale, float* out,
                      void* scratch, cudaStream_t s);

}  // namespace strata::cuda
