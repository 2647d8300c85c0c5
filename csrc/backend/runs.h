// How a runs op (Backend::matmul_q8_runs / matmul_runs) becomes launches of one kernel each: the runs
// packed into argument blocks of at most max_runs runs and 65535 token tiles, each run's tiles a range of
// grid rows (tile0), and the lookup a block makes of its run. Host and device share it (the CUDA
// launchers pack, the kernels look up; tests/native checks that every row is covered once).
#pragma once
#include <cstdint>

#include "backend/backend.h"
#include "core/error.h"
#include "core/host_device.h"

namespace strata {

// The run of an argument block that holds grid row y: tile0[lo] <= y < tile0[lo + 1] (g.n_runs runs).
template <class Args>
STRATA_HD inline int run_of(const Args& g, int y) {
  int lo = 0, hi = g.n_runs;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (g.tile0[mid] <= y)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// Packs runs[0 .. n_runs) (runs of no rows left out) into `g` (fields n_runs, row0, n, tile0, W, W2 of
// max_runs entries, tile0 one more), calling check(run) for each run it takes and launch() after each
// block is full: at most max_runs runs and 65535 tiles of tile_rows a block, a run of more than 4096 tiles
// in pieces. ConfigError for a negative count or rows outside 0 .. 2^31.
template <class Args, class Check, class Launch>
void pack_runs(const char* op, Args& g, const Backend::ExpertRun* runs, int64_t n_runs, int64_t tile_rows,
               int max_runs, Check check, Launch launch) {
  STRATA_CHECK(n_runs >= 0 && tile_rows >= 1, ConfigError, op, ": negative run count ", n_runs);
  int64_t tiles = 0;
  g.n_runs = 0;
  const auto flush = [&] {
    if (g.n_runs == 0) return;
    g.tile0[g.n_runs] = static_cast<int32_t>(tiles);
    launch();
    g.n_runs = 0;
    tiles = 0;
  };
  const int64_t piece_rows = 4096 * tile_rows;  // a piece's tiles: at most 4096, so a block's fit
  for (int64_t j = 0; j < n_runs; ++j) {
    const Backend::ExpertRun& r = runs[j];
    STRATA_CHECK(r.n >= 0 && r.row0 >= 0 && r.row0 + r.n <= INT32_MAX, ConfigError, op, ": run ", j,
                 " has rows ", r.row0, " + ", r.n, ", outside 0 .. 2^31");
    if (r.n == 0) continue;
    check(r);
    for (int64_t done = 0; done < r.n;) {
      const int64_t piece = r.n - done < piece_rows ? r.n - done : piece_rows;
      const int64_t pt = (piece + tile_rows - 1) / tile_rows;
      if (g.n_runs == max_runs || tiles + pt > 65535) flush();
      const int k = g.n_runs++;
      g.W[k] = static_cast<const uint8_t*>(r.W);
      g.W2[k] = static_cast<const uint8_t*>(r.W2);
      g.row0[k] = static_cast<int32_t>(r.row0 + done);
      g.n[k] = static_cast<int32_t>(piece);
      g.tile0[k] = static_cast<int32_t>(tiles);
      tiles += pt;
      done += piece;
    }
  }
  flush();
}

}  // namespace strata
