// The host side of an expert's fill from a source the copy engine cannot read (the mapped file of a
// model larger than RAM): the expert's segments copied into a pinned staging buffer by several
// threads, so the page cache (or the disk behind it) is read at the memory's rate rather than one
// core's memcpy.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/thread_pool.h"
#include "expert_cache/expert_source.h"

namespace strata {

// Bytes a thread copies at a time: large enough that handing out pieces costs nothing next to them,
// small enough that an expert of a few MiB spreads over every thread.
constexpr size_t kStagePiece = size_t(512) << 10;

// dst + c[i].dst_off <- c[i].src (c[i].bytes) for i < n, in kStagePiece pieces over pool's threads.
void stage_copy(ThreadPool& pool, uint8_t* dst, const ExpertCopy* c, int n);

// Threads the staging copies use: every core up to 8 (a memcpy thread reads ~10 GB/s; 8 cover the
// host link's ~55 GB/s with room for page faults).
int stage_threads();

}  // namespace strata
