// Aligned host memory: the buffers the CPU backend uses as "device memory".
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

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

// The bytes of [base, base + bytes) (a mapping; base page-aligned) whose pages are in RAM now: for a file
// mapping, in the page cache (a file in /dev/shm or recently read is all resident). 0 where it cannot
// be told (mincore failed, or not Linux): the caller then counts every byte as needing RAM.
inline uint64_t resident_bytes(const void* base, size_t bytes) {
#if defined(__linux__)
  const long ps = sysconf(_SC_PAGESIZE);
  if (ps <= 0 || reinterpret_cast<uintptr_t>(base) % (uintptr_t)ps != 0) return 0;
  const size_t page = (size_t)ps, pages = (bytes + page - 1) / page, per = (size_t)1 << 18;  // 1 GiB of 4K
  std::vector<unsigned char> v(std::min(pages, per));
  uint64_t resident = 0;
  for (size_t p0 = 0; p0 < pages; p0 += per) {
    const size_t n = std::min(per, pages - p0);
    if (mincore(const_cast<uint8_t*>(static_cast<const uint8_t*>(base)) + p0 * page, n * page, v.data()) != 0)
      return 0;
    for (size_t i = 0; i < n; ++i)
      if (v[i] & 1) resident += std::min<uint64_t>(page, bytes - (p0 + i) * page);
  }
  return resident;
#else
  (void)base;
  (void)bytes;
  return 0;
#endif
}

}  // namespace strata
