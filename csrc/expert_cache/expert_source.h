// ExpertSource: where routed experts live off the device (a host copy or the mapped file), and the
// per-layer slot layout of an expert (gate | up | down). A source hands out host bytes; the cache
// queues their copies to the device.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/memory.h"

namespace strata {

class Backend;

// One expert matrix kind of one layer in the GGUF: `E` experts of `rows` x `cols` in `type`.
struct ExpertTensor {
  uint32_t type = 0;
  int64_t rows = 0, cols = 0;
  size_t bytes = 0;               // one expert's matrix
  const uint8_t* host = nullptr;  // expert 0 in the mapped file; expert e at host + e * bytes
};

struct ExpertLayerLayout {
  ExpertTensor gate, up, down;
  size_t gate_off = 0, up_off = 0, down_off = 0;  // offsets inside a slot, 256-byte aligned
  size_t bytes = 0;                               // gate + up + down with alignment
};

struct ExpertLayout {
  int64_t L = 0, E = 0;
  std::vector<ExpertLayerLayout> layers;
  size_t slot_bytes = 0;       // the largest expert of the model, aligned to 256 B
  size_t total_bytes() const;  // every expert of every layer, packed as in slots
  static ExpertLayout make(int64_t E, std::vector<ExpertLayerLayout> layers);
};

enum class SourceKind { Host, Mmap };
const char* source_kind_name(SourceKind k);

// Progress for long loads: (done_bytes, total_bytes).
using Progress = std::function<void(uint64_t, uint64_t)>;

// One host -> device copy of (part of) an expert into its slot.
struct ExpertCopy {
  size_t dst_off = 0;  // offset inside the slot
  const uint8_t* src = nullptr;
  size_t bytes = 0;
};

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  virtual SourceKind kind() const = 0;
  // The copies that fill a slot (laid out as the layer's ExpertLayerLayout) with expert (layer, e);
  // their sources stay valid and unchanged while the source lives. Returns how many (1 to 3).
  virtual int copies(int64_t layer, int64_t e, ExpertCopy out[3]) const = 0;
  // The copies' sources are page-locked: the copy engine reads them directly. Otherwise (the mapped
  // file of a model larger than RAM) a GPU cache stages them through pinned buffers.
  virtual bool page_locked() const = 0;
  // "host copy", "registered file", "mmap": for --stats and strata info.
  virtual const char* describe() const = 0;
};

// Every expert copied once into one pinned host buffer, each expert contiguous: one copy each.
std::unique_ptr<ExpertSource> make_host_source(const ExpertLayout& layout, Backend& be,
                                               const Progress& progress);
// The mapped GGUF itself, page-locked read-only by the backend (no second copy of the experts): three
// copies each. Null where the backend cannot register the mapping.
std::unique_ptr<ExpertSource> make_registered_source(const ExpertLayout& layout, Backend& be, const void* map,
                                                     size_t map_bytes);
// Experts read straight from the mapped GGUF: three copies each.
std::unique_ptr<ExpertSource> make_mmap_source(const ExpertLayout& layout);

}  // namespace strata
