// KVCache: keys and values of every layer for ctx positions, allocated once at load.
#pragma once
#include <cstdint>

#include "backend/backend.h"
#include "core/error.h"

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
  // Keys and values together.
  static size_t bytes(KvType t, int64_t L, int64_t ctx, int64_t width) {
    size_t n = 2 * kv_elem_bytes(t);
    for (int64_t f : {L, ctx, width})
      STRATA_CHECK(f >= 0 && !__builtin_mul_overflow(n, (size_t)f, &n), MemoryError,
                   "a KV cache of ctx=", ctx, " for ", L, " layers of width ", width,
                   " does not fit in memory; lower --ctx");
    return n;
  }
  KvType type() const { return type_; }
  int64_t ctx() const { return ctx_; }
  void* k(int64_t layer) const { return k_.as<uint8_t>() + layer_bytes() * layer; }
  void* v(int64_t layer) const { return v_.as<uint8_t>() + layer_bytes() * layer; }
  size_t total_bytes() const { return k_.size() + v_.size(); }

 private:
  size_t layer_bytes() const { return (size_t)ctx_ * width_ * kv_elem_bytes(type_); }
  KvType type_;
  int64_t ctx_, width_;
  DeviceBuffer k_, v_;
};

}  // namespace strata
