// KVCache: keys and values of every layer for ctx positions, allocated once at load; or, for an
// architecture that lays its cache out itself (ModelSpec::kv_layers), its named float32 tensors.
// It holds `seqs` sequence regions of ctx positions each (one per sequence decoding at once): the
// forward pass of one sequence reads the selected region (select), a batched decode row names its own.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/memory.h"
#include "model/spec.h"

namespace strata {

class KVCache {
 public:
  // L layers of [ctx, width] elements of `type` for keys and for values (one region).
  KVCache(Backend& be, KvType type, int64_t L, int64_t ctx, int64_t width)
      : type_(type),
        ctx_(ctx),
        width_(width),
        k_(be, bytes(type, L, ctx, width) / 2, "the KV cache (lower --ctx)"),
        v_(be, bytes(type, L, ctx, width) / 2, "the KV cache (lower --ctx)") {}
  // The cache the spec asks for, `seqs` regions of ctx positions: its own layout when it has one, else
  // keys and values. Layer l's keys of region r are at k_ + (l * seqs + r) * region bytes.
  KVCache(Backend& be, KvType type, const ModelSpec& s, int64_t ctx, int64_t seqs = 1)
      : type_(type), ctx_(ctx), width_(s.n_kv_head * s.head_dim), seqs_(seqs) {
    STRATA_CHECK(seqs >= 1, ConfigError, "the KV cache needs at least one sequence region, got ", seqs);
    if (s.kv_layers.empty()) {
      k_ = DeviceBuffer(be, bytes(type, s.L, ctx, width_, seqs) / 2, "the KV cache (lower --ctx)");
      if (s.kv_values_are_keys)
        values_are_keys_ = true;
      else
        v_ = DeviceBuffer(be, bytes(type, s.L, ctx, width_, seqs) / 2, "the KV cache (lower --ctx)");
      return;
    }
    size_t off = 0;
    for (const auto& layer : s.kv_layers) {
      offsets_.emplace_back();
      for (const auto& t : layer) {
        offsets_.back().emplace_back(t.name, off);
        off += align_up(tensor_bytes(t, ctx));
      }
    }
    own_region_ = off;
    own_ = DeviceBuffer(be, checked_regions(off, seqs, ctx), "the KV cache (lower --ctx)");
  }
  // Keys and values together, for `seqs` regions.
  static size_t bytes(KvType t, int64_t L, int64_t ctx, int64_t width, int64_t seqs = 1) {
    size_t n = 2 * kv_elem_bytes(t);
    for (int64_t f : {L, ctx, width, seqs})
      STRATA_CHECK(f >= 0 && !__builtin_mul_overflow(n, (size_t)f, &n), MemoryError,
                   "a KV cache of ctx=", ctx, " for ", L, " layers of width ", width, " in ", seqs,
                   " sequence regions does not fit in memory; lower --ctx");
    return n;
  }
  static size_t bytes(KvType t, const ModelSpec& s, int64_t ctx, int64_t seqs = 1) {
    if (s.kv_layers.empty())
      return bytes(t, s.L, ctx, s.n_kv_head * s.head_dim, seqs) / (s.kv_values_are_keys ? 2 : 1);
    size_t n = 0;
    for (const auto& layer : s.kv_layers)
      for (const auto& k : layer)
        STRATA_CHECK(!__builtin_add_overflow(n, align_up(tensor_bytes(k, ctx)), &n), MemoryError,
                     "a KV cache of ctx=", ctx, " for ", s.L, " layers does not fit in memory; lower --ctx");
    return checked_regions(n, seqs, ctx);
  }
  static int64_t tensor_rows(const KvTensorSpec& t, int64_t ctx) {
    return t.rows + (t.ctx_div > 0 ? (ctx + t.ctx_div - 1) / t.ctx_div : 0);
  }
  KvType type() const { return type_; }
  // Positions of one sequence region.
  int64_t ctx() const { return ctx_; }
  int64_t seqs() const { return seqs_; }
  // The region that k(l), v(l) and tensor() read: the sequence a (single-sequence) pass runs.
  void select(int64_t seq) {
    STRATA_CHECK(seq >= 0 && seq < seqs_, Error, "internal error: KV region ", seq, " of ", seqs_);
    seq_ = seq;
  }
  int64_t selected() const { return seq_; }
  void* k(int64_t layer) const { return k(layer, seq_); }
  void* v(int64_t layer) const { return v(layer, seq_); }
  // Region `seq` of layer `layer` (a batched decode row's).
  void* k(int64_t layer, int64_t seq) const {
    return k_.as<uint8_t>() + region_bytes() * (layer * seqs_ + seq);
  }
  void* v(int64_t layer, int64_t seq) const {
    return (values_are_keys_ ? k_ : v_).as<uint8_t>() + region_bytes() * (layer * seqs_ + seq);
  }
  // Tensor `name` of `layer` of the selected region in an architecture's own layout.
  float* tensor(int64_t layer, const std::string& name) const { return tensor(layer, name, seq_); }
  // The same of region `seq` (a batched decode row's).
  float* tensor(int64_t layer, const std::string& name, int64_t seq) const {
    STRATA_CHECK(seq >= 0 && seq < seqs_, Error, "internal error: KV region ", seq, " of ", seqs_);
    for (const auto& [n, off] : offsets_.at(layer))
      if (n == name) return reinterpret_cast<float*>(own_.as<uint8_t>() + own_region_ * seq + off);
    throw Error(str("internal error: KV cache of layer ", layer, " has no tensor '", name, "'"));
  }
  size_t total_bytes() const { return k_.size() + v_.size() + own_.size(); }

 private:
  // Bounded like bytes(): a crafted file's window or width cannot wrap the size around.
  static size_t tensor_bytes(const KvTensorSpec& t, int64_t ctx) {
    const int64_t rows = tensor_rows(t, ctx);
    size_t n = sizeof(float);
    for (int64_t f : {rows, t.width})
      STRATA_CHECK(f >= 0 && !__builtin_mul_overflow(n, (size_t)f, &n) && n < (size_t{1} << 62), MemoryError,
                   "the KV cache tensor '", t.name, "' of ctx=", ctx, " (", rows, " rows of ", t.width,
                   ") does not fit in memory; lower --ctx");
    return n;
  }
  static size_t checked_regions(size_t region, int64_t seqs, int64_t ctx) {
    size_t n = 0;
    STRATA_CHECK(seqs >= 0 && !__builtin_mul_overflow(region, (size_t)seqs, &n), MemoryError,
                 "a KV cache of ctx=", ctx, " in ", seqs,
                 " sequence regions does not fit in memory; lower --ctx");
    return n;
  }
  size_t region_bytes() const { return (size_t)ctx_ * width_ * kv_elem_bytes(type_); }
  KvType type_;
  int64_t ctx_, width_;
  int64_t seqs_ = 1, seq_ = 0;
  bool values_are_keys_ = false;  // v() is k() (ModelSpec::kv_values_are_keys)
  size_t own_region_ = 0;         // bytes of one region of an architecture's own layout
  DeviceBuffer k_, v_, own_;
  std::vector<std::vector<std::pair<std::string, size_t>>> offsets_;
};

}  // namespace strata
