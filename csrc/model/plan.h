// ModelPlan: what a GGUF file's header alone tells: the spec, the expert slot layout and the
// prompt-chunk plan. `strata info` and `strata layout` use it without loading any weight; a
// Model is built on one.
#pragma once
#include <memory>
#include <string>

#include "expert_cache/expert_source.h"
#include "gguf/gguf.h"
#include "model/spec.h"
#include "prefill/prefill.h"

namespace strata {

// The shapes the prefill plan is sized from, as the spec gives them.
PrefillShape prefill_shape(const ModelSpec& s, bool gr_unfused, bool streamed_fused = false);

struct ModelPlan {
  std::shared_ptr<gguf::File> file;
  ModelSpec spec;
  ExpertLayout experts;
  Prefill prefill;

  // Reads and validates the spec of `file` (FormatError / UnsupportedError naming the cause).
  // streamed_fused: the fused layout where a source streams the experts (ModelConfig::moe_layout "fused");
  // else the MMQ layout everywhere.
  static ModelPlan read(std::shared_ptr<gguf::File> file, bool gr_unfused, bool streamed_fused = false);
};

}  // namespace strata
