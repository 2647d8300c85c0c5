// The device side's one description of each weight format: per-element decoding that repeats
// quant/formats.cpp's float32 operations in the same order (so it is bit-identical to the CPU and to
// gguf's numpy), and the type switch of embed and dequant_rows. (The matmul kernels decode through
// quant/unit_decode.h.)
//
// Every float operation here is an explicit __fmul_rn / __fadd_rn / __fsub_rn, which nvcc never
// contracts into an fma, so the values do not depend on the -fmad setting of the including file.
// When quant/formats.h (block structs and decode helpers for host and device) lands, this header is
// the one place to switch over to it.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/common.cuh"
#include "core/error.h"
#include "quant/iq2xs_grid.h"
#include "quant/quant.h"

namespace strata::cuda {

// ---- raw fields. Block fields are read byte by byte: blocks are 34, 74 or 210 bytes long, and a row
// may start at any offset (dequant_rows takes any row stride), so no wider alignment is promised. ----

__device__ __forceinline__ uint16_t u16_at(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
// Exact: every fp16 value is a float32 value.
__device__ __forceinline__ float half_bits_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float half_at(const uint8_t* p) { return half_bits_to_f32(u16_at(p)); }
__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

// ggml's get_scale_min_k4: sub-block j's 6-bit scale and min of a Q4_K super-block.
__device__ __forceinline__ void q4_k_scale_min(int j, const uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// The IQ2_XS codebook in device memory, copied from quant/iq2xs_grid.h at compile time. Global
// memory rather than __constant__: lanes index it at random, which constant memory serializes.
struct Iq2xsGrid {
  uint64_t v[512];
};
constexpr Iq2xsGrid make_iq2xs_grid() {
  Iq2xsGrid g{};
  for (int i = 0; i < 512; ++i) g.v[i] = kIq2xsGrid[i];
  return g;
}
__device__ const Iq2xsGrid kIq2xsGridDev = make_iq2xs_grid();

// ggml's ksigns_iq2xs[k]: the 7 sign bits of k plus an 8th that makes the count of minuses even.
__device__ __forceinline__ unsigned iq2_xs_signs(unsigned k) { return k | ((__popc(k) & 1u) << 7); }

// ---- q8_0 activation rows (the MMQ layout): BlockQ8_0 blocks, fp16 d then 32 int8 ----

constexpr int64_t kQ8Block = sizeof(BlockQ8_0);
__device__ __forceinline__ float q8_0_d(const uint8_t* blk) { return half_at(blk + offsetof(BlockQ8_0, d)); }
__device__ __forceinline__ int q8_0_q(const uint8_t* blk, int l) {
  return static_cast<int8_t>(blk[offsetof(BlockQ8_0, qs) + l]);
}
// Lane l of a warp stores quant l of a block; lane 0 also its scale (fp16 bits). Byte stores, as the
// reads: activation rows may be any number of bytes apart.
__device__ __forceinline__ void q8_0_store(uint8_t* blk, int l, uint16_t d_bits, int q) {
  if (l == 0) {
    blk[offsetof(BlockQ8_0, d)] = static_cast<uint8_t>(d_bits & 0xFF);
    blk[offsetof(BlockQ8_0, d) + 1] = static_cast<uint8_t>(d_bits >> 8);
  }
  blk[offsetof(BlockQ8_0, qs) + l] = static_cast<uint8_t>(static_cast<int8_t>(q));
}

// ---- the formats. Each: kType, kBlock (elements per block), kBytes (bytes per block) and
// elem(row, i): element i of a row, as formats.cpp computes it. ----

struct DecF32 {
  static constexpr QType kType = QType::F32;
  static constexpr int64_t kBlock = 1, kBytes = 4;
  __device__ static float elem(const uint8_t* row, int64_t i) {
    return reinterpret_cast<const float*>(row)[i];
  }
};

struct DecF16 {
  static constexpr QType kType = QType::F16;
  static constexpr int64_t kBlock = 1, kBytes = 2;
  __device__ static float elem(const uint8_t* row, int64_t i) {
    return half_bits_to_f32(reinterpret_cast<const uint16_t*>(row)[i]);
  }
};

struct DecBF16 {
  static constexpr QType kType = QType::BF16;
  static constexpr int64_t kBlock = 1, kBytes = 2;
  __device__ static float elem(const uint8_t* row, int64_t i) {
    return bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(row)[i]);
  }
};

// BlockQ8_0: d (fp16), qs[32]. gguf: x * d.
struct DecQ8_0 {
  static constexpr QType kType = QType::Q8_0;
  static constexpr int64_t kBlock = 32, kBytes = sizeof(BlockQ8_0);
  __device__ static float elem(const uint8_t* row, int64_t i) {
    const uint8_t* b = row + (i / 32) * kBytes;
    return __fmul_rn(static_cast<float>(q8_0_q(b, static_cast<int>(i % 32))), q8_0_d(b));
  }
};

// BlockQ4_K: d, dmin (fp16), scales[12] (packed 6-bit), qs[128] (4-bit). gguf: d*sc and dmin*m
// rounded to float32 first, then (d*sc)*q - dmin*m.
struct DecQ4_K {
  static constexpr QType kType = QType::Q4_K;
  static constexpr int64_t kBlock = kQK_K, kBytes = sizeof(BlockQ4_K);
  static constexpr int kD = offsetof(BlockQ4_K, d), kDmin = offsetof(BlockQ4_K, dmin);
  static constexpr int kScales = offsetof(BlockQ4_K, scales), kQs = offsetof(BlockQ4_K, qs);
  __device__ static float elem(const uint8_t* row, int64_t i) {
    const uint8_t* b = row + (i / kQK_K) * kBytes;
    const int r = static_cast<int>(i % kQK_K), j = r / 32, l = r % 32;
    int sc, m;
    q4_k_scale_min(j, b + kScales, sc, m);
    const float ds = __fmul_rn(half_at(b + kD), static_cast<float>(sc));
    const float dm = __fmul_rn(half_at(b + kDmin), static_cast<float>(m));
    const int q = (b[kQs + (j / 2) * 32 + l] >> ((j % 2) * 4)) & 0xF;
    return __fsub_rn(__fmul_rn(ds, static_cast<float>(q)), dm);
  }
};

// BlockQ6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] (int8), d (fp16). gguf:
// (d * scale) rounded to float32, then times q in [-32, 31].
struct DecQ6_K {
  static constexpr QType kType = QType::Q6_K;
  static constexpr int64_t kBlock = kQK_K, kBytes = sizeof(BlockQ6_K);
  static constexpr int kQh = offsetof(BlockQ6_K, qh), kScales = offsetof(BlockQ6_K, scales),
                       kD = offsetof(BlockQ6_K, d);
  // Quant l (0..31) of the 32-element group k (0..3) of half h (0..1), in [-32, 31].
  __device__ static int quant(const uint8_t* b, int h, int k, int l) {
    const uint8_t* ql = b + offsetof(BlockQ6_K, ql) + h * 64 + (k % 2) * 32;
    const uint8_t* qh = b + kQh + h * 32;
    return (((ql[l] >> ((k / 2) * 4)) & 0xF) | (((qh[l] >> (k * 2)) & 3) << 4)) - 32;
  }
  __device__ static int scale(const uint8_t* b, int idx) { return static_cast<int8_t>(b[kScales + idx]); }
  __device__ static float elem(const uint8_t* row, int64_t i) {
    const uint8_t* b = row + (i / kQK_K) * kBytes;
    const int r = static_cast<int>(i % kQK_K), h = r / 128, k = (r % 128) / 32, s = (r % 32) / 16;
    const float ds = __fmul_rn(half_at(b + kD), static_cast<float>(scale(b, h * 8 + k * 2 + s)));
    return __fmul_rn(ds, static_cast<float>(quant(b, h, k, r % 32)));
  }
};

// BlockIQ2_XS: d (fp16), qs[32] (9-bit grid index | 7-bit sign index per 8 elements), scales[8]
// (two 4-bit scales per byte). gguf: db = d * (0.5 + scale) * 0.25, then (db * grid) * (+-1).
struct DecIQ2_XS {
  static constexpr QType kType = QType::IQ2_XS;
  static constexpr int64_t kBlock = kQK_K, kBytes = sizeof(BlockIQ2_XS);
  static constexpr int kD = offsetof(BlockIQ2_XS, d), kQs = offsetof(BlockIQ2_XS, qs),
                       kScales = offsetof(BlockIQ2_XS, scales);
  // Element e (0..7) of the 8 that qs[idx] codes: magnitude and whether it is negative.
  __device__ static int magnitude(uint16_t q, int e) {
    return static_cast<int>((kIq2xsGridDev.v[q & 511] >> (8 * e)) & 0xFF);
  }
  __device__ static bool negative(uint16_t q, int e) { return (iq2_xs_signs(q >> 9) >> e) & 1; }
  __device__ static float elem(const uint8_t* row, int64_t i) {
    const uint8_t* b = row + (i / kQK_K) * kBytes;
    const int r = static_cast<int>(i % kQK_K), g = r / 16, k = (r % 16) / 8, e = r % 8;
    const int sc = (b[kScales + g / 2] >> ((g % 2) * 4)) & 0xF;
    const float db = __fmul_rn(__fmul_rn(half_at(b + kD), __fadd_rn(0.5f, static_cast<float>(sc))), 0.25f);
    const uint16_t q = u16_at(b + kQs + (g * 2 + k) * 2);
    const float v = __fmul_rn(db, static_cast<float>(magnitude(q, e)));
    return __fmul_rn(v, negative(q, e) ? -1.0f : 1.0f);  // a multiply, as numpy does
  }
};

// ---- the type switch of embed and dequant_rows (the matmul kernels have theirs in matmul_kernels.cuh) ----

// Calls f(Dec{}) with the decoder of ggml type `type`; UnsupportedError naming `what` otherwise.
template <class F>
void dispatch_type(uint32_t type, const char* what, F&& f) {
  switch (static_cast<QType>(type)) {
    case QType::F32:
      return f(DecF32{});
    case QType::F16:
      return f(DecF16{});
    case QType::BF16:
      return f(DecBF16{});
    case QType::Q8_0:
      return f(DecQ8_0{});
    case QType::Q4_K:
      return f(DecQ4_K{});
    case QType::Q6_K:
      return f(DecQ6_K{});
    case QType::IQ2_XS:
      return f(DecIQ2_XS{});
  }
  quant_traits(type, what);  // throws, naming the type and the supported ones
  throw UnsupportedError(str(what, ": the CUDA backend has no kernel for ggml type ", type));
}

// Float rows are read with element-wide loads: their base and stride must be aligned to them.
template <class Dec>
void check_row_alignment(const void* p, size_t row_stride, const char* what) {
  if constexpr (Dec::kBlock == 1) {
    STRATA_CHECK(reinterpret_cast<uintptr_t>(p) % Dec::kBytes == 0 && row_stride % Dec::kBytes == 0,
                 ConfigError, what, ": rows of ", Dec::kBytes, "-byte elements at ", p, ", ", row_stride,
                 " bytes apart, are not aligned to their element size");
  }
}

}  // namespace strata::cuda
