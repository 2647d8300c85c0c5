// Qwen3.5 / 3.6 MoE (GGUF arch "qwen35moe"): hyperparameters and tensors from llama.cpp's key and
// tensor names, and its forward pass. Hybrid layers: three in four are gated DeltaNet linear attention
// (a short causal conv1d over q/k/v, the gated delta rule over a fixed-size state per layer, a gated
// RMSNorm), the rest gated full attention (a sigmoid output gate from the q projection, per-head
// q/k RMSNorm, NEOX RoPE over the first rope.dimension_count dims); every layer's FFN is softmax
// top-K routed experts, renormalized, plus a shared expert scaled by its sigmoid gate. MTP blocks
// (nextn_predict_layers) are not loaded. Its own ops are Qwen35Ops (backend/qwen35_ops.h), which only
// the CPU backend implements.
//
// The delta rule runs in its chunked form (Qwen35Ops::gated_delta_chunked) for prompts and decode alike,
// in chunks of 64 positions anchored at multiples of 64: a position's output reads the state at its
// chunk's start and the chunk's earlier rows, so it is the same float operations however the prompt is
// split into passes (and a decode step's equal a prompt's). The recurrent state lives in the KV cache
// (ModelSpec::kv_layers; one copy a KV sequence region, tracked per region): the conv rows and the
// chunk-start state twice, which copy decided by position alone (the conv rows after position q in copy
// q % 2, the state at the start of chunk c in copy c % 2: a one-token pass writes only the copies of its
// end, so one stopped between layers leaves the state of its pos0), and the current chunk's rows. A
// pass continues the state (pos0 = the tokens it holds) or starts over (pos0 = 0); a state cannot be cut back
// to an earlier position, so a prompt that shares only part of the cached tokens runs from position 0
// (Generator::begin), and any other pos0 is an error, never a silently wrong result.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "backend/qwen35_ops.h"
#include "core/env.h"
#include "core/error.h"
#include "core/utf8.h"
#include "model/arch.h"
#include "model/blocks.h"
#include "model/kv_cache.h"
#include "model/spec.h"
#include "model/weights.h"

namespace strata {

namespace {

// Bounds of qwen35moe's own hyperparameters beyond model/spec.h's limits (Qwen3.6: conv 4, 32 value
// heads of 128, 16 key heads of 128).
constexpr int64_t kMaxConvKernel = 64;
constexpr int64_t kMaxSsmHeads = 1 << 12;
constexpr int64_t kMaxSsmHeadDim = 1 << 12;
// The DeltaNet's chunk: positions [64 c, 64 c + 64) share a starting state (transformers' and FLA's size).
constexpr int64_t kDeltaChunk = 64;

// qwen35moe's tensors beyond LayerSpec: the linear layers' and the shared expert's.
struct Q35Layer {
  bool linear = false;  // gated DeltaNet (else full attention)
  WeightRef qkv, z, conv, dt_b, a_decay, beta, alpha, ssm_norm, ssm_out;
  WeightRef sh_gate_inp, sh_gate, sh_up, sh_down;
};

struct Q35Spec final : ArchSpec {
  int64_t n_rot = 0;              // rotated dims per head
  int64_t Kc = 0;                 // conv taps
  int64_t Hk = 0, Hv = 0;         // linear attention's key and value heads
  int64_t dk = 0, dv = 0;         // their dims
  int64_t conv_dim = 0;           // 2 Hk dk + Hv dv
  int64_t Fs = 0;                 // the shared expert's FFN width
  int64_t interval = 0, mtp = 0;  // full_attention_interval (0: per-layer list), MTP blocks skipped
  std::vector<Q35Layer> layers;
};

const Q35Spec& q35_spec(const ModelSpec& s) {
  const auto* d = dynamic_cast<const Q35Spec*>(s.arch_spec.get());
  STRATA_CHECK(d, Error, "internal error: the spec of '", s.arch, "' is not a qwen35moe spec");
  return *d;
}

// A layer is either kind, so the two kinds' token mixers share their buffers (mix.*), each as wide as
// the wider use; the ops read them as packed rows of their own width.
struct Q35Scratch {
  Scratch<float> in, mid, gate, out;        // full: q projection, queries, gate, output; DeltaNet: qkv
                                            // projection, the conv's output, z, the delta rule's output
  Scratch<float> k, v, a, b;                // full: keys, values; DeltaNet: alpha, beta
  Scratch<float> sh_g, sh_u, sh_out, sh_s;  // shared expert
};

Q35Scratch declare_q35_scratch(const ModelSpec& s, const Q35Spec& d, ScratchList& list) {
  const int64_t Hd = s.n_head * s.head_dim, Vd = d.Hv * d.dv;
  Q35Scratch sc;
  sc.in = list.f32("mix.in", {std::max(2 * Hd, d.conv_dim)});
  sc.mid = list.f32("mix.mid", {std::max(Hd, d.conv_dim)});
  sc.gate = list.f32("mix.gate", {std::max(Hd, Vd)});
  sc.out = list.f32("mix.out", {std::max(Hd, Vd)});
  sc.k = list.f32("attn.k", {s.n_kv_head, s.head_dim});
  sc.v = list.f32("attn.v", {s.n_kv_head, s.head_dim});
  sc.a = list.f32("gdn.a", {d.Hv});
  sc.b = list.f32("gdn.b", {d.Hv});
  sc.sh_g = list.f32("shexp.gate", {d.Fs});
  sc.sh_u = list.f32("shexp.up", {d.Fs});
  sc.sh_out = list.f32("shexp.out", {s.D});
  sc.sh_s = list.f32("shexp.scale", {});
  return sc;
}

}  // namespace

ModelSpec read_qwen35moe(const gguf::File& f) {
  ModelSpec s;
  const std::string a = "qwen35moe.";
  s.arch = "qwen35moe";
  read_gqa_moe(f, a, GqaMoeDefaults{32768, 1e-6, 10000}, s);
  s.norm_topk = true;  // softmax over E, top-K, renormalized
  auto d = std::make_shared<Q35Spec>();
  // block_count counts the MTP blocks after the trunk (llama.cpp's n_layer_all).
  d->mtp = read_count(f, a + "nextn_predict_layers", 0, s.L - 1, 0);
  s.L -= d->mtp;
  d->n_rot = read_count(f, a + "rope.dimension_count", 2, s.head_dim, s.head_dim);
  STRATA_CHECK(d->n_rot % 2 == 0, FormatError, f.path(), ": ", a, "rope.dimension_count ", d->n_rot,
               " must be even (RoPE rotates pairs)");
  d->Kc = read_count(f, a + "ssm.conv_kernel", 1, kMaxConvKernel);
  d->dk = read_count(f, a + "ssm.state_size", 1, kMaxSsmHeadDim);
  d->Hk = read_count(f, a + "ssm.group_count", 1, kMaxSsmHeads);
  d->Hv = read_count(f, a + "ssm.time_step_rank", 1, kMaxSsmHeads);
  STRATA_CHECK(d->Hv % d->Hk == 0, FormatError, f.path(), ": ", a, "ssm.time_step_rank ", d->Hv,
               " (value heads) is not a multiple of ", a, "ssm.group_count ", d->Hk, " (key heads)");
  const int64_t inner = read_count(f, a + "ssm.inner_size", 1, kMaxSsmHeads * kMaxSsmHeadDim);
  STRATA_CHECK(inner % d->Hv == 0, FormatError, f.path(), ": ", a, "ssm.inner_size ", inner,
               " is not a multiple of ", a, "ssm.time_step_rank ", d->Hv);
  d->dv = inner / d->Hv;
  d->conv_dim = 2 * d->Hk * d->dk + inner;  // each factor bounded by 2^24: no overflow
  // llama.cpp's fallback for the shared expert's width is feed_forward_length.
  const std::string fs_key = f.find(a + "expert_shared_feed_forward_length")
                                 ? a + "expert_shared_feed_forward_length"
                                 : a + "feed_forward_length";
  d->Fs = read_count(f, fs_key, 1, limits::kFfn);
  // Which layers are linear: llama.cpp's per-layer list when present, else every layer but each
  // interval-th (Qwen3.6: 3 linear, then 1 full).
  if (const gguf::Value* v = f.find(a + "attention.recurrent_layers")) {
    STRATA_CHECK(v->is_array() && (int64_t)v->ints.size() >= s.L, FormatError, f.path(), ": ", a,
                 "attention.recurrent_layers must be an array of at least ", s.L, " flags");
    for (int64_t l = 0; l < s.L; ++l) {
      STRATA_CHECK(v->ints[l] == 0 || v->ints[l] == 1, FormatError, f.path(), ": ", a,
                   "attention.recurrent_layers[", l, "] = ", v->ints[l], " is not a flag (0 or 1)");
      d->layers.emplace_back().linear = v->ints[l] == 1;
    }
  } else {
    d->interval = read_count(f, a + "full_attention_interval", 1, limits::kLayers, 4);
    for (int64_t l = 0; l < s.L; ++l) d->layers.emplace_back().linear = (l + 1) % d->interval != 0;
  }

  const TensorReader r(f, s.arch);
  r.common(s, true);
  const int64_t Hd = checked_mul(f, s.n_head, s.head_dim, "head_count * key_length");
  const int64_t KVd = checked_mul(f, s.n_kv_head, s.head_dim, "head_count_kv * key_length");
  const int64_t Vd = d->Hv * d->dv;
  int64_t n_linear = 0;
  for (int64_t l = 0; l < s.L; ++l) {
    LayerSpec ls;
    Q35Layer& ql = d->layers[l];
    // llama.cpp also reads gate and up fused in one tensor; its converter writes them apart.
    const std::string fused = str("blk.", l, ".ffn_gate_up_exps.weight");
    STRATA_CHECK(!f.find_tensor(fused), UnsupportedError, f.path(), ": tensor '", fused,
                 "' holds the experts' gate and up fused, which strata does not read yet; it reads them as "
                 "ffn_gate_exps and ffn_up_exps, as llama.cpp's converter writes them");
    r.layer<LayerSpec>(l, ls,
                       {
                           {"attn_norm.weight", &LayerSpec::attn_norm, {s.D}},
                           {"post_attention_norm.weight", &LayerSpec::ffn_norm, {s.D}},
                           {"ffn_gate_inp.weight", &LayerSpec::router, {s.D, s.E}},
                           {"ffn_gate_exps.weight", &LayerSpec::gate_exps, {s.D, s.F, s.E}},
                           {"ffn_up_exps.weight", &LayerSpec::up_exps, {s.D, s.F, s.E}},
                           {"ffn_down_exps.weight", &LayerSpec::down_exps, {s.F, s.D, s.E}},
                       });
    r.layer<Q35Layer>(l, ql,
                      {
                          {"ffn_gate_inp_shexp.weight", &Q35Layer::sh_gate_inp, {s.D}},
                          {"ffn_gate_shexp.weight", &Q35Layer::sh_gate, {s.D, d->Fs}},
                          {"ffn_up_shexp.weight", &Q35Layer::sh_up, {s.D, d->Fs}},
                          {"ffn_down_shexp.weight", &Q35Layer::sh_down, {d->Fs, s.D}},
                      });
    if (ql.linear) {
      ++n_linear;
      r.layer<Q35Layer>(l, ql,
                        {
                            {"attn_qkv.weight", &Q35Layer::qkv, {s.D, d->conv_dim}},
                            {"attn_gate.weight", &Q35Layer::z, {s.D, Vd}},
                            {"ssm_conv1d.weight", &Q35Layer::conv, {d->Kc, d->conv_dim}},
                            {"ssm_dt.bias", &Q35Layer::dt_b, {d->Hv}},
                            {"ssm_a", &Q35Layer::a_decay, {d->Hv}},
                            {"ssm_beta.weight", &Q35Layer::beta, {s.D, d->Hv}},
                            {"ssm_alpha.weight", &Q35Layer::alpha, {s.D, d->Hv}},
                            {"ssm_norm.weight", &Q35Layer::ssm_norm, {d->dv}},
                            {"ssm_out.weight", &Q35Layer::ssm_out, {Vd, s.D}},
                        });
    } else {
      r.layer<LayerSpec>(l, ls,
                         {
                             {"attn_q.weight", &LayerSpec::q, {s.D, 2 * Hd}},
                             {"attn_k.weight", &LayerSpec::k, {s.D, KVd}},
                             {"attn_v.weight", &LayerSpec::v, {s.D, KVd}},
                             {"attn_output.weight", &LayerSpec::o, {Hd, s.D}},
                             {"attn_q_norm.weight", &LayerSpec::q_norm, {s.head_dim}},
                             {"attn_k_norm.weight", &LayerSpec::k_norm, {s.head_dim}},
                         });
    }
    s.layers.push_back(ls);
  }
  // The KV cache per layer: keys and values of the full layers; the linear layers' conv rows (twice: the
  // committed copy and the one a pass writes), the delta rule's state at the start of the current chunk
  // (twice: the committed one and the next), and the chunk's rows so far (normalized keys, deltas,
  // log decays; Qwen35Ops::gated_delta_chunked).
  for (int64_t l = 0; l < s.L; ++l) {
    if (!d->layers[l].linear) {
      s.kv_layers.push_back({KvTensorSpec{"k", 0, 1, KVd}, KvTensorSpec{"v", 0, 1, KVd}});
      continue;
    }
    std::vector<KvTensorSpec> kv;
    for (const char* c : {"0", "1"}) {
      kv.push_back(KvTensorSpec{str("conv.", c), d->Kc - 1, 0, d->conv_dim});
      kv.push_back(KvTensorSpec{str("state.", c), d->Hv * d->dk, 0, d->dv});
    }
    kv.push_back(KvTensorSpec{"chunk.k", kDeltaChunk, 0, d->Hv * d->dk});
    kv.push_back(KvTensorSpec{"chunk.d", kDeltaChunk, 0, d->Hv * d->dv});
    kv.push_back(KvTensorSpec{"chunk.g", kDeltaChunk, 0, d->Hv});
    s.kv_layers.push_back(std::move(kv));
  }
  s.details.push_back(
      {"layer kinds",
       str(n_linear, " gated DeltaNet, ", s.L - n_linear, " gated full attention",
           d->interval ? str(" (full_attention_interval ", d->interval, ")") : std::string())});
  s.details.push_back({"linear attention", str("conv ", d->Kc, ", ", d->Hk, " key heads of ", d->dk, ", ",
                                               d->Hv, " value heads of ", d->dv)});
  s.details.push_back({"rope", str("NEOX over ", d->n_rot, " of ", s.head_dim, " dims")});
  s.details.push_back({"shared expert", str("FFN ", d->Fs, ", sigmoid gate")});
  if (d->mtp) s.details.push_back({"ignored", str(d->mtp, " MTP block(s)")});
  s.arch_spec = d;
  ScratchList scratch;
  declare_q35_scratch(s, *d, scratch);
  s.scratch = scratch.specs();
  return s;
}

namespace {

class Qwen35MoeForward final : public RowsForwardPass {
 public:
  Qwen35MoeForward(const ForwardContext& ctx, Qwen35Ops& ops) : ctx_(ctx), ops_(ops), w_(ctx.be) {
    const ModelSpec& s = ctx.spec;
    const Q35Spec& d = q35_spec(s);
    for (int64_t l = 0; l < s.L; ++l) {
      Layer ly;
      ly.linear = d.layers[l].linear;
      w_.layer<LayerSpec, Layer>(s.layers[l], ly,
                                 {
                                     {&LayerSpec::q, &Layer::q, "attn_q"},
                                     {&LayerSpec::k, &Layer::k, "attn_k"},
                                     {&LayerSpec::v, &Layer::v, "attn_v"},
                                     {&LayerSpec::o, &Layer::o, "attn_output"},
                                     {&LayerSpec::q_norm, &Layer::q_norm, "attn_q_norm"},
                                     {&LayerSpec::k_norm, &Layer::k_norm, "attn_k_norm"},
                                     {&LayerSpec::attn_norm, &Layer::attn_norm, "attn_norm"},
                                     {&LayerSpec::ffn_norm, &Layer::ffn_norm, "post_attention_norm"},
                                     {&LayerSpec::router, &Layer::router, "ffn_gate_inp"},
                                 });
      w_.layer<Q35Layer, Layer>(d.layers[l], ly,
                                {
                                    {&Q35Layer::qkv, &Layer::qkv, "attn_qkv"},
                                    {&Q35Layer::z, &Layer::z, "attn_gate"},
                                    {&Q35Layer::conv, &Layer::conv, "ssm_conv1d"},
                                    {&Q35Layer::dt_b, &Layer::dt_b, "ssm_dt.bias"},
                                    {&Q35Layer::a_decay, &Layer::a_decay, "ssm_a"},
                                    {&Q35Layer::beta, &Layer::beta, "ssm_beta"},
                                    {&Q35Layer::alpha, &Layer::alpha, "ssm_alpha"},
                                    {&Q35Layer::ssm_norm, &Layer::ssm_norm, "ssm_norm"},
                                    {&Q35Layer::ssm_out, &Layer::ssm_out, "ssm_out"},
                                    {&Q35Layer::sh_gate_inp, &Layer::sh_gate_inp, "ffn_gate_inp_shexp"},
                                    {&Q35Layer::sh_gate, &Layer::sh_gate, "ffn_gate_shexp"},
                                    {&Q35Layer::sh_up, &Layer::sh_up, "ffn_up_shexp"},
                                    {&Q35Layer::sh_down, &Layer::sh_down, "ffn_down_shexp"},
                                });
      layers_.push_back(ly);
    }
    head_ = w_.head(s);
    shape_ =
        AttentionShape{s.n_head, s.n_kv_head, s.head_dim, s.rms_eps, RopeParams{d.n_rot, s.rope_base, true}};
    regions_.resize((size_t)ctx.kv.seqs());
    ScratchList scratch;
    scratch_ = declare_q35_scratch(s, d, scratch);
    STRATA_CHECK(scratch.specs() == s.scratch, Error,
                 "internal error: the qwen35moe scratch is not the spec's");
  }

 protected:
  // A chunk of the selected region at pos0 (rows null: one piece), or the rows of several sequences
  // (rows: a piece a span of one region, RowRun; a region has one span a pass).
  void run(const PrefillBuffers& b, const int32_t* ids, int64_t T, int64_t pos0, const SeqRows* rows,
           float* logits, bool all_logits) override {
    std::vector<Piece> pieces;
    if (ctx_.be.position_source()) {
      // A decode step being recorded (Model::record_decode): one token at the device's position, which the
      // ops add to pos0 0; the host's state moves around each replay (before_replay, after_replay).
      STRATA_CHECK(
          !rows && T == 1 && pos0 == 0, Error,
          "internal error: a qwen35moe pass recorded with a position source is one token of one sequence");
      const int64_t seq = ctx_.kv.selected();
      pieces.push_back(Piece{seq, 0, 0, 1, &regions_.at((size_t)seq), true});
    } else if (!rows) {
      pieces.push_back(begin_piece(ctx_.kv.selected(), pos0, 0, T));
    } else {
      for (const RowRun& r : row_runs(*rows, T)) {
        for (const Piece& p : pieces)
          STRATA_CHECK(p.seq != r.seq, Error, "internal error: KV region ", r.seq,
                       " has two spans of rows in one qwen35moe pass");
        pieces.push_back(begin_piece(r.seq, r.pos0, r.first, r.n));
      }
    }
    run_pieces(b, ids, T, pos0, pieces, logits, all_logits, rows);
  }

  // A one-token step's state copies and chunk slot follow from its position alone (delta_net), which its ops
  // read from the device while it is recorded: one graph serves every step of a sequence (checked against
  // op by op on an H100 by test_gpu_archs.py; 6.38 -> 5.80 ms a token on the q36 shape).
  // STRATA_QWEN35_GRAPH=0 runs op by op, for the A/B. A batched step of several sequences runs op by op
  // (each piece would need its own position source).
  bool graphable() const override { return env_switch("STRATA_QWEN35_GRAPH", true); }
  bool graphable_batch() const override { return false; }
  void before_replay(int64_t seq, int64_t pos) override {
    const RegionState& st = regions_.at((size_t)seq);
    STRATA_CHECK(pos >= 1 && pos == st.pos, Error, "qwen35moe: a recorded decode step at position ", pos,
                 " of KV region ", seq, " but its recurrent state holds ",
                 st.pos < 0 ? std::string("none (a pass did not complete)") : str(st.pos, " tokens"));
  }
  void after_replay(int64_t seq, int64_t pos) override { regions_.at((size_t)seq).pos = pos + 1; }

 private:
  // The committed recurrent state of one KV region (each sequence region has its own copies).
  struct RegionState {
    int64_t pos = -1;  // tokens the committed state holds (-1: none)
  };
  // The rows [row0, row0 + n) of a pass: positions pos0.. of KV region seq. A chunk is one piece; a
  // batched pass a piece a region (a decode step's of one row, a prompt's of its rows).
  struct Piece {
    int64_t seq, pos0, row0, n;
    RegionState* st;
    bool recorded = false;  // a recorded step: its position on the device, its state left to the replays
  };

  // The piece's recurrent state continues from its region's committed copy, or starts from zeros at
  // position 0; any other position is an error.
  Piece begin_piece(int64_t seq, int64_t pos0, int64_t row0, int64_t n) {
    RegionState& st = regions_.at((size_t)seq);
    STRATA_CHECK(
        pos0 == 0 || pos0 == st.pos, Error, "qwen35moe: a pass at position ", pos0, " of KV region ", seq,
        " but its recurrent state holds ",
        st.pos < 0 ? std::string("none (a pass did not complete)") : str(st.pos, " tokens"),
        "; a recurrent state cannot be cut back to an earlier position: run the tokens from position 0");
    return Piece{seq, pos0, row0, n, &st, false};
  }

  void run_pieces(const PrefillBuffers& b, const int32_t* ids, int64_t T, int64_t pos0,
                  const std::vector<Piece>& pieces, float* logits, bool all_logits, const SeqRows* rows) {
    const ModelSpec& s = ctx_.spec;
    Backend& be = ctx_.be;
    const int64_t D = s.D;
    // A piece of one token leaves the committed state as it was until the pass completes (it writes only
    // the other copies and its own position's rows); a longer one may overwrite the chunk rows the
    // committed state needs, so until it completes there is none.
    for (const Piece& p : pieces)
      if (!p.recorded && (p.pos0 == 0 || p.n > 1)) p.st->pos = -1;
    be.upload(b.topk_ids, ids, (size_t)T * sizeof(int32_t));
    be.embed(s.token_embd.type(), head_.token_embd.get(), D, b.topk_ids, T, b.R);
    for (int64_t l = 0; l < s.L; ++l) {
      between_layers(ctx_, l, T, pos0);
      const Layer& ly = layers_[l];
      const float* x = l == 0 ? gr_read(be, b, T, D, s.rms_eps, ly.attn_norm, b.proj)
                              : add_gr_read(be, b, T, D, s.rms_eps, ly.attn_norm, b.proj);
      if (ly.linear)
        delta_net(b, l, ly, x, T, pieces);
      else
        attention(b, l, ly, x, T, pieces);
      x = add_gr_read(be, b, T, D, s.rms_eps, ly.ffn_norm, b.proj);
      shared_expert(b, ly, x, T);
      softmax_router(be, b, ly.router, x, T, s.K, s.norm_topk);
      moe_block(ctx_, b, l, T, ly.ffn_norm);
      ops_.add_sigmoid_scaled(b.proj, b[scratch_.sh_out], b[scratch_.sh_s], T, D);
    }
    // Every layer ran: the copies the pass wrote (those of its end position: state_copies) are committed.
    for (const Piece& p : pieces)
      if (!p.recorded) p.st->pos = p.pos0 + p.n;
    between_layers(ctx_, s.L, T, pos0);
    if (!logits) return;
    final_logits(be, b, head_, T, D, s.rms_eps, all_logits, logits, rows);
  }

  struct Layer : AttentionWeights {
    bool linear = false;
    const float *attn_norm = nullptr, *ffn_norm = nullptr;
    DenseMatrix router;
    DenseMatrix qkv, z, beta, alpha, ssm_out;
    const float *conv = nullptr, *dt_b = nullptr, *a_decay = nullptr, *ssm_norm = nullptr;
    DenseMatrix sh_gate_inp, sh_gate, sh_up, sh_down;
  };

  void matmul(const DenseMatrix& m, const float* x, int64_t T, float* y) {
    ctx_.be.matmul(m.type, m.data, m.rows, m.cols, x, m.cols, T, y, m.rows);
  }

  // Gated full attention: q (with its gate half), k, v; per-head q/k RMSNorm and partial RoPE, each
  // piece's rows into its region's KV cache at its positions and causal GQA attention there, the output
  // times sigmoid(gate), the output projection into b.proj.
  void attention(const PrefillBuffers& b, int64_t l, const Layer& w, const float* x, int64_t T,
                 const std::vector<Piece>& pieces) {
    const AttentionShape& a = shape_;
    Backend& be = ctx_.be;
    float *qg = b[scratch_.in], *q = b[scratch_.mid], *gate = b[scratch_.gate], *out = b[scratch_.out];
    float *k = b[scratch_.k], *v = b[scratch_.v];
    matmul_same_x(be, x, T, {{w.q, qg}, {w.k, k}, {w.v, v}});  // one launch where the types agree
    ops_.split_q_gate(qg, T, a.n_head, a.head_dim, q, gate);
    const int64_t qw = a.n_head * a.head_dim, kw = a.n_kv_head * a.head_dim;
    const float scale = 1.0f / std::sqrt((float)a.head_dim);
    for (const Piece& p : pieces) {
      float* kc = ctx_.kv.tensor(l, "k", p.seq);
      float* vc = ctx_.kv.tensor(l, "v", p.seq);
      const int64_t r = p.row0;
      be.qk_rope_store(q + r * qw, k + r * kw, v + r * kw, p.n, a.n_head, a.n_kv_head, a.head_dim, w.q_norm,
                       w.k_norm, a.eps, p.pos0, a.rope, kc, vc, KvType::F32);
      be.attention(q + r * qw, kc, vc, KvType::F32, p.n, p.pos0, a.n_head, a.n_kv_head, a.head_dim, scale,
                   out + r * qw);
    }
    ops_.sigmoid_mul(out, gate, T * qw);
    matmul(w.o, out, T, b.proj);
  }

  // Gated DeltaNet: the q/k/v, z, alpha and beta projections; for each piece the causal conv1d and the
  // delta rule over its region's recurrent state (from zeros at position 0); the gated RMSNorm, the
  // output projection into b.proj.
  void delta_net(const PrefillBuffers& b, int64_t l, const Layer& w, const float* x, int64_t T,
                 const std::vector<Piece>& pieces) {
    const ModelSpec& s = ctx_.spec;
    const Q35Spec& d = q35_spec(s);
    float *qkv = b[scratch_.in], *conv = b[scratch_.mid], *z = b[scratch_.gate], *dn = b[scratch_.out];
    float *al = b[scratch_.a], *bt = b[scratch_.b];
    // One launch where the four share a type (a decode step's alpha and beta are 32-row GEMVs, a launch
    // each).
    matmul_same_x(ctx_.be, x, T, {{w.qkv, qkv}, {w.z, z}, {w.alpha, al}, {w.beta, bt}});
    const KVCache& kv = ctx_.kv;
    const int64_t C = d.conv_dim, Vd = d.Hv * d.dv;
    for (const Piece& p : pieces) {
      const int64_t r = p.row0, end = p.pos0 + p.n;
      if (p.recorded) {  // the ops choose the copies by the device's position
        ops_.conv1d_silu_at(qkv + r * C, C, d.Kc, w.conv, kv.tensor(l, "conv.0", p.seq),
                            kv.tensor(l, "conv.1", p.seq), p.pos0, conv + r * C);
        ops_.gated_delta_at(conv + r * C, al + r * d.Hv, bt + r * d.Hv, p.pos0, kDeltaChunk, d.Hk, d.Hv, d.dk,
                            d.dv, w.a_decay, w.dt_b, kv.tensor(l, "state.0", p.seq),
                            kv.tensor(l, "state.1", p.seq), kv.tensor(l, "chunk.k", p.seq),
                            kv.tensor(l, "chunk.d", p.seq), kv.tensor(l, "chunk.g", p.seq), dn + r * Vd);
        continue;
      }
      const bool fresh = p.pos0 == 0;
      // The state copies follow from positions: the conv rows after position q in copy q % 2, the delta
      // rule's state at the start of chunk c in copy c % 2. A pass reads its start's copies and leaves its
      // end's; a one-token pass writes only the other copies, so until it completes the committed state
      // is whole (a longer one has none meanwhile: begin_piece).
      auto conv_copy = [&](int64_t q) { return kv.tensor(l, q % 2 ? "conv.1" : "conv.0", p.seq); };
      float* conv_out = conv_copy(fresh ? end : p.pos0 + 1);
      ops_.conv1d_silu(qkv + r * C, p.n, C, d.Kc, w.conv, fresh ? nullptr : conv_copy(p.pos0), conv_out,
                       conv + r * C);
      if (!fresh && p.n % 2 == 0 && d.Kc > 1)  // the end's copy is the start's: it takes the rows after
        ctx_.be.copy(conv_copy(end), conv_out, (size_t)(d.Kc - 1) * C * sizeof(float));
      const bool odd_chunk = p.pos0 / kDeltaChunk % 2;
      ops_.gated_delta_chunked(
          conv + r * C, al + r * d.Hv, bt + r * d.Hv, p.n, p.pos0, kDeltaChunk, d.Hk, d.Hv, d.dk, d.dv,
          w.a_decay, w.dt_b, fresh, kv.tensor(l, odd_chunk ? "state.1" : "state.0", p.seq),
          kv.tensor(l, odd_chunk ? "state.0" : "state.1", p.seq), kv.tensor(l, "chunk.k", p.seq),
          kv.tensor(l, "chunk.d", p.seq), kv.tensor(l, "chunk.g", p.seq), dn + r * Vd);
    }
    ops_.gated_rms_norm(dn, z, w.ssm_norm, T * d.Hv, d.dv, s.rms_eps);
    matmul(w.ssm_out, dn, T, b.proj);
  }

  // The shared expert of x: SwiGLU into shexp.out, its gate's logit into shexp.scale; joined to the
  // routed experts' sum after moe_block.
  void shared_expert(const PrefillBuffers& b, const Layer& w, const float* x, int64_t T) {
    float *g = b[scratch_.sh_g], *u = b[scratch_.sh_u];
    matmul_same_x(ctx_.be, x, T, {{w.sh_gate, g}, {w.sh_up, u}});
    ctx_.be.swiglu(g, u, T * w.sh_gate.rows);
    matmul(w.sh_down, g, T, b[scratch_.sh_out]);
    matmul(w.sh_gate_inp, x, T, b[scratch_.sh_s]);
  }

  ForwardContext ctx_;
  Qwen35Ops& ops_;
  ResidentWeights w_;
  std::vector<Layer> layers_;
  HeadWeights head_;
  AttentionShape shape_;
  Q35Scratch scratch_;
  std::vector<RegionState> regions_;  // one a KV sequence region
};

std::string no_q35_ops(Backend& be) {
  return str(
      "qwen35moe runs on the CPU and CUDA backends; the ", be.name(),
      " backend has no qwen35moe ops (the gated DeltaNet, the attention's output gate). Use --device cpu.");
}

void check_qwen35_backend(Backend& be, const std::string& path) {
  STRATA_CHECK(qwen35_ops(be), UnsupportedError, path, ": ", no_q35_ops(be));
}

std::unique_ptr<ForwardPass> make_qwen35moe(const ForwardContext& ctx) {
  Qwen35Ops* ops = qwen35_ops(ctx.be);
  STRATA_CHECK(ops, UnsupportedError, no_q35_ops(ctx.be));
  return std::make_unique<Qwen35MoeForward>(ctx, *ops);
}

}  // namespace

extern const Architecture kQwen35Moe{"qwen35moe", read_qwen35moe, make_qwen35moe, check_qwen35_backend};

}  // namespace strata
