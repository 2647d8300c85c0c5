// Backend: device memory, the host->device link and the ops the architectures need.
// The CPU backend (backend/cpu) is the reference; CUDA (backend/cuda) implements the same surface.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace strata {

class ThreadPool;

struct RopeParams {
  int64_t n_dims = 0;        // rotated dims per head (== head_dim for qwen3moe)
  float freq_base = 10000.f;
  bool neox = true;          // rotate pairs (i, i + n_dims/2) as llama.cpp's NEOX mode
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual int threads() const = 0;

  // Device memory. CPU: aligned host memory.
  virtual void* alloc(size_t bytes, const char* what) = 0;
  virtual void free(void* p) = 0;
  // The link: host -> device (an expert stream, a weight upload) and back.
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
  virtual void download(void* dst, const void* src, size_t bytes) = 0;
  // A dense weight the device reads: CPU uses the host bytes in place, a GPU copies them.
  virtual const void* resident(const void* host, size_t bytes, const char* what) = 0;

  // ---- ops; all pointers are device memory ----
  // out[t, :] = dequantized row ids[t] of a [rows, D] table of ggml type `type`.
  virtual void embed(uint32_t type, const void* table, int64_t D, const int32_t* ids, int64_t T, float* out) = 0;
  // grs[t] = 1 / sqrt(mean(x[t]^2) + eps) for x of T rows of D.
  virtual void rms_scale(const float* x, int64_t T, int64_t D, float eps, float* grs) = 0;
  // The GR read: out[i, :] = x[s, :] * grs[s] * w with s = rows ? rows[i] / div : i.
  virtual void apply_norm(const float* x, const float* grs, const float* w, int64_t D, const int32_t* rows,
                          int64_t div, int64_t n, float* out) = 0;
  // out[i, :] = x[rows[i] / div, :] (rows of D floats).
  virtual void gather(const float* x, int64_t D, const int32_t* rows, int64_t div, int64_t n, float* out) = 0;
  // The MMQ gather: out row i (out_row_bytes apart) = q8_0 blocks of x[s, :] * grs[s] * w, or of
  // x[s, :] when grs is null; s = rows ? rows[i] / div : i.
  virtual void quantize_q8_0(const float* x, const float* grs, const float* w, int64_t D, const int32_t* rows,
                             int64_t div, int64_t n, uint8_t* out, size_t out_row_bytes) = 0;
  // Integer matmul of weights by q8_0 activations (the MMQ kernels), for types with one.
  virtual bool has_matmul_q8(uint32_t type) const = 0;
  virtual void matmul_q8(uint32_t type, const void* W, int64_t rows, int64_t cols, const uint8_t* Xq,
                         size_t xrow_bytes, int64_t T, float* Y, int64_t ldy) = 0;
  // out[i, :] = dequantized row i (src_row_bytes apart) of n rows of D elements of ggml type `type`.
  virtual void dequant_rows(uint32_t type, const void* src, size_t src_row_bytes, int64_t D, int64_t n,
                            float* out) = 0;
  // Device-to-device copy.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // Y[t, r] = W[r, :] . X[t, :]; W has `rows` rows of `cols` elements of ggml type `type`.
  virtual void matmul(uint32_t type, const void* W, int64_t rows, int64_t cols, const float* X, int64_t ldx,
                      int64_t T, float* Y, int64_t ldy) = 0;
  // In place per head: x = rmsnorm(x) * w (if w), then rotary embedding at positions pos0 + t.
  virtual void head_norm_rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const float* w, float eps,
                              int64_t pos0, const RopeParams& rope) = 0;
  // Causal GQA attention of T queries at positions pos0.. against the layer's cached keys/values
  // [0, pos0 + T). kc/vc are [ctx, KV, hd] float.
  virtual void attention(const float* q, const float* kc, const float* vc, int64_t T, int64_t pos0,
                         int64_t n_head, int64_t n_kv_head, int64_t head_dim, float scale, float* out) = 0;
  // x[i] += y[i]
  virtual void add(float* x, const float* y, int64_t n) = 0;
  // Router: softmax over E logits, top-K (ties to the lower id), weights renormalized if norm.
  virtual void router_topk(const float* logits, int64_t T, int64_t E, int64_t K, bool norm, int32_t* ids,
                           float* weights) = 0;
  // Groups (t, k) pairs by expert: off[E + 1] prefix counts, rows[] = t * K + k sorted by (expert, t).
  virtual void group_by_expert(const int32_t* ids, int64_t T, int64_t K, int64_t E, int32_t* off,
                               int32_t* rows) = 0;
  // g[i] = silu(g[i]) * u[i]
  virtual void swiglu(float* g, const float* u, int64_t n) = 0;
  // out[rows[i] / K, :] += w[rows[i]] * y[i, :] for i < n.
  virtual void scatter_add(const float* y, const int32_t* rows, const float* w, int64_t K, int64_t n,
                           int64_t D, float* out) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  virtual void fill(void* p, uint8_t value, size_t bytes) = 0;
  // Blocks until all queued work is done (a no-op on the CPU).
  virtual void sync() = 0;
};

std::unique_ptr<Backend> make_cpu_backend(int threads);

}  // namespace strata
