// Every input the fuzzers ever failed on (tests/fuzz/regressions/) still ends in strata's own error
// or a clean load and forward pass, never a crash or a foreign exception; under scripts/sanitize the
// same replay runs with AddressSanitizer and UndefinedBehaviorSanitizer.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_load.h"

namespace fs = std::filesystem;

namespace {

std::vector<fs::path> regressions() {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(fs::path(STRATA_FUZZ_DIR) / "regressions"))
    if (e.is_regular_file() && e.path().filename().string()[0] != '.' && e.path().extension() != ".md")
      out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(FuzzRegressions, EveryKeptInputEndsInAStrataErrorOrLoads) {
  const auto files = regressions();
  ASSERT_FALSE(files.empty()) << "no inputs in " << STRATA_FUZZ_DIR << "/regressions";
  for (const auto& p : files) {
    std::ifstream in(p, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
    EXPECT_EQ(strata::fuzz::run_input(data, bytes.size(), strata::fuzz::Depth::Model), "") << p.filename();
  }
}

}  // namespace
