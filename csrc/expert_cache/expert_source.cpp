// ExpertSource implementations: host copy and mmap.
#include "expert_cache/expert_source.h"

#include <cstring>

#include "backend/backend.h"
#include "core/error.h"

namespace strata {

const char* source_kind_name(SourceKind k) { return k == SourceKind::Host ? "host" : "mmap"; }

ExpertLayout ExpertLayout::make(int64_t E, std::vector<ExpertLayerLayout> layers) {
  ExpertLayout out;
  out.L = (int64_t)layers.size();
  out.E = E;
  for (auto& l : layers) {
    l.gate_off = 0;
    l.up_off = align_up(l.gate.bytes);
    l.down_off = l.up_off + align_up(l.up.bytes);
    l.bytes = l.down_off + align_up(l.down.bytes);
    out.slot_bytes = std::max(out.slot_bytes, l.bytes);
  }
  out.slot_bytes = align_up(out.slot_bytes);
  out.layers = std::move(layers);
  return out;
}

size_t ExpertLayout::total_bytes() const {
  size_t n = 0;
  for (const auto& l : layers) n += l.bytes * (size_t)E;
  return n;
}

namespace {

// The three matrices of expert e where the GGUF keeps them.
int file_copies(const ExpertLayerLayout& l, int64_t e, ExpertCopy out[3]) {
  out[0] = {l.gate_off, l.gate.host + (size_t)e * l.gate.bytes, l.gate.bytes};
  out[1] = {l.up_off, l.up.host + (size_t)e * l.up.bytes, l.up.bytes};
  out[2] = {l.down_off, l.down.host + (size_t)e * l.down.bytes, l.down.bytes};
  return 3;
}

class HostSource final : public ExpertSource {
 public:
  HostSource(const ExpertLayout& layout, Backend& be, const Progress& progress) : layout_(layout) {
    const size_t total = layout.total_bytes();
    buf_ =
        PinnedBuffer(be, total,
                     "the host copy of the experts (--source host); use --source mmap to read them from the "
                     "file instead");
    size_t off = 0;
    for (int64_t l = 0; l < layout.L; ++l) {
      layer_off_.push_back(off);
      const auto& ll = layout.layers[l];
      for (int64_t e = 0; e < layout.E; ++e) {
        ExpertCopy c[3];
        file_copies(ll, e, c);
        uint8_t* dst = buf_.get() + off + (size_t)e * ll.bytes;
        for (const ExpertCopy& p : c) std::memcpy(dst + p.dst_off, p.src, p.bytes);
      }
      off += ll.bytes * (size_t)layout.E;
      if (progress) progress(off, total);
    }
  }
  SourceKind kind() const override { return SourceKind::Host; }
  bool page_locked() const override { return true; }
  const char* describe() const override { return "host copy"; }
  int copies(int64_t layer, int64_t e, ExpertCopy out[3]) const override {
    const auto& ll = layout_.layers[layer];
    out[0] = {0, buf_.get() + layer_off_[layer] + (size_t)e * ll.bytes, ll.bytes};
    return 1;
  }

 private:
  const ExpertLayout& layout_;
  PinnedBuffer buf_;
  std::vector<size_t> layer_off_;
};

class MmapSource final : public ExpertSource {
 public:
  explicit MmapSource(const ExpertLayout& layout) : layout_(layout) {}
  SourceKind kind() const override { return SourceKind::Mmap; }
  bool page_locked() const override { return false; }
  const char* describe() const override { return "mmap"; }
  int copies(int64_t layer, int64_t e, ExpertCopy out[3]) const override {
    return file_copies(layout_.layers[layer], e, out);
  }

 private:
  const ExpertLayout& layout_;
};

// The file mapping, page-locked by the backend for as long as the source lives.
class RegisteredSource final : public ExpertSource {
 public:
  RegisteredSource(const ExpertLayout& layout, Backend& be, const void* map)
      : layout_(layout), be_(be), map_(map) {}
  ~RegisteredSource() override { be_.unregister_host(map_); }
  SourceKind kind() const override { return SourceKind::Host; }
  bool page_locked() const override { return true; }
  const char* describe() const override { return "registered file"; }
  int copies(int64_t layer, int64_t e, ExpertCopy out[3]) const override {
    return file_copies(layout_.layers[layer], e, out);
  }

 private:
  const ExpertLayout& layout_;
  Backend& be_;
  const void* map_;
};

}  // namespace

std::unique_ptr<ExpertSource> make_host_source(const ExpertLayout& layout, Backend& be,
                                               const Progress& progress) {
  return std::make_unique<HostSource>(layout, be, progress);
}
std::unique_ptr<ExpertSource> make_registered_source(const ExpertLayout& layout, Backend& be, const void* map,
                                                     size_t map_bytes) {
  if (!be.register_host(map, map_bytes)) return nullptr;
  return std::make_unique<RegisteredSource>(layout, be, map);
}
std::unique_ptr<ExpertSource> make_mmap_source(const ExpertLayout& layout) {
  return std::make_unique<MmapSource>(layout);
}

}  // namespace strata
