// The peer side of bench/ggml_matmul.py (in bench/peer/: not one of the CMake-built benches): ggml's CPU mul_mat (llama.cpp's matmul) timed on the shapes
// and token counts of bench/quant_matmul.cpp, one line per cell. Built by that script against a
// llama.cpp build (../shared/peers); it uses ggml's public API only and is not part of strata.
// Usage: ggml_matmul THREADS SECONDS TYPE_ID...   (ids as in GGUF: 0 F32, 1 F16, 8 Q8_0, 12 Q4_K, ...)
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "ggml-cpu.h"
#include "ggml.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: ggml_matmul THREADS SECONDS TYPE_ID...\n");
    return 2;
  }
  const int threads = std::atoi(argv[1]);
  const double seconds = std::atof(argv[2]);
  const long long shapes[][2] = {{2048, 768}, {768, 2048}};
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
  ggml_threadpool* pool = ggml_threadpool_new(&tpp);
  for (int a = 3; a < argc; ++a) {
    const auto type = static_cast<ggml_type>(std::atoi(argv[a]));
    for (const auto& sh : shapes) {
      const long long rows = sh[0], cols = sh[1];
      if (cols % ggml_blck_size(type) != 0) continue;
      for (long long T : {1LL, 8LL}) {
        const size_t wbytes = ggml_row_size(type, cols) * rows;
        ggml_init_params ip{wbytes + static_cast<size_t>(cols * T * 4 + rows * T * 4) + (64u << 20), nullptr, false};
        ggml_context* ctx = ggml_init(ip);
        ggml_tensor* W = ggml_new_tensor_2d(ctx, type, cols, rows);
        ggml_tensor* X = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cols, T);
        std::vector<float> src(static_cast<size_t>(rows * cols));
        for (auto& v : src) v = nd(rng) * 0.05f;
        std::vector<float> imat(static_cast<size_t>(cols), 1.0f);
        ggml_quantize_chunk(type, src.data(), W->data, 0, rows, cols,
                            ggml_quantize_requires_imatrix(type) ? imat.data() : nullptr);
        auto* x = static_cast<float*>(X->data);
        for (long long i = 0; i < cols * T; ++i) x[i] = nd(rng);
        ggml_tensor* Y = ggml_mul_mat(ctx, W, X);
        ggml_cgraph* gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, Y);
        // One thread pool for every call, as llama.cpp keeps one (a pool made per call costs more
        // than a decode-sized matmul).
        ggml_cplan plan = ggml_graph_plan(gf, threads, pool);
        std::vector<uint8_t> work(plan.work_size);
        plan.work_data = work.data();
        ggml_graph_compute(gf, &plan);  // warm-up
        long long calls = 0;
        const auto t0 = std::chrono::steady_clock::now();
        double el = 0;
        do {
          ggml_graph_compute(gf, &plan);
          ++calls;
          el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        } while (el < seconds);
        const double per = el / static_cast<double>(calls);
        std::printf("%d %s %lld %lld %lld %.3f %.3f %.3f\n", static_cast<int>(type), ggml_type_name(type), rows,
                    cols, T, per * 1e6, static_cast<double>(wbytes) / per * 1e-9,
                    2.0 * rows * cols * T / per * 1e-9);
        std::fflush(stdout);
        ggml_free(ctx);
      }
    }
  }
  ggml_threadpool_free(pool);
  return 0;
}
