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
// An opaque handle of a recorded graph of work (see capture_begin); 0 is "no graph".
using GraphId = uint64_t;

// What the model is running: the kernels a matmul uses are chosen per phase, never by the number of
// tokens, so no logit depends on how a prompt was cut into chunks (invariant 4). Any: by the shape
// (the op tests; a backend with one kernel family ignores the phase).
enum class Phase { Any = 0, Prompt = 1, Decode = 2 };

// Where one layer's routed experts lie in device memory, for the ops that find them by id without
// the host: either every expert at a fixed stride from the layer's tensors (all resident), or in
// cache slots found through the slot table (-1: not resident). m = 0, 1, 2: gate, up, down.
struct ExpertTable {
  const uint8_t* base[3] = {nullptr, nullptr,
                            nullptr};  // resident: expert e's matrix m at base[m] + e * stride[m]
  size_t stride[3] = {0, 0, 0};
  const int32_t* slots = nullptr;  // cached: this layer's row of the slot table (E entries)
  const uint8_t* arena = nullptr;  // the first slot
  size_t slot_bytes = 0;
  size_t off[3] = {0, 0, 0};  // matrix m at arena + slot * slot_bytes + off[m]
  int64_t E = 0;
  // Write-through (a one-token decode step resolved on the device with ExpertResolve::write_through):
  // a slot s with pending[s] set has not received its expert's bytes yet. matmul_experts then reads
  // expert e's matrix m from src[m] + e * src_stride[m] (page-locked host memory the device reads) and
  // writes it into the slot as it multiplies: the miss crosses the link once, inside the product that
  // needs it, instead of in a fill before it. Null pending: every slot holds its bytes.
  const uint8_t* pending = nullptr;
  const uint8_t* src[3] = {nullptr, nullptr, nullptr};
  size_t src_stride[3] = {0, 0, 0};
  // An expert without a slot is computed elsewhere (on the host, from its source: a decode step's CPU
  // share): matmul_experts leaves its rows of Y as they are. False: such an expert is a caller's bug (the
  // CPU backend throws, a GPU writes NaN rows).
  bool leave_absent = false;
};
// The longest row (bytes) of an expert matrix that matmul_experts writes through (a GPU stages each such
// row in shared memory); the cache offers write-through for a layer only when every row fits.
constexpr size_t kWriteThroughRowBytes = 4096;
// The decode step's cache resolution on the device (design (b) of bench/NOTES.md): the state the
// host's ExpertCache keeps (slot table, slot -> key, LRU ticks) mirrored in device memory, and
// where each missing expert's bytes are in page-locked host memory the device reads directly.
struct ExpertResolve {
  int64_t layer = 0, E = 0, n_slots = 0;
  const int32_t* ids = nullptr;  // the experts ids[order[i]], i < n, in ascending id
  const int32_t* order = nullptr;
  int64_t n = 0;
  int32_t* table = nullptr;         // (layer * E + e) -> slot or -1, every layer
  int32_t* key = nullptr;           // slot -> layer * E + e or -1
  uint64_t* last = nullptr;         // slot -> LRU tick of its last use (0: empty)
  uint64_t* tick = nullptr;         // the LRU clock
  uint8_t* held = nullptr;          // slot -> held by this call; all zero between calls
  const uint8_t* pinned = nullptr;  // slot -> never a victim
  uint64_t* counters = nullptr;     // kResolveCounters: hits, misses, bytes streamed, evictions, failures,
                                    // prefetch fills, prefetch fills used, fills evicted unused, fill bytes
  int32_t* jobs = nullptr;          // scratch: the count, then (slot, expert) per miss; 1 + 2 n ints
  uint8_t* arena = nullptr;         // the first slot
  size_t slot_bytes = 0;
  // Expert e of the layer is segments m < 3 of bytes[m] at src[m] + e * src_stride[m] (device views
  // of page-locked host memory), each to offset off[m] of its slot; layer_bytes counted per miss.
  const uint8_t* src[3] = {nullptr, nullptr, nullptr};
  size_t src_stride[3] = {0, 0, 0}, bytes[3] = {0, 0, 0}, off[3] = {0, 0, 0};
  size_t layer_bytes = 0;
  // A prefetch (issue 18: the next layer's experts as its router predicts them from this layer's
  // state): a predicted expert already resident is left as it is (no tick, no count); a missing one
  // takes a victim as a miss does, is filled, stamped with the next tick and flagged in pref. Never a
  // failure: with no victim left, the prediction is dropped. The fill may run beside later work: on a
  // GPU it goes on the copy stream, and the next resolve_experts waits for it first.
  bool prefetch = false;
  uint8_t* pref = nullptr;  // slot -> filled by a prefetch and not used since (null: no accounting)
  // Write-through (not with prefetch): a miss is not filled here; its slot is marked in pending and the
  // layer's matmul_experts calls, through ExpertTable::pending, read its bytes from the source and write
  // them into the slot. Every resolution clears pending for the slots it finds resident (their bytes
  // landed in the earlier work) and for the slots it fills. pending may be null (no write-through).
  bool write_through = false;
  uint8_t* pending = nullptr;
  // A prefetch's budget: at most max_fills misses filled (0: every one); with `ranked` the experts are
  // walked as ids lists them (each token's top-K best first: the surest guesses fill first), not in
  // order's ascending-id order.
  int64_t max_fills = 0;
  bool ranked = false;
  // The scan policy's state (null pass: LRU, the smallest tick goes): slot -> the pass and the layer of
  // its last use, and scan_now = {the pass now, the layer the last call resolved}. A call (not a
  // prefetch) for a layer no later than that one begins a pass. Victims go in scan_key's order.
  uint64_t* pass = nullptr;
  int64_t* pass_layer = nullptr;
  uint64_t* scan_now = nullptr;
};
constexpr int kResolveCounters = 9;
// The plain sequential resolve_experts over memory the host reads (the CPU backend's, and the
// reference of the op tests); copy moves a miss's segments.
void resolve_experts_reference(const ExpertResolve& r, void (*copy)(void*, const void*, size_t));

// Expert e's matrix m through a table whose memory the caller can read (host memory: the CPU's),
// or null when the expert is not resident.
const uint8_t* expert_matrix(const ExpertTable& t, int m, int64_t e);

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
  // The phase the following ops belong to (see Phase).
  void set_phase(Phase p) { phase_ = p; }
  Phase phase() const { return phase_; }
  // Reserves, at load, the op scratch that attention over `ctx` positions and scatter_add over
  // `max_rows` rows need, so that no op allocates later (nor inside a graph capture).
  virtual void reserve_scratch(int64_t /*ctx*/, int64_t /*max_rows*/, int64_t /*n_head*/,
                               int64_t /*head_dim*/) {}

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
  // The address at which kernels read page-locked host memory (pinned or registered) directly, or
  // null where they cannot. The CPU: the memory itself.
  virtual const void* device_view(const void* host) const = 0;

  // ---- the link ----
  // Synchronous: returns when the bytes have arrived.
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
  virtual void download(void* dst, const void* src, size_t bytes) = 0;
  // Queued on `s` after the work already there; `src` (host) must stay unchanged until an event
  // recorded after it on `s` has completed. CPU: copies at once.
  virtual void upload_async(void* dst, const void* src, size_t bytes, Stream s) = 0;
  // A weight the device reads for the model's life: the CPU borrows the host bytes in place (they
  // must outlive the buffer), a GPU copies them into memory the returned buffer owns. Nothing may write
  // it afterwards: a GPU's kernels may read it before the kernel queued before them has finished.
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

  // ---- graphs: work recorded once and replayed without the host (CUDA graphs) ----
  // Whether this backend records graphs. Where it does not, the capture calls throw.
  virtual bool supports_graphs() const { return false; }
  // From capture_begin to capture_end the compute stream's work is recorded, not run: upload and
  // download then queue their copies without waiting, so their host side must be pinned memory that
  // stays put (the replay reads and writes it there), and nothing may wait on the host.
  virtual void capture_begin();
  // Ends the capture; the graph runs the recorded work when launched. On an exception between
  // begin and end, call capture_abort.
  virtual GraphId capture_end();
  virtual void capture_abort() {}
  // Queues the graph's work on the compute stream.
  virtual void graph_launch(GraphId g);
  virtual void graph_destroy(GraphId /*g*/) {}
  // While set, the ops that take a position (head_norm_rope, kv_store, attention) add the int32 at
  // `dev` (device memory, read when the op runs) to their pos0, and size their launches for
  // positions below `max_pos`: a recorded decode step then serves every position.
  virtual void set_position_source(const int32_t* dev, int64_t max_pos);
  // The position source set now (null: none); a pass that must choose its ops by position (DeepSeek V4's
  // compressor) leaves the choice to the device while it is set.
  virtual const int32_t* position_source() const { return nullptr; }

  // ---- ops; all pointers are device memory, all run on the compute stream ----
  // out[t, :] = dequantized row ids[t] of a [rows, D] table of ggml type `type`.
  virtual void embed(uint32_t type, const void* table, int64_t D, const int32_t* ids, int64_t T,
                     float* out) = 0;
  // grs[t] = 1 / sqrt(mean(x[t]^2) + eps) for x of T rows of D.
  virtual void rms_scale(const float* x, int64_t T, int64_t D, float eps, float* grs) = 0;
  // The GR read: out[i, :] = x[s, :] * grs[s] * w with s = rows ? rows[i] / div : i.
  virtual void apply_norm(const float* x, const float* grs, const float* w, int64_t D, const int32_t* rows,
                          int64_t div, int64_t n, float* out) = 0;
  // The GR read of T whole rows in one op: grs = rms_scale(x), then out = apply_norm(x, grs, w), bit
  // for bit those two (a backend may fuse them into one pass over x).
  virtual void rms_norm_read(const float* x, int64_t T, int64_t D, float eps, const float* w, float* grs,
                             float* out) {
    rms_scale(x, T, D, eps, grs);
    apply_norm(x, grs, w, D, nullptr, 1, T, out);
  }
  // The residual add and the next GR read as one op, bit for bit add(x, y, T * D) then
  // rms_norm_read(x, ..., out); out may be y (each element is read before it is written).
  virtual void add_rms_norm_read(float* x, const float* y, int64_t T, int64_t D, float eps, const float* w,
                                 float* grs, float* out) {
    add(x, y, T * D);
    rms_norm_read(x, T, D, eps, w, grs, out);
  }
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
  // src and src_row_bytes are multiples of the alignment the format's blocks are read at
  // (unit::block_align in quant/unit_decode.h: 4 for F32, 1 for MXFP4, else 2); a backend may refuse
  // others with a ConfigError.
  virtual void dequant_rows(uint32_t type, const void* src, size_t src_row_bytes, int64_t D, int64_t n,
                            float* out) = 0;
  // Device-to-device copy.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  // Y[t, r] = W[r, :] . X[t, :]; W has `rows` rows of `cols` elements of ggml type `type`.
  virtual void matmul(uint32_t type, const void* W, int64_t rows, int64_t cols, const float* X, int64_t ldx,
                      int64_t T, float* Y, int64_t ldy) = 0;
  // Several matmuls of one activation, bit for bit these calls: matmul(type, outs[i].W, outs[i].rows,
  // cols, X, ldx, T, outs[i].Y, outs[i].ldy) for i < n (a backend may run them as one launch).
  struct MatmulOut {
    const void* W;
    int64_t rows;
    float* Y;
    int64_t ldy;
  };
  virtual void matmul_n(uint32_t type, int64_t cols, const float* X, int64_t ldx, int64_t T,
                        const MatmulOut* outs, int n) {
    for (int i = 0; i < n; ++i)
      matmul(type, outs[i].W, outs[i].rows, cols, X, ldx, T, outs[i].Y, outs[i].ldy);
  }
  // n matmuls of one shape at fixed strides, bit for bit these calls: matmul(type, W + i * w_stride, rows,
  // cols, X + i * x_stride, ldx, T, Y + i * y_stride, ldy) for i < n (the per-head products of latent
  // attention; a backend may run them as one launch). w_stride is in bytes, the others in floats.
  virtual void matmul_strided(uint32_t type, const void* W, size_t w_stride, int64_t rows, int64_t cols,
                              const float* X, int64_t x_stride, int64_t ldx, int64_t T, float* Y,
                              int64_t y_stride, int64_t ldy, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      matmul(type, static_cast<const uint8_t*>(W) + i * w_stride, rows, cols, X + i * x_stride, ldx, T,
             Y + i * y_stride, ldy);
  }
  // In place per head: x = rmsnorm(x) * w (if w), then rotary embedding at positions pos0 + t.
  virtual void head_norm_rope(float* x, int64_t T, int64_t n_heads, int64_t head_dim, const float* w,
                              float eps, int64_t pos0, const RopeParams& rope) = 0;
  // The attention block's per-head steps of T tokens as one op, bit for bit these calls:
  // head_norm_rope of q (n_head heads, q_norm) and of k (n_kv_head heads, k_norm), then kv_store of the
  // rotated k into kc and of v into vc at pos0 (rows of n_kv_head * head_dim).
  virtual void qk_rope_store(float* q, float* k, const float* v, int64_t T, int64_t n_head, int64_t n_kv_head,
                             int64_t head_dim, const float* q_norm, const float* k_norm, float eps,
                             int64_t pos0, const RopeParams& rope, void* kc, void* vc, KvType t) {
    head_norm_rope(q, T, n_head, head_dim, q_norm, eps, pos0, rope);
    head_norm_rope(k, T, n_kv_head, head_dim, k_norm, eps, pos0, rope);
    kv_store(kc, t, pos0, T, n_kv_head * head_dim, k);
    kv_store(vc, t, pos0, T, n_kv_head * head_dim, v);
  }
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
  // The softmax router of T tokens as one op, bit for bit these calls: matmul(type, W, E, D, x, D, T,
  // logits, E), router_topk(logits, T, E, K, norm, ids, weights), group_by_expert(ids, T, K, E, off,
  // rows) (a backend may run them as one launch).
  virtual void route(uint32_t type, const void* W, int64_t E, int64_t D, const float* x, int64_t T, int64_t K,
                     bool norm, float* logits, int32_t* ids, float* weights, int32_t* off, int32_t* rows) {
    matmul(type, W, E, D, x, D, T, logits, E);
    router_topk(logits, T, E, K, norm, ids, weights);
    group_by_expert(ids, T, K, E, off, rows);
  }
  // The routed experts' matmul for one matrix m (0 gate, 1 up, 2 down) of every row at once:
  // Y[i, :] = W(ids[order[i]], m) . X[i, :] for i < n, each expert's matrix (rows x cols of `type`)
  // found through the table without the host. Per row the result equals matmul's on that expert's
  // matrix. An expert that is not resident is a caller error: the CPU throws, a GPU writes NaN rows.
  virtual void matmul_experts(uint32_t type, const ExpertTable& t, int m, int64_t rows, int64_t cols,
                              const int32_t* ids, const int32_t* order, int64_t n, const float* X,
                              int64_t ldx, float* Y, int64_t ldy) = 0;
  // As matmul_experts against q8_0 activation rows (xrow_bytes apart), per row equal to matmul_q8's;
  // only for weight types where uses_matmul_q8(type) holds.
  virtual void matmul_q8_experts(uint32_t type, const ExpertTable& t, int m, int64_t rows, int64_t cols,
                                 const int32_t* ids, const int32_t* order, int64_t n, const uint8_t* Xq,
                                 size_t xrow_bytes, float* Y, int64_t ldy) = 0;
  // matmul_q8_experts of two matrices m and m2 (the same type and shape) on the same rows as one op,
  // bit for bit the two calls (Y from m, Y2 from m2; a backend may run them as one launch).
  virtual void matmul_q8_experts_pair(uint32_t type, const ExpertTable& t, int m, int m2, int64_t rows,
                                      int64_t cols, const int32_t* ids, const int32_t* order, int64_t n,
                                      const uint8_t* Xq, size_t xrow_bytes, float* Y, float* Y2,
                                      int64_t ldy) {
    matmul_q8_experts(type, t, m, rows, cols, ids, order, n, Xq, xrow_bytes, Y, ldy);
    matmul_q8_experts(type, t, m2, rows, cols, ids, order, n, Xq, xrow_bytes, Y2, ldy);
  }
  // One run of rows that share an expert, for matmul_q8_runs: rows [row0, row0 + n) against W (and W2).
  struct ExpertRun {
    const void* W = nullptr;
    const void* W2 = nullptr;
    int64_t row0 = 0, n = 0;
  };
  // matmul_q8 of each run's rows against its own matrix (rows x cols of `type`, one type and shape for
  // all), as one op: bit for bit the calls matmul_q8(type, run.W, rows, cols, Xq + run.row0 * xrow_bytes,
  // xrow_bytes, run.n, Y + run.row0 * ldy, ldy), and with Y2 the same of run.W2 into Y2. The prompt's
  // experts: a backend may run every run of a layer in one launch instead of one launch an expert.
  virtual void matmul_q8_runs(uint32_t type, const ExpertRun* runs, int64_t n_runs, int64_t rows,
                              int64_t cols, const uint8_t* Xq, size_t xrow_bytes, float* Y, float* Y2,
                              int64_t ldy) {
    for (int64_t j = 0; j < n_runs; ++j) {
      const ExpertRun& r = runs[j];
      matmul_q8(type, r.W, rows, cols, Xq + r.row0 * xrow_bytes, xrow_bytes, r.n, Y + r.row0 * ldy, ldy);
      if (Y2)
        matmul_q8(type, r.W2, rows, cols, Xq + r.row0 * xrow_bytes, xrow_bytes, r.n, Y2 + r.row0 * ldy, ldy);
    }
  }
  // matmul_q8_runs with float activation rows: bit for bit the calls matmul(type, run.W, rows, cols,
  // X + run.row0 * ldx, ldx, run.n, Y + run.row0 * ldy, ldy) (and run.W2 into Y2 when Y2 is given).
  virtual void matmul_runs(uint32_t type, const ExpertRun* runs, int64_t n_runs, int64_t rows, int64_t cols,
                           const float* X, int64_t ldx, float* Y, float* Y2, int64_t ldy) {
    for (int64_t j = 0; j < n_runs; ++j) {
      const ExpertRun& r = runs[j];
      matmul(type, r.W, rows, cols, X + r.row0 * ldx, ldx, r.n, Y + r.row0 * ldy, ldy);
      if (Y2) matmul(type, r.W2, rows, cols, X + r.row0 * ldx, ldx, r.n, Y2 + r.row0 * ldy, ldy);
    }
  }
  // The expert cache's resolution of one layer's experts on the device, as ExpertCache::prepare
  // does it on the host, in the same order: per expert in ascending id, a hit takes the next LRU
  // tick; a miss takes the slot with the smallest tick among those neither pinned nor held by this
  // call (ties to the lower slot, so empty slots first), evicting its expert, and its bytes are
  // copied from the source into the slot (read by the device from page-locked host memory: no copy
  // engine, no host). Counters accumulate; failures counts experts that found no slot.
  virtual void resolve_experts(const ExpertResolve& r) = 0;
  // g[i] = silu(g[i]) * u[i]
  virtual void swiglu(float* g, const float* u, int64_t n) = 0;
  // SwiGLU of n rows of F and their q8_0 rows (out_row_bytes apart) as one op, bit for bit
  // swiglu(g, u, n * F) then quantize_q8_0(g, nullptr, nullptr, F, nullptr, 1, n, out, out_row_bytes).
  virtual void swiglu_q8_0(float* g, const float* u, int64_t n, int64_t F, uint8_t* out,
                           size_t out_row_bytes) {
    swiglu(g, u, n * F);
    quantize_q8_0(g, nullptr, nullptr, F, nullptr, 1, n, out, out_row_bytes);
  }
  // out[rows[i] / K, :] += w[rows[i]] * y[i, :] for i < n, in order of i.
  virtual void scatter_add(const float* y, const int32_t* rows, const float* w, int64_t K, int64_t n,
                           int64_t D, float* out) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  virtual void fill(void* p, uint8_t value, size_t bytes) = 0;

 private:
  Phase phase_ = Phase::Any;
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

// One recorded graph of a backend, destroyed with its owner.
class Graph {
 public:
  Graph() = default;
  Graph(Backend& be, GraphId id) : be_(&be), id_(id) {}
  ~Graph() { reset(); }
  Graph(Graph&& o) noexcept { *this = std::move(o); }
  Graph& operator=(Graph&& o) noexcept {
    if (this != &o) {
      reset();
      be_ = std::exchange(o.be_, nullptr);
      id_ = std::exchange(o.id_, 0);
    }
    return *this;
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  void reset() {
    if (id_) be_->graph_destroy(id_);
    id_ = 0;
  }
  explicit operator bool() const { return id_ != 0; }
  void launch() const { be_->graph_launch(id_); }

 private:
  Backend* be_ = nullptr;
  GraphId id_ = 0;
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
