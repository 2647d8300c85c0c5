// Model: load, chunked prefill over a borrowed region, decode on resident scratch.
#include "model/model.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "core/thread_pool.h"
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

}  // namespace

std::shared_ptr<Backend> make_backend(const std::string& device, int threads) {
  STRATA_CHECK(threads >= 0, ConfigError, "threads must be >= 0 (0: every core), got ", threads);
  STRATA_CHECK(device == "cpu" || device == "cuda" || device == "auto", ConfigError,
               "device must be cpu, cuda or auto, got '", device, "'");
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
  a.others = s.dense_bytes + KVCache::bytes(kv, s.L, cfg.ctx, s.n_kv_head * s.head_dim) +
             plan.prefill.bytes_needed(1, true) + (size_t)kHeadRows * s.V * sizeof(float);
  const size_t avail = free_bytes > a.others + a.reserve ? free_bytes - a.others - a.reserve : 0;
  // Every expert resident, plus the prompt scratch that then has no slots to borrow.
  if (avail >= plan.experts.total_bytes() + plan.prefill.bytes_needed(chunk, false)) {
    a.all_resident = true;
    return a;
  }
  a.cache_bytes = avail / plan.experts.slot_bytes * plan.experts.slot_bytes;
  const ChunkPlan c =
      plan_chunk(plan.prefill, plan.experts.slot_bytes, (int64_t)(a.cache_bytes / plan.experts.slot_bytes),
                 a.cache_bytes, chunk, cfg.prefill_auto);
  if (!c.fits) {
    a.error = str("--expert-cache auto: ", mib_str(free_bytes),
                  " free on the device; the dense weights, KV cache (--ctx ", cfg.ctx, ") and scratch take ",
                  mib_str(a.others), " and ", mib_str(a.reserve), " stay in reserve, leaving ",
                  mib_str(a.cache_bytes), " for the expert cache, which is too small: ", c.error,
                  "; or lower --ctx");
  }
  return a;
}

Model::Model(std::shared_ptr<gguf::File> file, const ModelConfig& cfg, std::shared_ptr<Backend> be)
    : cfg_(cfg),
      be_(backend_for(cfg, std::move(be))),
      plan_(ModelPlan::read(std::move(file), cfg.gr_unfused)) {
  STRATA_CHECK(cfg_.ctx >= 1, ConfigError, "ctx must be at least 1, got ", cfg_.ctx);
  STRATA_CHECK(cfg_.prefill >= 1, ConfigError, "--prefill must be at least 1 token, got ", cfg_.prefill);
  const ModelSpec& s = plan_.spec;
  const Prefill& pf = plan_.prefill;
  const ExpertLayout& xl = plan_.experts;

  KvType kv = be_->supports_kv(KvType::F16) ? KvType::F16 : KvType::F32;
  if (cfg_.kv_type == "f32")
    kv = KvType::F32;
  else if (cfg_.kv_type == "f16")
    kv = KvType::F16;
  else
    STRATA_CHECK(cfg_.kv_type == "auto", ConfigError, "--kv-type must be f32, f16 or auto, got '",
                 cfg_.kv_type, "'");
  STRATA_CHECK(be_->supports_kv(kv), UnsupportedError, "the ", be_->name(), " backend has no ",
               kv_type_name(kv), " KV cache; use --kv-type f32");

  if (cfg_.cache_auto) {
    // On the CPU every expert is read where it lies; on a GPU the cache takes what is free.
    if (be_->host_is_device()) {
      cfg_.all_resident = true;
    } else {
      size_t free_b = 0, total_b = 0;
      be_->memory_info(&free_b, &total_b);
      const AutoCache a = auto_cache(plan_, cfg_, kv, free_b, total_b);
      if (!a.error.empty()) throw MemoryError(a.error);
      cfg_.all_resident = a.all_resident;
      cfg_.cache_bytes = a.cache_bytes;
    }
  }
  if (!cfg_.all_resident) {
    std::string kind = cfg_.source;
    if (kind == "auto") kind = host_fits(xl.total_bytes()) ? "host" : "mmap";
    if (kind == "host") {
      // A GPU reads the experts straight from the page-locked mapping of the file when it can
      // register it: no second copy of them in RAM. Else one pinned copy.
      if (!be_->host_is_device())
        src_ = make_registered_source(xl, *be_, plan_.file->base(), plan_.file->file_size());
      if (!src_) src_ = make_host_source(xl, *be_, cfg_.progress);
    } else if (kind == "mmap") {
      src_ = make_mmap_source(xl);
    } else {
      throw ConfigError(str("--source must be host, mmap or auto, got '", cfg_.source, "'"));
    }
  }
  cache_ = std::make_unique<ExpertCache>(*be_, xl, src_.get(), cfg_.cache_bytes);
  kv_ = std::make_unique<KVCache>(*be_, kv, s.L, cfg_.ctx, s.n_kv_head * s.head_dim);
  decode_region_ = DeviceBuffer(*be_, pf.bytes_needed(1, has_source()), "the decode scratch");

  chunk_ = std::min(cfg_.prefill, cfg_.ctx);
  if (cache_->all_resident()) {
    own_region_ = DeviceBuffer(*be_, pf.bytes_needed(chunk_, false), "the prompt scratch (lower --prefill)");
  } else {
    const ChunkPlan plan =
        plan_chunk(pf, xl.slot_bytes, cache_->n_slots(), cfg_.cache_bytes, chunk_, cfg_.prefill_auto);
    if (!plan.fits) throw MemoryError(plan.error);
    chunk_ = plan.chunk;
  }
  forward_ = find_architecture(s.arch, plan_.file->path())
                 .make_forward(ForwardContext{*be_, s, xl, *cache_, *kv_, &layer_hook_});

  log(LogLevel::Info, plan_.file->path(), ": ", s.arch, " L=", s.L, " D=", s.D, " E=", s.E, " K=", s.K,
      " F=", s.F, " V=", s.V, "; dense ", mib_str(s.dense_bytes), ", experts ", mib_str(s.expert_bytes),
      " (slot ", xl.slot_bytes, " bytes)");
  log(LogLevel::Info, "backend ", be_->describe(), ", ctx=", cfg_.ctx, " KV ", mib_str(kv_->total_bytes()),
      "; expert cache ",
      cache_->all_resident() ? std::string("all resident") : str(cache_->n_slots(), " slots"), ", source ",
      source_kind(), "; prompt chunk ", chunk_, " tokens (",
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

void Model::forward(const int32_t* ids, int64_t n, int64_t pos0, float* logits, bool all_logits) {
  const ModelSpec& s = plan_.spec;
  const Prefill& pf = plan_.prefill;
  STRATA_CHECK(n >= 1, ConfigError, "forward needs at least one token");
  STRATA_CHECK(pos0 >= 0 && pos0 + n <= cfg_.ctx, ConfigError, "context full: ", pos0 + n,
               " tokens exceed ctx=", cfg_.ctx, "; load the model with a larger ctx");
  for (int64_t i = 0; i < n; ++i)
    STRATA_CHECK(ids[i] >= 0 && ids[i] < s.V, ConfigError, "token id ", ids[i], " out of range [0, ", s.V,
                 ")");
  if (n == 1) {
    const size_t need = pf.bytes_needed(1, has_source());
    forward_->run_chunk(pf.carve(decode_region_.get(), need, 1, has_source()), ids, 1, pos0, logits,
                        all_logits);
    return;
  }
  for (int64_t i = 0; i < n; i += chunk_) {
    const int64_t T = std::min(chunk_, n - i);
    const bool last = i + T == n;
    float* lg = all_logits ? logits + i * s.V : (last ? logits : nullptr);
    if (cache_->all_resident()) {
      forward_->run_chunk(pf.carve(own_region_.get(), own_region_.size(), T, false), ids + i, T, pos0 + i, lg,
                          all_logits);
    } else {
      run_borrowed(ids + i, T, pos0 + i, lg, all_logits);
    }
    chunk_stats_.chunks++;
    chunk_stats_.chunk_tokens = std::max(chunk_stats_.chunk_tokens, T);
  }
}

void Model::run_borrowed(const int32_t* ids, int64_t T, int64_t pos0, float* logits, bool all_logits) {
  const Prefill& pf = plan_.prefill;
  const int32_t slots = (int32_t)slots_for(T);
  auto [region, bytes] = cache_->lend(slots);
  chunk_stats_.slots_borrowed = std::max<int64_t>(chunk_stats_.slots_borrowed, slots);
  chunk_stats_.region_bytes = std::max<uint64_t>(chunk_stats_.region_bytes, bytes);
  // The region's tail past bytes_needed is a guard: carve must never reach it.
  const size_t need = pf.bytes_needed(T, true);
  be_->fill(region + need, ExpertCache::kGuard, bytes - need);
  try {
    forward_->run_chunk(pf.carve(region, need, T, true), ids, T, pos0, logits, all_logits);
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
