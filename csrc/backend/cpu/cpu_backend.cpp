// CPU backend: the reference implementation of every op; its "device memory" is host memory
// and its link is memcpy, so the expert cache and prefill mechanics run without a GPU.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/activation.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/deepseek2_ops.h"
#include "backend/cpu/ds4_ops.h"
#include "backend/cpu/gemma4_ops.h"
#include "backend/cpu/gptoss_ops.h"
#include "backend/cpu/qwen35_ops.h"
#include "backend/deepseek2_ops.h"
#include "backend/ds4_ops.h"
#include "backend/gemma4_ops.h"
#include "backend/gptoss_ops.h"
#include "backend/qwen35_ops.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/thread_pool.h"
#include "quant/quant.h"
#include "quant/quantize.h"

namespace strata {
namespace {

// MemAvailable and MemTotal from /proc/meminfo (0 where it cannot be read).
void host_memory(size_t* avail, size_t* total) {
  *avail = *total = 0;
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return;
  char key[64];
  unsigned long long v;
  while (std::fscanf(f, "%63s %llu kB", key, &v) == 2) {
    if (!std::strcmp(key, "MemTotal:")) *total = (size_t)v * 1024;
    if (!std::strcmp(key, "MemAvailable:")) *avail = (size_t)v * 1024;
  }
  std::fclose(f);
}

void copy_bytes(void* dst, const void* src, size_t n) {
  if (n) std::memcpy(dst, src, n);
}

class CpuBackend final : public Backend,
                         public Ds4Ops,
                         public GptOssOps,
                         public Qwen35Ops,
                         public Gemma4Ops,
                         public Deepseek2Ops {
 public:
  explicit CpuBackend(int threads) : pool_(threads > 0 ? threads : ThreadPool::default_threads()) {}

  const char* name() const override { return "cpu"; }
  // The kernels it runs and on how many threads: "cpu (AVX2, 2 threads)", "cpu (AVX-512 VNNI, 2
  // threads)" or "cpu (scalar, 1 thread)".
  std::string describe() const override {
    return str("cpu (", isa_name(best_isa()), ", ", pool_.size(),
               pool_.size() == 1 ? " thread)" : " threads)");
  }
  int threads() const override { return pool_.size(); }
  void set_interrupt(const std::atomic<bool>* flag) override { pool_.set_interrupt(flag); }

  // Device and pinned memory are both aligned host memory; the count makes leaks testable.
  void* alloc(size_t bytes, const char* what) override {
    void* p = host_alloc(bytes, what).release();
    ++live_;
    return p;
  }
  void free(void* p) override {
    if (!p) return;
    std::free(p);
    --live_;
  }
  void* alloc_pinned(size_t bytes, const char* what) override { return alloc(bytes, what); }
  void free_pinned(void* p) override { free(p); }
  size_t live_allocations() const override { return live_.load(); }
  void memory_info(size_t* free_bytes, size_t* total_bytes) const override {
    host_memory(free_bytes, total_bytes);
  }
  bool host_is_device() const override { return true; }
  // The CPU reads host memory where it is: there is nothing to register.
  bool register_host(const void*, size_t) override { return false; }
  const void* device_view(const void* host) const override { return host; }
  void unregister_host(const void*) override {}

  // Zero-byte copies may come with null pointers (an empty guard tail), which memcpy may not see.
  void upload(void* dst, const void* src, size_t bytes) override { copy_bytes(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { copy_bytes(dst, src, bytes); }
  // One thread of control: a queued copy is done by the time the call returns, and every event
  // is complete when recorded.
  void upload_async(void* dst, const void* src, size_t bytes, Stream) override {
    copy_bytes(dst, src, bytes);
  }
  DeviceBuffer resident(const void* host, size_t bytes, const char*) override {
    return DeviceBuffer::borrow(host, bytes);
  }
  void zero(void* p, size_t bytes) override { fill(p, 0, bytes); }
  void fill(void* p, uint8_t value, size_t bytes) override {
    if (bytes) std::memset(p, value, bytes);
  }

  EventId event_create() override { return ++next_event_; }
  void event_destroy(EventId) override {}
  void record(EventId, Stream) override {}
  void wait(Stream, EventId) override {}
  bool query(EventId) override { return true; }
  void event_sync(EventId) override {}
  void sync() override {}

  void embed(uint32_t type, const void* table, int64_t D, const int32_t* ids, int64_t T,
             float* out) override {
    const QuantTraits& q = quant_traits(type, "token embedding");
    const size_t rb = row_bytes(q.type, D);
    pool_.parallel_for(T, 1, [&](int64_t b, int64_t e, int) {
      for (int64_t t = b; t < e; ++t)
        q.dequant_row(static_cast<const uint8_t*>(table) + (size_t)ids[t] * rb, out + t * D, D);
    });
  }

  void rms_scale(const float* x, int64_t T, int64_t D, float eps, float* grs) override {
    pool_.parallel_for(T, 16, [&](int64_t b, int64_t e, int) {
      for (int64_t t = b; t < e; ++t) {
        const float* r = x + t * D;
        float ss = 0.f;
        for (int64_t i = 0; i < D; ++i) ss += r[i] * r[i];
        grs[t] = 1.0f / std::sqrt(ss / (float)D + eps);
      }
    });
  }

  void apply_norm(const float* x, const float* grs, const float* w, int64_t D, const int32_t* rows,
                  int64_t div, int64_t n, float* out) override {
    pool_.parallel_for(n, 16, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) {
        const int64_t s = rows ? rows[i] / div : i;
        const float* r = x + s * D;
        const float g = grs[s];
        float* o = out + i * D;
        for (int64_t c = 0; c < D; ++c) o[c] = (r[c] * g) * w[c];
      }
    });
  }

  void gather(const float* x, int64_t D, const int32_t* rows, int64_t div, int64_t n, float* out) override {
    pool_.parallel_for(n, 16, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i)
        std::memcpy(out + i * D, x + (int64_t)(rows[i] / div) * D, D * sizeof(float));
    });
  }

  void quantize_q8_0(const float* x, const float* grs, const float* w, int64_t D, const int32_t* rows,
                     int64_t div, int64_t n, uint8_t* out, size_t out_row_bytes) override {
    pool_.parallel_for(n, 4, [&](int64_t b, int64_t e, int) {
      std::vector<float> tmp(grs ? D : 0);
      for (int64_t i = b; i < e; ++i) {
        const int64_t s = rows ? rows[i] / div : i;
        const float* r = x + s * D;
        if (grs) {
          for (int64_t c = 0; c < D; ++c) tmp[c] = (r[c] * grs[s]) * w[c];
          r = tmp.data();
        }
        quantize_row_q8_0(r, out + i * out_row_bytes, D);
      }
    });
  }

  void matmul_q8(uint32_t type, const void* W, int64_t rows, int64_t cols, const uint8_t* Xq,
                 size_t xrow_bytes, int64_t T, float* Y, int64_t ldy) override {
    strata::matmul_q8(quant_traits(type, "matmul_q8 weight").type, W, rows, cols, Xq, (int64_t)xrow_bytes, T,
                      Y, ldy, pool_);
  }

  void dequant_rows(uint32_t type, const void* src, size_t src_row_bytes, int64_t D, int64_t n,
                    float* out) override {
    const QuantTraits& q = quant_traits(type, "dequant_rows");
    pool_.parallel_for(n, 4, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i)
        q.dequant_row(static_cast<const uint8_t*>(src) + i * src_row_bytes, out + i * D, D);
    });
  }

  void copy(void* dst, const void* src, size_t bytes) override { copy_bytes(dst, src, bytes); }

  void matmul(uint32_t type, const void* W, int64_t rows, int64_t cols, const float* X, int64_t ldx,
              int64_t T, float* Y, int64_t ldy) override {
    strata::matmul(quant_traits(type, "matmul weight").type, W, rows, cols, X, ldx, T, Y, ldy, pool_);
  }

  void matmul_experts(uint32_t type, const ExpertTable& t, int m, int64_t rows, int64_t cols,
                      const int32_t* ids, const int32_t* order, int64_t n, const float* X, int64_t ldx,
                      float* Y, int64_t ldy) override {
    const QType q = quant_traits(type, "matmul_experts weight").type;
    for_expert_runs(t, m, rows * row_bytes(q, cols), ids, order, n,
                    [&](const uint8_t* W, int64_t i, int64_t k) {
                      strata::matmul(q, W, rows, cols, X + i * ldx, ldx, k, Y + i * ldy, ldy, pool_);
                    });
  }
  void matmul_q8_experts(uint32_t type, const ExpertTable& t, int m, int64_t rows, int64_t cols,
                         const int32_t* ids, const int32_t* order, int64_t n, const uint8_t* Xq,
                         size_t xrow_bytes, float* Y, int64_t ldy) override {
    const QType q = quant_traits(type, "matmul_q8_experts weight").type;
    for_expert_runs(t, m, rows * row_bytes(q, cols), ids, order, n,
                    [&](const uint8_t* W, int64_t i, int64_t k) {
                      strata::matmul_q8(q, W, rows, cols, Xq + i * xrow_bytes, (int64_t)xrow_bytes, k,
                                        Y + i * ldy, ldy, pool_);
                    });
  }

  void resolve_experts(const ExpertResolve& r) override {
    resolve_experts_reference(r, [](void* d, const void* s, size_t n) { std::memcpy(d, s, n); });
  }

  void head_norm_rope(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* w, float eps,
                      int64_t pos0, const RopeParams& rope) override {
    STRATA_CHECK(rope.neox && rope.n_dims % 2 == 0 && rope.n_dims <= hd, UnsupportedError,
                 "head_norm_rope: only NEOX rotation of an even number of dims <= head_dim is implemented");
    const int64_t half = rope.n_dims / 2;
    std::vector<float> inv_freq(half);
    for (int64_t i = 0; i < half; ++i)
      inv_freq[i] = 1.0f / std::pow(rope.freq_base, (float)(2 * i) / (float)rope.n_dims);
    pool_.parallel_for(T * n_heads, 8, [&](int64_t b, int64_t e, int) {
      for (int64_t th = b; th < e; ++th) {
        float* h = x + th * hd;
        const int64_t pos = pos0 + th / n_heads;
        if (w) {
          float ss = 0.f;
          for (int64_t i = 0; i < hd; ++i) ss += h[i] * h[i];
          const float g = 1.0f / std::sqrt(ss / (float)hd + eps);
          for (int64_t i = 0; i < hd; ++i) h[i] = (h[i] * g) * w[i];
        }
        for (int64_t i = 0; i < half; ++i) {
          const float theta = (float)pos * inv_freq[i];
          const float c = std::cos(theta), s = std::sin(theta);
          const float x0 = h[i], x1 = h[i + half];
          h[i] = x0 * c - x1 * s;
          h[i + half] = x1 * c + x0 * s;
        }
      }
    });
  }

  bool supports_kv(KvType t) const override { return t == KvType::F32; }
  void kv_store(void* cache, KvType t, int64_t pos0, int64_t T, int64_t width, const float* src) override {
    STRATA_CHECK(t == KvType::F32, UnsupportedError,
                 "the CPU backend keeps an f32 KV cache only (--kv-type f32)");
    std::memcpy(static_cast<float*>(cache) + pos0 * width, src, (size_t)T * width * sizeof(float));
  }
  void attention(const float* q, const void* kc, const void* vc, KvType t, int64_t T, int64_t pos0, int64_t H,
                 int64_t KV, int64_t hd, float scale, float* out) override {
    STRATA_CHECK(t == KvType::F32, UnsupportedError,
                 "the CPU backend keeps an f32 KV cache only (--kv-type f32)");
    cpu_attention(q, static_cast<const float*>(kc), static_cast<const float*>(vc), T, pos0, H, KV, hd, scale,
                  out, pool_);
  }

  void add(float* x, const float* y, int64_t n) override {
    pool_.parallel_for(n, 1 << 14, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) x[i] += y[i];
    });
  }

  void router_topk(const float* logits, int64_t T, int64_t E, int64_t K, bool norm, int32_t* ids,
                   float* weights) override {
    pool_.parallel_for(T, 8, [&](int64_t b, int64_t e, int) {
      std::vector<float> p(E);
      std::vector<int32_t> idx(E);
      for (int64_t t = b; t < e; ++t) {
        const float* lg = logits + t * E;
        const float mx = *std::max_element(lg, lg + E);
        float sum = 0.f;
        for (int64_t i = 0; i < E; ++i) sum += (p[i] = std::exp(lg[i] - mx));
        for (int64_t i = 0; i < E; ++i) p[i] /= sum;
        std::iota(idx.begin(), idx.end(), 0);
        std::partial_sort(idx.begin(), idx.begin() + K, idx.end(),
                          [&](int32_t a, int32_t c) { return p[a] > p[c] || (p[a] == p[c] && a < c); });
        float ws = 0.f;
        for (int64_t k = 0; k < K; ++k) ws += p[idx[k]];
        for (int64_t k = 0; k < K; ++k) {
          ids[t * K + k] = idx[k];
          weights[t * K + k] = norm ? p[idx[k]] / ws : p[idx[k]];
        }
      }
    });
  }

  void group_by_expert(const int32_t* ids, int64_t T, int64_t K, int64_t E, int32_t* off,
                       int32_t* rows) override {
    std::fill(off, off + E + 1, 0);
    for (int64_t i = 0; i < T * K; ++i) off[ids[i] + 1]++;
    for (int64_t e = 0; e < E; ++e) off[e + 1] += off[e];
    // Counting sort keeps (expert, t) order: deterministic whatever the chunk.
    std::vector<int32_t> fill(off, off + E);
    for (int64_t i = 0; i < T * K; ++i) rows[fill[ids[i]]++] = (int32_t)i;
  }

  void swiglu(float* g, const float* u, int64_t n) override { cpu_swiglu(best_isa(), g, u, n, pool_); }

  void scatter_add(const float* y, const int32_t* rows, const float* w, int64_t K, int64_t n, int64_t D,
                   float* out) override {
    // Split by columns: each output element is summed by one thread in row order, so rows that
    // share a token (the MMQ pass) neither race nor change the order.
    pool_.parallel_for(D, 64, [&](int64_t c0, int64_t c1, int) {
      for (int64_t i = 0; i < n; ++i) {
        const int32_t r = rows[i];
        float* o = out + (int64_t)(r / K) * D;
        const float wr = w[r];
        const float* yi = y + i * D;
        for (int64_t c = c0; c < c1; ++c) o[c] += yi[c] * wr;
      }
    });
  }

  // Ds4Ops (backend/ds4_ops.h), implemented in the files backend/cpu/ds4_ops.h lists.
  void apply_norm_hc(const float* x, const float* grs, const float* w, int64_t D, int64_t HC,
                     const int32_t* rows, int64_t div, int64_t n, float* out) override {
    cpu_apply_norm_hc(x, grs, w, D, HC, rows, div, n, out, pool_);
  }
  void quantize_q8_0_hc(const float* x, const float* grs, const float* w, int64_t D, int64_t HC,
                        const int32_t* rows, int64_t div, int64_t n, uint8_t* out,
                        size_t out_row_bytes) override {
    cpu_quantize_q8_0_hc(x, grs, w, D, HC, rows, div, n, out, out_row_bytes, pool_);
  }
  void hc_mix(uint32_t type, const void* fn, int64_t M, int64_t K, const float* x, int64_t T,
              float* mix) override {
    matmul(type, fn, M, K, x, K, T, mix, M);
  }
  void hc_pre(const float* mix, const float* x, int64_t T, int64_t HC, int64_t D, float eps,
              const float* scale, const float* base, float hc_eps, int64_t iters, float* grs, float* post,
              float* comb) override {
    cpu_hc_pre(mix, x, T, HC, D, eps, scale, base, hc_eps, iters, grs, post, comb, pool_);
  }
  void hc_post(float* x, const float* y, const float* post, const float* comb, int64_t T, int64_t HC,
               int64_t D) override {
    cpu_hc_post(x, y, post, comb, T, HC, D, pool_);
  }
  void hc_expand(const float* y, int64_t T, int64_t HC, int64_t D, float* x) override {
    cpu_hc_expand(y, T, HC, D, x, pool_);
  }
  void rms_norm(float* x, int64_t rows, int64_t D, const float* w, float eps) override {
    cpu_rms_norm(x, rows, D, w, eps, pool_);
  }
  void rope_tail(float* x, int64_t rows, int64_t n_heads, int64_t hd, int64_t n_pairs, const float* inv_freq,
                 float mscale, int64_t pos0, int64_t pos_step, bool inverse) override {
    cpu_rope_tail(x, rows, n_heads, hd, n_pairs, inv_freq, mscale, pos0, pos_step, inverse, pool_);
  }
  void ring_store(float* ring, int64_t slots, int64_t width, int64_t pos0, int64_t T,
                  const float* src) override {
    cpu_ring_store(ring, slots, width, pos0, T, src);
  }
  void compress_pool(const float* kv, const float* score, const float* state_kv, const float* state_score,
                     const float* ape, int64_t pos0, int64_t T, int64_t ratio, int64_t lanes, int64_t hd,
                     float* out) override {
    cpu_compress_pool(kv, score, state_kv, state_score, ape, pos0, T, ratio, lanes, hd, out, pool_);
  }
  void window_commit(const float* row, float* rows, int64_t hd, int64_t ratio, int64_t pos0,
                     int64_t T) override {
    STRATA_CHECK(T == 1 && ratio >= 1, ConfigError, "window_commit: one token, got T ", T, ", ratio ", ratio);
    if ((pos0 + 1) % ratio == 0)
      std::memcpy(rows + ((pos0 + 1) / ratio - 1) * hd, row, (size_t)hd * sizeof(float));
  }
  void attention_sink(const float* q, const float* kv, const float* win, int64_t window, const float* comp,
                      int64_t ratio, const int32_t* sel, int64_t topk, const float* sinks, int64_t T,
                      int64_t pos0, int64_t H, int64_t hd, float scale, float* out) override {
    cpu_attention_sink(q, kv, win, window, comp, ratio, sel, topk, sinks, T, pos0, H, hd, scale, out, pool_);
  }
  void indexer_topk(const float* q, const float* w, const float* keys, int64_t T, int64_t pos0,
                    int64_t n_heads, int64_t dim, int64_t ratio, int64_t topk, float scale,
                    int32_t* sel) override {
    cpu_indexer_topk(q, w, keys, T, pos0, n_heads, dim, ratio, topk, scale, sel, pool_);
  }
  void router_v4(const float* logits, int64_t T, int64_t E, int64_t K, const float* bias,
                 const int32_t* table, const int32_t* tokens, bool norm, float scale, int32_t* ids,
                 float* weights) override {
    cpu_router_v4(logits, T, E, K, bias, table, tokens, norm, scale, ids, weights, pool_);
  }
  void swiglu_clamp(float* g, const float* u, int64_t n, float limit) override {
    cpu_swiglu_clamp(best_isa(), g, u, n, limit, pool_);
  }

  // Deepseek2Ops (backend/deepseek2_ops.h), implemented in deepseek2_ops.cpp and ds4_misc.cpp.
  void rms_norm_rows(float* x, int64_t rows, int64_t D, int64_t stride, const float* w, float eps) override {
    cpu_rms_norm_rows(x, rows, D, stride, w, eps, pool_);
  }
  void rope_pairs(const float* x, int64_t x_row, int64_t x_head, float* y, int64_t y_row, int64_t y_head,
                  int64_t T, int64_t n_heads, int64_t n_pairs, const float* inv_freq, int64_t pos0) override {
    cpu_rope_pairs(x, x_row, x_head, y, y_row, y_head, T, n_heads, n_pairs, inv_freq, pos0, pool_);
  }
  void router_grouped(const float* logits, int64_t T, int64_t E, int64_t K, bool sigmoid, const float* bias,
                      int64_t groups, int64_t groups_used, bool norm, float scale, int32_t* ids,
                      float* weights) override {
    cpu_router_grouped(logits, T, E, K, sigmoid, bias, groups, groups_used, norm, scale, ids, weights, pool_);
  }

  // GptOssOps (backend/gptoss_ops.h), implemented in gptoss_ops.cpp.
  void add_bias(float* y, const float* bias, int64_t T, int64_t n) override {
    cpu_add_bias(y, bias, T, n, pool_);
  }
  void rope_neox(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* inv_freq, float mscale,
                 int64_t pos0) override {
    cpu_rope_neox(x, T, n_heads, hd, inv_freq, mscale, pos0, pool_);
  }
  void attention_sinks(const float* q, const void* kc, const void* vc, KvType t, int64_t T, int64_t pos0,
                       int64_t H, int64_t KV, int64_t hd, float scale, const float* sinks, int64_t window,
                       float* out) override {
    STRATA_CHECK(t == KvType::F32, UnsupportedError,
                 "the CPU backend keeps an f32 KV cache only (--kv-type f32)");
    cpu_attention(q, static_cast<const float*>(kc), static_cast<const float*>(vc), T, pos0, H, KV, hd, scale,
                  out, pool_, sinks, window);
  }
  void swiglu_oai(float* g, const float* u, const int32_t* ids, const int32_t* rows, int64_t n, int64_t F,
                  const float* gate_b, const float* up_b, float alpha, float limit) override {
    cpu_swiglu_oai(best_isa(), g, u, ids, rows, n, F, gate_b, up_b, alpha, limit, pool_);
  }
  void expert_bias(float* y, const int32_t* ids, const float* w, const float* bias, int64_t T, int64_t K,
                   int64_t D) override {
    cpu_expert_bias(y, ids, w, bias, T, K, D, pool_);
  }

  // Qwen35Ops (backend/qwen35_ops.h), implemented in qwen35_ops.cpp.
  void conv1d_silu(const float* x, int64_t T, int64_t C, int64_t Kc, const float* w, const float* state_in,
                   float* state_out, float* y) override {
    cpu_conv1d_silu(x, T, C, Kc, w, state_in, state_out, y, pool_);
  }
  void gated_delta_chunked(const float* qkv, const float* a, const float* b, int64_t T, int64_t pos0,
                           int64_t C, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, const float* A,
                           const float* dt_bias, bool fresh, float* s_cur, float* s_other, float* rows_k,
                           float* rows_d, float* rows_g, float* out) override {
    cpu_gated_delta_chunked(qkv, a, b, T, pos0, C, Hk, Hv, dk, dv, A, dt_bias, fresh, s_cur, s_other, rows_k,
                            rows_d, rows_g, out, pool_);
  }
  void conv1d_silu_at(const float* x, int64_t C, int64_t Kc, const float* w, float* conv0, float* conv1,
                      int64_t pos0, float* y) override {
    float* conv[2] = {conv0, conv1};
    cpu_conv1d_silu(x, 1, C, Kc, w, pos0 == 0 ? nullptr : conv[pos0 % 2], conv[(pos0 + 1) % 2], y, pool_);
  }
  void gated_delta_at(const float* qkv, const float* a, const float* b, int64_t pos0, int64_t C, int64_t Hk,
                      int64_t Hv, int64_t dk, int64_t dv, const float* A, const float* dt_bias, float* state0,
                      float* state1, float* rows_k, float* rows_d, float* rows_g, float* out) override {
    STRATA_CHECK(C >= 1, ConfigError, "gated_delta_at: chunk ", C);
    const bool odd = pos0 / C % 2;
    cpu_gated_delta_chunked(qkv, a, b, 1, pos0, C, Hk, Hv, dk, dv, A, dt_bias, pos0 == 0,
                            odd ? state1 : state0, odd ? state0 : state1, rows_k, rows_d, rows_g, out, pool_);
  }
  void gated_rms_norm(float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps) override {
    cpu_gated_rms_norm(x, z, w, rows, n, eps, pool_);
  }
  void split_q_gate(const float* qg, int64_t T, int64_t H, int64_t hd, float* q, float* gate) override {
    cpu_split_q_gate(qg, T, H, hd, q, gate, pool_);
  }
  void sigmoid_mul(float* x, const float* g, int64_t n) override { cpu_sigmoid_mul(x, g, n, pool_); }
  void add_sigmoid_scaled(float* y, const float* x, const float* s, int64_t T, int64_t D) override {
    cpu_add_sigmoid_scaled(y, x, s, T, D, pool_);
  }

  // Gemma4Ops (backend/gemma4_ops.h), implemented in gemma4_ops.cpp.
  void head_norm(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* w, float eps) override {
    cpu_head_norm(x, T, n_heads, hd, w, eps, pool_);
  }
  void rope_freqs(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* inv_freq, int64_t pos0,
                  const int64_t* pos) override {
    cpu_rope_freqs(x, T, n_heads, hd, inv_freq, pos0, pos, pool_);
  }
  void attention_window(const float* q, const void* kc, const void* vc, KvType t, int64_t T, int64_t pos0,
                        int64_t H, int64_t KV, int64_t hd, float scale, int64_t window, float* out) override {
    STRATA_CHECK(t == KvType::F32, UnsupportedError,
                 "the CPU backend keeps an f32 KV cache only (--kv-type f32)");
    cpu_attention(q, static_cast<const float*>(kc), static_cast<const float*>(vc), T, pos0, H, KV, hd, scale,
                  out, pool_, nullptr, window);
  }
  void geglu(float* g, const float* u, int64_t n) override { cpu_geglu(g, u, n, pool_); }
  void scale(float* x, int64_t n, const float* s) override { cpu_scale(x, n, s, pool_); }
  void softcap(float* x, int64_t n, float cap) override { cpu_softcap(x, n, cap, pool_); }
  void expert_scale(float* w, const int32_t* ids, const float* scale, int64_t n) override {
    cpu_expert_scale(w, ids, scale, n);
  }

 private:
  // fn(W, i, k) for each run of k consecutive rows i.. on one expert (rows sorted by expert: one run
  // each), W its matrix m (`bytes` long). A slot whose write-through is pending (ExpertTable::pending)
  // first receives the matrix from the source.
  template <class Fn>
  static void for_expert_runs(const ExpertTable& t, int m, size_t bytes, const int32_t* ids,
                              const int32_t* order, int64_t n, Fn fn) {
    STRATA_CHECK(m >= 0 && m < 3, ConfigError, "matmul_experts: matrix ", m, " is not 0, 1 or 2");
    for (int64_t i = 0; i < n;) {
      const int32_t e = ids[order[i]];
      STRATA_CHECK(e >= 0 && e < t.E, ConfigError, "matmul_experts: expert ", e, " out of range [0, ", t.E,
                   ")");
      int64_t j = i + 1;
      while (j < n && ids[order[j]] == e) ++j;
      const uint8_t* W = expert_matrix(t, m, e);
      if (!W && t.leave_absent) {  // computed on the host: its rows stay as they are
        i = j;
        continue;
      }
      STRATA_CHECK(W != nullptr, Error, "internal error: matmul_experts: expert ", e, " is not resident");
      if (t.pending && t.slots && t.pending[t.slots[e]])  // the slot is ours to write: see ExpertTable
        std::memcpy(const_cast<uint8_t*>(W), t.src[m] + (size_t)e * t.src_stride[m], bytes);
      fn(W, i, j - i);
      i = j;
    }
  }
  ThreadPool pool_;
  std::atomic<size_t> live_{0};
  EventId next_event_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace strata
