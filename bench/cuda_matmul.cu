// Micro-benchmark of the CUDA matmul kernels: per weight type, the GEMV path at few tokens (weight
// bandwidth, GB/s), the tensor-core path at many (TFLOP/s), both paths across the crossover, and
// matmul_q8; prints a table and writes bench/out/cuda_matmul.json (run from the repository root).
// Usage: strata_bench_cuda_matmul [types=all, e.g. Q4_K,Q8_0] [timed runs per cell=100]
//
// Each cell: warm-up calls, then CUDA-event times of single calls, the median reported. The weights
// rotate through copies that together exceed the L2 cache several times, so each call streams its
// weights from memory as decode does. The few-token cells are also timed chained: 32 calls back to back
// in one CUDA graph (programmatic dependent launch between them, as a recorded decode step runs them), the
// time a call then excludes the launch overhead a single call pays (~4 us on an H100), which is how a
// decode step's kernels see them; the GB/s of that column is the figure against the HBM's. The copies are
// never written after they are made, so the calls say so (w_fixed), as a model's resident weights do.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/matmul.cuh"
#include "core/error.h"
#include "core/half.h"
#include "quant/quant.h"
#include "quant/quantize.h"

using namespace strata;
using strata::cuda::MatmulPath;

namespace {

constexpr size_t kRotateBytes = size_t{512} << 20;  // weight copies that together exceed L2 several times
constexpr int kWarmup = 5;

// Random weights whose fp16 fields are small finite values (finite results).
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
    } else if (t == QType::F16 || t == QType::Q8_0 || t == QType::Q4_K || t == QType::IQ2_XS ||
               t == QType::IQ2_XXS) {
      std::memcpy(&w[off], &h, 2);
      if (t == QType::Q4_K) std::memcpy(&w[off + 2], &h, 2);
    } else if (t == QType::Q2_K) {
      std::memcpy(&w[off + q.type_size - 4], &h, 2);
      std::memcpy(&w[off + q.type_size - 2], &h, 2);
    } else if (t == QType::Q6_K) {
      std::memcpy(&w[off + q.type_size - 2], &h, 2);
    }
  }
  return w;
}

// Device copies of one weight matrix, 256 bytes apart in one allocation, used in turn.
struct Rotation {
  std::vector<const void*> copies;
  uint8_t* base = nullptr;
  explicit Rotation(const std::vector<uint8_t>& w) {
    const size_t stride = (w.size() + 255) / 256 * 256;
    const size_t n = std::max<size_t>(2, kRotateBytes / stride);
    STRATA_CUDA_CHECK(cudaMalloc(&base, n * stride));
    for (size_t i = 0; i < n; ++i) {
      STRATA_CUDA_CHECK(cudaMemcpy(base + i * stride, w.data(), w.size(), cudaMemcpyHostToDevice));
      copies.push_back(base + i * stride);
    }
  }
  ~Rotation() { cudaFree(base); }
  Rotation(const Rotation&) = delete;
  Rotation& operator=(const Rotation&) = delete;
};

// The median over `runs` of the seconds between CUDA events recorded on s around body(i).
double median_events(int runs, cudaStream_t s, const std::function<void(int)>& body) {
  std::vector<cudaEvent_t> ev(2 * runs);
  for (auto& e : ev) STRATA_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < runs; ++i) {
    STRATA_CUDA_CHECK(cudaEventRecord(ev[2 * i], s));
    body(i);
    STRATA_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], s));
  }
  STRATA_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> t(runs);
  for (int i = 0; i < runs; ++i) {
    float ms = 0;
    STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    t[i] = ms * 1e-3;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  std::nth_element(t.begin(), t.begin() + runs / 2, t.end());
  return t[runs / 2];
}

// Median seconds of one call(weights) over `runs` timed calls after a warm-up.
double median_time(const Rotation& rot, int runs, cudaStream_t s,
                   const std::function<void(const void*)>& call) {
  for (int i = 0; i < kWarmup; ++i) call(rot.copies[i % rot.copies.size()]);
  return median_events(runs, s, [&](int i) { call(rot.copies[(kWarmup + i) % rot.copies.size()]); });
}

// Seconds a call with kChain calls back to back in one CUDA graph, each on the next weight copy (the
// median over graph launches after a warm-up one, divided by kChain).
constexpr int kChain = 32;
double chained_time(const Rotation& rot, int runs, cudaStream_t s,
                    const std::function<void(const void*)>& call) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  STRATA_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kChain; ++i) call(rot.copies[i % rot.copies.size()]);
  STRATA_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  STRATA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  STRATA_CUDA_CHECK(cudaGraphLaunch(exec, s));  // warm-up
  const double t = median_events(std::max(3, std::min(runs, 20)), s,
                                 [&](int) { STRATA_CUDA_CHECK(cudaGraphLaunch(exec, s)); });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return t / kChain;
}

template <class T>
T* device_copy(const std::vector<T>& v) {
  T* p = nullptr;
  STRATA_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(v.size(), 1) * sizeof(T)));
  STRATA_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

struct Cell {
  const char* what;  // "gemv", "tc" or "q8"
  int64_t rows, cols, T;
};

}  // namespace

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  const int runs = argc > 2 ? std::max(1, std::atoi(argv[2])) : 100;
  cudaDeviceProp prop{};
  STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, %.0f MB L2, sm_%d%d; median of %d runs per cell\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize / 1e6, prop.major, prop.minor, runs);
  cudaStream_t s;
  STRATA_CUDA_CHECK(cudaStreamCreate(&s));
  std::mt19937 rng(1);

  // The shapes: a 2048 x 4096 dense matrix and qwen3-30b-a3b's expert matrices (gate/up 768 x 2048,
  // down 2048 x 768); GEMV at decode, the tensor cores at prompt chunks, both paths across the
  // crossover, and the integer kernel where the type has one. At decode only: a large projection (4096 x
  // 8192: V4 Flash's output projection) and the 30B shape's output head (151,936 x 2048).
  std::vector<Cell> cells;
  const int64_t shapes[][2] = {{2048, 4096}, {768, 2048}, {2048, 768}, {4096, 8192}, {151936, 2048}};
  const auto decode_only = [](const int64_t* sh) { return sh[1] == 8192 || sh[0] == 151936; };
  for (const auto& sh : shapes) {
    cells.push_back({"gemv", sh[0], sh[1], 1});
    if (decode_only(sh)) continue;
    for (int64_t T : {512, 2048}) cells.push_back({"tc", sh[0], sh[1], T});
  }
  for (int64_t T : {2, 4, 8, 16, 32}) {
    cells.push_back({"gemv", 2048, 4096, T});
    cells.push_back({"tc", 2048, 4096, T});
  }
  for (const auto& sh : shapes)
    if (!decode_only(sh))
      for (int64_t T : {1, 8, 512, 2048}) cells.push_back({"q8", sh[0], sh[1], T});

  std::printf("%-7s %-5s %6s %5s %5s %10s %9s %9s %10s %9s\n", "type", "path", "rows", "cols", "T", "us/call",
              "GB/s", "TFLOP/s", "us chained", "GB/s");
  std::string json = str("{\"device\": \"", prop.name, "\", \"sms\": ", prop.multiProcessorCount,
                         ", \"runs\": ", runs, ", \"cells\": [");
  bool first = true;
  for (QType t : {QType::F32, QType::F16, QType::BF16, QType::Q8_0, QType::Q4_K, QType::Q6_K, QType::IQ2_XS,
                  QType::Q2_K, QType::IQ2_XXS}) {
    const QuantTraits& q = quant_traits(t);
    if (!only.empty() && ("," + only + ",").find(str(",", q.name, ",")) == std::string::npos) continue;
    for (const auto& shape : shapes) {
      const int64_t rows = shape[0], cols = shape[1];
      const auto w = weights(t, rows, cols, rng);
      const Rotation rot(w);
      for (const Cell& c : cells) {
        if (c.rows != rows || c.cols != cols) continue;
        const bool q8 = std::strcmp(c.what, "q8") == 0;
        if (q8 && !uses_matmul_q8(static_cast<uint32_t>(t))) continue;
        const int64_t T = c.T;
        std::vector<float> x(T * cols);
        for (auto& v : x) v = static_cast<float>(rng() % 2000) / 1000.0f - 1.0f;
        const size_t xrb = row_bytes(QType::Q8_0, cols);
        std::vector<uint8_t> xq(q8 ? T * xrb : 0);
        if (q8)
          for (int64_t i = 0; i < T; ++i) quantize_row_q8_0(x.data() + i * cols, xq.data() + i * xrb, cols);
        float* dx = device_copy(x);
        uint8_t* dxq = device_copy(xq);
        float* dy = nullptr;
        STRATA_CUDA_CHECK(cudaMalloc(&dy, T * rows * sizeof(float)));
        const uint32_t type = static_cast<uint32_t>(t);
        const auto call = [&](const void* W) {
          if (q8)
            cuda::launch_matmul_q8(type, W, rows, cols, dxq, xrb, T, dy, rows, s);
          else
            cuda::launch_matmul_path(c.what[0] == 'g' ? MatmulPath::Gemv : MatmulPath::TensorCore, type, W,
                                     rows, cols, dx, cols, T, dy, rows, s, /*w_fixed=*/true);
        };
        const double sec = median_time(rot, runs, s, call);
        const double chained = T <= 8 ? chained_time(rot, runs, s, call) : 0.0;
        cudaFree(dx);
        cudaFree(dxq);
        cudaFree(dy);
        // Bytes a call must move at least: the weights once, the activations, the outputs.
        const double bytes = static_cast<double>(w.size()) + (q8 ? T * xrb : T * cols * 4.0) + T * rows * 4.0;
        const double flop = 2.0 * rows * cols * T;
        std::printf("%-7s %-5s %6lld %5lld %5lld %10.2f %9.1f %9.2f", q.name, c.what, (long long)rows,
                    (long long)cols, (long long)T, sec * 1e6, bytes / sec * 1e-9, flop / sec * 1e-12);
        if (chained > 0)
          std::printf(" %10.2f %9.1f\n", chained * 1e6, bytes / chained * 1e-9);
        else
          std::printf(" %10s %9s\n", "-", "-");
        json += str(
            first ? "" : ",", "\n  {\"type\": \"", q.name, "\", \"path\": \"", c.what, "\", \"rows\": ", rows,
            ", \"cols\": ", cols, ", \"T\": ", T, ", \"us_per_call\": ", sec * 1e6,
            ", \"gb_per_s\": ", bytes / sec * 1e-9, ", \"tflop_per_s\": ", flop / sec * 1e-12,
            chained > 0
                ? str(", \"us_chained\": ", chained * 1e6, ", \"gb_per_s_chained\": ", bytes / chained * 1e-9)
                : std::string(),
            "}");
        first = false;
      }
    }
  }
  STRATA_CUDA_CHECK(cudaStreamDestroy(s));
  std::filesystem::create_directories("bench/out");
  std::ofstream("bench/out/cuda_matmul.json") << json << "\n]}\n";
  std::printf("wrote bench/out/cuda_matmul.json\n");
}
