// Generator: chunked prefill of the prompt, then a decode loop one token at a time, with the
// sampler, stop tokens, max tokens and timings. Stop strings are matched by the caller on text.
// Each Generator owns its tokens and runs in one KV region (seq) of the Model; several may share a
// region, taking turns (the one whose tokens it does not hold recomputes them before its next pass),
// and generators of distinct regions decode together in one pass (next_tokens).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "generate/sampler.h"
#include "model/model.h"

namespace strata {

// The defaults here and in SamplerParams are the only ones: the Python API and the CLI read them.
struct GenParams {
  int64_t max_tokens = 256;
  SamplerParams sampler;
  std::vector<int32_t> stop_ids;
};

// How a caller watches and stops a long call. `interrupt`, once set (from another thread or a signal
// handler), stops the pass in progress before its next layer with Interrupted; the generation then
// ends with stop_reason "interrupted". `progress` hears (tokens done, tokens in all) of the prompt,
// before each layer of its chunks: done counts a chunk's tokens in proportion to its layers run.
struct RunControl {
  const std::atomic<bool>* interrupt = nullptr;
  std::function<void(double done, int64_t total)> progress;
};

struct GenStats {
  int64_t prompt_tokens = 0, generated = 0, decode_passes = 0;
  int64_t prompt_total = 0;             // the prompt's length; prompt_tokens is less when it was interrupted
  int64_t prompt_reused = 0;            // leading prompt tokens whose KV another generation left in the cache
  int64_t recomputed = 0;               // tokens run again: another generation had the KV cache
  double prompt_ms = 0, decode_ms = 0;  // prompt_ms: the prompt and the first token's sampling
  // The expert cache's counters over this generation's decode passes (a batched pass: the whole step's,
  // which the sequences in it share): lookups that hit, that missed, and the bytes the misses streamed.
  uint64_t decode_hits = 0, decode_misses = 0, decode_bytes = 0;
  int64_t prompt_chunk = 0,
          prompt_chunks = 0;  // the prompt ran as prompt_chunks chunks of up to prompt_chunk
  // "stop_token", "max_tokens", "ctx_full", "stop_string", "interrupted", "caller"
  std::string stop_reason;
  double prompt_tps() const {
    return prompt_ms > 0 ? (prompt_tokens - prompt_reused) * 1000.0 / prompt_ms : 0;
  }
  double decode_tps() const { return decode_ms > 0 ? decode_passes * 1000.0 / decode_ms : 0; }
};

class Generator;
// Runs the prompts of generators that were prepared (Generator::prepare) in one batched pass (passes of
// up to the model's chunk of rows: Model::forward_rows), each in its own KV region (distinct; ConfigError
// otherwise), so the experts of a layer are fetched once for all of them; then each samples its first
// token with next(). Every generator's logits and KV are those begin() gives it alone. Each one's
// prompt_ms is the whole pass's (as a batched decode step's time is every row's).
void run_prompts(Model& m, const std::vector<Generator*>& gens, const RunControl& rc = {});
// The next token of each generator (as next(), -1 when it has ended): every one that needs a pass
// runs in one batched decode step (Model::decode_batch), so their experts are fetched once a layer
// for all. The generators are in distinct KV regions (ConfigError otherwise); a generator whose
// region another one took recomputes its tokens first.
std::vector<int32_t> next_tokens(Model& m, const std::vector<Generator*>& gens, const RunControl& rc = {});

class Generator {
 public:
  // A generation in KV region `seq` of `m` (0 .. m.seqs() - 1).
  explicit Generator(Model& m, int64_t seq = 0);
  int64_t seq() const { return seq_; }
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  // Runs the prompt through the model (chunked); the next call to next() samples the first token.
  // Interrupted: stats() then hold the tokens whose every layer ran (prompt_tokens) and the time.
  // With `reuse` (an earlier generation that still holds the KV cache), the prompt's tokens that
  // begin as its did are not run again (a chat's history): the same cache as a full run, as logits
  // do not depend on the chunking (DESIGN.md, invariant 4; the MoE layout may differ by chunk
  // size with an ExpertSource).
  void begin(const std::vector<int32_t>& prompt, const GenParams& p, const RunControl& rc = {},
             const Generator* reuse = nullptr);
  // begin() without the pass: the checks (ConfigError for this request alone) and the prompt's reuse of
  // `reuse`'s KV; run_prompts then runs it together with other generators' prompts.
  void prepare(const std::vector<int32_t>& prompt, const GenParams& p, const Generator* reuse = nullptr);
  // The next token, or -1 when generation has ended (stats().stop_reason says why).
  int32_t next(const RunControl& rc = {});
  // The caller ends generation (e.g. "stop_string" when a stop string matched).
  void finish(const std::string& reason);
  const GenStats& stats() const { return stats_; }

 private:
  friend std::vector<int32_t> next_tokens(Model& m, const std::vector<Generator*>& gens,
                                          const RunControl& rc);
  friend void run_prompts(Model& m, const std::vector<Generator*>& gens, const RunControl& rc);
  // The prompt ran (in `ms`): its logits are in logits_, the KV cache is this generation's.
  void started(double ms);
  // What the next token needs: none (the generation has ended: -1), a sample of the logits it
  // has (the prompt's), or a pass of its last token first.
  enum class Need { Ended, Sample, Pass };
  Need need();
  // Samples the next token from logits_ (after a pass of `pass_ms`, or the prompt's logits).
  int32_t sample(bool pass, double ms);
  // Leading tokens_ whose keys and values are in the KV cache while this generation owns it (the
  // last sampled token is fed by the next pass; a stopped pass leaves those before it).
  int64_t kv_valid() const { return have_logits_ ? pos_ : pos_ - 1; }

  // Puts this generation's tokens back into the KV cache when another one has taken it.
  void reclaim_kv();
  // The cache counters' change over one decode pass, into decode_hits / decode_misses / decode_bytes.
  void add_decode_traffic(const CacheStats& before, const CacheStats& after);

  Model& m_;
  int64_t seq_ = 0;
  GenParams p_;
  std::unique_ptr<Sampler> sampler_;
  std::vector<int32_t> tokens_;
  std::vector<float> logits_;
  int64_t pos_ = 0;
  bool done_ = true, have_logits_ = false;
  bool pending_ = false;  // prepared: its prompt waits for run_prompts
  int64_t from_ = 0;      // the prompt's first token to run (those before it are reused)
  GenStats stats_;
};

// Logits at every position of ids[0..n) (n x V floats into `out`), from position 0, in KV region
// `seq`. The region then holds these tokens, which belong to no generation.
void prompt_logits(Model& m, const int32_t* ids, int64_t n, float* out, const RunControl& rc = {},
                   int64_t seq = 0);
// One decode step of B rows (Model::decode_batch): logits B x V into `out`. The rows' regions then
// belong to no generation.
void step_logits(Model& m, const int32_t* ids, const int64_t* pos, const int32_t* seqs, int64_t B,
                 float* out);

}  // namespace strata
