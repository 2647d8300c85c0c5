// Prefill plan: one ordered list of buffer specs per (T, src), the only place chunk scratch is sized.
#include "prefill/prefill.h"

#include <algorithm>
#include <climits>

#include "core/error.h"
#include "core/memory.h"
#include "quant/formats.h"

namespace strata {

namespace {
// No single buffer may exceed 2^56 bytes: far beyond any memory, and small enough that the sum of
// a plan's buffers cannot wrap size_t.
constexpr size_t kMaxBuffer = size_t(1) << 56;
}  // namespace

const char* moe_layout_name(MoeLayout l) { return l == MoeLayout::Fused ? "fused" : "mmq"; }

void set_expert_kernels(PrefillShape& s, bool (*uses_q8)(uint32_t ggml_type)) {
  STRATA_CHECK(s.expert_types.size() % 3 == 0, ConfigError,
               "expert_types holds (gate, up, down) per layer, got ", s.expert_types.size(), " types");
  s.q8_gate_up = s.float_gate_up = s.q8_down = false;
  for (size_t i = 0; i + 2 < s.expert_types.size(); i += 3) {
    for (size_t j = i; j < i + 2; ++j) (uses_q8(s.expert_types[j]) ? s.q8_gate_up : s.float_gate_up) = true;
    s.q8_down = s.q8_down || uses_q8(s.expert_types[i + 2]);
  }
}

Prefill::Prefill(PrefillShape shape) : shape_(std::move(shape)) {
  const auto& s = shape_;
  STRATA_CHECK(s.D > 0 && s.HC > 0 && s.E > 0 && s.K > 0 && s.K <= s.E && s.F > 0 && s.n_head > 0 &&
                   s.n_kv_head > 0 && s.head_dim > 0,
               ConfigError, "prefill shape out of range: D=", s.D, " HC=", s.HC, " E=", s.E, " K=", s.K,
               " F=", s.F, " heads=", s.n_head, "/", s.n_kv_head, " head_dim=", s.head_dim);
}

bool Prefill::fused_supported() const {
  // The fused path runs every expert type strata computes with; the flag exists because
  // other backends (and future types) may not.
  return !shape_.expert_types.empty();
}

MoeLayout Prefill::fused_layout(int64_t /*T*/, bool has_src) const {
  return (has_src && fused_supported()) ? MoeLayout::Fused : MoeLayout::MMQ;
}

PrefillPlan Prefill::layout(int64_t T, bool src) const {
  STRATA_CHECK(T >= 1, ConfigError, "prefill chunk must be at least 1 token, got ", T);
  const auto& s = shape_;
  PrefillPlan p;
  p.T = T;
  p.src = src;
  p.moe = fused_layout(T, src);
  // Sizes are products of the shape and T: each one is checked, so a chunk too large for the address
  // space is an error, not a wrapped size that carves overlapping buffers.
  auto too_large = [&] {
    return MemoryError(str("a prompt chunk of ", T,
                           " tokens is too large to plan for this model (its scratch size overflows); "
                           "use a smaller --prefill"));
  };
  // Row indices (t * K + k) and expert offsets are int32 on every backend.
  int64_t rows = 0;
  if (__builtin_mul_overflow(T, s.K, &rows) || rows > INT32_MAX) throw too_large();
  auto add = [&](const char* name, const char* dtype, std::vector<int64_t> shape, size_t elem_bytes) {
    size_t n = elem_bytes;
    for (int64_t d : shape)
      if (d < 0 || __builtin_mul_overflow(n, (size_t)d, &n) || n > kMaxBuffer) throw too_large();
    p.buffers.push_back(BufferSpec{name, n, dtype, std::move(shape), 0});
  };
  const int64_t Hd = s.n_head * s.head_dim, KVd = s.n_kv_head * s.head_dim;
  add("R", "f32", {T, s.HC, s.D}, 4);
  add("grs", "f32", {T, s.HC}, 4);
  if (s.gr_unfused) add("xn", "f32", {T, s.D}, 4);
  add("attn.q", "f32", {T, s.n_head, s.head_dim}, 4);
  add("attn.k", "f32", {T, s.n_kv_head, s.head_dim}, 4);
  add("attn.v", "f32", {T, s.n_kv_head, s.head_dim}, 4);
  add("attn.out", "f32", {T, Hd}, 4);
  (void)KVd;
  add("proj", "f32", {T, s.D}, 4);
  add("router.logits", "f32", {T, s.E}, 4);
  add("router.ids", "i32", {T, s.K}, 4);
  add("router.weights", "f32", {T, s.K}, 4);
  add("moe.offsets", "i32", {s.E + 1}, 4);
  add("moe.rows", "i32", {T * s.K}, 4);
  if (p.moe == MoeLayout::Fused) {
    // One expert at a time: at most T tokens route to it.
    add("moe.x", "f32", {T, s.D}, 4);
    add("moe.gate", "f32", {T, s.F}, 4);
    add("moe.up", "f32", {T, s.F}, 4);
    add("moe.down", "f32", {T, s.D}, 4);
  } else {
    // All experts in one pass: every (token, k) row gathered, as q8_0 blocks for integer kernels
    // (rows wide enough to hold the down projection's requantized input, F, after gate/up have
    // read theirs, D), as floats for float weights, which are never quantized.
    if (s.q8_gate_up || s.q8_down) {
      STRATA_CHECK(s.D % kQK8_0 == 0 && s.F % kQK8_0 == 0, UnsupportedError,
                   "the MMQ layout needs D and F divisible by 32 (q8_0 blocks), got D=", s.D, " F=", s.F);
      const int64_t width = std::max(s.q8_gate_up ? s.D : 0, s.q8_down ? s.F : 0);
      add("moe.xq", "q8_0", {T * s.K, width / kQK8_0 * kQ8_0Bytes}, 1);
    }
    if (s.float_gate_up) add("moe.x", "f32", {T * s.K, s.D}, 4);
    add("moe.gate", "f32", {T * s.K, s.F}, 4);
    add("moe.up", "f32", {T * s.K, s.F}, 4);
    add("moe.down", "f32", {T * s.K, s.D}, 4);
  }
  size_t off = 0;
  for (auto& b : p.buffers) {
    b.offset = off;
    off += align_up(b.bytes);  // at most ~20 buffers of at most kMaxBuffer: cannot wrap
  }
  p.total = off;
  return p;
}

size_t Prefill::bytes_needed(int64_t T, bool src) const { return layout(T, src).total; }

PrefillBuffers Prefill::carve(void* region, size_t region_bytes, int64_t T, bool src) const {
  const PrefillPlan p = layout(T, src);
  STRATA_CHECK(region != nullptr && region_bytes >= p.total, MemoryError, "prefill region of ", region_bytes,
               " bytes is smaller than the ", p.total, " bytes chunk T=", T, " needs");
  STRATA_CHECK(reinterpret_cast<uintptr_t>(region) % kAlign == 0, ConfigError, "prefill region is not ",
               kAlign, "-byte aligned");
  auto* base = static_cast<uint8_t*>(region);
  PrefillBuffers b;
  b.T = T;
  b.moe = p.moe;
  for (const auto& s : p.buffers) {
    void* ptr = base + s.offset;
    const std::string& n = s.name;
    auto f = static_cast<float*>(ptr);
    auto i = static_cast<int32_t*>(ptr);
    if (n == "R")
      b.R = f;
    else if (n == "grs")
      b.grs = f;
    else if (n == "xn")
      b.xn = f;
    else if (n == "attn.q")
      b.q = f;
    else if (n == "attn.k")
      b.k = f;
    else if (n == "attn.v")
      b.v = f;
    else if (n == "attn.out")
      b.attn = f;
    else if (n == "proj")
      b.proj = f;
    else if (n == "router.logits")
      b.router = f;
    else if (n == "router.ids")
      b.topk_ids = i;
    else if (n == "router.weights")
      b.topk_w = f;
    else if (n == "moe.offsets")
      b.expert_off = i;
    else if (n == "moe.rows")
      b.expert_rows = i;
    else if (n == "moe.x")
      b.xg = f;
    else if (n == "moe.xq")
      b.xq = static_cast<uint8_t*>(ptr), b.xq_row_bytes = (size_t)s.shape[1];
    else if (n == "moe.gate")
      b.hg = f;
    else if (n == "moe.up")
      b.hu = f;
    else if (n == "moe.down")
      b.yd = f;
    else
      throw Error(str("prefill carve: buffer '", n, "' has no destination"));
  }
  return b;
}

}  // namespace strata
