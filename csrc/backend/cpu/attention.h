// CPU attention: causal GQA with a blockwise online softmax, vectorized where the CPU has AVX2.
#pragma once
#include <cstdint>

namespace strata {

class ThreadPool;

// out[t, h, :] = softmax(q[t, h] . K[0..pos0+t] * scale) V for T queries at positions pos0..;
// kc/vc are [ctx, KV, hd]. Each (t, h) is computed the same way whatever T is, so results do not
// depend on the prompt chunking. With `sinks`, the logit sinks[h] joins each softmax's denominator
// (gpt-oss); with window > 0 only the last `window` keys up to the query's position are attended.
void cpu_attention(const float* q, const float* kc, const float* vc, int64_t T, int64_t pos0, int64_t H,
                   int64_t KV, int64_t hd, float scale, float* out, ThreadPool& pool,
                   const float* sinks = nullptr, int64_t window = 0);

}  // namespace strata
