// DeepSeek V4's forward pass, internal: the resident weights of a layer and the attention block
// (deepseek4_attention.cpp) that deepseek4.cpp's pass calls.
#pragma once
#include <cstdint>

#include "model/blocks.h"
#include "model/deepseek4.h"

namespace strata {

class Ds4Ops;

// A RoPE flavour on the device: inv_freq (rope_dim / 2 floats) and the cos/sin factor.
struct Ds4RopeDev {
  const float* inv_freq = nullptr;
  float mscale = 1.f;
};

// One hyper-connection site (HC > 1 streams): the mixing projection of the flattened streams and
// the scale and base of its pre / post / comb parts; eps and Sinkhorn iterations from the spec.
struct HcSite {
  DenseMatrix fn;                // (2 + HC) HC rows of HC * D (the head's: HC rows)
  const float* scale = nullptr;  // 3 (the head's: 1)
  const float* base = nullptr;   // (2 + HC) HC (the head's: HC)
  float hc_eps = 1e-6f;
  int64_t iters = 1;
};

struct Ds4LayerWeights {
  int64_t ratio = 0;
  bool hash = false;
  float clamp_exp = 0.f, clamp_shexp = 0.f;
  HcSite hc_attn, hc_ffn;
  const float *attn_norm = nullptr, *ffn_norm = nullptr;
  DenseMatrix q_a, q_b, kv, o_a, o_b;
  const float *q_a_norm = nullptr, *kv_norm = nullptr, *sinks = nullptr;
  DenseMatrix comp_kv, comp_gate;
  const float *comp_ape = nullptr, *comp_norm = nullptr;
  DenseMatrix idx_proj, idx_q_b, idx_kv, idx_gate;
  const float *idx_ape = nullptr, *idx_norm = nullptr;
  DenseMatrix router, gate_shexp, up_shexp, down_shexp;
  const float* probs_b = nullptr;
  const int32_t* tid2eid = nullptr;
  Ds4RopeDev rope;  // the window rope, or the compressed layers' (YaRN) one
};

// The attention sublayer of layer l on the normalized input x (T x D): low-rank Q, the shared KV row,
// the compressors and the indexer appending to the KV cache, attention with the sink over the window
// and the compressed rows, inverse RoPE and the grouped output projection into b.proj.
void ds4_attention(const ForwardContext& ctx, Ds4Ops& ops, const PrefillBuffers& b, const Ds4Scratch& sc,
                   int64_t l, const Ds4LayerWeights& w, const Ds4RopeDev& compress_rope, const float* x,
                   int64_t T, int64_t pos0);

}  // namespace strata
