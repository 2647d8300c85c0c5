// The architectures strata runs: one line each.
#include "core/error.h"
#include "model/arch.h"

namespace strata {

extern const Architecture kQwen3Moe;
extern const Architecture kDeepseek4;
extern const Architecture kGptOss;
extern const Architecture kQwen35Moe;
extern const Architecture kGemma4;
extern const Architecture kDeepseek2;

namespace {
const Architecture* const kArchitectures[] = {&kQwen3Moe,  &kDeepseek4, &kGptOss,
                                              &kQwen35Moe, &kGemma4,    &kDeepseek2};
}  // namespace

const Architecture& find_architecture(const std::string& name, const std::string& path) {
  std::string known;
  for (const Architecture* a : kArchitectures) {
    if (name == a->name) return *a;
    known += str(known.empty() ? "" : ", ", a->name);
  }
  throw UnsupportedError(str(path, ": architecture '", name, "' is not supported; strata runs: ", known,
                             ". Use llama.cpp for this model."));
}

}  // namespace strata
