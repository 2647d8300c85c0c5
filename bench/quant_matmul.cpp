// Benchmark of strata::matmul (float activations) and strata::matmul_q8 (q8_0 activations):
// GFLOP/s per quant type, shape and token count; prints a table and writes
// bench/out/quant_matmul.json (run from the repository root).
// Usage: strata_bench_quant_matmul [threads=2] [seconds per cell=0.3] [types=all, e.g. Q4_K,Q8_0]
//        [token counts=1,8,32,64] [paths=float,q8]
// (all: every type in the traits table)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "quant/quant.h"
#include "quant/quantize.h"

using namespace strata;

namespace {

struct Timing {
  double per, cpu_per;  // seconds per call: wall, and process CPU per thread
};

Timing time_it(const std::function<void()>& call, double seconds, int threads) {
  call();  // warm-up
  int64_t calls = 0;
  const std::clock_t c0 = std::clock();
  const auto t0 = std::chrono::steady_clock::now();
  double el = 0;
  do {
    call();
    ++calls;
    el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (el < seconds);
  return {el / calls, static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC / calls / threads};
}

// Byte offsets of a block's fp16 scale fields.
std::vector<size_t> half_fields(QType t) {
  switch (t) {
    case QType::F16:
    case QType::Q8_0:
    case QType::IQ2_XS:
    case QType::IQ2_XXS:
    case QType::IQ4_XS:
    case QType::Q5_0:
    case QType::Q4_0:
    case QType::IQ4_NL:
    case QType::IQ3_XXS:
    case QType::IQ3_S:
    case QType::IQ2_S:
    case QType::IQ1_S:
      return {0};
    case QType::Q4_K:
    case QType::Q5_K:
    case QType::Q4_1:
    case QType::Q5_1:
      return {0, 2};
    case QType::Q2_K:
      return {80, 82};
    case QType::Q3_K:
      return {108};
    case QType::Q6_K:
      return {208};
    default:
      return {};
  }
}

// Random weights whose scale fields are a small positive value (finite results).
std::vector<uint8_t> weights(QType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  const QuantTraits& q = quant_traits(t);
  std::vector<uint8_t> w(rows * row_bytes(t, cols));
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  const uint16_t h = f32_to_fp16(0.01f);
  for (size_t off = 0; off < w.size(); off += q.type_size) {
    if (t == QType::F32) {
      const float v = static_cast<float>(rng() % 1000) / 1000.0f;
      std::memcpy(&w[off], &v, 4);
    } else if (t == QType::BF16) {
      const uint16_t b =
          static_cast<uint16_t>(bits_from_f32(static_cast<float>(rng() % 1000) / 1000.0f) >> 16);
      std::memcpy(&w[off], &b, 2);
    }
    for (size_t f : half_fields(t)) std::memcpy(&w[off + f], &h, 2);
    if (t == QType::MXFP4) w[off] = 121;  // 2^-7
    if (t == QType::IQ1_M)                // the fp16 scale in the top nibbles of the words at 48-55
      for (int i = 0; i < 4; ++i)
        w[off + 49 + 2 * i] =
            static_cast<uint8_t>((w[off + 49 + 2 * i] & 0x0F) | (((h >> (4 * i)) & 0xF) << 4));
  }
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 0.3;  // per cell
  const std::string only = argc > 3 && std::strcmp(argv[3], "all") != 0 ? argv[3] : "";
  std::vector<int64_t> token_counts;
  for (const char* p = argc > 4 ? argv[4] : "1,8,32,64"; *p;) {
    char* end;
    token_counts.push_back(std::strtoll(p, &end, 10));
    p = *end ? end + 1 : end;
  }
  const std::string only_paths = argc > 5 ? argv[5] : "float,q8";
  ThreadPool pool(threads);
  std::mt19937 rng(1);
  std::printf("threads=%d isa=%s\n", threads, isa_name(best_isa()));
  // GFLOP/s from wall time, and from process CPU time per thread: on a shared machine the
  // second shows what the kernels do when they get the cores. "q8" is matmul_q8 (activations
  // quantized outside the timed call, as the MMQ layout does once per layer).
  std::printf("%-8s %5s %5s %4s %-6s %10s %9s %11s\n", "type", "rows", "cols", "T", "path", "us/call",
              "GFLOP/s", "GFLOP/s cpu");
  std::string json = "[";
  const int64_t shapes[][2] = {{2048, 768}, {768, 2048}};
  for (uint32_t id = 0; id < 64; ++id) {  // every type strata computes with, in ggml id order
    const QuantTraits* qp = find_quant(id);
    if (!qp) continue;
    const QuantTraits& q = *qp;
    const QType t = q.type;
    if (!only.empty() && ("," + only + ",").find(str(",", q.name, ",")) == std::string::npos) continue;
    for (const auto& shape : shapes) {
      const int64_t rows = shape[0], cols = shape[1];
      const auto w = weights(t, rows, cols, rng);
      for (int64_t T : token_counts) {
        std::vector<float> x(T * cols), y(T * rows);
        for (auto& v : x) v = static_cast<float>(rng() % 2000) / 1000.0f - 1.0f;
        const size_t xrb = row_bytes(QType::Q8_0, cols);
        std::vector<uint8_t> xq(T * xrb);
        for (int64_t i = 0; i < T; ++i) quantize_row_q8_0(x.data() + i * cols, xq.data() + i * xrb, cols);
        std::vector<std::pair<const char*, std::function<void()>>> paths = {
            {"float", [&] { matmul(t, w.data(), rows, cols, x.data(), cols, T, y.data(), rows, pool); }}};
        if (has_matmul_q8(t))
          paths.push_back({"q8", [&] {
                             matmul_q8(t, w.data(), rows, cols, xq.data(), static_cast<int64_t>(xrb), T,
                                       y.data(), rows, pool);
                           }});
        for (const auto& [path, call] : paths) {
          if (("," + only_paths + ",").find(str(",", path, ",")) == std::string::npos) continue;
          const Timing tm = time_it(call, seconds, threads);
          const double flop = 2.0 * rows * cols * T;
          std::printf("%-8s %5lld %5lld %4lld %-6s %10.1f %9.2f %11.2f\n", q.name, (long long)rows,
                      (long long)cols, (long long)T, path, tm.per * 1e6, flop / tm.per * 1e-9,
                      flop / tm.cpu_per * 1e-9);
          json +=
              str(json.size() > 1 ? "," : "", "\n {\"type\": \"", q.name, "\", \"path\": \"", path,
                  "\", \"T\": ", T, ", \"rows\": ", rows, ", \"cols\": ", cols, ", \"threads\": ", threads,
                  ", \"us_per_call\": ", tm.per * 1e6, ", \"gflops\": ", flop / tm.per * 1e-9,
                  ", \"gflops_cpu\": ", flop / tm.cpu_per * 1e-9, "}");
        }
      }
    }
  }
  std::filesystem::create_directories("bench/out");
  std::ofstream("bench/out/quant_matmul.json") << json << "\n]\n";
}
