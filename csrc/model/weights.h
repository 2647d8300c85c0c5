// The weight loader every architecture shares, driven by its tables: a spec reader lists a layer's
// tensors (name, shape from the metadata, the field of its layer spec) and TensorReader checks and
// finds them; a forward pass lists which of those fields become which resident weights, and
// ResidentWeights makes them resident on the backend and owns them.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/blocks.h"
#include "model/spec.h"

namespace strata {

// What a tensor must hold: a type strata computes with, or ggml's I32 (lookup tables).
enum class TensorKind { Compute, I32 };

// One tensor of a layer: its name after "blk.<l>.", its shape (ggml order) and the field it fills.
template <class Layer>
struct TensorRow {
  const char* name;
  WeightRef Layer::* field;
  std::vector<int64_t> ne;
  TensorKind kind = TensorKind::Compute;
};

class TensorReader {
 public:
  TensorReader(const gguf::File& f, std::string arch) : f_(f), arch_(std::move(arch)) {}

  // The tensor `name` of exactly shape `ne` and kind `kind`: FormatError naming the file, the tensor and
  // both shapes otherwise (a type strata does not run: UnsupportedError naming it).
  WeightRef need(const std::string& name, const std::vector<int64_t>& ne,
                 TensorKind kind = TensorKind::Compute) const;
  // Every row of `rows` of layer l into `layer`.
  template <class Layer>
  void layer(int64_t l, Layer& layer, std::initializer_list<TensorRow<Layer>> rows) const {
    const std::string p = "blk." + std::to_string(l) + ".";
    for (const TensorRow<Layer>& r : rows) layer.*r.field = need(p + r.name, r.ne, r.kind);
  }
  // token_embd [D, V] (V from the file, bounded to int32 ids), output_norm [D] and output [D, V],
  // which may be absent when `tied_ok` (the head reads the embedding).
  void common(ModelSpec& s, bool tied_ok) const;
  const gguf::File& file() const { return f_; }

 private:
  const gguf::File& f_;
  std::string arch_;
};

// One resident weight of a layer: the spec field it comes from and the pass's field it becomes, a
// matrix or a float32 vector. A field whose tensor the layer does not have (a null WeightRef) is
// skipped.
template <class Spec, class Dst>
struct ResidentRow {
  ResidentRow(WeightRef Spec::* f, DenseMatrix Dst::* d, const char* w) : from(f), dense(d), what(w) {}
  ResidentRow(WeightRef Spec::* f, const float* Dst::* v, const char* w) : from(f), vec(v), what(w) {}
  WeightRef Spec::* from;
  DenseMatrix Dst::* dense = nullptr;
  const float* Dst::* vec = nullptr;
  const char* what;
};

// The common weights of a pass: the embedding table, the final norm, the head (the embedding itself
// when tied) and the device buffer the head's logits go through.
struct HeadWeights {
  DeviceBuffer token_embd;
  const float* output_norm = nullptr;
  DenseMatrix output;
  DeviceBuffer logits_dev;  // kHeadRows x V
  // An architecture's op on a block of logits (n floats at logits_dev) before they leave the device
  // (gemma4's final softcap), so a recorded decode step computes them whole; null: none.
  std::function<void(float* logits_dev, int64_t n)> on_logits;
};

class ResidentWeights {
 public:
  explicit ResidentWeights(Backend& be) : be_(be) {}

  DenseMatrix dense(const WeightRef& w, const char* what);
  // A vector (norms, sinks, biases) as float32: other types converted once at load.
  const float* vec(const WeightRef& w, const char* what);
  const float* floats(std::vector<float> v, const char* what);
  // The tensor's bytes as they are (lookup tables).
  const void* raw(const WeightRef& w, const char* what);
  // Every row of `rows` from the layer spec `src` into `dst`.
  template <class Spec, class Dst>
  void layer(const Spec& src, Dst& dst, std::initializer_list<ResidentRow<Spec, Dst>> rows) {
    for (const auto& r : rows) {
      const WeightRef& w = src.*r.from;
      if (!w.t) continue;
      if (r.dense)
        dst.*r.dense = dense(w, r.what);
      else
        dst.*r.vec = vec(w, r.what);
    }
  }
  HeadWeights head(const ModelSpec& s);

 private:
  Backend& be_;
  std::vector<std::vector<float>> converted_;  // before owned_: borrowed buffers may point into it
  std::vector<DeviceBuffer> owned_;
};

}  // namespace strata
