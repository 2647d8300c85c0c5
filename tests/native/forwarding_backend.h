// A Backend that forwards every call to a CPU backend: tests derive from it and override the few
// calls they watch or bend (a stream-operation log, a kernel that writes where it should not).
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"

namespace strata::testing_support {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(int threads = 1) : cpu_(make_cpu_backend(threads)) {}
  Backend& inner() { return *cpu_; }

  const char* name() const override { return cpu_->name(); }
  std::string describe() const override { return cpu_->describe(); }
  int threads() const override { return cpu_->threads(); }
  void* alloc(size_t b, const char* w) override { return cpu_->alloc(b, w); }
  void free(void* p) override { cpu_->free(p); }
  void* alloc_pinned(size_t b, const char* w) override { return cpu_->alloc_pinned(b, w); }
  void free_pinned(void* p) override { cpu_->free_pinned(p); }
  size_t live_allocations() const override { return cpu_->live_allocations(); }
  void memory_info(size_t* f, size_t* t) const override { cpu_->memory_info(f, t); }
  bool host_is_device() const override { return cpu_->host_is_device(); }
  bool register_host(const void* p, size_t n) override { return cpu_->register_host(p, n); }
  void unregister_host(const void* p) override { cpu_->unregister_host(p); }
  const void* device_view(const void* h) const override { return cpu_->device_view(h); }
  void upload(void* d, const void* s, size_t n) override { cpu_->upload(d, s, n); }
  void download(void* d, const void* s, size_t n) override { cpu_->download(d, s, n); }
  void upload_async(void* d, const void* s, size_t n, Stream st) override { cpu_->upload_async(d, s, n, st); }
  DeviceBuffer resident(const void* h, size_t b, const char* w) override { return cpu_->resident(h, b, w); }
  EventId event_create() override { return cpu_->event_create(); }
  void event_destroy(EventId e) override { cpu_->event_destroy(e); }
  void record(EventId e, Stream s) override { cpu_->record(e, s); }
  void wait(Stream s, EventId e) override { cpu_->wait(s, e); }
  bool query(EventId e) override { return cpu_->query(e); }
  void event_sync(EventId e) override { cpu_->event_sync(e); }
  void sync() override { cpu_->sync(); }
  bool supports_kv(KvType t) const override { return cpu_->supports_kv(t); }
#define STRATA_FWD(name, sig, args) \
  void name sig override { cpu_->name args; }
  STRATA_FWD(embed, (uint32_t a, const void* b, int64_t c, const int32_t* d, int64_t e, float* f),
             (a, b, c, d, e, f))
  STRATA_FWD(rms_scale, (const float* a, int64_t b, int64_t c, float d, float* e), (a, b, c, d, e))
  STRATA_FWD(apply_norm,
             (const float* a, const float* b, const float* c, int64_t d, const int32_t* e, int64_t f,
              int64_t g, float* h),
             (a, b, c, d, e, f, g, h))
  STRATA_FWD(gather, (const float* a, int64_t b, const int32_t* c, int64_t d, int64_t e, float* f),
             (a, b, c, d, e, f))
  STRATA_FWD(quantize_q8_0,
             (const float* a, const float* b, const float* c, int64_t d, const int32_t* e, int64_t f,
              int64_t g, uint8_t* h, size_t i),
             (a, b, c, d, e, f, g, h, i))
  STRATA_FWD(matmul_q8,
             (uint32_t a, const void* b, int64_t c, int64_t d, const uint8_t* e, size_t f, int64_t g,
              float* h, int64_t i),
             (a, b, c, d, e, f, g, h, i))
  STRATA_FWD(dequant_rows, (uint32_t a, const void* b, size_t c, int64_t d, int64_t e, float* f),
             (a, b, c, d, e, f))
  STRATA_FWD(copy, (void* a, const void* b, size_t c), (a, b, c))
  STRATA_FWD(matmul,
             (uint32_t a, const void* b, int64_t c, int64_t d, const float* e, int64_t f, int64_t g, float* h,
              int64_t i),
             (a, b, c, d, e, f, g, h, i))
  STRATA_FWD(head_norm_rope,
             (float* a, int64_t b, int64_t c, int64_t d, const float* e, float f, int64_t g,
              const RopeParams& h),
             (a, b, c, d, e, f, g, h))
  STRATA_FWD(kv_store, (void* a, KvType b, int64_t c, int64_t d, int64_t e, const float* f),
             (a, b, c, d, e, f))
  STRATA_FWD(attention,
             (const float* a, const void* b, const void* c, KvType t, int64_t d, int64_t e, int64_t f,
              int64_t g, int64_t h, float i, float* j),
             (a, b, c, t, d, e, f, g, h, i, j))
  STRATA_FWD(add, (float* a, const float* b, int64_t c), (a, b, c))
  STRATA_FWD(router_topk, (const float* a, int64_t b, int64_t c, int64_t d, bool e, int32_t* f, float* g),
             (a, b, c, d, e, f, g))
  STRATA_FWD(group_by_expert, (const int32_t* a, int64_t b, int64_t c, int64_t d, int32_t* e, int32_t* f),
             (a, b, c, d, e, f))
  STRATA_FWD(swiglu, (float* a, const float* b, int64_t c), (a, b, c))
  STRATA_FWD(matmul_experts,
             (uint32_t a, const ExpertTable& b, int c, int64_t d, int64_t e, const int32_t* f,
              const int32_t* g, int64_t h, const float* i, int64_t j, float* k, int64_t l),
             (a, b, c, d, e, f, g, h, i, j, k, l))
  STRATA_FWD(matmul_q8_experts,
             (uint32_t a, const ExpertTable& b, int c, int64_t d, int64_t e, const int32_t* f,
              const int32_t* g, int64_t h, const uint8_t* i, size_t j, float* k, int64_t l),
             (a, b, c, d, e, f, g, h, i, j, k, l))
  STRATA_FWD(resolve_experts, (const ExpertResolve& a), (a))
  STRATA_FWD(scatter_add,
             (const float* a, const int32_t* b, const float* c, int64_t d, int64_t e, int64_t f, float* g),
             (a, b, c, d, e, f, g))
  STRATA_FWD(zero, (void* a, size_t b), (a, b))
  STRATA_FWD(fill, (void* a, uint8_t b, size_t c), (a, b, c))
#undef STRATA_FWD

 private:
  std::unique_ptr<Backend> cpu_;
};

}  // namespace strata::testing_support
