#include "expert_cache/stage_copy.h"

#include <algorithm>
#include <cstring>

namespace strata {

void stage_copy(ThreadPool& pool, uint8_t* dst, const ExpertCopy* c, int n) {
  int64_t first[4] = {0, 0, 0, 0};  // the first piece of each segment, in one index space
  for (int i = 0; i < n; ++i)
    first[i + 1] = first[i] + static_cast<int64_t>((c[i].bytes + kStagePiece - 1) / kStagePiece);
  pool.parallel_for(first[n], 1, [&](int64_t b, int64_t e, int) {
    for (int64_t p = b; p < e; ++p) {
      const int i = static_cast<int>(std::upper_bound(first, first + n + 1, p) - first) - 1;
      const size_t off = static_cast<size_t>(p - first[i]) * kStagePiece;
      std::memcpy(dst + c[i].dst_off + off, c[i].src + off, std::min(kStagePiece, c[i].bytes - off));
    }
  });
}

int stage_threads() { return std::min(8, ThreadPool::default_threads()); }

}  // namespace strata
