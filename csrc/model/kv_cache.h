// KVCache: keys and values of every layer for ctx positions, allocated once at load.
#pragma once
#include <cstdint>

#include "backend/backend.h"

namespace strata {

class KVCache {
 public:
  // L layers of [ctx, width] floats for keys and for values.
  KVCache(Backend& be, int64_t L, int64_t ctx, int64_t width)
      : ctx_(ctx),
        width_(width),
        k_(be, bytes(L, ctx, width), "the KV cache (lower --ctx)"),
        v_(be, bytes(L, ctx, width), "the KV cache (lower --ctx)") {}
  static size_t bytes(int64_t L, int64_t ctx, int64_t width) { return (size_t)L * ctx * width * sizeof(float); }
  int64_t ctx() const { return ctx_; }
  float* k(int64_t layer) const { return k_.as<float>() + (size_t)layer * ctx_ * width_; }
  float* v(int64_t layer) const { return v_.as<float>() + (size_t)layer * ctx_ * width_; }
  size_t total_bytes() const { return k_.size() + v_.size(); }

 private:
  int64_t ctx_, width_;
  DeviceBuffer k_, v_;
};

}  // namespace strata
