// Backend: device memory, streams and events, the host->device link and the ops the architectures
// need. The CPU backend (backend/cpu) is the reference; CUDA (backend/cuda) implements the same surface.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace strata {

class ThreadPool;
class DeviceBuffer;

struct RopeParams {
  int64_t n_dims = 0;  // rotated dims per head (== head_dim for qwen3moe)
  float freq_base = 10000.f;
  bool neox = true;  // rotate pairs (i, i + n_dims/2) as llama.cpp's NEOX mode
};

// Element type of the KV cache: f16 on a GPU by default (half the memory and bandwidth), f32 for
// checking against the CPU, which keeps f32.
enum class KvType { F32 = 0, F16 = 1 };
inline size_t kv_elem_bytes(KvType t) { return t == KvType::F32 ? 4 : 2; }
inline const char* kv_type_name(KvType t) { return t == KvType::F32 ? "f32" : "f16"; }

// The two queues of work: ops run in order on Compute; expert copies run on Copy, ordered
// against Compute only through events.
enum class Stream { Compute = 0, Copy = 1 };

// An opaque event handle of one backend; 0 is "no event". Events are owned by `Event` (below).
using EventId = uint64_t;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // A line for `strata info` and --stats: "cpu, 16 threads" or the GPU's name and free memory.
  virtual std::string describe() const = 0;
  virtual int threads() const = 0;
  // Ops stop early and throw Interrupted once *flag is true (null: never), within one piece of their
  // work: a long CPU op ends within a second of a Ctrl-C. A backend whose ops run asynchronously may
  // ignore it; the model also checks between layers.
  virtual void set_interrupt(const std::atomic<bool>* /*flag*/) {}

  // ---- memory; prefer the owning DeviceBuffer / PinnedBuffer below to raw pairs ----
  // Device memory. CPU: aligned host memory. Throws MemoryError naming `what`.
  virtual void* alloc(size_t bytes, const char* what) = 0;
  virtual void free(void* p) = 0;
  // Page-locked host memory, the source the copy engine reads at full speed. CPU: aligned memory.
  virtual void* alloc_pinned(size_t bytes, const char* what) = 0;
  virtual void free_pinned(void* p) = 0;
  // Device (and pinned) allocations alive now: a failed load must bring this back to its start.
  virtual size_t live_allocations() const = 0;
  // Device memory free and in total now (CPU: available and total RAM).
  virtual void memory_info(size_t* free_bytes, size_t* total_bytes) const = 0;
  // True where device memory is host memory (the CPU): nothing to pin, register or stage.
  virtual bool host_is_device() const = 0;
  // Page-locks existing host memory, read-only, so the copy engine reads it at full speed (a read-only
  // file mapping). False, with nothing changed, where the backend or the system cannot.
  virtual bool register_host(const void* p, size_t bytes) = 0;
  virtual void unregister_host(const void* p) = 0;

  // ---- the link ----
  // Synchronous: returns when the bytes have arrived.
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
  virtual void download(void* dst, const void* src, size_t bytes) = 0;
  // Queued on `s` after the work already there; `src` (host) must stay unchanged until an event
  // recorded after it on `s` has completed. CPU: copies at once.
  virtual void upload_async(void* dst, const void* src, size_t bytes, Stream s) = 0;
  // A weight the device reads for the model's life: the CPU borrows the host bytes in place (they
  // must outlive the buffer), a GPU copies them into memory the returned buffer owns.
  virtual DeviceBuffer resident(const void* host, size_t bytes, const char* what) = 0;

  // ---- streams and events ----
  virtual EventId event_create() = 0;
  virtual void event_destroy(EventId e) = 0;
  // Marks the point after the work queued so far on `s`.
  virtual void record(EventId e, Stream s) = 0;
  // Work queued on `s` after this call starts only after `e` completed.
  virtual void wait(Stream s, EventId e) = 0;
  // Whether the work before `e` is done (an event never recorded is done).
  virtual bool query(EventId e) = 0;
  // Blocks the host until the work before `e` is done.
  virtual void event_sync(EventId e) = 0;
  // Blocks until all queued work on every stream is done.
  virtual void sync() = 0;

  // ---- ops; all pointers are device memory, all run on the compute stream ----
  // out[t, :] = dequantized row ids[t] of a [rows, D] table of ggml type `type`.
  virtual void embed(uint32_t type, const void* table, int64_t D, const int32_t* ids, int64_t T,
                     float* out) = 0;
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
  // Integer matmul of weights by q8_0 activations (the MMQ kernels); only for weight types where
  // uses_matmul_q8(type) (quant/quant.h) holds.
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
  virtual void head_norm_rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const float* w,
                              float eps, int64_t pos0, const RopeParams& rope) = 0;
  // Whether the backend keeps a KV cache of this element type.
  virtual bool supports_kv(KvType t) const = 0;
  // cache rows [pos0, pos0 + T) (rows of `width` elements of type t) = src (T x width floats),
  // rounded to nearest for f16.
  virtual void kv_store(void* cache, KvType t, int64_t pos0, int64_t T, int64_t width, const float* src) = 0;
  // Causal GQA attention of T queries at positions pos0.. against the layer's cached keys/values
  // [0, pos0 + T). kc/vc are [ctx, KV, hd] of type t.
  virtual void attention(const float* q, const void* kc, const void* vc, KvType t, int64_t T, int64_t pos0,
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
  // out[rows[i] / K, :] += w[rows[i]] * y[i, :] for i < n, in order of i.
  virtual void scatter_add(const float* y, const int32_t* rows, const float* w, int64_t K, int64_t n,
                           int64_t D, float* out) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  virtual void fill(void* p, uint8_t value, size_t bytes) = 0;
};

std::unique_ptr<Backend> make_cpu_backend(int threads);

// ---- owners: device memory and events that free themselves ----

// Device memory of one backend, freed when the owner goes (a throwing constructor leaks nothing).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend& be, size_t bytes, const char* what)
      : be_(&be), p_(be.alloc(bytes, what)), n_(bytes) {}
  // A view of memory someone else owns (the CPU's resident weights): never freed.
  static DeviceBuffer borrow(const void* p, size_t bytes) {
    DeviceBuffer b;
    b.p_ = const_cast<void*>(p);
    b.n_ = bytes;
    return b;
  }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      be_ = std::exchange(o.be_, nullptr);
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void reset() {
    if (p_ && be_) be_->free(p_);
    p_ = nullptr;
    n_ = 0;
  }
  void* get() const { return p_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t size() const { return n_; }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  Backend* be_ = nullptr;
  void* p_ = nullptr;
  size_t n_ = 0;
};

// Page-locked host memory of one backend.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(Backend& be, size_t bytes, const char* what)
      : be_(&be), p_(static_cast<uint8_t*>(be.alloc_pinned(bytes, what))), n_(bytes) {}
  ~PinnedBuffer() { reset(); }
  PinnedBuffer(PinnedBuffer&& o) noexcept { *this = std::move(o); }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      be_ = std::exchange(o.be_, nullptr);
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void reset() {
    if (p_) be_->free_pinned(p_);
    p_ = nullptr;
    n_ = 0;
  }
  uint8_t* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  Backend* be_ = nullptr;
  uint8_t* p_ = nullptr;
  size_t n_ = 0;
};

// One backend event, destroyed with its owner.
class Event {
 public:
  Event() = default;
  explicit Event(Backend& be) : be_(&be), id_(be.event_create()) {}
  ~Event() { reset(); }
  Event(Event&& o) noexcept { *this = std::move(o); }
  Event& operator=(Event&& o) noexcept {
    if (this != &o) {
      reset();
      be_ = std::exchange(o.be_, nullptr);
      id_ = std::exchange(o.id_, 0);
    }
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void reset() {
    if (id_) be_->event_destroy(id_);
    id_ = 0;
  }
  EventId id() const { return id_; }
  void record(Stream s) const { be_->record(id_, s); }
  bool done() const { return be_->query(id_); }
  void sync() const { be_->event_sync(id_); }

 private:
  Backend* be_ = nullptr;
  EventId id_ = 0;
};

}  // namespace strata
