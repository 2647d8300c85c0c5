// Architectures: each one is a spec reader (GGUF metadata -> ModelSpec) and a forward pass over a
// prompt chunk, registered by name in model/registry.cpp. Adding one is a new file and one line there.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "expert_cache/expert_cache.h"
#include "model/spec.h"
#include "prefill/prefill.h"

namespace strata {

class HostExperts;
class KVCache;

// Called by a forward pass before each layer and once after the last (layer == L), with the
// pass's T and pos0, on the thread running it. A hook that throws (Interrupted on Ctrl-C) stops the
// pass there, between layers, where no expert-cache slot is held.
using LayerHook = std::function<void(int64_t layer, int64_t T, int64_t pos0)>;

// What a forward pass runs on; all owned by the Model, which outlives the pass.
// How one forward call finds its experts: decided once by the Model before the call (Model::forward,
// Model::decode) and read by the blocks, which never work it out again from the cache's state or the
// backend's phase.
enum class ExpertPath : uint8_t {
  PerExpert,  // a prompt chunk, or a decode step with too few free slots: expert by expert (for_routed)
  Resident,   // a decode step, every expert resident: the gathered decode finds them by id
  Device,     // a decode step, a bounded cache resolved on the device (resolve_experts): gathered
  Host,       // a decode step, a bounded cache resolved on the host for the whole layer (prepare): gathered
};
struct StepPlan {
  bool decode = false;  // a token of each of 1..seqs generations (the backend's phase: its kernels per shape)
  ExpertPath experts = ExpertPath::PerExpert;
  bool prefetch = false;     // Device path: each layer prefetches the next one's predicted experts
  int64_t prefetch_max = 0;  // with prefetch: at most this many of each token's guesses filled (0: all)
  int64_t cpu_experts =
      0;  // Host path, one token: at most this many of a layer's misses computed on the host
};

struct ForwardContext {
  Backend& be;
  const ModelSpec& spec;
  const ExpertLayout& experts;
  ExpertCache& cache;
  KVCache& kv;
  const LayerHook* layer_hook = nullptr;  // the Model's; empty when no caller watches
  const StepPlan* step = nullptr;         // the Model's plan of the call running; null: a prompt's
  HostExperts* host_experts = nullptr;    // the Model's, where cpu_experts > 0
};

// The rows of a batched pass: row i is at position pos[i] of KV region seq[i] (host memory). A decode
// step has one row a region; a pass of several prompts has each prompt's rows in order, at consecutive
// positions. `pick` (ascending row indices, n_pick of them; host memory) names the rows whose logits
// the pass writes, in that order; null: every row's.
//
// A recorded batched decode step (Model::decode_batch's graph) reads the rows' positions on the device
// instead: `pos_dev` (device memory, one int32 a row) set, every row is a span of its own at pos0 0 and
// its ops add pos_dev[row] (Backend::set_position_source, positions below max_pos), so one recording
// serves every step of the same regions.
struct SeqRows {
  const int64_t* pos = nullptr;
  const int32_t* seq = nullptr;
  const int32_t* pick = nullptr;
  int64_t n_pick = 0;
  const int32_t* pos_dev = nullptr;
  int64_t max_pos = 0;
};

// A span of a pass's rows that belong to one KV region at consecutive positions: rows first ..
// first + n - 1 at positions pos0 .. pos0 + n - 1 of region seq. The per-sequence ops (RoPE, the KV
// store, attention) run on a span as on a chunk of that sequence, which gives each row what it gets
// alone (logits do not depend on the chunking).
struct RowRun {
  int64_t first = 0, n = 0, pos0 = 0;
  int32_t seq = 0;
};
// The maximal spans of rows[0 .. T), in row order (with rows.pos_dev, each row alone at pos0 0).
std::vector<RowRun> row_runs(const SeqRows& rows, int64_t T);
// Runs fn(span) for the spans of rows[0 .. T) in row order; with rows.pos_dev, each span's ops read its
// row's position from the device (the backend's position source, set around fn and cleared after).
template <class Fn>
void for_row_runs(Backend& be, const SeqRows& rows, int64_t T, Fn&& fn) {
  if (!rows.pos_dev) {
    for (const RowRun& r : row_runs(rows, T)) fn(r);
    return;
  }
  struct Clear {
    Backend& be;
    ~Clear() { be.set_position_source(nullptr, 0); }
  } clear{be};
  for (const RowRun& r : row_runs(rows, T)) {
    be.set_position_source(rows.pos_dev + r.first, rows.max_pos);
    fn(r);
  }
}

class ForwardPass {
 public:
  virtual ~ForwardPass() = default;
  // Runs T tokens `ids` (host memory) at positions pos0.. through every layer on the scratch `b`,
  // appending to the KV cache's selected region. With `logits` (host memory) set, writes the logits
  // of every position (all_logits) or of the last one.
  virtual void run_chunk(const PrefillBuffers& b, const int32_t* ids, int64_t T, int64_t pos0, float* logits,
                         bool all_logits) = 0;
  // Whether run_rows is implemented: several sequences decode in one pass.
  virtual bool batches() const { return false; }
  // Whether a decode step may be recorded as a graph and replayed: every buffer it touches is the same
  // each step (false: the pass picks buffers on the host per step, as qwen35moe's recurrent state copies).
  virtual bool graphable() const { return true; }
  // Whether a batched decode step of several sequences may be recorded too (Model::decode_batch).
  virtual bool graphable_batch() const { return graphable(); }
  // Around each replay of a recorded one-token step of KV region seq at position pos (no pass runs on the
  // host then): an architecture with host state of its own checks the step against it first, and
  // advances it after.
  virtual void before_replay(int64_t /*seq*/, int64_t /*pos*/) {}
  virtual void after_replay(int64_t /*seq*/, int64_t /*pos*/) {}
  // B rows (rows: their positions and KV regions; one token of each of B sequences, or the tokens of
  // several prompts, each prompt's rows in order at consecutive positions) through every layer on the
  // scratch `b` (carved for T = B); the logits of the rows rows.pick names (every row's when null) into
  // `logits` (n x V, host memory). Every row's logits are those run_chunk gives it in its own sequence
  // (each op is per row, or per span of one sequence: RowRun).
  virtual void run_rows(const PrefillBuffers& /*b*/, const int32_t* /*ids*/, const SeqRows& /*rows*/,
                        int64_t /*B*/, float* /*logits*/) {
    throw UnsupportedError("internal error: this architecture decodes one sequence a pass");
  }
};

// A forward pass whose chunks and batched rows are one loop: run() takes a chunk of one sequence at
// pos0 (rows null) or the rows of several sequences (rows), every op per row or per span either way.
class RowsForwardPass : public ForwardPass {
 public:
  void run_chunk(const PrefillBuffers& b, const int32_t* ids, int64_t T, int64_t pos0, float* logits,
                 bool all_logits) final {
    run(b, ids, T, pos0, nullptr, logits, all_logits);
  }
  bool batches() const final { return true; }
  void run_rows(const PrefillBuffers& b, const int32_t* ids, const SeqRows& rows, int64_t B,
                float* logits) final {
    run(b, ids, B, 0, &rows, logits, true);
  }

 protected:
  virtual void run(const PrefillBuffers& b, const int32_t* ids, int64_t T, int64_t pos0, const SeqRows* rows,
                   float* logits, bool all_logits) = 0;
};

struct Architecture {
  const char* name;  // general.architecture
  ModelSpec (*read_spec)(const gguf::File& f);
  // The forward pass; it makes its dense weights resident on ctx.be.
  std::unique_ptr<ForwardPass> (*make_forward)(const ForwardContext& ctx);
  // Throws UnsupportedError naming the file (`path`) and the fix when the pass needs ops `be` does not
  // have (ops beyond the shared Backend surface); the Model asks before it allocates anything. Null:
  // the shared surface is enough, every backend runs it.
  void (*check_backend)(Backend& be, const std::string& path) = nullptr;
};

// The registered architecture of `name`; UnsupportedError naming the file and the ones strata runs.
const Architecture& find_architecture(const std::string& name, const std::string& path);

}  // namespace strata
