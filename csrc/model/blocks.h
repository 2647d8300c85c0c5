// The building blocks every architecture's forward pass is written with: the GR read, GQA
// attention over the KV cache, the softmax router, the MoE block over the expert cache and the
// output head. Each runs on the compute stream of ctx.be over a chunk's carved buffers.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>

#include "model/arch.h"

namespace strata {

// A dense weight matrix as the device reads it.
struct DenseMatrix {
  uint32_t type = 0;
  const void* data = nullptr;
  int64_t rows = 0, cols = 0;
};

// The GR read of the T x D residual b.R for a consumer with norm weight w: grs = the RMS scale of
// each row; the normalized rows R * grs * w are returned where the consumer reads them: xn when the
// plan carves it (gr_unfused), else staged in `stage` (a buffer free at this point of the layer).
const float* gr_read(Backend& be, const PrefillBuffers& b, int64_t T, int64_t D, float eps, const float* w,
                     float* stage);
// b.R += b.proj (the sublayer's output), then gr_read: one op (Backend::add_rms_norm_read).
const float* add_gr_read(Backend& be, const PrefillBuffers& b, int64_t T, int64_t D, float eps,
                         const float* w, float* stage);

// Matrices of one activation x (T rows of their width): y = m x for each (m, y) of `outs` (at most 4); one
// Backend::matmul_n where all share a type and a width (one launch for a decode step), bit for bit the
// single matmuls either way.
struct MatmulTo {
  const DenseMatrix& m;
  float* y;
};
void matmul_same_x(Backend& be, const float* x, int64_t T, std::initializer_list<MatmulTo> outs);

struct AttentionWeights {
  DenseMatrix q, k, v, o;
  const float* q_norm = nullptr;  // per-head RMSNorm weights (may be null)
  const float* k_norm = nullptr;
};

struct AttentionShape {
  int64_t n_head = 0, n_kv_head = 0, head_dim = 0;
  float eps = 1e-6f;
  RopeParams rope;
};

// The attention block's scratch: q (T x H x hd), k and v (T x KV x hd), the output (T x H * hd).
struct AttentionScratch {
  Scratch<float> q, k, v, out;
};
// Adds them (attn.q, attn.k, attn.v, attn.out) to an architecture's list.
AttentionScratch declare_attention(ScratchList& list, const AttentionShape& a);
// A GQA spec's attention: its heads, rms eps, and RoPE (NEOX pairs) over the whole head at rope_base.
inline AttentionShape gqa_attention_shape(const ModelSpec& s) {
  return AttentionShape{s.n_head, s.n_kv_head, s.head_dim, s.rms_eps,
                        RopeParams{s.head_dim, s.rope_base, true}};
}
// Its chunk scratch beyond the common buffers (the attention block's): the spec reader stores the list,
// the forward pass takes the handles of the same declaration.
inline AttentionScratch declare_gqa_scratch(const ModelSpec& s, ScratchList& list) {
  return declare_attention(list, gqa_attention_shape(s));
}

// Pre-norm GQA attention of layer `l`: q/k/v projections of x, per-head norm and RoPE, the KV cache
// appended at pos0, causal attention; the output projection lands in b.proj. With `rows` (a batched
// decode step), row t is one token at rows->pos[t] of KV region rows->seq[t] instead: its norm, RoPE,
// store and attention are the ops of that token alone (pos0 is unused).
void attention_block(const ForwardContext& ctx, const PrefillBuffers& b, int64_t l, const AttentionWeights& w,
                     const AttentionShape& a, const AttentionScratch& sc, const float* x, int64_t T,
                     int64_t pos0, const SeqRows* rows = nullptr);

// Router: logits of x against the router matrix, softmax, top-K (ties to the lower id), weights
// renormalized when norm; then the (token, k) rows grouped by expert (b.expert_off, b.expert_rows).
void softmax_router(Backend& be, const PrefillBuffers& b, const DenseMatrix& router, const float* x,
                    int64_t T, int64_t K, bool norm);

// What an architecture changes in the MoE block: how the routed experts read their input rows from
// the residual (only when the plan has no xn: an unfused plan gathers xn's rows) and the activation
// between gate/up and down. Without one the block reads R * grs * w (one stream) and runs SwiGLU.
class MoeVariant {
 public:
  virtual ~MoeVariant() = default;
  // The input of n (token, k) rows (`rows`, K per token, as expert_rows) with the GR read's weight
  // ffn_norm, as floats (out, rows of D) or as q8_0 rows `rb` bytes apart.
  virtual void input(Backend& be, const PrefillBuffers& b, const float* ffn_norm, int64_t D, int64_t K,
                     const int32_t* rows, int64_t n, float* out) const = 0;
  virtual void input_q8(Backend& be, const PrefillBuffers& b, const float* ffn_norm, int64_t D, int64_t K,
                        const int32_t* rows, int64_t n, uint8_t* out, size_t rb) const = 0;
  // g[i] = act(g[i], u[i]) for i < n.
  virtual void activate(Backend& be, float* g, const float* u, int64_t n) const = 0;
  // The activation of n rows of F whose (token, k) ids are rows[0..n) (row i's expert is
  // b.topk_ids[rows[i]]): for an activation that depends on the expert (gpt-oss's biases). Default:
  // activate over the n * F values.
  virtual void activate_rows(Backend& be, const PrefillBuffers& /*b*/, const int32_t* /*rows*/, int64_t n,
                             int64_t F, float* g, const float* u) const {
    activate(be, g, u, n * F);
  }
};

// The routed experts of layer `l` over the rows the router grouped, through the expert cache; the
// weighted sum of each token's experts lands in b.proj. Experts are resolved once per layer per chunk;
// per-(token, k) outputs are added in a fixed order (ascending expert, then token), so the result does
// not depend on which experts were resident. `ffn_norm` is the GR read's weight (the fused read
// gathers R * grs * w by row); with an unfused plan the rows come from b.xn.
// `var` (null: the plain residual's fused GR read and SwiGLU) is what the architecture changes in it;
// a plan with b.HC > 1 needs one.
// `next` (null: none) is layer l + 1's router and FFN norm, for the prefetch of a decode step resolved on
// the device (StepPlan::prefetch): after this layer's experts, layer l + 1's router runs on this layer's
// post-attention residual under layer l + 1's norm, and the experts it picks are filled on the copy
// stream while the next layer's attention runs. Only which experts are resident changes, never a result.
struct NextRouter {
  const DenseMatrix* router = nullptr;
  const float* ffn_norm = nullptr;
  bool norm_topk = true;
  // The architecture's choice from the router's logits of T rows: their top-K ids and weights (deepseek2's
  // grouped, biased selection). Null: Backend::route's softmax top-K (norm_topk), router matmul included.
  std::function<void(float* logits, int64_t T, int32_t* ids, float* w)> select;
  // The guess's router input (T rows of D) from this layer's streams R and GR weights grs under the next
  // layer's FFN norm, for streams the plain read does not collapse (V4's HC). Null: apply_norm(R, grs,
  // ffn_norm), the HC = 1 read.
  std::function<void(float* out, int64_t T)> input;
};

// Whether a one-token decode step resolved on the device leaves its misses to the expert products
// (STRATA_WRITE_THROUGH, default 1; read at each call).
bool write_through_on();

void moe_block(const ForwardContext& ctx, const PrefillBuffers& b, int64_t l, int64_t T,
               const float* ffn_norm, const MoeVariant* var = nullptr, const NextRouter* next = nullptr);

// A pass calls this before each layer and once after the last (l == L): before layer 0 it tells the
// expert cache a pass begins (the scan policy's on_pass); then the Model's layer hook, which may throw
// Interrupted to stop the pass.
inline void between_layers(const ForwardContext& ctx, int64_t l, int64_t T, int64_t pos0) {
  if (l == 0) ctx.cache.begin_pass();
  if (ctx.layer_hook && *ctx.layer_hook) (*ctx.layer_hook)(l, T, pos0);
}

// Output head over `rows` normalized rows x: logits to host memory, kHeadRows rows at a time
// through the device buffer `logits_dev` (kHeadRows x V).
constexpr int64_t kHeadRows = 16;
// `on_logits` (null: none) runs on each block's logits before they leave the device.
void head_block(Backend& be, const DenseMatrix& output, const float* x, int64_t rows, float* logits_dev,
                float* logits_host, const std::function<void(float*, int64_t)>* on_logits = nullptr);

struct HeadWeights;
// After the last layer of a pass: its output (b.proj) joins the residual b.R, the final RMSNorm of
// every row (all_logits) or the last, or of the rows `rows->pick` names when a batched pass has them,
// then the head into `logits` (host memory). Returns the number of rows whose logits it wrote.
int64_t final_logits(Backend& be, const PrefillBuffers& b, const HeadWeights& head, int64_t T, int64_t D,
                     float eps, bool all_logits, float* logits, const SeqRows* rows = nullptr);

}  // namespace strata
