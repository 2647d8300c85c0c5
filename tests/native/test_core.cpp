// Core utilities: thread pool coverage and fp16/bf16 conversions.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <vector>

#include "core/half.h"
#include "core/memory.h"
#include "core/thread_pool.h"

using namespace strata;

TEST(ThreadPool, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 7, 64, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, 3, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
    }
  }
}

// Jobs handed over back to back, of every size against the grain: under scripts/sanitize's
// ThreadSanitizer run this is the pool's race check (start, drain, done, the next job).
TEST(ThreadPool, BackToBackJobsSumInAFixedOrder) {
  ThreadPool pool(4);
  std::vector<int64_t> out(257);
  for (int round = 0; round < 300; ++round) {
    const int64_t n = 1 + round % 257, grain = 1 + round % 5;
    pool.parallel_for(n, grain, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) out[i] = i * round;
    });
    int64_t sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += out[i];
    ASSERT_EQ(sum, round * n * (n - 1) / 2) << "round " << round;
  }
}

TEST(Half, RoundTripsEveryFiniteHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if (((h >> 10) & 0x1f) == 0x1f) continue;  // inf / nan
    const float f = fp16_to_f32((uint16_t)h);
    ASSERT_EQ(f32_to_fp16(f), (uint16_t)h) << std::hex << h;
  }
  EXPECT_EQ(fp16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_fp16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
}

// resident_bytes counts the pages in RAM: of an anonymous mapping, the ones touched.
TEST(Memory, ResidentBytesCountsTouchedPages) {
  const long ps = sysconf(_SC_PAGESIZE);
  ASSERT_GT(ps, 0);
  const size_t page = (size_t)ps, n = 16;
  void* m = mmap(nullptr, n * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* p = static_cast<uint8_t*>(m);
  EXPECT_EQ(resident_bytes(p, n * page), 0u);
  for (size_t i : {0, 5, 9}) p[i * page + 7] = 1;
  EXPECT_EQ(resident_bytes(p, n * page), 3 * page);
  // A range ending inside a touched page counts that page's bytes within the range only.
  EXPECT_EQ(resident_bytes(p, 5 * page + 100), page + 100);
  EXPECT_EQ(resident_bytes(p, 9 * page + 100), 2 * page + 100);
  EXPECT_EQ(resident_bytes(p + 1, page), 0u);  // not page-aligned: unknown
  munmap(m, n * page);
}
