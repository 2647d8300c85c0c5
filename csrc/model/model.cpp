// Model: load, chunked prefill over a borrowed region, decode on resident scratch.
#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <tuple>

#include "core/error.h"
#include "core/log.h"
#include "prefill/chunk_plan.h"
#include "quant/quant.h"

namespace strata {

namespace {
constexpr int64_t kHeadRows = 16;  // output-head rows per batch when every position's logits are wanted

bool env_flag(const char* name) {
  const char* e = std::getenv(name);
  return e && *e && std::strcmp(e, "0") != 0;
}

ExpertTensor expert_tensor(const WeightRef& w, int64_t E) {
  ExpertTensor t;
  t.type = w.type();
  t.cols = w.t->ne[0];
  t.rows = w.t->ne[1];
  t.bytes = w.t->nbytes / (size_t)E;
  t.host = w.data();
  return t;
}

PrefillShape prefill_shape(const ModelSpec& s) {
  PrefillShape p;
  p.D = s.D;
  p.HC = 1;
  p.E = s.E;
  p.K = s.K;
  p.F = s.F;
  p.n_head = s.n_head;
  p.n_kv_head = s.n_kv_head;
  p.head_dim = s.head_dim;
  for (const auto& l : s.layers)
    for (const WeightRef* w : {&l.gate_exps, &l.up_exps, &l.down_exps}) p.expert_types.push_back(w->type());
  p.gr_unfused = env_flag("STRATA_GR_UNFUSED");
  return p;
}
}  // namespace

// The host copy is the default when the experts fit in the memory available now with a margin
// (a tenth of RAM, at least 2 GiB) for the rest of the process and the system; else mmap.
static bool host_fits(uint64_t expert_bytes) {
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

static std::shared_ptr<gguf::File> open_file(const std::string& path) { return gguf::File::open(path); }

Model::Model(const std::string& path, const ModelConfig& cfg)
    : cfg_(cfg), file_(open_file(path)), spec_(read_spec(*file_)), prefill_(prefill_shape(spec_)) {
  STRATA_CHECK(cfg_.device == "cpu", UnsupportedError, "device '", cfg_.device,
               "' is not available in this build; use device='cpu'");
  STRATA_CHECK(cfg_.ctx >= 1, ConfigError, "ctx must be at least 1, got ", cfg_.ctx);
  STRATA_CHECK(cfg_.prefill >= 1, ConfigError, "--prefill must be at least 1 token, got ", cfg_.prefill);
  be_ = make_cpu_backend(cfg_.threads);
  const auto& s = spec_;

  std::vector<ExpertLayerLayout> layers;
  for (const auto& l : s.layers) {
    ExpertLayerLayout ll;
    ll.gate = expert_tensor(l.gate_exps, s.E);
    ll.up = expert_tensor(l.up_exps, s.E);
    ll.down = expert_tensor(l.down_exps, s.E);
    layers.push_back(ll);
  }
  xlayout_ = ExpertLayout::make(s.E, std::move(layers));

  // Dense weights: resident on the device (the CPU reads the mapping in place).
  for (const auto& l : s.layers) {
    for (const WeightRef* w : {&l.q, &l.k, &l.v, &l.o, &l.router}) be_->resident(w->data(), w->t->nbytes, "dense");
    dense_.push_back(DenseLayer{norm_weight(l.attn_norm, "attn_norm"), norm_weight(l.q_norm, "attn_q_norm"),
                                norm_weight(l.k_norm, "attn_k_norm"), norm_weight(l.ffn_norm, "ffn_norm")});
  }
  output_norm_ = norm_weight(s.output_norm, "output_norm");

  if (!cfg_.all_resident) {
    std::string kind = cfg_.source;
    if (kind == "auto") kind = host_fits(xlayout_.total_bytes()) ? "host" : "mmap";
    if (kind == "host") src_ = make_host_source(xlayout_, cfg_.progress);
    else if (kind == "mmap") src_ = make_mmap_source(xlayout_);
    else throw ConfigError(str("--source must be host, mmap or auto, got '", cfg_.source, "'"));
  }
  cache_ = std::make_unique<ExpertCache>(*be_, xlayout_, src_.get(), cfg_.cache_bytes);

  const size_t kv_bytes = (size_t)s.L * cfg_.ctx * s.n_kv_head * s.head_dim * sizeof(float);
  kc_ = static_cast<float*>(be_->alloc(kv_bytes, "the KV cache (lower ctx)"));
  vc_ = static_cast<float*>(be_->alloc(kv_bytes, "the KV cache (lower ctx)"));
  decode_region_ = be_->alloc(prefill_.bytes_needed(1, has_source()), "the decode scratch");
  logits_dev_ = static_cast<float*>(be_->alloc((size_t)kHeadRows * s.V * sizeof(float), "the logits"));

  chunk_ = std::min(cfg_.prefill, cfg_.ctx);
  if (cache_->all_resident()) {
    own_region_bytes_ = prefill_.bytes_needed(chunk_, false);
    own_region_ = be_->alloc(own_region_bytes_, "the prompt scratch (lower --prefill)");
  } else {
    const ChunkPlan plan = plan_chunk(prefill_, xlayout_.slot_bytes, cache_->n_slots(), cfg_.cache_bytes, chunk_,
                                      cfg_.prefill_auto);
    if (!plan.fits) throw MemoryError(plan.error);
    chunk_ = plan.chunk;
  }
  log(LogLevel::Info, path, ": ", s.arch, " L=", s.L, " D=", s.D, " E=", s.E, " K=", s.K, " F=", s.F, " V=", s.V,
      "; dense ", mib_str(s.dense_bytes), ", experts ", mib_str(s.expert_bytes), " (slot ", xlayout_.slot_bytes,
      " bytes)");
  log(LogLevel::Info, "backend ", be_->name(), " threads=", be_->threads(), " ctx=", cfg_.ctx, " KV ",
      mib_str(2 * kv_bytes), "; expert cache ",
      cache_->all_resident() ? std::string("all resident") : str(cache_->n_slots(), " slots"), ", source ",
      source_kind(), "; prompt chunk ", chunk_, " tokens (", moe_layout_name(prefill_.fused_layout(chunk_, has_source())),
      " layout", cache_->all_resident() ? "" : str(", borrows ", slots_for(chunk_), " slots").c_str(), ")");
}

int64_t Model::slots_for(int64_t T) const {
  if (cache_->all_resident()) return 0;
  return region_slots(prefill_, T, xlayout_.slot_bytes);
}

Model::~Model() {
  for (void* p : {(void*)kc_, (void*)vc_, decode_region_, own_region_, (void*)logits_dev_})
    if (p) be_->free(p);
}

const float* Model::norm_weight(const WeightRef& w, const char* what) {
  const int64_t n = w.t->nelements();
  if (w.type() == (uint32_t)QType::F32) return static_cast<const float*>(be_->resident(w.data(), n * 4, what));
  owned_norms_.emplace_back(n);
  dequantize(quant_traits(w.type(), what).type, w.data(), owned_norms_.back().data(), n);
  return static_cast<const float*>(be_->resident(owned_norms_.back().data(), n * 4, what));
}

void Model::reset_stats() {
  cache_->reset_stats();
  chunk_stats_ = ChunkStats{};
}

void Model::forward(const int32_t* ids, int64_t n, int64_t pos0, float* logits, bool all_logits) {
  STRATA_CHECK(n >= 1, ConfigError, "forward needs at least one token");
  STRATA_CHECK(pos0 + n <= cfg_.ctx, ConfigError, "context full: ", pos0 + n, " tokens exceed ctx=", cfg_.ctx,
               "; load the model with a larger ctx");
  for (int64_t i = 0; i < n; ++i)
    STRATA_CHECK(ids[i] >= 0 && ids[i] < spec_.V, ConfigError, "token id ", ids[i], " out of range [0, ",
                 spec_.V, ")");
  if (n == 1) {
    const PrefillBuffers b = prefill_.carve(decode_region_, prefill_.bytes_needed(1, has_source()), 1, has_source());
    run_chunk(b, ids, 1, pos0, logits, all_logits);
    return;
  }
  const int64_t chunk = chunk_;
  for (int64_t i = 0; i < n; i += chunk) {
    const int64_t T = std::min(chunk, n - i);
    const bool last = i + T == n;
    float* lg = all_logits ? logits + i * spec_.V : (last ? logits : nullptr);
    if (cache_->all_resident()) {
      run_chunk(prefill_.carve(own_region_, own_region_bytes_, T, false), ids + i, T, pos0 + i, lg, all_logits);
    } else {
      const int32_t slots = (int32_t)slots_for(T);
      auto [region, bytes] = cache_->lend(slots);
      chunk_stats_.slots_borrowed = std::max<int64_t>(chunk_stats_.slots_borrowed, slots);
      chunk_stats_.region_bytes = std::max<uint64_t>(chunk_stats_.region_bytes, bytes);
      // The region's tail past bytes_needed is a guard: carve must never reach it.
      const size_t need = prefill_.bytes_needed(T, true);
      be_->fill(region + need, ExpertCache::kGuard, bytes - need);
      try {
        run_chunk(prefill_.carve(region, need, T, true), ids + i, T, pos0 + i, lg, all_logits);
      } catch (...) {
        cache_->give_back();
        throw;
      }
      check_guards(region + need, bytes - need, T);
      cache_->give_back();
    }
    chunk_stats_.chunks++;
    chunk_stats_.chunk_tokens = std::max(chunk_stats_.chunk_tokens, T);
  }
}

void Model::check_guards(const uint8_t* tail, size_t n, int64_t T) {
  std::vector<uint8_t> g(n);
  be_->download(g.data(), tail, n);
  bool ok = cache_->guards_intact();
  for (uint8_t b : g) ok = ok && b == ExpertCache::kGuard;
  if (!ok) {
    cache_->give_back();
    throw Error(str("internal error: the prompt chunk of ", T, " tokens wrote outside its planned ",
                    prefill_.bytes_needed(T, true), " bytes (guard bytes changed); please report it"));
  }
}

void Model::run_chunk(const PrefillBuffers& b, const int32_t* ids_host, int64_t T, int64_t pos0, float* logits,
                      bool all_logits) {
  const auto& s = spec_;
  Backend& be = *be_;
  const int64_t D = s.D, Hd = s.n_head * s.head_dim, KVd = s.n_kv_head * s.head_dim;
  // Token ids live in the router-ids buffer until the first router overwrites them.
  be.upload(b.topk_ids, ids_host, (size_t)T * sizeof(int32_t));
  be.embed(s.token_embd.type(), s.token_embd.data(), D, b.topk_ids, T, b.R);
  // GR read: with STRATA_GR_UNFUSED the normalized input is materialized in xn; by default the
  // consumer stages it in its own input buffer (proj is free at both read points).
  float* x_in = b.xn ? b.xn : b.proj;
  const RopeParams rope{s.head_dim, s.rope_base, true};
  const float scale = 1.0f / std::sqrt((float)s.head_dim);
  for (int64_t l = 0; l < s.L; ++l) {
    const LayerSpec& ls = s.layers[l];
    const DenseLayer& dl = dense_[l];
    be.rms_scale(b.R, T, D, s.rms_eps, b.grs);
    be.apply_norm(b.R, b.grs, dl.attn_norm, D, nullptr, 1, T, x_in);
    be.matmul(ls.q.type(), ls.q.data(), Hd, D, x_in, D, T, b.q, Hd);
    be.matmul(ls.k.type(), ls.k.data(), KVd, D, x_in, D, T, b.k, KVd);
    be.matmul(ls.v.type(), ls.v.data(), KVd, D, x_in, D, T, b.v, KVd);
    be.head_norm_rope(b.q, T, s.n_head, s.head_dim, dl.q_norm, s.rms_eps, pos0, rope);
    be.head_norm_rope(b.k, T, s.n_kv_head, s.head_dim, dl.k_norm, s.rms_eps, pos0, rope);
    float* kl = kc_ + (size_t)l * cfg_.ctx * KVd;
    float* vl = vc_ + (size_t)l * cfg_.ctx * KVd;
    be.copy(kl + pos0 * KVd, b.k, (size_t)T * KVd * sizeof(float));
    be.copy(vl + pos0 * KVd, b.v, (size_t)T * KVd * sizeof(float));
    be.attention(b.q, kl, vl, T, pos0, s.n_head, s.n_kv_head, s.head_dim, scale, b.attn);
    be.matmul(ls.o.type(), ls.o.data(), D, Hd, b.attn, Hd, T, b.proj, D);
    be.add(b.R, b.proj, T * D);

    be.rms_scale(b.R, T, D, s.rms_eps, b.grs);
    be.apply_norm(b.R, b.grs, dl.ffn_norm, D, nullptr, 1, T, x_in);
    moe(b, l, T, x_in);
    be.add(b.R, b.proj, T * D);
  }
  if (!logits) return;
  be.rms_scale(b.R, T, D, s.rms_eps, b.grs);
  if (all_logits) {
    be.apply_norm(b.R, b.grs, output_norm_, D, nullptr, 1, T, x_in);
    head(b, x_in, T, logits);
  } else {
    be.apply_norm(b.R + (T - 1) * D, b.grs + (T - 1), output_norm_, D, nullptr, 1, 1, x_in);
    head(b, x_in, 1, logits);
  }
}

void Model::head(const PrefillBuffers&, const float* x, int64_t rows, float* logits_host) {
  const auto& s = spec_;
  for (int64_t r = 0; r < rows; r += kHeadRows) {
    const int64_t n = std::min(kHeadRows, rows - r);
    be_->matmul(s.output.type(), s.output.data(), s.V, s.D, x + r * s.D, s.D, n, logits_dev_, s.V);
    be_->download(logits_host + r * s.V, logits_dev_, (size_t)n * s.V * sizeof(float));
  }
}

void Model::moe(const PrefillBuffers& b, int64_t l, int64_t T, const float* x_in) {
  const auto& s = spec_;
  Backend& be = *be_;
  const LayerSpec& ls = s.layers[l];
  const auto& xl = xlayout_.layers[l];
  be.matmul(ls.router.type(), ls.router.data(), s.E, s.D, x_in, s.D, T, b.router, s.E);
  be.router_topk(b.router, T, s.E, s.K, s.norm_topk, b.topk_ids, b.topk_w);
  be.group_by_expert(b.topk_ids, T, s.K, s.E, b.expert_off, b.expert_rows);
  be.sync();
  // The host walks experts by these offsets.
  std::vector<int32_t> off(s.E + 1);
  be.download(off.data(), b.expert_off, off.size() * sizeof(int32_t));
  const bool fused_read = b.xn == nullptr;  // default GR mode: read R * grs * w by row index
  const float* ffn_norm = dense_[l].ffn_norm;
  if (b.moe == MoeLayout::MMQ) {
    // Every (token, k) row quantized to q8_0 in expert order, then all experts in one pass with
    // the integer kernels; a type without one reads the dequantized rows with the float matmul.
    const int64_t n_rows = T * s.K;
    const size_t xrb = row_bytes(QType::Q8_0, std::max(s.D, s.F));
    be.quantize_q8_0(fused_read ? b.R : b.xn, fused_read ? b.grs : nullptr, ffn_norm, s.D, b.expert_rows, s.K,
                     n_rows, b.xq, xrb);
    auto experts = [&](auto&& fn) {
      for (int64_t e = 0; e < s.E; ++e)
        if (off[e + 1] > off[e]) fn(e, (int64_t)off[e], (int64_t)(off[e + 1] - off[e]));
    };
    const bool float_in = !uses_matmul_q8(xl.gate.type) || !uses_matmul_q8(xl.up.type);
    if (float_in) {
      be.dequant_rows((uint32_t)QType::Q8_0, b.xq, xrb, s.D, n_rows, b.yd);
    }
    experts([&](int64_t e, int64_t o, int64_t n) {
      const ExpertView v = cache_->acquire(l, e);
      for (auto [type, W, out] : {std::tuple{xl.gate.type, v.gate, b.hg}, std::tuple{xl.up.type, v.up, b.hu}}) {
        if (uses_matmul_q8(type)) be.matmul_q8(type, W, s.F, s.D, b.xq + o * xrb, xrb, n, out + o * s.F, s.F);
        else be.matmul(type, W, s.F, s.D, b.yd + o * s.D, s.D, n, out + o * s.F, s.F);
      }
    });
    be.swiglu(b.hg, b.hu, n_rows * s.F);
    const bool q8_down = uses_matmul_q8(xl.down.type);
    if (q8_down) be.quantize_q8_0(b.hg, nullptr, nullptr, s.F, nullptr, 1, n_rows, b.xq, xrb);
    experts([&](int64_t e, int64_t o, int64_t n) {
      const ExpertView v = cache_->acquire(l, e);
      if (q8_down) be.matmul_q8(xl.down.type, v.down, s.D, s.F, b.xq + o * xrb, xrb, n, b.yd + o * s.D, s.D);
      else be.matmul(xl.down.type, v.down, s.D, s.F, b.hg + o * s.F, s.F, n, b.yd + o * s.D, s.D);
    });
    be.zero(b.proj, (size_t)T * s.D * sizeof(float));
    be.scatter_add(b.yd, b.expert_rows, b.topk_w, s.K, n_rows, s.D, b.proj);
    return;
  }
  // Fused: experts in ascending id, the order of the sums into proj, fixed whatever is resident,
  // so logits do not depend on the cache.
  be.zero(b.proj, (size_t)T * s.D * sizeof(float));
  for (int64_t e = 0; e < s.E; ++e) {
    const int64_t o = off[e], n = off[e + 1] - off[e];
    if (n == 0) continue;
    const ExpertView v = cache_->acquire(l, e);
    const int32_t* rows = b.expert_rows + o;
    if (fused_read) be.apply_norm(b.R, b.grs, ffn_norm, s.D, rows, s.K, n, b.xg);
    else be.gather(b.xn, s.D, rows, s.K, n, b.xg);
    be.matmul(xl.gate.type, v.gate, s.F, s.D, b.xg, s.D, n, b.hg, s.F);
    be.matmul(xl.up.type, v.up, s.F, s.D, b.xg, s.D, n, b.hu, s.F);
    be.swiglu(b.hg, b.hu, n * s.F);
    be.matmul(xl.down.type, v.down, s.D, s.F, b.hg, s.F, n, b.yd, s.D);
    be.scatter_add(b.yd, rows, b.topk_w, s.K, n, s.D, b.proj);
  }
}

}  // namespace strata
