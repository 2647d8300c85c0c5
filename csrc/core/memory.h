// Aligned host memory: the buffers the CPU backend uses as "device memory".
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "core/error.h"

namespace strata {

constexpr size_t kAlign = 256;  // every carved buffer and every slot is 256-byte aligned

inline constexpr size_t align_up(size_t n, size_t a = kAlign) { return (n + a - 1) / a * a; }

// "14900 MiB", "0.25 MiB": sizes in messages, in the unit --expert-cache takes.
inline std::string mib_str(uint64_t bytes) {
  const double mib = bytes / 1048576.0;
  char buf[64];
  std::snprintf(buf, sizeof buf, mib >= 10 || mib == (uint64_t)mib ? "%.0f MiB" : "%.2f MiB", mib);
  return buf;
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using HostBuffer = std::unique_ptr<uint8_t, FreeDeleter>;

// Allocates n bytes aligned to kAlign; throws MemoryError naming what it was for.
inline HostBuffer host_alloc(size_t n, const char* what) {
  if (n == 0) n = kAlign;
  STRATA_CHECK(n <= SIZE_MAX - kAlign, MemoryError, "cannot allocate ", n, " bytes for ", what);
  void* p = std::aligned_alloc(kAlign, align_up(n));
  STRATA_CHECK(p != nullptr, MemoryError, "out of host memory allocating ", n, " bytes for ", what);
  return HostBuffer(static_cast<uint8_t*>(p));
}

}  // namespace strata
