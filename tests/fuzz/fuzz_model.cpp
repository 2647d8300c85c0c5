// libFuzzer target: everything fuzz_gguf covers, then a load on the CPU backend (all-resident, host
// or mmap source, chunk and GR mode picked per input) and a 3-token prompt plus a decode step.
#include <cstdio>
#include <cstdlib>

#include "core/log.h"
#include "fuzz_load.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  strata::set_log_level(strata::LogLevel::Error);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bad = strata::fuzz::run_input(data, size, strata::fuzz::Depth::Model);
  if (!bad.empty()) {
    std::fprintf(stderr, "%s\n", bad.c_str());
    std::abort();
  }
  return 0;
}
