// KVCache: keys and values of every layer for ctx positions, allocated once at load; or, for an
// architecture that lays its cache out itself (ModelSpec::kv_layers), its named float32 tensors.
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
  // L layers of [ctx, width] elements of `type` for keys and for values.
  KVCache(Backend& be, KvType type, int64_t L, int64_t ctx, int64_t width)
      : type_(type),
        ctx_(ctx),
        width_(width),
        k_(be, bytes(type, L, ctx, width) / 2, "the KV cache (lower --ctx)"),
        v_(be, bytes(type, L, ctx, width) / 2, "the KV cache (lower --ctx)") {}
  // The cache the spec asks for: its own layout when it has one, else keys and values.
  KVCache(Backend& be, KvType type, const ModelSpec& s, int64_t ctx)
      : type_(type), ctx_(ctx), width_(s.n_kv_head * s.head_dim) {
    if (s.kv_layers.empty()) {
      k_ = DeviceBuffer(be, bytes(type, s.L, ctx, width_) / 2, "the KV cache (lower --ctx)");
      v_ = DeviceBuffer(be, bytes(type, s.L, ctx, width_) / 2, "the KV cache (lower --ctx)");
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
    own_ = DeviceBuffer(be, off, "the KV cache (lower --ctx)");
  }
  // Keys and values together.
  static size_t bytes(KvType t, int64_t L, int64_t ctx, int64_t width) {
    size_t n = 2 * kv_elem_bytes(t);
    for (int64_t f : {L, ctx, width})
      STRATA_CHECK(f >= 0 && !__builtin_mul_overflow(n, (size_t)f, &n), MemoryError,
                   "a KV cache of ctx=", ctx, " for ", L, " layers of width ", width,
                   " does not fit in memory; lower --ctx");
    return n;
  }
  static size_t bytes(KvType t, const ModelSpec& s, int64_t ctx) {
    if (s.kv_layers.empty()) return bytes(t, s.L, ctx, s.n_kv_head * s.head_dim);
    size_t n = 0;
    for (const auto& layer : s.kv_layers)
      for (const auto& k : layer)
        STRATA_CHECK(!__builtin_add_overflow(n, align_up(tensor_bytes(k, ctx)), &n), MemoryError,
                     "a KV cache of ctx=", ctx, " for ", s.L, " layers does not fit in memory; lower --ctx");
    return n;
  }
  static int64_t tensor_rows(const KvTensorSpec& t, int64_t ctx) {
    return t.rows + (t.ctx_div > 0 ? (ctx + t.ctx_div - 1) / t.ctx_div : 0);
  }
  KvType type() const { return type_; }
  int64_t ctx() const { return ctx_; }
  void* k(int64_t layer) const { return k_.as<uint8_t>() + layer_bytes() * layer; }
  void* v(int64_t layer) const { return v_.as<uint8_t>() + layer_bytes() * layer; }
  // Tensor `name` of `layer` in an architecture's own layout.
  float* tensor(int64_t layer, const std::string& name) const {
    for (const auto& [n, off] : offsets_.at(layer))
      if (n == name) return reinterpret_cast<float*>(own_.as<uint8_t>() + off);
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
  size_t layer_bytes() const { return (size_t)ctx_ * width_ * kv_elem_bytes(type_); }
  KvType type_;
  int64_t ctx_, width_;
  DeviceBuffer k_, v_, own_;
  std::vector<std::vector<std::pair<std::string, size_t>>> offsets_;
};

}  // namespace strata
