// The runs ops' scheduling (backend/runs.h), which the CUDA launchers and kernels share: pack_runs's
// argument blocks and run_of's lookup together cover every row of every run exactly once, within the
// limits of a launch (runs a block, grid rows), at any tile size, with long runs in pieces.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "backend/runs.h"

using namespace strata;

namespace {

constexpr int kMax = 5;
struct FakeArgs {
  int n_runs = 0;
  int32_t row0[kMax], n[kMax], tile0[kMax + 1];
  const uint8_t* W[kMax];
  const uint8_t* W2[kMax];
};

// Packs `runs` and checks every launch block; returns how often each row was covered.
std::vector<int> cover(const std::vector<Backend::ExpertRun>& runs, int64_t tile_rows, int64_t total_rows,
                       int* launches, int* checked) {
  std::vector<int> seen(total_rows, 0);
  FakeArgs g;
  *launches = *checked = 0;
  pack_runs(
      "test", g, runs.data(), (int64_t)runs.size(), tile_rows, kMax,
      [&](const Backend::ExpertRun&) { ++*checked; },
      [&] {
        ++*launches;
        EXPECT_GE(g.n_runs, 1);
        EXPECT_LE(g.n_runs, kMax);
        EXPECT_LE(g.tile0[g.n_runs], 65535);
        EXPECT_EQ(g.tile0[0], 0);
        for (int j = 0; j < g.n_runs; ++j) {
          EXPECT_EQ(g.tile0[j + 1] - g.tile0[j], (g.n[j] + tile_rows - 1) / tile_rows) << "run " << j;
          EXPECT_GT(g.n[j], 0);
        }
        for (int y = 0; y < g.tile0[g.n_runs]; ++y) {
          const int j = run_of(g, y);
          ASSERT_TRUE(j >= 0 && j < g.n_runs && g.tile0[j] <= y && y < g.tile0[j + 1]) << "tile " << y;
          const int64_t r0 = g.row0[j] + (int64_t)(y - g.tile0[j]) * tile_rows;
          const int64_t r1 = std::min<int64_t>(r0 + tile_rows, (int64_t)g.row0[j] + g.n[j]);
          for (int64_t r = r0; r < r1; ++r) ++seen[r];
        }
      });
  return seen;
}

TEST(Runs, PackedTilesCoverEveryRowOnce) {
  std::mt19937 rng(9);
  for (const int64_t tile_rows : {1, 16, 32, 128}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<Backend::ExpertRun> runs;
      int64_t row = 0;
      const int nr = 1 + (int)(rng() % 17);
      for (int i = 0; i < nr; ++i) {
        row += rng() % 3;  // gaps no run covers
        int64_t len = rng() % 4 == 0 ? 0 : 1 + rng() % 300;
        if (trial == 0 && i == 0) len = 70000 + tile_rows;       // a run in pieces
        if (tile_rows == 1 && trial == 1 && i < 2) len = 40000;  // blocks full by tiles, not runs
        runs.push_back({reinterpret_cast<const void*>(0x100), nullptr, row, len});
        row += len;
      }
      int launches = 0, checked = 0;
      const auto seen = cover(runs, tile_rows, row, &launches, &checked);
      std::vector<int> want(row, 0);
      int nonempty = 0;
      for (const auto& r : runs) {
        nonempty += r.n > 0;
        for (int64_t i = r.row0; i < r.row0 + r.n; ++i) want[i] = 1;
      }
      ASSERT_EQ(seen, want) << "tile_rows " << tile_rows << " trial " << trial;
      EXPECT_EQ(checked, nonempty);
      EXPECT_EQ(launches > 0, nonempty > 0);
    }
  }
}

TEST(Runs, BadRunsAreConfigErrors) {
  FakeArgs g;
  const auto none = [](const Backend::ExpertRun&) {};
  const auto launch = [] {};
  const std::vector<Backend::ExpertRun> neg = {{nullptr, nullptr, 0, -1}};
  EXPECT_THROW(pack_runs("test", g, neg.data(), 1, 16, kMax, none, launch), ConfigError);
  const std::vector<Backend::ExpertRun> big = {{nullptr, nullptr, INT32_MAX - 3, 8}};
  EXPECT_THROW(pack_runs("test", g, big.data(), 1, 16, kMax, none, launch), ConfigError);
  EXPECT_THROW(pack_runs("test", g, neg.data(), -1, 16, kMax, none, launch), ConfigError);
}

}  // namespace
