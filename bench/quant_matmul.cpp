// Benchmark of strata::matmul: GFLOP/s per quant type and token count on a 2048 x 768 matrix;
// prints a table and writes bench/out/quant_matmul.json (run from the repository root).
// Usage: strata_bench_quant_matmul [threads=2] [seconds per cell=0.3]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "quant/quant.h"

using namespace strata;

int main(int argc, char** argv) {
  const int64_t rows = 2048, cols = 768;
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 0.3;  // per cell
  ThreadPool pool(threads);
  std::mt19937 rng(1);
  std::printf("rows=%lld cols=%lld threads=%d isa=%s\n", (long long)rows, (long long)cols, threads,
              best_isa() == Isa::Avx2 ? "avx2" : "scalar");
  // GFLOP/s from wall time, and from process CPU time per thread: on a shared machine the
  // second shows what the kernels do when they get the cores.
  std::printf("%-8s %6s %10s %10s %12s\n", "type", "T", "us/call", "GFLOP/s", "GFLOP/s cpu");
  std::string json = "[";
  for (QType t : {QType::F32, QType::F16, QType::Q8_0, QType::Q4_K, QType::Q6_K, QType::IQ2_XS}) {
    const QuantTraits& q = quant_traits(t);
    std::vector<uint8_t> w(rows * row_bytes(t, cols));
    for (auto& b : w) b = static_cast<uint8_t>(rng());
    // Keep every half finite: put a small positive fp16 at each block's scale fields and,
    // for float types, write finite values throughout.
    for (size_t off = 0; off < w.size(); off += q.type_size) {
      if (t == QType::F32) {
        const float v = static_cast<float>(rng() % 1000) / 1000.0f;
        std::memcpy(&w[off], &v, 4);
      } else if (t == QType::F16 || t == QType::Q8_0 || t == QType::Q4_K || t == QType::IQ2_XS) {
        const uint16_t h = f32_to_fp16(0.01f);
        std::memcpy(&w[off], &h, 2);
        if (t == QType::Q4_K) std::memcpy(&w[off + 2], &h, 2);
      } else if (t == QType::Q6_K) {
        const uint16_t h = f32_to_fp16(0.01f);
        std::memcpy(&w[off + q.type_size - 2], &h, 2);
      }
    }
    for (int64_t T : {1, 64}) {
      std::vector<float> x(T * cols), y(T * rows);
      for (auto& v : x) v = static_cast<float>(rng() % 2000) / 1000.0f - 1.0f;
      matmul(t, w.data(), rows, cols, x.data(), cols, T, y.data(), rows, pool);  // warm-up
      int64_t calls = 0;
      const std::clock_t c0 = std::clock();
      const auto t0 = std::chrono::steady_clock::now();
      double el = 0;
      do {
        matmul(t, w.data(), rows, cols, x.data(), cols, T, y.data(), rows, pool);
        ++calls;
        el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      } while (el < seconds);
      const double per = el / calls;
      const double cpu_per = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC / calls / threads;
      const double flop = 2.0 * rows * cols * T;
      std::printf("%-8s %6lld %10.1f %10.2f %12.2f\n", q.name, (long long)T, per * 1e6, flop / per * 1e-9,
                  flop / cpu_per * 1e-9);
      json +=
          str(json.size() > 1 ? "," : "", "\n {\"type\": \"", q.name, "\", \"T\": ", T, ", \"rows\": ", rows,
              ", \"cols\": ", cols, ", \"threads\": ", threads, ", \"us_per_call\": ", per * 1e6,
              ", \"gflops\": ", flop / per * 1e-9, ", \"gflops_cpu\": ", flop / cpu_per * 1e-9, "}");
    }
  }
  std::filesystem::create_directories("bench/out");
  std::ofstream("bench/out/quant_matmul.json") << json << "\n]\n";
}
