// Model: a loaded GGUF on a backend: dense weights resident, experts behind the ExpertCache,
// KV cache and decode scratch allocated once, prompt scratch borrowed from the cache per chunk.
// The architecture's forward pass (model/arch.h) runs each chunk; this file owns memory and chunking.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "expert_cache/expert_cache.h"
#include "expert_cache/expert_source.h"
#include "gguf/gguf.h"
#include "model/arch.h"
#include "model/host_experts.h"
#include "model/kv_cache.h"
#include "model/plan.h"
#include "prefill/chunk_plan.h"
#include "prefill/prefill.h"

namespace strata {

// The expert cache a load asks for: --expert-cache auto (on the CPU every expert resident; on a GPU
// what is free, auto_cache), all (every expert resident, nothing streams) or a size in bytes.
enum class CacheKind { Auto, All, Size };

// A load's options: the only place their defaults live (strata._core.ModelConfig; Python's
// LOAD_DEFAULTS and the CLI's flags read theirs from it), checked once by check_config.
struct ModelConfig {
  std::string device = "auto";  // cpu | cuda | auto (CUDA when built with it and a GPU is present)
  int threads = 0;              // CPU threads; 0: every core
  int64_t ctx = 4096;           // KV cache length in tokens, divided among the seqs regions
  int64_t seqs = 1;  // KV sequence regions (llama.cpp's -np): sequences that decode together in one
                     // step, each in ctx / seqs positions of its own
  CacheKind cache = CacheKind::Auto;
  size_t cache_bytes = 0;                           // the size when cache is Size
  std::string source = "auto";                      // host | mmap | auto
  PrefillMode prefill_mode = PrefillMode::Default;  // see PrefillMode (prefill/chunk_plan.h)
  int64_t prefill = kPrefillDefault;                // tokens per chunk; Auto: the largest tried
  bool gr_unfused = false;              // STRATA_GR_UNFUSED=1 (read at the edge): carve xn, normalize into it
  std::string kv_type = "auto";         // f32 | f16 | auto (f16 where the backend keeps it, else f32)
  bool decode_graph = true;             // record a decode step as one graph where the host decides nothing in
                                        // it (a GPU, every expert resident or resolved on the device)
  std::string decode_resolve = "auto";  // a bounded cache's decode: "device" (resolve_experts), "host"
                                        // (prepare, one round trip a layer), auto: device where it can
  std::string cache_policy = "lru";     // the expert cache's eviction policy: lru | lfu (LFU with aging;
                                        // host resolution only)
  std::string moe_layout = "auto";      // the MoE scratch layout where a source streams the experts: auto
                                        // = mmq (q8_0 products, as every expert resident runs them; the
                                        // same logits as all resident) | fused (float expert products)
  bool prefetch = false;                // --prefetch on: each decode layer resolved on the device fills the
                                        // next layer's predicted experts beside its work (qwen3moe)
  int64_t prefetch_max = 0;             // --prefetch N: at most N of each token's guesses a layer, the
                                        // surest first (0: every guess that misses)
  bool prefetch_auto = true;            // --prefetch auto: the load decides prefetch and prefetch_max
                                        // (kAutoPrefetch where measured to win; off elsewhere)
  int cpu_experts = 0;                  // --cpu-experts N: at most N of a one-token decode step's missed
                                        // experts a layer computed on the host from the source beside the
                                        // link (moe_layout mmq, resolved on the host; the same logits)
  Progress progress;                    // long loads report here

  bool all_resident() const { return cache == CacheKind::All; }
  // Positions of one sequence region.
  int64_t seq_ctx() const { return ctx / seqs; }
};

// The largest --parallel (KV sequence regions) a load takes.
constexpr int64_t kMaxSeqs = 1024;
// The largest --prefetch N (guesses a token fills a layer).
constexpr int64_t kMaxPrefetch = 1024;
// --prefetch auto's budget where it turns prefetch on: deepseek4 decoding from a bounded cache resolved on a
// GPU (V4 Flash at 14,900 MiB on an H100: 22.99 -> 20.14 ms a token, 91% of the fills used; bench/NOTES.md,
// stop 41). The other architectures keep it off until a GPU has measured them.
constexpr int64_t kAutoPrefetch = 2;

// ConfigError naming the first option out of range, by the flag a user gives it.
void check_config(const ModelConfig& cfg);

struct ChunkStats {
  int64_t chunks = 0, chunk_tokens = 0, slots_borrowed = 0;
  uint64_t region_bytes = 0;
};

// The backend a config asks for ("cpu", "cuda", "auto": CUDA when built and a GPU is present, else
// the CPU): UnsupportedError naming why it is not available.
std::shared_ptr<Backend> make_backend(const std::string& device, int threads);

// What `--expert-cache auto` resolves to on a backend with `free_bytes` of device memory free.
struct AutoCache {
  bool all_resident = false;
  size_t cache_bytes = 0;
  size_t others = 0;   // dense weights + KV cache + decode scratch + logits, allocated beside the cache
  size_t reserve = 0;  // kept free for the driver, the CUDA context's growth and fragmentation
  std::string error;   // when nothing fits: what does (a smaller --ctx, --prefill or cache)
};
AutoCache auto_cache(const ModelPlan& plan, const ModelConfig& cfg, KvType kv, size_t free_bytes,
                     size_t total_bytes);

// What a load of `plan` with `cfg` on `be` takes, decided before anything is allocated: the KV type,
// the expert cache (auto resolved against the device's free memory) and the prompt chunk, or the
// error the load stops with. Model loads by it; `strata info --expert-cache` shows it.
struct LoadPlan {
  KvType kv = KvType::F32;
  size_t kv_bytes = 0;  // the KV cache of every sequence region, in the architecture's layout
  bool all_resident = false;
  size_t cache_bytes = 0;  // 0 when all resident
  int64_t slots = 0;       // slots of the cache (cache_bytes / slot_bytes)
  ChunkPlan chunk;         // the chunk and the slots it borrows (0 when all resident)
  std::string error;       // when the load would stop: MemoryError's message
};
LoadPlan plan_load(const ModelPlan& plan, const ModelConfig& cfg, Backend& be);

// The T a decode step of B rows carves its scratch for: B (1 alone), or B * K in the fused layout,
// whose expert buffers hold max(T, K) rows where a gathered step needs all B * K.
int64_t decode_scratch_tokens(const Prefill& pf, int64_t K, int64_t B, bool src);

class Model {
 public:
  // Loads the model of an opened file on `be` (made from cfg.device when null). A load that throws
  // leaves nothing allocated on the backend.
  Model(std::shared_ptr<gguf::File> file, const ModelConfig& cfg, std::shared_ptr<Backend> be = nullptr);
  Model(const std::string& path, const ModelConfig& cfg) : Model(gguf::File::open(path), cfg) {}
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelSpec& spec() const { return plan_.spec; }
  // As loaded: --expert-cache auto resolved (cache All or Size, with cache_bytes 0 when All).
  const ModelConfig& config() const { return cfg_; }
  const gguf::File& file() const { return *plan_.file; }
  const ModelPlan& plan() const { return plan_; }
  const Prefill& prefill() const { return plan_.prefill; }
  const ExpertLayout& expert_layout() const { return plan_.experts; }
  ExpertCache& cache() { return *cache_; }
  // Tokens per prompt chunk, as resolved at load (auto picks it from the cache size).
  int64_t chunk() const { return chunk_; }
  // Slots the prompt borrows for a chunk of T tokens (0 with an all-resident cache).
  int64_t slots_for(int64_t T) const;
  bool has_source() const { return src_ != nullptr; }
  const char* source_kind() const { return src_ ? source_kind_name(src_->kind()) : "none"; }
  // "host copy", "registered file", "mmap" or "none".
  const char* source_describe() const { return src_ ? src_->describe() : "none"; }
  Backend& backend() { return *be_; }
  const ChunkStats& chunk_stats() const { return chunk_stats_; }
  void reset_stats();
  // KV sequence regions, and the positions of each (ctx / seqs).
  int64_t seqs() const { return cfg_.seqs; }
  int64_t seq_ctx() const { return cfg_.seq_ctx(); }
  // Which generation's tokens KV region `seq` holds (opaque; null: none). A generation that finds
  // another owner recomputes its own before going on.
  const void* kv_owner(int64_t seq = 0) const { return kv_owner_.at((size_t)seq); }
  void set_kv_owner(const void* owner, int64_t seq = 0) { kv_owner_.at((size_t)seq) = owner; }
  // Called between the layers of every pass (model/arch.h): a caller watching a long call (progress,
  // Ctrl-C) sets it for the call's duration. A hook that throws stops the pass and leaves the model
  // usable; the KV cache from that pass's pos0 on is then stale.
  void set_layer_hook(LayerHook hook) { layer_hook_ = std::move(hook); }

  // Runs ids[0..n) at positions pos0.. through the model, in chunks of chunk() tokens, filling KV
  // region `seq`. Writes V logits per position into `logits` (host memory) when all_logits, else only
  // the last position's (none when logits is null).
  void forward(const int32_t* ids, int64_t n, int64_t pos0, float* logits, bool all_logits, int64_t seq = 0);
  // Whether the architecture runs several sequences in one pass (decode_batch, forward_rows).
  bool batch_supported() const { return forward_->batches(); }
  // The prompts of several KV regions in one pass (passes of up to chunk() rows): row i is token ids[i]
  // at position pos[i] of region seqs[i]; a region's rows are contiguous, in order, at consecutive
  // positions, the first where what the region holds ends (or before). Writes V logits for each row
  // that `pick` names (n_pick ascending row indices; host memory, n_pick x V). Each row's logits and KV
  // are those forward() gives it in its own region (each op is per row or per span of one region); the
  // experts of a layer are fetched once a pass for all its rows.
  void forward_rows(const int32_t* ids, const int64_t* pos, const int32_t* seqs, int64_t n,
                    const int32_t* pick, int64_t n_pick, float* logits);
  // One decode step of B sequences in one pass: row i is token ids[i] at position pos[i] of KV
  // region seqs[i] (B <= seqs(), the regions distinct); V logits per row into `logits` (host
  // memory, B x V). Each row's logits are those of forward(&ids[i], 1, pos[i], ., ., seqs[i]) alone:
  // every op is per row, the experts are gathered by expert for all rows (each resolved once a layer).
  void decode_batch(const int32_t* ids, const int64_t* pos, const int32_t* seqs, int64_t B, float* logits);
  // Whether decode steps replay one recorded graph (decode_graph on a backend with graphs and an
  // all-resident cache); true once the first step recorded it.
  bool decode_graph_active() const {
    for (const Graph& g : graphs_)
      if (g) return true;
    return !batch_graphs_.empty();
  }
  // How many batched decode steps replayed a recorded graph, and how many ran op by op (a first or
  // changed set of regions, a host-resolved step, or a backend without graphs).
  int64_t batch_steps_replayed() const { return batch_replayed_; }
  int64_t batch_steps_op_by_op() const { return batch_op_by_op_; }
  // "resident", "device" or "host": how the next decode step finds its experts.
  const char* decode_resolution() const;
  // Whether a one-token decode step resolved on the device writes its misses through (ExpertTable::pending)
  // in some layer: STRATA_WRITE_THROUGH on and a layer whose source allows it.
  bool decode_write_through() const;

 private:
  void decode(int32_t id, int64_t pos, float* logits, bool all_logits);
  // Whether a decode step of `rows` tokens resolves its experts on the device (design (b)).
  bool resolve_on_device(int64_t rows = 1) const;
  // How a decode step of `rows` tokens finds its experts: every one it may name needs a free slot to be
  // gathered (min(rows * K, E) distinct experts at most).
  ExpertPath decode_path(int64_t rows) const;
  void record_decode(const PrefillBuffers& b);
  // Launches a recorded decode step of `rows` rows, waits for it and counts its expert lookups.
  void replay(const Graph& g, int64_t rows);
  // Records the batched step of regions `seqs` (B of them, ascending) as a graph reading its ids and
  // positions from batch_io_ and writing its logits to batch_logits_.
  Graph record_batch(const PrefillBuffers& b, const std::vector<int32_t>& seqs);
  // A prompt pass of T rows on scratch carved from cache slots lent for it: run(scratch).
  void run_borrowed(int64_t T, const std::function<void(const PrefillBuffers&)>& run);
  // A prompt pass of T rows on the scratch that fits: own_region_ (all resident) or borrowed slots.
  void run_prompt_pass(int64_t T, const std::function<void(const PrefillBuffers&)>& run);
  void check_guards(const uint8_t* tail, size_t n, int64_t T);

  // Declared in destruction order reversed: the backend outlives everything allocated on it.
  ModelConfig cfg_;
  std::shared_ptr<Backend> be_;
  ModelPlan plan_;
  std::unique_ptr<ExpertSource> src_;
  std::unique_ptr<ExpertCache> cache_;
  std::unique_ptr<HostExperts> host_experts_;  // cpu_experts > 0: the decode step's CPU share
  std::unique_ptr<KVCache> kv_;
  DeviceBuffer decode_region_;  // layout(seqs, src): a decode step of up to seqs rows, allocated once
  DeviceBuffer own_region_;     // all-resident cache: the chunk region has no slots to borrow
  std::unique_ptr<ForwardPass> forward_;
  // The recorded decode step, one per KV region (the region's addresses are in it): its token id and
  // position are read from step_io_ (pinned: id, pos) and its logits land in step_logits_ (pinned),
  // where the replays find them.
  std::vector<Graph> graphs_;
  PinnedBuffer step_io_, step_logits_;
  DeviceBuffer step_pos_;  // the position the graph's ops add (Backend::set_position_source)
  // Recorded batched decode steps, one per set of regions (their KV addresses are in it; rows in
  // ascending region order), the least recently used dropped past kBatchGraphs. A set is recorded the
  // second step in a row it decodes (a continuous batch keeps its set for many steps; one that changes
  // every step would pay a recording a step). Ids and positions are read from batch_io_ (pinned: seqs
  // ids, then seqs positions, int32), copied to batch_pos_ for the ops; logits land in batch_logits_.
  struct BatchGraph {
    std::vector<int32_t> seqs;
    Graph graph;
    int64_t used = 0;
  };
  static constexpr size_t kBatchGraphs = 8;
  std::vector<BatchGraph> batch_graphs_;
  std::vector<int32_t> last_batch_;
  PinnedBuffer batch_io_, batch_logits_;
  DeviceBuffer batch_pos_;
  int64_t batch_replayed_ = 0, batch_op_by_op_ = 0;
  bool graph_failed_ = false;
  LayerHook layer_hook_;
  // The plan of the forward call running (the blocks read it through ForwardContext::step), and the
  // backend's phase set from it: the one place either is decided.
  StepPlan step_;
  void set_step(const StepPlan& p) {
    step_ = p;
    be_->set_phase(p.decode ? Phase::Decode : Phase::Prompt);
  }
  ChunkStats chunk_stats_;
  int64_t chunk_ = 0;
  std::vector<const void*> kv_owner_;  // per KV region
};

}  // namespace strata
