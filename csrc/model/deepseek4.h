// DeepSeek V4 (GGUF arch "deepseek4"): the hyperparameters and tensors beyond ModelSpec's common ones,
// read by read_deepseek4 (deepseek4_spec.cpp) with llama.cpp's key and tensor names; the forward pass
// is in deepseek4.cpp and deepseek4_attention.cpp.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/spec.h"

namespace strata {

struct Ds4Layer {
  int64_t ratio = 0;  // compress ratio: 0 (window only), 4 (compressed rows picked by the indexer), 128
  bool hash = false;  // routed by the token-id table instead of top-K
  float clamp_exp = 0.f, clamp_shexp = 0.f;  // SwiGLU limits of the routed and the shared experts (0: none)
  WeightRef attn_norm, sinks, q_a, q_a_norm, q_b, kv, kv_norm, o_a, o_b;
  WeightRef hc_attn_fn, hc_attn_base, hc_attn_scale, hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  WeightRef comp_kv, comp_gate, comp_ape, comp_norm;                 // ratio > 0
  WeightRef idx_proj, idx_q_b, idx_kv, idx_gate, idx_ape, idx_norm;  // ratio 4
  WeightRef router, tid2eid, probs_b, ffn_norm;                      // tid2eid (hash) or probs_b
  WeightRef gate_shexp, up_shexp, down_shexp;
};

struct Ds4Spec final : ArchSpec {
  int64_t HC = 4, sinkhorn_iters = 20;
  float hc_eps = 1e-6f;
  int64_t q_lora = 0, o_groups = 0, o_lora = 0, rope_dim = 0, window = 0;
  int64_t idx_heads = 0, idx_dim = 0, idx_topk = 0;
  int64_t hash_layers = 0, shared_ffn = 0;
  float routed_scale = 1.f;
  bool norm_weights = true;
  // Window-only layers rotate with rope_base and no scaling; compressed layers (and their compressors
  // and indexer) with compress_rope_base and YaRN (factor 0: none).
  float compress_rope_base = 0.f, yarn_factor = 0.f, beta_fast = 32.f, beta_slow = 1.f;
  int64_t yarn_orig_ctx = 0;
  int64_t mtp_blocks = 0;  // MTP blocks in the file, ignored
  std::vector<Ds4Layer> layers;
  WeightRef hc_head_fn, hc_head_base, hc_head_scale;

  bool any_ratio(int64_t r) const {
    for (const auto& l : layers)
      if (l.ratio == r) return true;
    return false;
  }
};

// V4's own file of a spec (its ArchSpec); an internal error for another architecture's.
const Ds4Spec& ds4_spec(const ModelSpec& s);

// V4's prompt-chunk scratch beyond the common buffers: the hyper-connection weights of the current
// site, the token ids (hash routing), low-rank Q, the shared KV row, grouped output, the compressors'
// and the indexer's projections (only when a layer has them) and the shared expert.
struct Ds4Scratch {
  Scratch<float> hc_mix, hc_post, hc_comb;         // T x (2 + HC) HC, T x HC, T x HC x HC
  Scratch<int32_t> tokens;                         // T
  Scratch<float> qa, q, kv, out, oa;               // T x q_lora, T x H x hd, T x hd, T x H x hd, T x G o_lora
  Scratch<float> comp_kv, comp_score;              // T x lanes hd (lanes 2 with a ratio-4 layer, else 1)
  Scratch<float> idx_kv, idx_score, idx_q, idx_w;  // T x 2 idx_dim (x2), T x heads x idx_dim, T x heads
  Scratch<int32_t> idx_sel;                        // T x idx_topk
  Scratch<float> sh_gate, sh_up, sh_out;           // T x shared_ffn (x2), T x D
};
// Declares it into `list` for the spec (the spec reader stores the list, the pass takes the handles).
Ds4Scratch ds4_scratch(const ModelSpec& s, const Ds4Spec& d, ScratchList& list);

// The rotation of one RoPE flavour: inverse frequencies of the n_rot / 2 pairs (YaRN folded in) and
// the factor cos and sin are scaled by.
struct Ds4Rope {
  std::vector<float> inv_freq;
  float mscale = 1.f;
};
// compressed: the compressed layers' rope (compress_rope_base, YaRN); else the window layers' one.
Ds4Rope ds4_rope(const Ds4Spec& s, float rope_base, bool compressed);

}  // namespace strata
