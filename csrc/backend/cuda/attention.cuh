// Launchers of the KV cache store and of causal GQA attention over an f32 or f16 cache.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/backend.h"

namespace strata::cuda {

// A position read on the device: the ops add the int32 at `dev` (when set) to their pos0 as they run,
// and size their launches for positions below max_pos. A recorded decode step then serves any position.
struct PosSource {
  const int32_t* dev = nullptr;
  int64_t max_pos = 0;
};

// cache rows [pos0, pos0 + T) (rows of `width` elements of type t) = src, rounded to nearest for f16.
void launch_kv_store(void* cache, KvType t, int64_t pos0, const PosSource& ps, int64_t T, int64_t width,
                     const float* src, cudaStream_t s);

// Device scratch that launch_attention needs for these shapes (the decode kernel's per-key-block
// partials; 0 for a prompt).
size_t attention_scratch_bytes(int64_t T, int64_t pos0, int64_t n_head, int64_t head_dim);
// The most attention over positions below max_pos needs.
size_t attention_scratch_max_bytes(int64_t max_pos, int64_t n_head, int64_t head_dim);
// Zeroed device words (count of them) the decode kernel's last blocks count on, one per kv head, to
// fold the partials in the same launch; each launch leaves them zeroed. Too few: a combine launch.
struct AttentionTickets {
  unsigned* words = nullptr;
  int64_t count = 0;
};
// out[t, h, :] = softmax(q[t, h] . K[0 .. pos0 + t] * scale) V; kc/vc are [ctx, n_kv_head, head_dim]
// of type t. `scratch` holds attention_scratch_bytes(...) bytes, unused by any other queued work.
void launch_attention(const float* q, const void* kc, const void* vc, KvType t, int64_t T, int64_t pos0,
                      const PosSource& ps, int64_t n_head, int64_t n_kv_head, int64_t head_dim, float scale,
                      float* out, void* scratch, const AttentionTickets& tickets, cudaStream_t s);

// gpt-oss's attention (a sink logit per query head in each softmax's denominator, no value; keys
// window_lo(p, window) .. p for a query at p, all of them at window 0; sinks may be null) on the
// tensor-core family: prompt and decode steps give a token the same bits, as launch_attention's kernels.
// Usable unless STRATA_CUDA_SINKS_MMA=0 (the A/B switch; read at each call: H100, gpt-oss-20b all resident,
// 2026-12-07: the 2048-token prompt 3,141 -> 12,566 tok/s, decode 189 -> 239 against the CUDA-core kernel),
// the cache is f16 and the tensor-core family takes the head dim and the caches' alignment. `scratch` holds
// attention_scratch_bytes(...) bytes, as for launch_attention.
bool attention_mma_sinks_usable(KvType t, int64_t head_dim, const void* kc, const void* vc);
void launch_attention_mma_sinks(const float* q, const void* kc, const void* vc, int64_t T, int64_t pos0,
                                const PosSource& ps, int64_t n_head, int64_t n_kv_head, int64_t head_dim,
                                float scale, const float* sinks, int64_t window, float* out, void* scratch,
                                cudaStream_t s);

}  // namespace strata::cuda
