// ModelPlan: spec, expert layout and prefill plan from the header.
#include "model/plan.h"

#include "quant/quant.h"

namespace strata {

namespace {
ExpertTensor expert_tensor(const WeightRef& w, int64_t E) {
  ExpertTensor t;
  t.type = w.type();
  t.cols = w.t->ne[0];
  t.rows = w.t->ne[1];
  t.bytes = w.t->nbytes / (size_t)E;
  t.host = w.data();
  return t;
}
}  // namespace

PrefillShape prefill_shape(const ModelSpec& s, bool gr_unfused, bool streamed_fused) {
  PrefillShape p;
  p.D = s.D;
  p.HC = s.HC;
  p.E = s.E;
  p.K = s.K;
  p.F = s.F;
  for (const auto& l : s.layers)
    for (const WeightRef* w : {&l.gate_exps, &l.up_exps, &l.down_exps}) p.expert_types.push_back(w->type());
  p.gr_unfused = gr_unfused;
  p.streamed_fused = streamed_fused;
  p.scratch = s.scratch;
  set_expert_kernels(p, uses_matmul_q8);
  return p;
}

ModelPlan ModelPlan::read(std::shared_ptr<gguf::File> file, bool gr_unfused, bool streamed_fused) {
  ModelSpec spec = read_spec(*file);
  std::vector<ExpertLayerLayout> layers;
  for (const auto& l : spec.layers) {
    ExpertLayerLayout ll;
    ll.gate = expert_tensor(l.gate_exps, spec.E);
    ll.up = expert_tensor(l.up_exps, spec.E);
    ll.down = expert_tensor(l.down_exps, spec.E);
    layers.push_back(ll);
  }
  ExpertLayout experts = ExpertLayout::make(spec.E, std::move(layers));
  Prefill prefill(prefill_shape(spec, gr_unfused, streamed_fused));
  return ModelPlan{std::move(file), std::move(spec), std::move(experts), std::move(prefill)};
}

}  // namespace strata
