// The CUDA backend: device memory, the compute and copy streams, events, and the ops, each a
// launcher of its op family's file (norm.cu, attention.cu, ...) queued on the compute stream.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/deepseek2.cuh"
#include "backend/cuda/ds4.cuh"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/embed.cuh"
#include "backend/cuda/expert_resolve.cuh"
#include "backend/cuda/gemma4.cuh"
#include "backend/cuda/gptoss.cuh"
#include "backend/cuda/matmul.cuh"
#include "backend/cuda/norm.cuh"
#include "backend/cuda/quantize.cuh"
#include "backend/cuda/qwen35.cuh"
#include "backend/cuda/router.cuh"
#include "backend/deepseek2_ops.h"
#include "backend/ds4_ops.h"
#include "backend/gemma4_ops.h"
#include "backend/gptoss_ops.h"
#include "backend/qwen35_ops.h"
#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "quant/quant.h"

namespace strata {
namespace cuda {
namespace {
__global__ void pdl_probe_kernel() {}
}  // namespace

bool pdl_on() {
  static const bool on = [] {
    const char* env = std::getenv("STRATA_CUDA_PDL");
    if (env && std::strcmp(env, "0") == 0) return false;
    cudaFuncAttributes a{};
    if (cudaFuncGetAttributes(&a, pdl_probe_kernel) != cudaSuccess) {
      cudaGetLastError();  // no kernel image for this device: the launches will say so themselves
      return false;
    }
    return a.ptxVersion >= 90;
  }();
  return on;
}
}  // namespace cuda

namespace {

std::string gib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

// The driver's device count, or why there is none.
int device_count_or(cudaError_t* why) {
  int n = 0;
  *why = cudaGetDeviceCount(&n);
  if (*why != cudaSuccess) {
    cudaGetLastError();  // not sticky, but leave no error behind for the next check
    return 0;
  }
  if (n == 0) *why = cudaErrorNoDevice;
  return n;
}

void require_device(int device) {
  cudaError_t why = cudaSuccess;
  const int n = device_count_or(&why);
  STRATA_CHECK(n > 0, UnsupportedError, "no CUDA device: ", cudaGetErrorString(why));
  STRATA_CHECK(device >= 0 && device < n, ConfigError, "CUDA device ", device,
               " does not exist: the driver sees ", n, " device(s), numbered from 0");
}

std::string describe_current(const cudaDeviceProp& p) {
  size_t free_b = 0, total_b = 0;
  STRATA_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return str(p.name, ", ", gib(free_b), " free of ", gib(total_b), ", sm_", p.major, p.minor);
}

class CudaBackend final : public Backend,
                          public GptOssOps,
                          public Qwen35Ops,
                          public Gemma4Ops,
                          public Deepseek2Ops,
                          public Ds4Ops {
 public:
  explicit CudaBackend(int device) : device_(device) {
    require_device(device);
    try {
      STRATA_CUDA_CHECK(cudaSetDevice(device_));
      STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop_, device_));
      // Non-blocking: neither stream waits for work on the legacy default stream (nobody's).
      STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
      STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
      STRATA_CUDA_CHECK(cudaMalloc(&tickets_, kTicketBytes));
      STRATA_CUDA_CHECK(cudaMemset(tickets_, 0, kTicketBytes));
    } catch (...) {
      release();
      throw;
    }
  }
  ~CudaBackend() override { release(); }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  const char* name() const override { return "cuda"; }
  std::string describe() const override {
    use();
    return describe_current(prop_);
  }
  int threads() const override { return 1; }  // one host thread queues all the work

  // ---- memory ----
  void* alloc(size_t bytes, const char* what) override {
    use();
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));  // never a null "allocation"
    if (e != cudaSuccess) {
      cudaGetLastError();
      if (e != cudaErrorMemoryAllocation) cuda::fail(e, "cudaMalloc", __FILE__, __LINE__);
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw MemoryError(str("out of GPU memory: ", mib_str(bytes), " for ", what, " on ", prop_.name,
                            ", which has ", mib_str(free_b), " free of ", mib_str(total_b),
                            "; lower --expert-cache, --prefill or the context"));
    }
    ++live_;
    return p;
  }
  // free and free_pinned run in destructors: a failure is logged, never thrown.
  void free(void* p) override {
    if (!p) return;
    {
      std::lock_guard<std::mutex> lock(fixed_mu_);
      fixed_.erase(reinterpret_cast<uintptr_t>(p));  // the address may come back as writable memory
    }
    report(cudaSetDevice(device_), "cudaSetDevice");
    report(cudaFree(p), "cudaFree");
    --live_;
  }
  void* alloc_pinned(size_t bytes, const char* what) override {
    use();
    void* p = nullptr;
    const cudaError_t e =
        cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocPortable | cudaHostAllocMapped);
    if (e != cudaSuccess) {
      cudaGetLastError();
      if (e != cudaErrorMemoryAllocation) cuda::fail(e, "cudaHostAlloc", __FILE__, __LINE__);
      throw MemoryError(str("out of page-locked host memory: ", mib_str(bytes), " for ", what,
                            "; lower --expert-cache or use the mmap expert source"));
    }
    ++live_;
    return p;
  }
  void free_pinned(void* p) override {
    if (!p) return;
    report(cudaFreeHost(p), "cudaFreeHost");
    --live_;
  }
  size_t live_allocations() const override { return live_.load(); }
  void memory_info(size_t* free_bytes, size_t* total_bytes) const override {
    use();
    STRATA_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
  }
  bool host_is_device() const override { return false; }
  // A read-only file mapping page-locked in place (and mapped: kernels read it too, device_view): the
  // copy engine reads it at full speed and no second copy of the experts is made. Fails (false) where
  // the system does not allow it, e.g. a locked-memory limit; the caller then makes a pinned copy.
  bool register_host(const void* p, size_t bytes) override {
    use();
    const cudaError_t e =
        cudaHostRegister(const_cast<void*>(p), bytes,
                         cudaHostRegisterPortable | cudaHostRegisterMapped | cudaHostRegisterReadOnly);
    if (e != cudaSuccess) {
      cudaGetLastError();
      log(LogLevel::Info, "cuda backend: cudaHostRegister of the file mapping (", mib_str(bytes),
          ") failed: ", cudaGetErrorString(e), "; using a pinned copy of the experts");
      return false;
    }
    return true;
  }
  // Pinned and registered pages are mapped into the device's address space (unified addressing):
  // kernels read them at the address cudaHostGetDevicePointer gives. Null where it gives none.
  const void* device_view(const void* host) const override {
    use();
    void* d = nullptr;
    if (cudaHostGetDevicePointer(&d, const_cast<void*>(host), 0) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return d;
  }
  void unregister_host(const void* p) override {
    report(cudaHostUnregister(const_cast<void*>(p)), "cudaHostUnregister");
  }

  // ---- the link ----
  // Queued on the compute stream, then waited for: ordered after the compute work already queued
  // (which may still read dst), and the bytes have arrived when the call returns.
  // While a graph is being recorded both only queue the copy (the graph replays it; see capture_begin).
  void upload(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    use();
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, compute_));
    if (!capturing_) STRATA_CUDA_CHECK(cudaStreamSynchronize(compute_));
  }
  void download(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    use();
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, compute_));
    if (!capturing_) STRATA_CUDA_CHECK(cudaStreamSynchronize(compute_));
  }
  void upload_async(void* dst, const void* src, size_t bytes, Stream s) override {
    if (bytes == 0) return;
    use();
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream(s)));
  }
  DeviceBuffer resident(const void* host, size_t bytes, const char* what) override {
    DeviceBuffer b(*this, bytes, what);
    upload(b.get(), host, bytes);
    std::lock_guard<std::mutex> lock(fixed_mu_);
    const auto at = reinterpret_cast<uintptr_t>(b.get());
    fixed_[at] = at + bytes;
    return b;
  }
  // The bytes of `rows` rows of `cols` Q8_0 elements, the weights whose matmul asks whether they are fixed;
  // 0 for other types (only the raw-word Q8_0 GEMV reads MatmulArgs::w_fixed: they skip the lookup, a lock
  // and a map search a call on op-by-op paths) and for rows that are not whole blocks (the launch refuses
  // those itself).
  static size_t raw_gemv_bytes(uint32_t type, int64_t rows, int64_t cols) {
    if (type != static_cast<uint32_t>(QType::Q8_0) || rows < 0 || cols < 0 || cols % kQK8_0 != 0) return 0;
    return static_cast<size_t>(rows) * row_bytes(QType::Q8_0, cols);
  }
  // Whether [p, p + bytes) lies in one resident buffer: memory nothing writes while work is queued (the
  // upload finished before resident returned), which a one-token GEMV may read before waiting for the
  // kernel before it (cuda::MatmulArgs::w_fixed).
  bool fixed(const void* p, size_t bytes) const {
    if (bytes == 0) return false;
    const auto a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(fixed_mu_);
    auto it = fixed_.upper_bound(a);
    if (it == fixed_.begin()) return false;
    --it;
    return a >= it->first && a + bytes <= it->second;
  }

  // ---- streams and events: an EventId is 1 + its index in events_ (0 is "no event") ----
  EventId event_create() override {
    use();
    cudaEvent_t ev = nullptr;
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    std::lock_guard<std::mutex> lock(events_mu_);
    if (!free_ids_.empty()) {
      const EventId id = free_ids_.back();
      free_ids_.pop_back();
      events_[id - 1] = ev;
      return id;
    }
    events_.push_back(ev);
    return events_.size();
  }
  void event_destroy(EventId e) override {  // runs in ~Event: logs, never throws
    cudaEvent_t ev = nullptr;
    {
      std::lock_guard<std::mutex> lock(events_mu_);
      if (e == 0 || e > events_.size() || events_[e - 1] == nullptr) {
        log(LogLevel::Error, "cuda backend: event_destroy of ", e, ", which is not a live event");
        return;
      }
      ev = events_[e - 1];
      events_[e - 1] = nullptr;
      free_ids_.push_back(e);
    }
    report(cudaEventDestroy(ev), "cudaEventDestroy");
  }
  void record(EventId e, Stream s) override {
    use();
    STRATA_CUDA_CHECK(cudaEventRecord(event(e), stream(s)));
  }
  void wait(Stream s, EventId e) override {
    use();
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(stream(s), event(e), 0));
  }
  bool query(EventId e) override {
    use();
    const cudaError_t r = cudaEventQuery(event(e));  // a never-recorded event reports success
    if (r == cudaErrorNotReady) {
      cudaGetLastError();  // "not ready" is an answer, not an error: leave none behind
      return false;
    }
    STRATA_CUDA_CHECK(r);
    return true;
  }
  void event_sync(EventId e) override {
    use();
    STRATA_CUDA_CHECK(cudaEventSynchronize(event(e)));
  }
  void sync() override {
    use();
    STRATA_CUDA_CHECK(cudaStreamSynchronize(compute_));
    STRATA_CUDA_CHECK(cudaStreamSynchronize(copy_));
  }

  // ---- graphs: a GraphId is 1 + its index in graphs_ ----
  bool supports_graphs() const override { return true; }
  void capture_begin() override {
    use();
    STRATA_CHECK(!capturing_, Error, "cuda backend: a graph is already being recorded");
    // Relaxed: the host may call unrelated CUDA functions (events, memory queries) meanwhile.
    STRATA_CUDA_CHECK(cudaStreamBeginCapture(compute_, cudaStreamCaptureModeRelaxed));
    capturing_ = true;
  }
  GraphId capture_end() override {
    use();
    STRATA_CHECK(capturing_, Error, "cuda backend: capture_end without capture_begin");
    capturing_ = false;
    cudaGraph_t g = nullptr;
    STRATA_CUDA_CHECK(cudaStreamEndCapture(compute_, &g));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    STRATA_CUDA_CHECK(e);
    graphs_.push_back(exec);
    return graphs_.size();
  }
  void capture_abort() override {
    if (!capturing_) return;
    capturing_ = false;
    cudaGraph_t g = nullptr;
    report(cudaStreamEndCapture(compute_, &g), "cudaStreamEndCapture");
    if (g) report(cudaGraphDestroy(g), "cudaGraphDestroy");
  }
  void graph_launch(GraphId id) override {
    use();
    STRATA_CHECK(id != 0 && id <= graphs_.size() && graphs_[id - 1] != nullptr, ConfigError,
                 "cuda backend: graph ", id, " is not a live graph of this backend");
    STRATA_CUDA_CHECK(cudaGraphLaunch(graphs_[id - 1], compute_));
  }
  void graph_destroy(GraphId id) override {  // runs in ~Graph: logs, never throws
    if (id == 0 || id > graphs_.size() || graphs_[id - 1] == nullptr) return;
    report(cudaGraphExecDestroy(graphs_[id - 1]), "cudaGraphExecDestroy");
    graphs_[id - 1] = nullptr;
  }
  void set_position_source(const int32_t* dev, int64_t max_pos) override {
    pos_ = cuda::PosSource{dev, max_pos};
  }
  const int32_t* position_source() const override { return pos_.dev; }
  void reserve_scratch(int64_t ctx, int64_t max_rows, int64_t n_head, int64_t head_dim) override {
    scratch(std::max(cuda::attention_scratch_max_bytes(ctx, n_head, head_dim),
                     cuda::scatter_add_scratch_bytes(max_rows)));
  }

  // ---- ops, on the compute stream ----
  void embed(uint32_t type, const void* table, int64_t D, const int32_t* ids, int64_t T,
             float* out) override {
    use();
    cuda::launch_embed(type, table, D, ids, T, out, compute_);
  }
  void rms_scale(const float* x, int64_t T, int64_t D, float eps, float* grs) override {
    use();
    cuda::launch_rms_scale(x, T, D, eps, grs, compute_);
  }
  void apply_norm(const float* x, const float* grs, const float* w, int64_t D, const int32_t* rows,
                  int64_t div, int64_t n, float* out) override {
    use();
    cuda::launch_apply_norm(x, grs, w, D, rows, div, n, out, compute_);
  }
  void rms_norm_read(const float* x, int64_t T, int64_t D, float eps, const float* w, float* grs,
                     float* out) override {
    use();
    cuda::launch_rms_norm_read(x, T, D, eps, w, grs, out, compute_);
  }
  void add_rms_norm_read(float* x, const float* y, int64_t T, int64_t D, float eps, const float* w,
                         float* grs, float* out) override {
    use();
    cuda::launch_add_rms_norm_read(x, y, T, D, eps, w, grs, out, compute_);
  }
  void gather(const float* x, int64_t D, const int32_t* rows, int64_t div, int64_t n, float* out) override {
    use();
    cuda::launch_gather(x, D, rows, div, n, out, compute_);
  }
  void quantize_q8_0(const float* x, const float* grs, const float* w, int64_t D, const int32_t* rows,
                     int64_t div, int64_t n, uint8_t* out, size_t out_row_bytes) override {
    use();
    cuda::launch_quantize_q8_0(x, grs, w, D, rows, div, n, out, out_row_bytes, compute_);
  }
  void matmul_q8(uint32_t type, const void* W, int64_t rows, int64_t cols, const uint8_t* Xq,
                 size_t xrow_bytes, int64_t T, float* Y, int64_t ldy) override {
    use();
    cuda::launch_matmul_q8(type, W, rows, cols, Xq, xrow_bytes, T, Y, ldy, compute_);
  }
  void dequant_rows(uint32_t type, const void* src, size_t src_row_bytes, int64_t D, int64_t n,
                    float* out) override {
    use();
    cuda::launch_dequant_rows(type, src, src_row_bytes, D, n, out, compute_);
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    use();
    STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, compute_));
  }
  void matmul(uint32_t type, const void* W, int64_t rows, int64_t cols, const float* X, int64_t ldx,
              int64_t T, float* Y, int64_t ldy) override {
    use();
    cuda::launch_matmul_path(matmul_path(type, rows, cols, T), type, W, rows, cols, X, ldx, T, Y, ldy,
                             compute_, fixed(W, raw_gemv_bytes(type, rows, cols)));
  }
  // A prompt always on tensor cores and decode always on GEMV, whatever the number of tokens: a row's
  // result then never depends on the chunking (see Phase); Phase::Any chooses by the shape.
  cuda::MatmulPath matmul_path(uint32_t type, int64_t rows, int64_t cols, int64_t T) const {
    if (phase() == Phase::Any)
      return cuda::matmul_should_use_gemv(type, rows, cols, T) ? cuda::MatmulPath::Gemv
                                                               : cuda::MatmulPath::TensorCore;
    return phase() == Phase::Prompt ? cuda::MatmulPath::TensorCore : cuda::MatmulPath::Gemv;
  }
  void matmul_n(uint32_t type, int64_t cols, const float* X, int64_t ldx, int64_t T, const MatmulOut* outs,
                int n) override {
    use();
    bool all_fixed = n > 0;
    for (int i = 0; i < n; ++i)
      all_fixed = all_fixed && fixed(outs[i].W, raw_gemv_bytes(type, outs[i].rows, cols));
    cuda::launch_matmul_n(matmul_path(type, 0, cols, T), type, cols, X, ldx, T, outs, n, compute_, all_fixed);
  }
  void matmul_strided(uint32_t type, const void* W, size_t w_stride, int64_t rows, int64_t cols,
                      const float* X, int64_t x_stride, int64_t ldx, int64_t T, float* Y, int64_t y_stride,
                      int64_t ldy, int64_t n) override {
    use();
    const size_t one = raw_gemv_bytes(type, rows, cols);
    const size_t span = n > 0 && one > 0 ? static_cast<size_t>(n - 1) * w_stride + one : 0;
    cuda::launch_matmul_strided(matmul_path(type, rows, cols, T), type, W, w_stride, rows, cols, X, x_stride,
                                ldx, T, Y, y_stride, ldy, n, compute_, n > 0 && fixed(W, span));
  }
  void matmul_experts(uint32_t type, const ExpertTable& t, int m, int64_t rows, int64_t cols,
                      const int32_t* ids, const int32_t* order, int64_t n, const float* X, int64_t ldx,
                      float* Y, int64_t ldy) override {
    use();
    cuda::launch_matmul_experts(type, t, m, rows, cols, ids, order, n, X, ldx, Y, ldy, compute_);
  }
  void matmul_q8_experts(uint32_t type, const ExpertTable& t, int m, int64_t rows, int64_t cols,
                         const int32_t* ids, const int32_t* order, int64_t n, const uint8_t* Xq,
                         size_t xrow_bytes, float* Y, int64_t ldy) override {
    use();
    cuda::launch_matmul_q8_experts(type, t, m, rows, cols, ids, order, n, Xq, xrow_bytes, Y, ldy, compute_);
  }
  void matmul_q8_runs(uint32_t type, const ExpertRun* runs, int64_t n_runs, int64_t rows, int64_t cols,
                      const uint8_t* Xq, size_t xrow_bytes, float* Y, float* Y2, int64_t ldy) override {
    use();
    cuda::launch_matmul_q8_runs(type, runs, n_runs, rows, cols, Xq, xrow_bytes, Y, Y2, ldy, compute_);
  }
  // A prompt's runs in one launch; elsewhere (decode, Phase::Any) matmul's own choice run by run.
  void matmul_runs(uint32_t type, const ExpertRun* runs, int64_t n_runs, int64_t rows, int64_t cols,
                   const float* X, int64_t ldx, float* Y, float* Y2, int64_t ldy) override {
    if (phase() != Phase::Prompt)
      return Backend::matmul_runs(type, runs, n_runs, rows, cols, X, ldx, Y, Y2, ldy);
    use();
    cuda::launch_matmul_runs(type, runs, n_runs, rows, cols, X, ldx, Y, Y2, ldy, compute_);
  }
  void matmul_q8_experts_pair(uint32_t type, const ExpertTable& t, int m, int m2, int64_t rows, int64_t cols,
                              const int32_t* ids, const int32_t* order, int64_t n, const uint8_t* Xq,
                              size_t xrow_bytes, float* Y, float* Y2, int64_t ldy) override {
    use();
    cuda::launch_matmul_q8_experts(type, t, m, rows, cols, ids, order, n, Xq, xrow_bytes, Y, ldy, compute_,
                                   m2, Y2);
  }
  void head_norm_rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const float* w, float eps,
                      int64_t pos0, const RopeParams& rope) override {
    use();
    cuda::launch_head_norm_rope(x, T, n_heads, head_dim, w, eps, pos0, pos_.dev, rope, compute_);
  }
  void qk_rope_store(float* q, float* k, const float* v, int64_t T, int64_t n_head, int64_t n_kv_head,
                     int64_t head_dim, const float* q_norm, const float* k_norm, float eps, int64_t pos0,
                     const RopeParams& rope, void* kc, void* vc, KvType t) override {
    use();
    cuda::launch_qk_rope_store(q, k, v, T, n_head, n_kv_head, head_dim, q_norm, k_norm, eps, pos0, pos_.dev,
                               rope, kc, vc, t, compute_);
  }
  bool supports_kv(KvType t) const override { return t == KvType::F32 || t == KvType::F16; }
  void kv_store(void* cache, KvType t, int64_t pos0, int64_t T, int64_t width, const float* src) override {
    use();
    cuda::launch_kv_store(cache, t, pos0, pos_, T, width, src, compute_);
  }
  void attention(const float* q, const void* kc, const void* vc, KvType t, int64_t T, int64_t pos0, int64_t H,
                 int64_t KV, int64_t hd, float scale, float* out) override {
    use();
    void* ws = scratch(pos_.dev ? cuda::attention_scratch_max_bytes(pos_.max_pos, H, hd)
                                : cuda::attention_scratch_bytes(T, pos0, H, hd));
    // Tickets past route's word 0.
    const cuda::AttentionTickets tk{tickets_ + 1, kDeltaTicket0 - 1};
    cuda::launch_attention(q, kc, vc, t, T, pos0, pos_, H, KV, hd, scale, out, ws, tk, compute_);
  }
  void add(float* x, const float* y, int64_t n) override {
    use();
    cuda::launch_add(x, y, n, compute_);
  }

  // Deepseek2Ops (backend/deepseek2_ops.h), in deepseek2.cu.
  void rms_norm_rows(float* x, int64_t rows, int64_t D, int64_t stride, const float* w, float eps) override {
    use();
    cuda::launch_rms_norm_rows(x, rows, D, stride, w, eps, compute_);
  }
  void rope_pairs(const float* x, int64_t x_row, int64_t x_head, float* y, int64_t y_row, int64_t y_head,
                  int64_t T, int64_t n_heads, int64_t n_pairs, const float* inv_freq, int64_t pos0) override {
    use();
    cuda::launch_rope_pairs(x, x_row, x_head, y, y_row, y_head, T, n_heads, n_pairs, inv_freq, pos0, pos_.dev,
                            compute_);
  }
  void router_grouped(const float* logits, int64_t T, int64_t E, int64_t K, bool sigmoid, const float* bias,
                      int64_t groups, int64_t groups_used, bool norm, float scale, int32_t* ids,
                      float* weights) override {
    use();
    cuda::launch_router_grouped(logits, T, E, K, sigmoid, bias, groups, groups_used, norm, scale, ids,
                                weights, compute_);
  }

  // Ds4Ops (backend/ds4_ops.h), in ds4.cu.
  void apply_norm_hc(const float* x, const float* grs, const float* w, int64_t D, int64_t HC,
                     const int32_t* rows, int64_t div, int64_t n, float* out) override {
    use();
    cuda::launch_apply_norm_hc(x, grs, w, D, HC, rows, div, n, out, compute_);
  }
  void quantize_q8_0_hc(const float* x, const float* grs, const float* w, int64_t D, int64_t HC,
                        const int32_t* rows, int64_t div, int64_t n, uint8_t* out,
                        size_t out_row_bytes) override {
    use();
    cuda::launch_quantize_q8_0_hc(x, grs, w, D, HC, rows, div, n, out, out_row_bytes, compute_);
  }
  void hc_mix(uint32_t type, const void* fn, int64_t M, int64_t K, const float* x, int64_t T,
              float* mix) override {
    use();
    // On the GEMV path (a decode step) F32 rows a block per (t, m): 24 rows as 24 warps of the weight GEMV
    // ran on 6 SMs. A prompt keeps the weight matmul's tensor-core tile (its chunks' bits as before).
    const cuda::MatmulPath path = matmul_path(type, M, K, T);
    if (type == static_cast<uint32_t>(QType::F32) && path == cuda::MatmulPath::Gemv)
      cuda::launch_hc_mix(static_cast<const float*>(fn), M, K, x, T, mix, compute_);
    else
      cuda::launch_matmul_path(path, type, fn, M, K, x, K, T, mix, M, compute_);
  }
  void hc_pre(const float* mix, const float* x, int64_t T, int64_t HC, int64_t D, float eps,
              const float* scale, const float* base, float hc_eps, int64_t iters, float* grs, float* post,
              float* comb) override {
    use();
    cuda::launch_hc_pre(mix, x, T, HC, D, eps, scale, base, hc_eps, iters, grs, post, comb, compute_);
  }
  void hc_post(float* x, const float* y, const float* post, const float* comb, int64_t T, int64_t HC,
               int64_t D) override {
    use();
    cuda::launch_hc_post(x, y, post, comb, T, HC, D, compute_);
  }
  void hc_expand(const float* y, int64_t T, int64_t HC, int64_t D, float* x) override {
    use();
    cuda::launch_hc_expand(y, T, HC, D, x, compute_);
  }
  void rms_norm(float* x, int64_t rows, int64_t D, const float* w, float eps) override {
    use();
    cuda::launch_ds4_rms_norm(x, rows, D, w, eps, compute_);
  }
  void rope_tail(float* x, int64_t rows, int64_t n_heads, int64_t hd, int64_t n_pairs, const float* inv_freq,
                 float mscale, int64_t pos0, int64_t pos_step, bool inverse) override {
    use();
    cuda::launch_rope_tail(x, rows, n_heads, hd, n_pairs, inv_freq, mscale, pos0, pos_, pos_step, inverse,
                           compute_);
  }
  void ring_store(float* ring, int64_t slots, int64_t width, int64_t pos0, int64_t T,
                  const float* src) override {
    use();
    cuda::launch_ring_store(ring, slots, width, pos0, pos_, T, src, compute_);
  }
  void compress_pool(const float* kv, const float* score, const float* state_kv, const float* state_score,
                     const float* ape, int64_t pos0, int64_t T, int64_t ratio, int64_t lanes, int64_t hd,
                     float* out) override {
    use();
    cuda::launch_compress_pool(kv, score, state_kv, state_score, ape, pos0, pos_, T, ratio, lanes, hd, out,
                               compute_);
  }
  void window_commit(const float* row, float* rows, int64_t hd, int64_t ratio, int64_t pos0,
                     int64_t T) override {
    use();
    cuda::launch_window_commit(row, rows, hd, ratio, pos0, pos_, T, compute_);
  }
  void attention_sink(const float* q, const float* kv, const float* win, int64_t window, const float* comp,
                      int64_t ratio, const int32_t* sel, int64_t topk, const float* sinks, int64_t T,
                      int64_t pos0, int64_t H, int64_t hd, float scale, float* out) override {
    use();
    cuda::launch_attention_sink(q, kv, win, window, comp, ratio, sel, topk, sinks, T, pos0, pos_, H, hd,
                                scale, out, compute_);
  }
  void indexer_topk(const float* q, const float* w, const float* keys, int64_t T, int64_t pos0,
                    int64_t n_heads, int64_t dim, int64_t ratio, int64_t topk, float scale,
                    int32_t* sel) override {
    use();
    cuda::launch_indexer_topk(q, w, keys, T, pos0, pos_, n_heads, dim, ratio, topk, scale, sel, compute_);
  }
  void router_v4(const float* logits, int64_t T, int64_t E, int64_t K, const float* bias,
                 const int32_t* table, const int32_t* tokens, bool norm, float scale, int32_t* ids,
                 float* weights) override {
    use();
    cuda::launch_router_v4(logits, T, E, K, bias, table, tokens, norm, scale, ids, weights, compute_);
  }
  void swiglu_clamp(float* g, const float* u, int64_t n, float limit) override {
    use();
    cuda::launch_swiglu_clamp(g, u, n, limit, compute_);
  }

  // Gemma4Ops (backend/gemma4_ops.h), in gemma4.cu (the windowed attention: gptoss.cu's without sinks).
  void head_norm(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* w, float eps) override {
    use();
    cuda::launch_head_norm(x, T, n_heads, hd, w, eps, compute_);
  }
  void rope_freqs(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* inv_freq, int64_t pos0,
                  const int64_t* pos) override {
    use();
    if (!pos) {
      cuda::launch_rope_freqs(x, T, n_heads, hd, inv_freq, pos0, pos_.dev, compute_);
      return;
    }
    STRATA_CHECK(!pos_.dev, ConfigError, "rope_freqs: host positions while the position source is set");
    for (int64_t t = 0; t < T; ++t)  // rows at their own positions (a batched decode step): one launch a row
      cuda::launch_rope_freqs(x + t * n_heads * hd, 1, n_heads, hd, inv_freq, pos[t], nullptr, compute_);
  }
  void attention_window(const float* q, const void* kc, const void* vc, KvType t, int64_t T, int64_t pos0,
                        int64_t H, int64_t KV, int64_t hd, float scale, int64_t window, float* out) override {
    attention_sinks(q, kc, vc, t, T, pos0, H, KV, hd, scale, nullptr, window, out);
  }
  void geglu(float* g, const float* u, int64_t n) override {
    use();
    cuda::launch_geglu(g, u, n, compute_);
  }
  void scale(float* x, int64_t n, const float* s) override {
    use();
    cuda::launch_scale(x, n, s, compute_);
  }
  void softcap(float* x, int64_t n, float cap) override {
    use();
    cuda::launch_softcap(x, n, cap, compute_);
  }
  void expert_scale(float* w, const int32_t* ids, const float* scale, int64_t n) override {
    use();
    cuda::launch_expert_scale(w, ids, scale, n, compute_);
  }

  // Qwen35Ops (backend/qwen35_ops.h), in qwen35.cu.
  void conv1d_silu(const float* x, int64_t T, int64_t C, int64_t Kc, const float* w, const float* state_in,
                   float* state_out, float* y) override {
    use();
    cuda::launch_conv1d_silu(x, T, C, Kc, w, state_in, state_out, y, compute_);
  }
  void gated_delta_chunked(const float* qkv, const float* a, const float* b, int64_t T, int64_t pos0,
                           int64_t C, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, const float* A,
                           const float* dt_bias, bool fresh, float* s_cur, float* s_other, float* rows_k,
                           float* rows_d, float* rows_g, float* out) override {
    use();
    cuda::launch_gated_delta_chunked(qkv, a, b, T, pos0, C, Hk, Hv, dk, dv, A, dt_bias, fresh, s_cur, s_other,
                                     rows_k, rows_d, rows_g, out, tickets_ + kDeltaTicket0, kDeltaTickets,
                                     compute_);
  }
  void conv1d_silu_at(const float* x, int64_t C, int64_t Kc, const float* w, float* conv0, float* conv1,
                      int64_t pos0, float* y) override {
    use();
    cuda::launch_conv1d_silu_at(x, C, Kc, w, conv0, conv1, pos0, pos_.dev, y, compute_);
  }
  void gated_delta_at(const float* qkv, const float* a, const float* b, int64_t pos0, int64_t C, int64_t Hk,
                      int64_t Hv, int64_t dk, int64_t dv, const float* A, const float* dt_bias, float* state0,
                      float* state1, float* rows_k, float* rows_d, float* rows_g, float* out) override {
    use();
    cuda::launch_gated_delta_at(qkv, a, b, pos0, pos_.dev, C, Hk, Hv, dk, dv, A, dt_bias, state0, state1,
                                rows_k, rows_d, rows_g, out, tickets_ + kDeltaTicket0, kDeltaTickets,
                                compute_);
  }
  void gated_rms_norm(float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps) override {
    use();
    cuda::launch_gated_rms_norm(x, z, w, rows, n, eps, compute_);
  }
  void split_q_gate(const float* qg, int64_t T, int64_t H, int64_t hd, float* q, float* gate) override {
    use();
    cuda::launch_split_q_gate(qg, T, H, hd, q, gate, compute_);
  }
  void sigmoid_mul(float* x, const float* g, int64_t n) override {
    use();
    cuda::launch_sigmoid_mul(x, g, n, compute_);
  }
  void add_sigmoid_scaled(float* y, const float* x, const float* sc, int64_t T, int64_t D) override {
    use();
    cuda::launch_add_sigmoid_scaled(y, x, sc, T, D, compute_);
  }

  // GptOssOps (backend/gptoss_ops.h), in gptoss.cu.
  void add_bias(float* y, const float* bias, int64_t T, int64_t n) override {
    use();
    cuda::launch_add_bias(y, bias, T, n, compute_);
  }
  void rope_neox(float* x, int64_t T, int64_t n_heads, int64_t hd, const float* inv_freq, float mscale,
                 int64_t pos0) override {
    use();
    cuda::launch_rope_neox(x, T, n_heads, hd, inv_freq, mscale, pos0, pos_.dev, compute_);
  }
  void attention_sinks(const float* q, const void* kc, const void* vc, KvType t, int64_t T, int64_t pos0,
                       int64_t H, int64_t KV, int64_t hd, float scale, const float* sinks, int64_t window,
                       float* out) override {
    use();
    if (cuda::attention_mma_sinks_usable(
            t, hd, kc, vc)) {  // the tensor-core family (STRATA_CUDA_SINKS_MMA=0: CUDA cores)
      void* ws = scratch(pos_.dev ? cuda::attention_scratch_max_bytes(pos_.max_pos, H, hd)
                                  : cuda::attention_scratch_bytes(T, pos0, H, hd));
      cuda::launch_attention_mma_sinks(q, kc, vc, T, pos0, pos_, H, KV, hd, scale, sinks, window, out, ws,
                                       compute_);
      return;
    }
    cuda::launch_attention_sinks(q, kc, vc, t, T, pos0, pos_.dev, H, KV, hd, scale, sinks, window, out,
                                 compute_);
  }
  void swiglu_oai(float* g, const float* u, const int32_t* ids, const int32_t* rows, int64_t n, int64_t F,
                  const float* gate_b, const float* up_b, float alpha, float limit) override {
    use();
    cuda::launch_swiglu_oai(g, u, ids, rows, n, F, gate_b, up_b, alpha, limit, compute_);
  }
  void expert_bias(float* y, const int32_t* ids, const float* w, const float* bias, int64_t T, int64_t K,
                   int64_t D) override {
    use();
    cuda::launch_expert_bias(y, ids, w, bias, T, K, D, compute_);
  }
  void router_topk(const float* logits, int64_t T, int64_t E, int64_t K, bool norm, int32_t* ids,
                   float* weights) override {
    use();
    cuda::launch_router_topk(logits, T, E, K, norm, ids, weights, compute_);
  }
  void group_by_expert(const int32_t* ids, int64_t T, int64_t K, int64_t E, int32_t* off,
                       int32_t* rows) override {
    use();
    cuda::launch_group_by_expert(ids, T, K, E, off, rows, compute_);
  }
  void route(uint32_t type, const void* W, int64_t E, int64_t D, const float* x, int64_t T, int64_t K,
             bool norm, float* logits, int32_t* ids, float* weights, int32_t* off, int32_t* rows) override {
    use();
    // One token on the GEMV path: one launch, its logits those of matmul's gemv_row_kernel.
    if (T == 1 && matmul_path(type, E, D, T) == cuda::MatmulPath::Gemv &&
        cuda::launch_route(type, W, E, D, x, K, norm, logits, ids, weights, off, rows, tickets_, compute_))
      return;
    Backend::route(type, W, E, D, x, T, K, norm, logits, ids, weights, off, rows);
  }
  // A prefetch's fill runs on the copy stream beside the compute stream's next ops (the next layer's
  // attention and router); the next resolution waits for it, since both touch the slots and the
  // cache's state. In a graph capture the copy stream joins the capture by the fork and leaves it by
  // that wait.
  void resolve_experts(const ExpertResolve& r) override {
    use();
    if (prefetch_pending_) {
      STRATA_CUDA_CHECK(cudaStreamWaitEvent(compute_, prefetch_done_, 0));
      prefetch_pending_ = false;
    }
    if (!r.prefetch || r.n == 0) {  // (a prefetch of nothing forks nothing: nothing to wait for)
      cuda::launch_resolve_experts(r, compute_, compute_, nullptr);
      return;
    }
    if (!prefetch_forked_) {
      STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&prefetch_forked_, cudaEventDisableTiming));
      STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&prefetch_done_, cudaEventDisableTiming));
    }
    cuda::launch_resolve_experts(r, compute_, copy_, prefetch_forked_);
    STRATA_CUDA_CHECK(cudaEventRecord(prefetch_done_, copy_));
    prefetch_pending_ = true;
  }
  void swiglu(float* g, const float* u, int64_t n) override {
    use();
    cuda::launch_swiglu(g, u, n, compute_);
  }
  void swiglu_q8_0(float* g, const float* u, int64_t n, int64_t F, uint8_t* out,
                   size_t out_row_bytes) override {
    use();
    cuda::launch_swiglu_q8_0(g, u, n, F, out, out_row_bytes, compute_);
  }
  void scatter_add(const float* y, const int32_t* rows, const float* w, int64_t K, int64_t n, int64_t D,
                   float* out) override {
    use();
    void* ws = scratch(cuda::scatter_add_scratch_bytes(n));
    cuda::launch_scatter_add(y, rows, w, K, n, D, out, ws, compute_);
  }
  void zero(void* p, size_t bytes) override { fill(p, 0, bytes); }
  void fill(void* p, uint8_t value, size_t bytes) override {
    if (bytes == 0) return;
    use();
    STRATA_CUDA_CHECK(cudaMemsetAsync(p, value, bytes, compute_));
  }

 private:
  // The runtime's current device is per host thread: every entry point makes it ours.
  void use() const { STRATA_CUDA_CHECK(cudaSetDevice(device_)); }
  cudaStream_t stream(Stream s) const { return s == Stream::Copy ? copy_ : compute_; }

  cudaEvent_t event(EventId e) {
    std::lock_guard<std::mutex> lock(events_mu_);
    STRATA_CHECK(e != 0 && e <= events_.size() && events_[e - 1] != nullptr, ConfigError,
                 "cuda backend: event ", e, " is not a live event of this backend");
    return events_[e - 1];
  }

  static void report(cudaError_t e, const char* call) {
    if (e == cudaSuccess) return;
    cudaGetLastError();
    log(LogLevel::Error, "cuda backend: ", call, " failed: ", cudaGetErrorString(e));
  }

  // Device scratch of the ops that need some (attention's decode partials, scatter_add's order),
  // used by one op at a time on the compute stream. It grows to the largest request and stays; it
  // is the backend's own, so live_allocations does not count it. Growing waits for the compute
  // stream, since queued kernels may still read the old buffer.
  void* scratch(size_t bytes) {
    if (bytes <= scratch_bytes_) return scratch_;
    STRATA_CHECK(!capturing_, Error, "internal error: an op needs ", bytes,
                 " bytes of scratch while a graph is recorded; reserve_scratch was not called for it");
    const size_t want = std::max(align_up(bytes, size_t{1} << 20), 2 * scratch_bytes_);
    STRATA_CUDA_CHECK(cudaStreamSynchronize(compute_));
    if (scratch_) STRATA_CUDA_CHECK(cudaFree(scratch_));
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    const cudaError_t e = cudaMalloc(&scratch_, want);
    if (e != cudaSuccess) {
      cudaGetLastError();
      scratch_ = nullptr;
      throw MemoryError(str("out of GPU memory: ", mib_str(want),
                            " of op scratch (attention partials, MoE "
                            "combine order) on ",
                            prop_.name, "; lower --expert-cache"));
    }
    scratch_bytes_ = want;
    return scratch_;
  }

  // Undoes the constructor, whatever part of it ran; logs instead of throwing.
  void release() {
    report(cudaSetDevice(device_), "cudaSetDevice");
    if (compute_) report(cudaStreamSynchronize(compute_), "cudaStreamSynchronize");
    if (copy_) report(cudaStreamSynchronize(copy_), "cudaStreamSynchronize");
    for (cudaEvent_t ev : events_)
      if (ev) report(cudaEventDestroy(ev), "cudaEventDestroy");
    events_.clear();
    for (cudaEvent_t* ev : {&prefetch_forked_, &prefetch_done_})
      if (*ev) report(cudaEventDestroy(*ev), "cudaEventDestroy");
    prefetch_forked_ = prefetch_done_ = nullptr;
    for (cudaGraphExec_t g : graphs_)
      if (g) report(cudaGraphExecDestroy(g), "cudaGraphExecDestroy");
    graphs_.clear();
    if (scratch_) report(cudaFree(scratch_), "cudaFree");
    scratch_ = nullptr;
    if (tickets_) report(cudaFree(tickets_), "cudaFree");
    tickets_ = nullptr;
    if (compute_) report(cudaStreamDestroy(compute_), "cudaStreamDestroy");
    if (copy_) report(cudaStreamDestroy(copy_), "cudaStreamDestroy");
    compute_ = copy_ = nullptr;
  }

  int device_;
  cudaDeviceProp prop_{};
  cudaStream_t compute_ = nullptr, copy_ = nullptr;
  // A prefetch's fill in flight on copy_ (resolve_experts): the next resolution waits for done.
  cudaEvent_t prefetch_forked_ = nullptr, prefetch_done_ = nullptr;
  bool prefetch_pending_ = false;
  std::atomic<size_t> live_{0};
  mutable std::mutex fixed_mu_;
  std::map<uintptr_t, uintptr_t> fixed_;  // resident buffers: start -> end
  std::mutex events_mu_;                  // the expert cache may create and query events from its own threads
  std::vector<cudaEvent_t> events_;       // nullptr: a free slot, listed in free_ids_
  std::vector<EventId> free_ids_;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  // Zeroed device words for the kernels whose last block finishes the op (route: word 0; decode
  // attention: one per kv head after it); each such launch leaves its words zeroed again, so graphs
  // replay them.
  // Tickets: [0] route, [1, 64) attention's, [kDeltaTicket0, + kDeltaTickets) the split delta rule's per-head
  // counters (qwen35.cu).
  static constexpr int64_t kDeltaTicket0 = 64, kDeltaTickets = 1024;
  static constexpr size_t kTicketBytes = (kDeltaTicket0 + kDeltaTickets) * sizeof(unsigned);
  unsigned* tickets_ = nullptr;
  std::vector<cudaGraphExec_t> graphs_;  // nullptr: destroyed
  bool capturing_ = false;
  cuda::PosSource pos_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device) { return std::make_unique<CudaBackend>(device); }

int cuda_device_count() {
  cudaError_t why = cudaSuccess;
  return device_count_or(&why);
}

std::string cuda_device_describe(int device) {
  require_device(device);
  int prev = 0;
  STRATA_CUDA_CHECK(cudaGetDevice(&prev));
  STRATA_CUDA_CHECK(cudaSetDevice(device));
  cudaDeviceProp p{};
  std::string s;
  try {
    STRATA_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    s = describe_current(p);
  } catch (...) {
    cudaSetDevice(prev);  // best effort on the way out of an error already being thrown
    throw;
  }
  STRATA_CUDA_CHECK(cudaSetDevice(prev));
  return s;
}

}  // namespace strata
