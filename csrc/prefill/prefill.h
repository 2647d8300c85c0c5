// Prefill: the one ordered plan of a chunk's scratch buffers; bytes_needed and carve both derive from it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace strata {

// The shapes Prefill sizes from; model/ fills it from the GGUF, tests fill it at random.
struct PrefillShape {
  int64_t D = 0;         // hidden size
  int64_t HC = 1;        // residual streams per token
  int64_t E = 0, K = 0;  // routed experts, experts per token
  int64_t F = 0;         // routed expert FFN width
  int64_t n_head = 0, n_kv_head = 0, head_dim = 0;
  std::vector<uint32_t> expert_types;  // ggml types of gate/up/down experts, 3 per layer
  bool gr_unfused = false;             // STRATA_GR_UNFUSED=1: carve xn and normalize into it
  // How the MMQ layout feeds the experts, from the kernel choice per weight type (set_expert_kernels):
  // some layer's gate/up use the integer kernel (q8_0 input rows) / the float matmul (f32 input
  // rows); some layer's down uses the integer kernel (its input requantized into the q8_0 rows).
  bool q8_gate_up = true, float_gate_up = false, q8_down = true;
};

// Fills the MMQ flags of `s` from its expert_types and the kernel predicate (uses_matmul_q8).
void set_expert_kernels(PrefillShape& s, bool (*uses_q8)(uint32_t ggml_type));

enum class MoeLayout { Fused, MMQ };
const char* moe_layout_name(MoeLayout l);

struct BufferSpec {
  std::string name;
  size_t bytes = 0;
  std::string dtype;           // "f32", "i32", "q8_0"
  std::vector<int64_t> shape;  // row-major, outermost first
  size_t offset = 0;           // filled by the plan: offset in the region
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
  MoeLayout moe = MoeLayout::Fused;
  float* R = nullptr;              // T x HC x D residual
  float* grs = nullptr;            // T x HC GR scalars
  float* xn = nullptr;             // T x D normalized input (unfused only)
  float* q = nullptr;              // T x H x hd
  float* k = nullptr;              // T x KV x hd
  float* v = nullptr;              // T x KV x hd
  float* attn = nullptr;           // T x H x hd attention output
  float* proj = nullptr;           // T x D sublayer output before the residual add
  float* router = nullptr;         // T x E router logits
  int32_t* topk_ids = nullptr;     // T x K
  float* topk_w = nullptr;         // T x K
  int32_t* expert_off = nullptr;   // E + 1 prefix offsets into expert_rows
  int32_t* expert_rows = nullptr;  // T x K entries (t * K + k), grouped by expert
  float* xg = nullptr;             // fused: T x D one expert's gathered input; MMQ: T*K x D float input rows
                                   // (only for float gate/up weights)
  uint8_t* xq = nullptr;           // MMQ: T*K rows of q8_0 gathered activations (only for integer kernels)
  size_t xq_row_bytes = 0;         // the stride of xq's rows
  float* hg = nullptr;             // rows x F gate, then silu(gate) * up
  float* hu = nullptr;             // rows x F up
  float* yd = nullptr;             // rows x D expert down output
};

class Prefill {
 public:
  explicit Prefill(PrefillShape shape);

  const PrefillShape& shape() const { return shape_; }
  // Fused needs an ExpertSource streaming the experts and expert types the fused path handles.
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
