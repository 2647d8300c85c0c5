// Prefill plan: one ordered list of buffer specs per (T, src), the only place chunk scratch is sized.
#include "prefill/prefill.h"

#include <algorithm>
#include <climits>
#include <string_view>
#include <type_traits>

#include "core/error.h"
#include "core/memory.h"
#include "quant/formats.h"

namespace strata {

namespace {
// No single buffer may exceed 2^56 bytes: far beyond any memory, and small enough that the sum of
// a plan's buffers cannot wrap size_t.
constexpr size_t kMaxBuffer = size_t(1) << 56;
}  // namespace

namespace {
// A field of PrefillBuffers of pointer type P* takes the buffer.
template <auto Field>
void bind(PrefillBuffers& b, void* p, const BufferSpec&) {
  using Ptr = std::remove_reference_t<decltype(b.*Field)>;
  b.*Field = static_cast<Ptr>(p);
}
void bind_xq(PrefillBuffers& b, void* p, const BufferSpec& s) {
  b.xq = static_cast<uint8_t*>(p);
  b.xq_row_bytes = (size_t)s.shape[1];
}
void bind_scratch(PrefillBuffers& b, void* p, const BufferSpec& s) { b.scratch[(size_t)s.scratch_index] = p; }
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
  STRATA_CHECK(s.D > 0 && s.HC > 0 && s.E > 0 && s.K > 0 && s.K <= s.E && s.F > 0, ConfigError,
               "prefill shape out of range: D=", s.D, " HC=", s.HC, " E=", s.E, " K=", s.K, " F=", s.F);
  for (const ScratchSpec& b : s.scratch) {
    STRATA_CHECK(!b.name.empty(), ConfigError, "prefill scratch: an architecture buffer has no name");
    for (int64_t d : b.row)
      STRATA_CHECK(d > 0, ConfigError, "prefill scratch '", b.name,
                   "': every dimension must be positive, got ", d);
  }
}

bool Prefill::fused_supported() const {
  // The fused path runs every expert type strata computes with; the flag exists because
  // other backends (and future types) may not.
  return !shape_.expert_types.empty();
}

MoeLayout Prefill::fused_layout(int64_t /*T*/, bool has_src) const {
  return (has_src && fused_supported() && shape_.streamed_fused) ? MoeLayout::Fused : MoeLayout::MMQ;
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
  auto add = [&](const char* name, const char* dtype, std::vector<int64_t> shape, size_t elem_bytes,
                 BindFn to) {
    size_t n = elem_bytes;
    for (int64_t d : shape)
      if (d < 0 || __builtin_mul_overflow(n, (size_t)d, &n) || n > kMaxBuffer) throw too_large();
    p.buffers.push_back(BufferSpec{name, n, dtype, std::move(shape), 0, to, -1});
  };
  add("R", "f32", {T, s.HC, s.D}, 4, bind<&PrefillBuffers::R>);
  add("grs", "f32", {T, s.HC}, 4, bind<&PrefillBuffers::grs>);
  if (s.gr_unfused) add("xn", "f32", {T, s.D}, 4, bind<&PrefillBuffers::xn>);
  // The architecture's buffers: T rows each.
  for (size_t i = 0; i < s.scratch.size(); ++i) {
    const ScratchSpec& a = s.scratch[i];
    std::vector<int64_t> shape{T};
    shape.insert(shape.end(), a.row.begin(), a.row.end());
    add(a.name.c_str(), a.dtype == ScratchType::F32 ? "f32" : "i32", std::move(shape), 4, bind_scratch);
    p.buffers.back().scratch_index = (int32_t)i;
  }
  add("proj", "f32", {T, s.D}, 4, bind<&PrefillBuffers::proj>);
  add("router.logits", "f32", {T, s.E}, 4, bind<&PrefillBuffers::router>);
  add("router.ids", "i32", {T, s.K}, 4, bind<&PrefillBuffers::topk_ids>);
  add("router.weights", "f32", {T, s.K}, 4, bind<&PrefillBuffers::topk_w>);
  add("moe.offsets", "i32", {s.E + 1}, 4, bind<&PrefillBuffers::expert_off>);
  add("moe.rows", "i32", {T * s.K}, 4, bind<&PrefillBuffers::expert_rows>);
  if (p.moe == MoeLayout::Fused) {
    // One expert at a time: at most T tokens route to it. A decode step runs its K experts at once
    // (every row found by id on the device): K rows. max(T, K) keeps the plan growing with T.
    const int64_t fr = std::max(T, s.K);
    add("moe.x", "f32", {fr, s.D}, 4, bind<&PrefillBuffers::xg>);
    add("moe.gate", "f32", {fr, s.F}, 4, bind<&PrefillBuffers::hg>);
    add("moe.up", "f32", {fr, s.F}, 4, bind<&PrefillBuffers::hu>);
    add("moe.down", "f32", {fr, s.D}, 4, bind<&PrefillBuffers::yd>);
  } else {
    // All experts in one pass: every (token, k) row gathered, as q8_0 blocks for integer kernels
    // (rows wide enough to hold the down projection's requantized input, F, after gate/up have
    // read theirs, D), as floats for float weights, which are never quantized.
    if (s.q8_gate_up || s.q8_down) {
      STRATA_CHECK(s.D % kQK8_0 == 0 && s.F % kQK8_0 == 0, UnsupportedError,
                   "the MMQ layout needs D and F divisible by 32 (q8_0 blocks), got D=", s.D, " F=", s.F);
      const int64_t width = std::max(s.q8_gate_up ? s.D : 0, s.q8_down ? s.F : 0);
      add("moe.xq", "q8_0", {T * s.K, width / kQK8_0 * kQ8_0Bytes}, 1, bind_xq);
    }
    if (s.float_gate_up) add("moe.x", "f32", {T * s.K, s.D}, 4, bind<&PrefillBuffers::xg>);
    add("moe.gate", "f32", {T * s.K, s.F}, 4, bind<&PrefillBuffers::hg>);
    add("moe.up", "f32", {T * s.K, s.F}, 4, bind<&PrefillBuffers::hu>);
    add("moe.down", "f32", {T * s.K, s.D}, 4, bind<&PrefillBuffers::yd>);
  }
  size_t off = 0;
  for (auto& b : p.buffers) {
    b.offset = off;
    if (__builtin_add_overflow(off, align_up(b.bytes), &off)) throw too_large();
  }
  p.total = off;
  // A name is what `strata layout` shows: an architecture's may not repeat one.
  std::vector<std::string_view> names;
  for (const auto& b : p.buffers) names.push_back(b.name);
  std::sort(names.begin(), names.end());
  const auto dup = std::adjacent_find(names.begin(), names.end());
  STRATA_CHECK(dup == names.end(), ConfigError, "prefill scratch: the buffer name '", *dup,
               "' appears twice in the plan");
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
  b.HC = shape_.HC;
  b.scratch.assign(shape_.scratch.size(), nullptr);
  for (const auto& s : p.buffers) s.bind(b, base + s.offset, s);
  return b;
}

}  // namespace strata
