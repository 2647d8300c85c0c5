// Prefill: the one ordered plan of a chunk's scratch buffers; bytes_needed and carve both derive from it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace strata {

// One buffer an architecture adds to a chunk's scratch: T rows of `row` (dims after T, row-major;
// empty: one element a token) of `dtype`. Its name is the one `strata layout` shows.
enum class ScratchType { F32, I32 };
struct ScratchSpec {
  std::string name;
  ScratchType dtype = ScratchType::F32;
  std::vector<int64_t> row;
  bool operator==(const ScratchSpec&) const = default;
};

// A typed handle to entry `index` of an architecture's scratch list; PrefillBuffers resolves it.
template <class E>
struct Scratch {
  int32_t index = -1;
};

// An architecture's scratch list as it declares it: each call adds one entry and returns its handle.
// The spec reader stores specs() in ModelSpec::scratch; the forward pass runs the same declaration
// for its handles.
class ScratchList {
 public:
  Scratch<float> f32(std::string name, std::vector<int64_t> row) {
    return Scratch<float>{add(std::move(name), ScratchType::F32, std::move(row))};
  }
  Scratch<int32_t> i32(std::string name, std::vector<int64_t> row) {
    return Scratch<int32_t>{add(std::move(name), ScratchType::I32, std::move(row))};
  }
  const std::vector<ScratchSpec>& specs() const { return specs_; }

 private:
  int32_t add(std::string name, ScratchType t, std::vector<int64_t> row) {
    specs_.push_back(ScratchSpec{std::move(name), t, std::move(row)});
    return (int32_t)specs_.size() - 1;
  }
  std::vector<ScratchSpec> specs_;
};

// The shapes Prefill sizes from; model/ fills it from the GGUF, tests fill it at random.
struct PrefillShape {
  int64_t D = 0;                       // hidden size
  int64_t HC = 1;                      // residual streams per token
  int64_t E = 0, K = 0;                // routed experts, experts per token
  int64_t F = 0;                       // routed expert FFN width
  std::vector<uint32_t> expert_types;  // ggml types of gate/up/down experts, 3 per layer
  bool gr_unfused = false;             // STRATA_GR_UNFUSED=1: carve xn and normalize into it
  bool streamed_fused = false;         // the fused layout where a source streams the experts
                                       // (ModelConfig::moe_layout "fused"); else MMQ there too
  // How the MMQ layout feeds the experts, from the kernel choice per weight type (set_expert_kernels):
  // some layer's gate/up use the integer kernel (q8_0 input rows) / the float matmul (f32 input
  // rows); some layer's down uses the integer kernel (its input requantized into the q8_0 rows).
  bool q8_gate_up = true, float_gate_up = false, q8_down = true;
  // The architecture's own buffers (its attention's, any mixing of HC streams), carved after R, grs
  // and xn (ModelSpec::scratch).
  std::vector<ScratchSpec> scratch;
};

// Fills the MMQ flags of `s` from its expert_types and the kernel predicate (uses_matmul_q8).
void set_expert_kernels(PrefillShape& s, bool (*uses_q8)(uint32_t ggml_type));

enum class MoeLayout { Fused, MMQ };
const char* moe_layout_name(MoeLayout l);

struct PrefillBuffers;
struct BufferSpec;
// Where carve puts a buffer's address: a field of PrefillBuffers, or the architecture's entry.
using BindFn = void (*)(PrefillBuffers& b, void* p, const BufferSpec& spec);

struct BufferSpec {
  std::string name;
  size_t bytes = 0;
  std::string dtype;           // "f32", "i32", "q8_0"
  std::vector<int64_t> shape;  // row-major, outermost first
  size_t offset = 0;           // filled by the plan: offset in the region
  BindFn bind = nullptr;
  int32_t scratch_index = -1;  // the architecture's entry (PrefillShape::scratch), or -1
};

struct PrefillPlan {
  int64_t T = 0;
  bool src = true;
  MoeLayout moe = MoeLayout::Fused;
  std::vector<BufferSpec> buffers;  // in carve order
  size_t total = 0;                 // == bytes_needed
};

// Pointers into a carved region; a buffer absent from the plan stays null.
struct PrefillBuffers {
  int64_t T = 0;
  int64_t HC = 1;
  MoeLayout moe = MoeLayout::Fused;
  float* R = nullptr;              // T x HC x D residual
  float* grs = nullptr;            // T x HC GR scalars
  float* xn = nullptr;             // T x D normalized input (unfused only)
  float* proj = nullptr;           // T x D sublayer output before the residual add
  float* router = nullptr;         // T x E router logits
  int32_t* topk_ids = nullptr;     // T x K
  float* topk_w = nullptr;         // T x K
  int32_t* expert_off = nullptr;   // E + 1 prefix offsets into expert_rows
  int32_t* expert_rows = nullptr;  // T x K entries (t * K + k), grouped by expert
  float* xg = nullptr;             // fused: max(T, K) x D, one expert's gathered input (or a decode
                                   // step's K experts at once); MMQ: T*K x D float input rows
                                   // (only for float gate/up weights)
  uint8_t* xq = nullptr;           // MMQ: T*K rows of q8_0 gathered activations (only for integer kernels)
  size_t xq_row_bytes = 0;         // the stride of xq's rows
  float* hg = nullptr;             // rows x F gate, then silu(gate) * up
  float* hu = nullptr;             // rows x F up
  float* yd = nullptr;             // rows x D expert down output
  std::vector<void*> scratch;      // the architecture's buffers, in the order of its list

  // The architecture's buffer `h` (a handle from its ScratchList).
  template <class E>
  E* operator[](Scratch<E> h) const {
    return static_cast<E*>(scratch.at((size_t)h.index));
  }
};

class Prefill {
 public:
  explicit Prefill(PrefillShape shape);

  const PrefillShape& shape() const { return shape_; }
  // Fused needs an ExpertSource streaming the experts, expert types the fused path handles and
  // shape().streamed_fused; otherwise the MMQ layout runs, source or not.
  bool fused_supported() const;
  MoeLayout fused_layout(int64_t T, bool has_src) const;

  PrefillPlan layout(int64_t T, bool src) const;
  size_t bytes_needed(int64_t T, bool src = true) const;
  // Assigns every buffer of layout(T, src) inside [region, region + region_bytes); throws if it does not fit.
  PrefillBuffers carve(void* region, size_t region_bytes, int64_t T, bool src) const;

 private:
  PrefillShape shape_;
};

}  // namespace strata
