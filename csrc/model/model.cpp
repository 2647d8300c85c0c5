// Model: load, chunked prefill over a borrowed region, decode on resident scratch.
#include "model/model.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "core/thread_pool.h"
#include "expert_cache/policy.h"
#include "model/blocks.h"
#include "prefill/chunk_plan.h"
#if defined(STRATA_HAVE_CUDA)
#include "backend/cuda/cuda_backend.h"
#endif

namespace strata {

namespace {

// The host copy is the default when the experts fit in the memory available now with a margin
// (a tenth of RAM, at least 2 GiB) for the rest of the process and the system; else mmap.
bool host_fits(uint64_t expert_bytes) {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return false;
  uint64_t total_kb = 0, avail_kb = 0;
  char key[64];
  unsigned long long v;
  while (std::fscanf(f, "%63s %llu kB", key, &v) == 2) {
    if (!std::strcmp(key, "MemTotal:")) total_kb = v;
    if (!std::strcmp(key, "MemAvailable:")) avail_kb = v;
  }
  std::fclose(f);
  const uint64_t margin = std::max<uint64_t>(total_kb * 1024 / 10, 2ull << 30);
  return avail_kb * 1024 > expert_bytes + margin;
}

std::shared_ptr<Backend> backend_for(const ModelConfig& cfg, std::shared_ptr<Backend> be) {
  return be ? std::move(be) : make_backend(cfg.device, cfg.threads);
}

const ModelConfig& checked(const ModelConfig& cfg) {
  check_config(cfg);
  return cfg;
}

void check_device(const std::string& device, int threads) {
  STRATA_CHECK(threads >= 0, ConfigError, "threads (-t/--threads) must be >= 0 (0: every core), got ",
               threads);
  STRATA_CHECK(device == "cpu" || device == "cuda" || device == "auto", ConfigError,
               "device (--device) must be cpu, cuda or auto, got '", device, "'");
}

bool one_of(const std::string& v, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (v == n) return true;
  return false;
}

}  // namespace

void check_config(const ModelConfig& c) {
  check_device(c.device, c.threads);
  STRATA_CHECK(c.ctx >= 1, ConfigError, "ctx (-c/--ctx) must be at least 1 token (KV cache length), got ",
               c.ctx);
  STRATA_CHECK(c.seqs >= 1 && c.seqs <= kMaxSeqs, ConfigError, "seqs (--parallel) must be in [1, ", kMaxSeqs,
               "] (sequences decoding together, each in its own KV region), got ", c.seqs);
  STRATA_CHECK(
      c.ctx >= c.seqs, ConfigError, "ctx (-c/--ctx) ", c.ctx, " is divided among ", c.seqs,
      " sequences (--parallel) and leaves less than one position each; raise ctx or lower --parallel");
  STRATA_CHECK(c.cache != CacheKind::Size || c.cache_bytes > 0, ConfigError,
               "--expert-cache must be positive: a size, all or auto");
  STRATA_CHECK(c.prefill >= 1, ConfigError, "--prefill must be at least 1 token, got ", c.prefill);
  STRATA_CHECK(!c.prefetch_auto || (!c.prefetch && c.prefetch_max == 0), ConfigError,
               "--prefetch auto decides the prefetch at load: give prefetch on or N without auto");
  STRATA_CHECK(c.prefetch_max >= 0 && c.prefetch_max <= kMaxPrefetch && (c.prefetch || c.prefetch_max == 0),
               ConfigError, "--prefetch N takes N from 1 to ", kMaxPrefetch,
               " (the guesses a token fills a layer, the surest first), got ", c.prefetch_max);
  STRATA_CHECK(one_of(c.source, {"auto", "host", "mmap"}), ConfigError,
               "source (--source) must be host, mmap or auto, got '", c.source, "'");
  STRATA_CHECK(one_of(c.kv_type, {"auto", "f16", "f32"}), ConfigError,
               "kv_type (--kv-type) must be auto, f16 or f32, got '", c.kv_type, "'");
  STRATA_CHECK(one_of(c.decode_resolve, {"auto", "device", "host"}), ConfigError,
               "decode_resolve must be auto, device or host, got '", c.decode_resolve, "'");
  STRATA_CHECK(one_of(c.moe_layout, {"auto", "mmq", "fused"}), ConfigError,
               "moe_layout must be auto, mmq or fused, got '", c.moe_layout, "'");
  STRATA_CHECK(one_of(c.cache_policy, {"lru", "lfu", "scan"}), ConfigError, "--cache-policy must be one of ",
               cache_policy_names(), ", got '", c.cache_policy, "'");
  // A prefetch fills layer l + 1's experts before its pass reaches it, which the scan policy's ranks
  // (by the pass and layer of each slot's use) do not place.
  STRATA_CHECK(c.cache_policy != "scan" || !c.prefetch, ConfigError,
               "--prefetch on fills the next layer's experts ahead of their layer, which --cache-policy scan "
               "does not rank: use --prefetch off with scan, or --cache-policy lru");
  STRATA_CHECK(c.decode_resolve != "device" || c.cache_policy != "lfu", ConfigError,
               "decode_resolve 'device' runs the LRU or scan policy on the device; --cache-policy lfu "
               "resolves a decode step's experts on the host (decode_resolve 'host' or 'auto')");
  STRATA_CHECK(
      !c.prefetch || (c.cache_policy == "lru" && c.decode_resolve != "host"), ConfigError,
      "--prefetch on fills the next layer's experts from a decode step resolved on the device: it needs "
      "--cache-policy lru and decode_resolve 'auto' or 'device'");
  STRATA_CHECK(c.cpu_experts >= 0 && c.cpu_experts <= 64, ConfigError,
               "cpu_experts (--cpu-experts) must be 0 (off) to 64, got ", c.cpu_experts);
  if (c.cpu_experts > 0) {
    STRATA_CHECK(c.decode_resolve != "device", ConfigError,
                 "--cpu-experts computes missed experts on the host, which resolves the step's experts: use "
                 "decode_resolve 'host' or 'auto' with it");
    STRATA_CHECK(
        !c.prefetch || c.prefetch_auto, ConfigError,
        "--prefetch on fills experts from a step resolved on the device; --cpu-experts resolves on the "
        "host: use one or the other");
    STRATA_CHECK(
        c.moe_layout != "fused", ConfigError,
        "--cpu-experts needs the MMQ layout (moe_layout 'auto' or 'mmq'): the host computes an expert "
        "with the q8_0 products' bits, which moe_layout 'fused' does not run");
  }
}

std::shared_ptr<Backend> make_backend(const std::string& device, int threads) {
  check_device(device, threads);
#if defined(STRATA_HAVE_CUDA)
  if (device == "cuda" || (device == "auto" && cuda_device_count() > 0)) return make_cuda_backend(0);
#else
  STRATA_CHECK(
      device != "cuda", UnsupportedError,
      "device 'cuda': this strata was built without the CUDA backend (no nvcc at install time); "
      "reinstall with the CUDA toolkit present (STRATA_CUDA=ON pip install strata) or use --device cpu");
#endif
  return make_cpu_backend(threads > 0 ? threads : ThreadPool::default_threads());
}

AutoCache auto_cache(const ModelPlan& plan, const ModelConfig& cfg, KvType kv, size_t free_bytes,
                     size_t total_bytes) {
  const ModelSpec& s = plan.spec;
  AutoCache a;
  a.reserve = std::max<size_t>(size_t(512) << 20, total_bytes / 32);
  const int64_t chunk = std::min(cfg.prefill, cfg.ctx);
  a.others = s.dense_bytes + KVCache::bytes(kv, s, cfg.seq_ctx(), cfg.seqs) +
             plan.prefill.bytes_needed(decode_scratch_tokens(plan.prefill, s.K, cfg.seqs, true), true) +
             (size_t)kHeadRows * s.V * sizeof(float);
  const size_t avail = free_bytes > a.others + a.reserve ? free_bytes - a.others - a.reserve : 0;
  // Every expert resident, plus the prompt scratch that then has no slots to borrow.
  if (avail >= plan.experts.total_bytes() + plan.prefill.bytes_needed(chunk, false)) {
    a.all_resident = true;
    return a;
  }
  a.cache_bytes = avail / plan.experts.slot_bytes * plan.experts.slot_bytes;
  const ChunkPlan c =
      plan_chunk(plan.prefill, plan.experts.slot_bytes, (int64_t)(a.cache_bytes / plan.experts.slot_bytes),
                 a.cache_bytes, chunk, cfg.prefill_mode);
  if (!c.fits) {
    a.error = str("--expert-cache auto: ", mib_str(free_bytes),
                  " free on the device; the dense weights, KV cache (--ctx ", cfg.ctx, ") and scratch take ",
                  mib_str(a.others), " and ", mib_str(a.reserve), " stay in reserve, leaving ",
                  mib_str(a.cache_bytes), " for the expert cache, which is too small: ", c.error,
                  "; or lower --ctx");
  }
  return a;
}

LoadPlan plan_load(const ModelPlan& plan, const ModelConfig& cfg, Backend& be) {
  check_config(cfg);
  LoadPlan lp;
  lp.kv = cfg.kv_type == "f32"          ? KvType::F32
          : cfg.kv_type == "f16"        ? KvType::F16
          : be.supports_kv(KvType::F16) ? KvType::F16
                                        : KvType::F32;
  STRATA_CHECK(be.supports_kv(lp.kv), UnsupportedError, "the ", be.name(), " backend has no ",
               kv_type_name(lp.kv), " KV cache; use --kv-type f32");
  lp.kv_bytes = KVCache::bytes(lp.kv, plan.spec, cfg.seq_ctx(), cfg.seqs);
  const int64_t T = std::min(cfg.prefill, cfg.ctx);  // a chunk is never longer than the context
  lp.all_resident = cfg.cache == CacheKind::All;
  lp.cache_bytes = cfg.cache == CacheKind::Size ? cfg.cache_bytes : 0;
  if (cfg.cache == CacheKind::Auto) {
    // On the CPU every expert is read where it lies; on a GPU the cache takes what is free.
    if (be.host_is_device()) {
      lp.all_resident = true;
    } else {
      size_t free_b = 0, total_b = 0;
      be.memory_info(&free_b, &total_b);
      const AutoCache a = auto_cache(plan, cfg, lp.kv, free_b, total_b);
      lp.error = a.error;
      lp.all_resident = a.all_resident;
      lp.cache_bytes = a.cache_bytes;
    }
  }
  if (lp.all_resident) {
    lp.cache_bytes = 0;
    lp.chunk.chunk = T;
    lp.chunk.fits = lp.error.empty();
    return lp;
  }
  const size_t slot = plan.experts.slot_bytes;
  lp.slots = (int64_t)(lp.cache_bytes / slot);
  lp.chunk = plan_chunk(plan.prefill, slot, lp.slots, lp.cache_bytes, T, cfg.prefill_mode);
  if (lp.error.empty() && !lp.chunk.fits) lp.error = lp.chunk.error;
  return lp;
}

Model::Model(std::shared_ptr<gguf::File> file, const ModelConfig& cfg, std::shared_ptr<Backend> be)
    : cfg_(checked(cfg)),
      be_(backend_for(cfg, std::move(be))),
      plan_(ModelPlan::read(std::move(file), cfg.gr_unfused, cfg.moe_layout == "fused")) {
  const ModelSpec& s = plan_.spec;
  const Prefill& pf = plan_.prefill;
  const Architecture& arch = find_architecture(s.arch, plan_.file->path());
  if (arch.check_backend) arch.check_backend(*be_, plan_.file->path());
  const ExpertLayout& xl = plan_.experts;

  const LoadPlan lp = plan_load(plan_, cfg_, *be_);
  if (!lp.error.empty()) throw MemoryError(lp.error);
  cfg_.cache = lp.all_resident ? CacheKind::All : CacheKind::Size;  // as loaded: auto resolved
  cfg_.cache_bytes = lp.cache_bytes;
  if (!lp.all_resident) {
    std::string kind = cfg_.source;
    // What "host" costs in RAM: on a GPU the file's mapping is registered (page-locked), which takes
    // only its pages not in RAM yet (a file in /dev/shm or in the page cache costs nothing more); on
    // the CPU, or where registering fails, "host" is a copy of the experts.
    const uint64_t copy = xl.total_bytes();
    if (kind == "auto") {
      const uint64_t size = plan_.file->file_size();
      kind = host_fits(be_->host_is_device() ? copy : size - resident_bytes(plan_.file->base(), size))
                 ? "host"
                 : "mmap";
    }
    if (kind == "host") {
      // A GPU reads the experts straight from the page-locked mapping of the file when it can
      // register it: no second copy of them in RAM. Else one pinned copy, or (auto, when the copy
      // would not fit) the mapped file.
      if (!be_->host_is_device())
        src_ = make_registered_source(xl, *be_, plan_.file->base(), plan_.file->file_size());
      if (!src_ && cfg_.source == "auto" && !be_->host_is_device() && !host_fits(copy))
        src_ = make_mmap_source(xl);
      if (!src_) src_ = make_host_source(xl, *be_, cfg_.progress);
    } else {
      src_ = make_mmap_source(xl);
    }
  }
  const std::string& arch_name = plan_.spec.arch;
  STRATA_CHECK(
      !cfg_.prefetch || arch_name == "qwen3moe" || arch_name == "deepseek2" || arch_name == "deepseek4",
      UnsupportedError, "--prefetch on: the ", arch_name,
      " architecture does not predict its next layer's experts (qwen3moe, deepseek2 and deepseek4 do)");
  cache_ = std::make_unique<ExpertCache>(*be_, xl, src_.get(), cfg_.cache_bytes, cfg_.cache_policy);
  if (cfg_.cpu_experts > 0) {
    STRATA_CHECK(arch_name == "qwen3moe" || arch_name == "deepseek2" || arch_name == "qwen35moe",
                 UnsupportedError, "--cpu-experts: the ", arch_name,
                 " architecture's experts have their own activation, which the host does not compute yet "
                 "(qwen3moe, deepseek2 and qwen35moe's plain SwiGLU experts it does)");
    for (int64_t l = 0; l < xl.L; ++l)
      if (const char* why = HostExperts::unsupported(xl.layers[l]))
        STRATA_CHECK(false, UnsupportedError, "--cpu-experts: layer ", l, " of ", plan_.file->path(), " has ",
                     why, "; run without it");
    host_experts_ =
        std::make_unique<HostExperts>(cfg_.threads > 0 ? cfg_.threads : ThreadPool::default_threads());
  }
  if (cfg_.prefetch_auto) {
    // --prefetch auto: kAutoPrefetch where it was measured to win (deepseek4, a bounded cache on a GPU
    // resolved there), else off. The load's config says which (Model.config).
    const bool on = arch_name == "deepseek4" && !be_->host_is_device() && !cache_->all_resident() &&
                    cache_->can_resolve_on_device() && cfg_.cache_policy == "lru" &&
                    cfg_.decode_resolve != "host" && cfg_.cpu_experts == 0;
    cfg_.prefetch = on;
    cfg_.prefetch_max = on ? kAutoPrefetch : 0;
    cfg_.prefetch_auto = false;
  }
  STRATA_CHECK(cfg_.decode_resolve != "device" || cache_->all_resident() || cache_->can_resolve_on_device(),
               UnsupportedError, "decode_resolve 'device': the ", be_->name(),
               " backend cannot read this expert source (", src_ ? src_->describe() : "none",
               ") from its kernels; use decode_resolve 'host' or 'auto', or --source host");
  kv_ = std::make_unique<KVCache>(*be_, lp.kv, s, cfg_.seq_ctx(), cfg_.seqs);
  kv_owner_.assign((size_t)cfg_.seqs, nullptr);
  graphs_.resize((size_t)cfg_.seqs);
  decode_region_ = DeviceBuffer(
      *be_, pf.bytes_needed(decode_scratch_tokens(pf, s.K, cfg_.seqs, has_source()), has_source()),
      "the decode scratch (lower --parallel)");

  chunk_ = lp.chunk.chunk;
  if (cache_->all_resident())
    own_region_ = DeviceBuffer(*be_, pf.bytes_needed(chunk_, false), "the prompt scratch (lower --prefill)");
  // Op scratch for the largest chunk (or decode step of seqs rows) and context, now: no op allocates
  // later (nor inside a graph).
  be_->reserve_scratch(cfg_.ctx, std::max(chunk_, cfg_.seqs) * s.K, s.n_head, s.head_dim);
  forward_ = arch.make_forward(
      ForwardContext{*be_, s, xl, *cache_, *kv_, &layer_hook_, &step_, host_experts_.get()});

  log(LogLevel::Info, plan_.file->path(), ": ", s.arch, " L=", s.L, " D=", s.D, " E=", s.E, " K=", s.K,
      " F=", s.F, " V=", s.V, "; dense ", mib_str(s.dense_bytes), ", experts ", mib_str(s.expert_bytes),
      " (slot ", xl.slot_bytes, " bytes)");
  log(LogLevel::Info, "backend ", be_->describe(), ", ctx=", cfg_.ctx,
      cfg_.seqs > 1 ? str(" (", cfg_.seqs, " sequences of ", cfg_.seq_ctx(), ")") : std::string(), " KV ",
      mib_str(kv_->total_bytes()), "; expert cache ",
      cache_->all_resident() ? std::string("all resident")
                             : str(cache_->n_slots(), " slots (", cfg_.cache_policy, ")"),
      ", source ", source_kind(), "; prompt chunk ", chunk_, " tokens (",
      moe_layout_name(pf.fused_layout(chunk_, has_source())), " layout",
      cache_->all_resident() ? "" : str(", borrows ", slots_for(chunk_), " slots").c_str(), ")");
}

int64_t Model::slots_for(int64_t T) const {
  if (cache_->all_resident()) return 0;
  return region_slots(plan_.prefill, T, plan_.experts.slot_bytes);
}

void Model::reset_stats() {
  cache_->reset_stats();
  chunk_stats_ = ChunkStats{};
}

namespace {
std::string ctx_limit(const ModelConfig& c) {
  return c.seqs == 1 ? str("ctx=", c.ctx, "; load the model with a larger ctx")
                     : str("a sequence's ", c.seq_ctx(), " positions (ctx=", c.ctx, " over ", c.seqs,
                           " sequences); load the model with a larger ctx or fewer sequences (--parallel)");
}
}  // namespace

int64_t decode_scratch_tokens(const Prefill& pf, int64_t K, int64_t B, bool src) {
  // The fused layout holds max(T, K) expert rows, a gathered decode step needs every row's K: B * K.
  if (B == 1) return 1;
  return pf.fused_layout(B, src) == MoeLayout::Fused ? B * K : B;
}

void Model::forward(const int32_t* ids, int64_t n, int64_t pos0, float* logits, bool all_logits,
                    int64_t seq) {
  const ModelSpec& s = plan_.spec;
  STRATA_CHECK(n >= 1, ConfigError, "forward needs at least one token");
  STRATA_CHECK(seq >= 0 && seq < cfg_.seqs, ConfigError, "sequence ", seq, " is not one of the model's ",
               cfg_.seqs, " KV regions (seqs / --parallel)");
  STRATA_CHECK(pos0 >= 0 && pos0 + n <= seq_ctx(), ConfigError, "context full: ", pos0 + n, " tokens exceed ",
               ctx_limit(cfg_));
  for (int64_t i = 0; i < n; ++i)
    STRATA_CHECK(ids[i] >= 0 && ids[i] < s.V, ConfigError, "token id ", ids[i], " out of range [0, ", s.V,
                 ")");
  kv_->select(seq);
  if (n == 1) {
    decode(ids[0], pos0, logits, all_logits);
    return;
  }
  set_step(StepPlan{false, ExpertPath::PerExpert});
  cache_->to_host();
  for (int64_t i = 0; i < n; i += chunk_) {
    const int64_t T = std::min(chunk_, n - i);
    const bool last = i + T == n;
    float* lg = all_logits ? logits + i * s.V : (last ? logits : nullptr);
    run_prompt_pass(
        T, [&](const PrefillBuffers& b) { forward_->run_chunk(b, ids + i, T, pos0 + i, lg, all_logits); });
  }
}

void Model::forward_rows(const int32_t* ids, const int64_t* pos, const int32_t* seqs, int64_t n,
                         const int32_t* pick, int64_t n_pick, float* logits) {
  const ModelSpec& s = plan_.spec;
  STRATA_CHECK(n >= 1, ConfigError, "forward_rows needs at least one row");
  STRATA_CHECK(n_pick >= 0 && n_pick <= n && (n_pick == 0 || (pick && logits)), ConfigError,
               "forward_rows: ", n_pick, " logit rows picked of ", n);
  std::vector<int64_t> last((size_t)cfg_.seqs, -1);  // each region's last row so far
  for (int64_t i = 0; i < n; ++i) {
    STRATA_CHECK(seqs[i] >= 0 && seqs[i] < cfg_.seqs, ConfigError, "row ", i, ": sequence ", seqs[i],
                 " is not one of the model's ", cfg_.seqs, " KV regions (seqs / --parallel)");
    STRATA_CHECK(pos[i] >= 0 && pos[i] < seq_ctx(), ConfigError, "context full: position ", pos[i],
                 " of sequence ", seqs[i], " exceeds ", ctx_limit(cfg_));
    STRATA_CHECK(ids[i] >= 0 && ids[i] < s.V, ConfigError, "token id ", ids[i], " out of range [0, ", s.V,
                 ")");
    const int64_t prev = last[(size_t)seqs[i]];
    STRATA_CHECK(prev < 0 || (prev == i - 1 && pos[prev] + 1 == pos[i]), ConfigError, "row ", i,
                 ": the rows of sequence ", seqs[i], " must be contiguous, at consecutive positions");
    last[(size_t)seqs[i]] = i;
  }
  for (int64_t k = 0; k < n_pick; ++k)
    STRATA_CHECK(pick[k] >= 0 && pick[k] < n && (k == 0 || pick[k] > pick[k - 1]), ConfigError,
                 "forward_rows: the picked rows must be ascending row indices below ", n);
  // One region: a chunked prompt, as forward() runs it.
  if (seqs[n - 1] == seqs[0] && (n_pick == 0 || (n_pick == 1 && pick[0] == n - 1))) {
    forward(ids, n, pos[0], n_pick ? logits : nullptr, false, seqs[0]);
    return;
  }
  STRATA_CHECK(forward_->batches(), UnsupportedError, plan_.file->path(), ": the ", s.arch,
               " architecture runs one sequence a pass in strata; run its prompts one at a time");
  set_step(StepPlan{false, ExpertPath::PerExpert});
  cache_->to_host();
  int64_t k = 0;  // the picks done
  for (int64_t i = 0; i < n; i += chunk_) {
    const int64_t T = std::min(chunk_, n - i);
    std::vector<int32_t> local;
    float* lg = logits ? logits + k * s.V : nullptr;
    for (; k < n_pick && pick[k] < i + T; ++k) local.push_back((int32_t)(pick[k] - i));
    const SeqRows rows{pos + i, seqs + i, local.empty() ? nullptr : local.data(), (int64_t)local.size()};
    // No logits wanted (null): the pass stops after the last layer.
    run_prompt_pass(T, [&](const PrefillBuffers& b) {
      forward_->run_rows(b, ids + i, rows, T, local.empty() ? nullptr : lg);
    });
  }
}

void Model::run_prompt_pass(int64_t T, const std::function<void(const PrefillBuffers&)>& run) {
  if (cache_->all_resident())
    run(plan_.prefill.carve(own_region_.get(), own_region_.size(), T, false));
  else
    run_borrowed(T, run);
  chunk_stats_.chunks++;
  chunk_stats_.chunk_tokens = std::max(chunk_stats_.chunk_tokens, T);
}

namespace {
// The distinct experts a decode step of `rows` tokens may name in one layer.
int64_t step_experts(const ModelSpec& s, int64_t rows) { return std::min(rows * s.K, s.E); }
}  // namespace

bool Model::resolve_on_device(int64_t rows) const {
  return !cache_->all_resident() && cfg_.decode_resolve != "host" && cfg_.cpu_experts == 0 &&
         cache_->can_resolve_on_device() && cache_->free_slots() >= step_experts(plan_.spec, rows);
}

ExpertPath Model::decode_path(int64_t rows) const {
  return cache_->all_resident()                                   ? ExpertPath::Resident
         : resolve_on_device(rows)                                ? ExpertPath::Device
         : cache_->free_slots() >= step_experts(plan_.spec, rows) ? ExpertPath::Host
                                                                  : ExpertPath::PerExpert;
}

const char* Model::decode_resolution() const {
  return cache_->all_resident() ? "resident" : resolve_on_device() ? "device" : "host";
}

bool Model::decode_write_through() const {
  if (cache_->all_resident() || !resolve_on_device() || !write_through_on()) return false;
  for (int64_t l = 0; l < plan_.experts.L; ++l)
    if (cache_->write_through(l)) return true;
  return false;
}

void Model::decode(int32_t id, int64_t pos, float* logits, bool all_logits) {
  const Prefill& pf = plan_.prefill;
  const PrefillBuffers b = pf.carve(decode_region_.get(), decode_region_.size(), 1, has_source());
  // The step's one decision: how its tokens find their experts (moe_block reads it, the backend
  // gets its phase from it).
  const ExpertPath path = decode_path(1);
  const bool on_device = path == ExpertPath::Device;
  set_step(StepPlan{true, path, cfg_.prefetch && on_device, cfg_.prefetch_max, cfg_.cpu_experts});
  if (on_device)
    cache_->to_device();
  else
    cache_->to_host();
  // A graph reads nothing the host decides per step but the token and position it finds in step_io_:
  // the decode MoE must find its experts on the device: every expert resident, or resolved there.
  const bool graphable =
      (path == ExpertPath::Resident || path == ExpertPath::Device) && forward_->graphable();
  if (!graphable) {
    forward_->run_chunk(b, &id, 1, pos, logits, all_logits);
    return;
  }
  Graph& graph = graphs_[(size_t)kv_->selected()];
  if (!graph && !graph_failed_ && cfg_.decode_graph && be_->supports_graphs()) {
    try {
      record_decode(b);
    } catch (const Interrupted&) {
      throw;
    } catch (const std::exception& e) {
      // The step still runs, op by op: said once, not hidden.
      graph_failed_ = true;
      log(LogLevel::Warn, "decode: recording the step as one graph failed (", e.what(),
          "); decoding op by op, which is slower");
    }
  }
  if (!graph) {
    forward_->run_chunk(b, &id, 1, pos, logits, all_logits);
    cache_->read_device_counters();
    return;
  }
  auto* io = reinterpret_cast<int32_t*>(step_io_.get());
  io[0] = id;
  io[1] = (int32_t)pos;
  forward_->before_replay(kv_->selected(), pos);
  replay(graph, 1);
  forward_->after_replay(kv_->selected(), pos);
  if (logits) std::memcpy(logits, step_logits_.get(), (size_t)plan_.spec.V * sizeof(float));
}

void Model::decode_batch(const int32_t* ids, const int64_t* pos, const int32_t* seqs, int64_t B,
                         float* logits) {
  const ModelSpec& s = plan_.spec;
  STRATA_CHECK(B >= 1 && B <= cfg_.seqs, ConfigError, "a decode step of ", B, " sequences: the model has ",
               cfg_.seqs, " KV regions (load it with seqs / --parallel >= ", std::max<int64_t>(B, 1), ")");
  std::vector<uint8_t> seen((size_t)cfg_.seqs, 0);
  for (int64_t i = 0; i < B; ++i) {
    STRATA_CHECK(seqs[i] >= 0 && seqs[i] < cfg_.seqs, ConfigError, "decode step row ", i, ": sequence ",
                 seqs[i], " is not one of the model's ", cfg_.seqs, " KV regions");
    STRATA_CHECK(!seen[(size_t)seqs[i]], ConfigError, "decode step row ", i, ": sequence ", seqs[i],
                 " appears twice; a step advances each sequence by one token");
    seen[(size_t)seqs[i]] = 1;
    STRATA_CHECK(pos[i] >= 0 && pos[i] < seq_ctx(), ConfigError, "context full: position ", pos[i],
                 " of sequence ", seqs[i], " exceeds ", ctx_limit(cfg_));
    STRATA_CHECK(ids[i] >= 0 && ids[i] < s.V, ConfigError, "token id ", ids[i], " out of range [0, ", s.V,
                 ")");
  }
  if (B == 1) {
    forward(ids, 1, pos[0], logits, false, seqs[0]);
    return;
  }
  STRATA_CHECK(forward_->batches(), UnsupportedError, plan_.file->path(), ": the ", s.arch,
               " architecture decodes one sequence a pass in strata; advance its sequences one at a time "
               "(--parallel 1, or a model whose architecture batches)");
  const Prefill& pf = plan_.prefill;
  const int64_t T = decode_scratch_tokens(pf, s.K, B, has_source());
  const PrefillBuffers b = pf.carve(decode_region_.get(), decode_region_.size(), T, has_source());
  const ExpertPath path = decode_path(B);
  set_step(StepPlan{true, path, cfg_.prefetch && path == ExpertPath::Device, cfg_.prefetch_max});
  if (path == ExpertPath::Device)
    cache_->to_device();
  else
    cache_->to_host();
  // As decode's: a graph reads nothing the host decides per step but the rows' ids and positions.
  const bool graphable = (path == ExpertPath::Resident || path == ExpertPath::Device) &&
                         forward_->graphable_batch() && cfg_.decode_graph && be_->supports_graphs() &&
                         !graph_failed_;
  // The rows in ascending region order (each row's logits do not depend on the batch, so the order
  // is free): one recording serves a set of regions whatever order its callers name them in.
  std::vector<int32_t> order((size_t)B);
  for (int64_t i = 0; i < B; ++i) order[(size_t)i] = (int32_t)i;
  std::sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return seqs[x] < seqs[y]; });
  std::vector<int32_t> key((size_t)B);
  for (int64_t i = 0; i < B; ++i) key[(size_t)i] = seqs[order[(size_t)i]];
  BatchGraph* g = nullptr;
  if (graphable) {
    for (BatchGraph& c : batch_graphs_)
      if (c.seqs == key) g = &c;
    if (!g && key == last_batch_) {
      try {
        Graph rec = record_batch(b, key);
        if (batch_graphs_.size() >= kBatchGraphs)
          batch_graphs_.erase(
              std::min_element(batch_graphs_.begin(), batch_graphs_.end(),
                               [](const BatchGraph& x, const BatchGraph& y) { return x.used < y.used; }));
        batch_graphs_.push_back(BatchGraph{key, std::move(rec), 0});
        g = &batch_graphs_.back();
      } catch (const Interrupted&) {
        throw;
      } catch (const std::exception& e) {
        graph_failed_ = true;
        log(LogLevel::Warn, "decode: recording a batched step as one graph failed (", e.what(),
            "); decoding op by op, which is slower");
      }
    }
  }
  last_batch_ = key;
  if (!g) {
    ++batch_op_by_op_;
    forward_->run_rows(b, ids, SeqRows{pos, seqs}, B, logits);
    if (path == ExpertPath::Device) cache_->read_device_counters();
    return;
  }
  ++batch_replayed_;
  g->used = batch_replayed_;
  auto* io = reinterpret_cast<int32_t*>(batch_io_.get());
  for (int64_t i = 0; i < B; ++i) {
    io[i] = ids[order[(size_t)i]];
    io[cfg_.seqs + i] = (int32_t)pos[order[(size_t)i]];
  }
  replay(g->graph, B);
  if (logits) {
    const auto* out = reinterpret_cast<const float*>(batch_logits_.get());
    for (int64_t i = 0; i < B; ++i)
      std::memcpy(logits + (size_t)order[(size_t)i] * s.V, out + (size_t)i * s.V,
                  (size_t)s.V * sizeof(float));
  }
}

void Model::replay(const Graph& g, int64_t rows) {
  g.launch();
  be_->sync();
  // The recording counted nothing: with every expert resident a step's rows count as hits (as
  // moe_gathered counts them op by op), else the device's counters of the step are read.
  if (cache_->all_resident())
    cache_->count_hits((uint64_t)plan_.experts.L * plan_.spec.K * (uint64_t)rows);
  else
    cache_->read_device_counters();
}

Graph Model::record_batch(const PrefillBuffers& b, const std::vector<int32_t>& seqs) {
  const ModelSpec& s = plan_.spec;
  const int64_t N = cfg_.seqs, B = (int64_t)seqs.size();
  if (!batch_io_.get()) {
    batch_io_ =
        PinnedBuffer(*be_, 2 * (size_t)N * sizeof(int32_t), "the batched decode step's ids and positions");
    batch_logits_ = PinnedBuffer(*be_, (size_t)N * s.V * sizeof(float), "the batched decode step's logits");
    batch_pos_ = DeviceBuffer(*be_, (size_t)N * sizeof(int32_t), "the batched decode step's positions");
  }
  auto* io = reinterpret_cast<int32_t*>(batch_io_.get());
  // Host positions of 0: the recording's ops add the device's copy (SeqRows::pos_dev) instead.
  const std::vector<int64_t> zero((size_t)B, 0);
  const CacheStats stats = cache_->stats();  // the recording computes nothing: the replays count
  be_->sync();
  be_->capture_begin();
  try {
    be_->upload(batch_pos_.get(), io + N, (size_t)B * sizeof(int32_t));
    SeqRows rows{zero.data(), seqs.data()};
    rows.pos_dev = batch_pos_.as<int32_t>();
    rows.max_pos = seq_ctx();
    forward_->run_rows(b, io, rows, B, reinterpret_cast<float*>(batch_logits_.get()));
    Graph g(*be_, be_->capture_end());
    cache_->set_stats(stats);
    return g;
  } catch (...) {
    be_->set_position_source(nullptr, 0);
    be_->capture_abort();
    cache_->set_stats(stats);
    throw;
  }
}

void Model::record_decode(const PrefillBuffers& b) {
  const ModelSpec& s = plan_.spec;
  if (!step_io_.get()) {
    step_io_ = PinnedBuffer(*be_, 2 * sizeof(int32_t), "the decode step's token and position");
    step_logits_ = PinnedBuffer(*be_, (size_t)s.V * sizeof(float), "the decode step's logits");
    step_pos_ = DeviceBuffer(*be_, sizeof(int32_t), "the decode step's position");
  }
  auto* io = reinterpret_cast<int32_t*>(step_io_.get());
  const CacheStats stats = cache_->stats();  // the recording computes nothing: the replays count
  be_->sync();
  be_->capture_begin();
  try {
    be_->upload(step_pos_.get(), io + 1, sizeof(int32_t));
    be_->set_position_source(step_pos_.as<int32_t>(), seq_ctx());
    forward_->run_chunk(b, io, 1, 0, reinterpret_cast<float*>(step_logits_.get()), false);
    be_->set_position_source(nullptr, 0);
    graphs_[(size_t)kv_->selected()] = Graph(*be_, be_->capture_end());
  } catch (...) {
    be_->set_position_source(nullptr, 0);
    be_->capture_abort();
    cache_->set_stats(stats);
    throw;
  }
  cache_->set_stats(stats);
}

void Model::run_borrowed(int64_t T, const std::function<void(const PrefillBuffers&)>& run) {
  const Prefill& pf = plan_.prefill;
  const int32_t slots = (int32_t)slots_for(T);
  auto [region, bytes] = cache_->lend(slots);
  chunk_stats_.slots_borrowed = std::max<int64_t>(chunk_stats_.slots_borrowed, slots);
  chunk_stats_.region_bytes = std::max<uint64_t>(chunk_stats_.region_bytes, bytes);
  // The region's tail past bytes_needed is a guard: carve must never reach it.
  const size_t need = pf.bytes_needed(T, true);
  be_->fill(region + need, ExpertCache::kGuard, bytes - need);
  try {
    run(pf.carve(region, need, T, true));
  } catch (...) {
    cache_->release(0);
    cache_->give_back();
    throw;
  }
  check_guards(region + need, bytes - need, T);
  cache_->give_back();
}

void Model::check_guards(const uint8_t* tail, size_t n, int64_t T) {
  std::vector<uint8_t> g(n);
  be_->download(g.data(), tail, n);
  bool ok = cache_->guards_intact();
  for (uint8_t b : g) ok = ok && b == ExpertCache::kGuard;
  if (!ok) {
    cache_->give_back();
    throw Error(str("internal error: the prompt chunk of ", T, " tokens wrote outside its planned ",
                    plan_.prefill.bytes_needed(T, true), " bytes (guard bytes changed); please report it"));
  }
}

}  // namespace strata
