// One input through strata's native load path, shared by the libFuzzer targets and the regression
// replay of the native tests: the GGUF reader, the spec reader of the file's architecture, the model
// plan, and, for the model target, a load on the CPU backend and a prompt plus a decode step.
// strata's own errors are the expected ending of a bad file; anything else escaping is a bug.
#pragma once
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <typeinfo>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "model/plan.h"

namespace strata::fuzz {

enum class Depth { Plan, Model };

namespace detail {

inline uint32_t fnv1a(const uint8_t* p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 16777619u;
  return h;
}

// A load like `strata.Model(path, ctx=16)` followed by logits of a 3-token prompt and one decode
// step. The configuration (cache kind, chunk, GR mode) is picked by a hash of the input, so each
// input always runs the same way and the corpus covers all of them.
inline void load_and_run(std::shared_ptr<gguf::File> file, uint32_t h) {
  const ModelPlan plan = ModelPlan::read(file, false);
  ModelConfig cfg;
  cfg.device = "cpu";
  cfg.threads = 1 + (h >> 8) % 2;
  cfg.ctx = 16;
  cfg.prefill_mode = PrefillMode::Fixed;
  cfg.prefill = 1 + (h >> 4) % 4;
  cfg.gr_unfused = (h >> 12) & 1;
  switch (h % 3) {
    case 0:
      cfg.cache = CacheKind::All;
      break;
    case 1:
    case 2: {
      cfg.source = h % 3 == 1 ? "host" : "mmap";
      cfg.cache = CacheKind::Size;
      // Room for the chunk's region and its experts, sometimes less (a MemoryError is an ending too).
      const int64_t slots = plan.spec.K + 4 * ((h >> 16) % 4) + (h >> 20) % 3;
      cfg.cache_bytes = (size_t)slots * plan.experts.slot_bytes;
      break;
    }
  }
  Model m(std::move(file), cfg);
  const int64_t V = m.spec().V;
  std::vector<int32_t> ids = {1, 2, 3};
  for (auto& i : ids) i = (int32_t)(i % V);
  std::vector<float> logits(3 * (size_t)V);
  m.forward(ids.data(), 3, 0, logits.data(), true);
  m.forward(ids.data(), 1, 3, logits.data(), false);
}

}  // namespace detail

// Runs one input. Returns "" when strata read it or rejected it with a strata::Error, else a
// description of what escaped (a crash or a sanitizer report ends the process before that).
inline std::string run_input(const uint8_t* data, size_t size, Depth depth) {
  try {
    auto file = gguf::File::from_memory("fuzz.gguf", data, size);
    const ModelPlan plan = ModelPlan::read(file, false);
    for (int64_t T : {int64_t(1), int64_t(7)})
      for (bool src : {false, true}) (void)plan.prefill.bytes_needed(T, src);
    // Bounded work per input: a model whose data is larger than this is only planned.
    if (depth == Depth::Model && size <= (size_t(4) << 20))
      detail::load_and_run(file, detail::fnv1a(data, size));
  } catch (const Error&) {
    return "";
  } catch (const std::exception& e) {
    return std::string("foreign exception: ") + typeid(e).name() + ": " + e.what();
  } catch (...) {
    return "foreign exception of unknown type";
  }
  return "";
}

}  // namespace strata::fuzz
