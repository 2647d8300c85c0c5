// read_spec: dispatches on general.architecture and totals the bytes and parameters.
#include "model/spec.h"

#include "core/error.h"
#include "model/arch.h"

namespace strata {

ModelSpec read_spec(const gguf::File& f) {
  ModelSpec s = find_architecture(f.get_string("general.architecture"), f.path()).read_spec(f);
  for (const auto& l : s.layers)
    for (const WeightRef* w : {&l.gate_exps, &l.up_exps, &l.down_exps}) {
      s.expert_bytes += w->t->nbytes;
      s.params_total += w->t->nelements();
      s.params_active += w->t->nelements() / s.E * s.K;
    }
  for (const auto& t : f.tensors()) {
    if (t.name.find("_exps.") != std::string::npos) continue;
    s.dense_bytes += t.nbytes;
    s.params_total += t.nelements();
    // The embedding is a lookup: one row per token is read, not counted as active compute.
    if (t.name != "token_embd.weight" || s.output.t == &t) s.params_active += t.nelements();
  }
  return s;
}

}  // namespace strata
