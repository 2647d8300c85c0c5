// Shared-memory staging and tensor-core primitives of the matmul kernels: rows of weight or
// activation bytes copied into shared memory by 16-byte cp.async whatever their alignment, fp16
// packing, ldmatrix and mma.sync. All of it is sm_80 and later: every architecture strata builds for.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace strata::cuda {

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ---- cp.async: the copy engine of each SM writes shared memory while the threads go on ----

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {  // both 16-byte aligned
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {  // both 4-byte aligned
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- rows of bytes into shared memory ----

// A staged row keeps its address modulo 16: the byte at p lands stage_head(p) bytes into the row's
// 16-byte-aligned copy, so every field keeps its alignment.
__device__ __forceinline__ int stage_head(const uint8_t* p) {
  return static_cast<int>(reinterpret_cast<uintptr_t>(p) & 15);
}
// Pieces of 16 bytes that hold n bytes at any alignment.
constexpr int stage_pieces(int n) { return (n + 15 + 15) / 16; }

// Copies the bytes [off, off + n) of rows i < count (row i at src + i * stride) to
// dst + i * 16 * kPieces + stage_head(src + i * stride + off), n <= 16 * kPieces - 15. The 16-byte
// aligned pieces that cover them go by cp.async where they lie inside [lo, hi), the readable
// extent of the source; pieces that reach past either end (at most the first and the last of the
// whole source) go byte by byte. Threads tid, tid + nthreads, ... share the pieces. The caller
// commits the group, waits for it and syncs before reading.
template <int kPieces>
__device__ __forceinline__ void stage_rows(uint8_t* dst, const uint8_t* src, size_t stride, int count,
                                           size_t off, int n, const uint8_t* lo, const uint8_t* hi, int tid,
                                           int nthreads) {
  const uintptr_t lo_a = reinterpret_cast<uintptr_t>(lo), hi_a = reinterpret_cast<uintptr_t>(hi);
  for (int it = tid; it < count * kPieces; it += nthreads) {
    const int i = it / kPieces, k = it % kPieces;
    const uintptr_t first = reinterpret_cast<uintptr_t>(src + static_cast<size_t>(i) * stride + off);
    const uintptr_t p = (first & ~uintptr_t{15}) + 16 * static_cast<uintptr_t>(k);
    if (p >= first + static_cast<uintptr_t>(n)) continue;
    uint8_t* d = dst + i * 16 * kPieces + 16 * k;
    if (p >= lo_a && p + 16 <= hi_a) {
      cp_async16(d, reinterpret_cast<const void*>(p));
    } else {
      for (int b = 0; b < 16; ++b)
        if (p + b >= lo_a && p + b < hi_a) d[b] = *reinterpret_cast<const uint8_t*>(p + b);
    }
  }
}

// The 16 bytes at p (16-byte aligned) by one load where they lie inside [lo, hi), the source's readable
// extent; else (at most its first and last piece) byte by byte, the bytes outside as zeros, never read.
__device__ __forceinline__ uint4 ld_piece16(uintptr_t p, uintptr_t lo, uintptr_t hi) {
  if (p >= lo && p + 16 <= hi) return *reinterpret_cast<const uint4*>(p);
  uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
  for (int b = 0; b < 16; ++b)
    if (p + b >= lo && p + b < hi)
      w[b / 4] |= uint32_t{*reinterpret_cast<const uint8_t*>(p + b)} << (8 * (b % 4));
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// stage_rows by plain 16-byte loads into registers, kPer a thread in flight at a time, then stores to dst:
// the same bytes at the same places, in dst when the caller's barrier has passed (no cp.async group). For
// a source in host memory (the write-through's pending rows): ncu and the 30B 1 GiB decode measured the
// cp.async staging of such rows at ~25 GB/s of the link where the float GEMV's register loads of the same
// rows reach ~34 (bench/NOTES.md, stop 45), so mmvq_experts' write-through takes this under
// STRATA_CUDA_WT_LD=1.
template <int kPieces, int kPer>
__device__ __forceinline__ void stage_rows_ld(uint8_t* dst, const uint8_t* src, size_t stride, int count,
                                              size_t off, int n, const uint8_t* lo, const uint8_t* hi,
                                              int tid, int nthreads) {
  const uintptr_t lo_a = reinterpret_cast<uintptr_t>(lo), hi_a = reinterpret_cast<uintptr_t>(hi);
  const int total = count * kPieces;
  for (int base = 0; base < total; base += kPer * nthreads) {
    uint4 v[kPer];
    bool live[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int it = base + tid + j * nthreads, i = it / kPieces, k = it % kPieces;
      const uintptr_t first = reinterpret_cast<uintptr_t>(src + static_cast<size_t>(i) * stride + off);
      const uintptr_t p = (first & ~uintptr_t{15}) + 16 * static_cast<uintptr_t>(k);
      live[j] = it < total && p < first + static_cast<uintptr_t>(n);
      if (live[j]) v[j] = ld_piece16(p, lo_a, hi_a);
    }
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (!live[j]) continue;
      const int it = base + tid + j * nthreads;
      *reinterpret_cast<uint4*>(dst + (it / kPieces) * 16 * kPieces + 16 * (it % kPieces)) = v[j];
    }
  }
}

// Write-through of what stage_rows staged from a source the slot has not received (ExpertTable::pending): row
// i's bytes [off, off + n) from its staged pieces (dst + i * 16 kPieces, as stage_rows laid them out from
// src) to the same bytes of slot, whose rows lie as src's modulo 16 (ExpertCache::write_through's condition):
// whole 16-byte pieces as one store, the row's ends byte by byte. After the staging has completed (the
// caller's barrier); the staged bytes stay for the product.
template <int kPieces>
__device__ __forceinline__ void write_back_rows(const uint8_t* dst, uint8_t* slot, const uint8_t* src,
                                                size_t stride, int count, size_t off, int n, int tid,
                                                int nthreads) {
  for (int it = tid; it < count * kPieces; it += nthreads) {
    const int i = it / kPieces, k = it % kPieces;
    const uintptr_t first = reinterpret_cast<uintptr_t>(src + static_cast<size_t>(i) * stride + off);
    const uintptr_t p = (first & ~uintptr_t{15}) + 16 * static_cast<uintptr_t>(k);
    if (p >= first + static_cast<uintptr_t>(n)) continue;
    const uint8_t* d = dst + i * 16 * kPieces + 16 * k;
    uint8_t* out = slot + static_cast<size_t>(i) * stride + off;  // the row's first byte, as `first`
    if (p >= first && p + 16 <= first + static_cast<uintptr_t>(n)) {
      *reinterpret_cast<uint4*>(out + (p - first)) = *reinterpret_cast<const uint4*>(d);
    } else {
      for (int b = 0; b < 16; ++b)
        if (p + b >= first && p + b < first + static_cast<uintptr_t>(n)) out[p + b - first] = d[b];
    }
  }
}

// ---- fp16 tiles and the tensor cores ----

// The largest finite fp16. Values beyond it are clamped rather than rounded to inf, which a zero
// weight would turn into NaN; NaN stays NaN.
constexpr float kHalfMax = 65504.0f;
__device__ __forceinline__ float clamp_half(float v) {
  return fabsf(v) > kHalfMax ? copysignf(kHalfMax, v) : v;
}
// Two floats as the halves of one word (a in the low half), rounded to nearest.
__device__ __forceinline__ uint32_t pack_half2(float a, float b) {
  const __half2 h = __floats2half2_rn(clamp_half(a), clamp_half(b));
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Four 8 x 8 fp16 matrices from shared memory: thread i gives the address of row i % 8 of matrix
// i / 8 (16 bytes, 16-byte aligned); r[j] holds, in thread t, elements (t / 4, 2 (t % 4) + {0, 1})
// of matrix j.
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

// The same four matrices transposed: r[j] holds, in thread t, elements (2 (t % 4) + {0, 1}, t / 4) of
// matrix j (the B operand of mma_16816 from a row-major k x n tile).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

// c += a b for a 16 x 16 fp16 tile a and a 16 x 8 fp16 tile b, c in fp32 (thread t = 4 g + q holds
// c[0..1] = rows g, columns 2q, 2q + 1 and c[2..3] = row g + 8, the same columns).
__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

}  // namespace strata::cuda
