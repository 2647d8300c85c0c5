// libFuzzer target: the GGUF reader, the spec reader of every registered architecture (picked by
// general.architecture) and the model plan. Fast; run by scripts/fuzz.
#include <cstdio>
#include <cstdlib>

#include "fuzz_load.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bad = strata::fuzz::run_input(data, size, strata::fuzz::Depth::Plan);
  if (!bad.empty()) {
    std::fprintf(stderr, "%s\n", bad.c_str());
    std::abort();
  }
  return 0;
}
