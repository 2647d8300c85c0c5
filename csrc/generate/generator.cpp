// Generator: prompt, then sample -> decode until a stop token, max tokens or a full context.
#include "generate/generator.h"

#include <algorithm>

#include "core/error.h"

namespace strata {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The model's layer hook for one call, from the caller's RunControl: stops the pass when the
// interrupt flag is set, reports the prompt's progress, and keeps in *complete the tokens from
// position 0 whose every layer ran. With `in_ops`, the backend's ops stop early too: only for
// passes of several tokens, as a decode pass stopped inside a layer would leave expert-cache slots
// held (between layers none is).
class Watch {
 public:
  Watch(Model& m, const RunControl& rc, int64_t total, int64_t* complete, bool in_ops) : m_(m) {
    const int64_t L = m.spec().L;
    m.set_layer_hook([&rc, total, complete, L](int64_t l, int64_t T, int64_t pos0) {
      if (complete) *complete = l == L ? pos0 + T : pos0;
      if (rc.interrupt && rc.interrupt->load(std::memory_order_relaxed)) throw Interrupted();
      if (rc.progress && total > 0) rc.progress((double)pos0 + (double)T * (double)l / (double)L, total);
    });
    if (in_ops) m.backend().set_interrupt(rc.interrupt);
  }
  ~Watch() {
    m_.set_layer_hook({});
    m_.backend().set_interrupt(nullptr);
  }
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

 private:
  Model& m_;
};
}  // namespace

Generator::Generator(Model& m, int64_t seq) : m_(m), seq_(seq) {
  STRATA_CHECK(seq >= 0 && seq < m.seqs(), ConfigError, "sequence ", seq, " is not one of the model's ",
               m.seqs(), " KV regions; load it with seqs (--parallel) > ", seq);
}

void Generator::prepare(const std::vector<int32_t>& prompt, const GenParams& p, const Generator* reuse) {
  STRATA_CHECK(!prompt.empty(), ConfigError, "the prompt is empty: it must hold at least one token");
  if (m_.seqs() == 1)
    STRATA_CHECK((int64_t)prompt.size() < m_.seq_ctx(), ConfigError, "the prompt has ", prompt.size(),
                 " tokens but ctx is ", m_.seq_ctx(), "; raise ctx (-c/--ctx) or shorten the prompt");
  else
    STRATA_CHECK((int64_t)prompt.size() < m_.seq_ctx(), ConfigError, "the prompt has ", prompt.size(),
                 " tokens but a sequence's context is ", m_.seq_ctx(), " (ctx ", m_.config().ctx, " over ",
                 m_.seqs(), " sequences); raise ctx (-c/--ctx), lower --parallel or shorten the prompt");
  STRATA_CHECK(p.max_tokens >= 0, ConfigError, "max_tokens must be >= 0");
  p_ = p;
  sampler_ = std::make_unique<Sampler>(p.sampler);
  stats_ = GenStats{};
  tokens_ = prompt;
  logits_.resize(m_.spec().V);
  const int64_t n = (int64_t)prompt.size();
  stats_.prompt_total = n;
  // The last token always runs: its pass gives the logits.
  int64_t from = 0;
  if (reuse && reuse != this && reuse->seq_ == seq_ && m_.kv_owner(seq_) == reuse) {
    const int64_t valid = std::min<int64_t>(reuse->kv_valid(), n - 1);
    while (from < valid && reuse->tokens_[from] == prompt[from]) ++from;
    // An architecture's own cache layout (DeepSeek V4's window and compressor rings) holds the state
    // after its last position only: positions past a shorter common beginning have overwritten rows
    // that beginning's continuation reads. Only the whole of it can be kept.
    if (!m_.spec().kv_layers.empty() && from < reuse->kv_valid()) from = 0;
  }
  const int64_t run = n - from;
  stats_.prompt_reused = from;
  stats_.prompt_chunk = run == 1 ? 1 : std::min(m_.chunk(), run);
  stats_.prompt_chunks = (run + stats_.prompt_chunk - 1) / stats_.prompt_chunk;
  from_ = from;
  pos_ = 0;
  have_logits_ = false;
  done_ = true;
  pending_ = true;
  m_.set_kv_owner(nullptr, seq_);  // until the prompt is all in: a throwing pass leaves the cache to no one
}

void Generator::started(double ms) {
  stats_.prompt_ms = ms;
  stats_.prompt_tokens = (int64_t)tokens_.size();
  pos_ = (int64_t)tokens_.size();
  have_logits_ = true;
  done_ = false;
  pending_ = false;
  m_.set_kv_owner(this, seq_);
}

void Generator::begin(const std::vector<int32_t>& prompt, const GenParams& p, const RunControl& rc,
                      const Generator* reuse) {
  prepare(prompt, p, reuse);
  const int64_t n = (int64_t)tokens_.size(), from = from_;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t complete = from;
  pending_ = false;
  try {
    Watch w(m_, rc, n, &complete, n - from > 1);
    m_.forward(tokens_.data() + from, n - from, from, logits_.data(), false, seq_);
  } catch (const Interrupted&) {
    stats_.prompt_ms = ms_since(t0);
    stats_.prompt_tokens = complete;
    stats_.prompt_chunks = (complete - from + stats_.prompt_chunk - 1) / stats_.prompt_chunk;
    stats_.stop_reason = "interrupted";
    throw;
  }
  started(ms_since(t0));
}

void run_prompts(Model& m, const std::vector<Generator*>& gens, const RunControl& rc) {
  std::vector<uint8_t> taken((size_t)m.seqs(), 0);
  for (size_t i = 0; i < gens.size(); ++i) {
    Generator* g = gens[i];
    STRATA_CHECK(g && &g->m_ == &m, ConfigError, "run_prompts: generator ", i, " is not one of this model's");
    STRATA_CHECK(g->pending_, ConfigError, "run_prompts: generator ", i,
                 " has no prompt waiting (prepare it first, once)");
    STRATA_CHECK(!taken[(size_t)g->seq_], ConfigError, "run_prompts: generators ", i,
                 " and an earlier one share KV region ", g->seq_, "; a pass runs one prompt a region");
    taken[(size_t)g->seq_] = 1;
  }
  if (gens.empty()) return;
  const int64_t V = m.spec().V;
  std::vector<int32_t> ids, seqs, pick;
  std::vector<int64_t> pos;
  for (Generator* g : gens) {
    g->pending_ = false;
    for (int64_t t = g->from_; t < (int64_t)g->tokens_.size(); ++t) {
      ids.push_back(g->tokens_[(size_t)t]);
      pos.push_back(t);
      seqs.push_back((int32_t)g->seq_);
    }
    pick.push_back((int32_t)ids.size() - 1);
  }
  const int64_t n = (int64_t)ids.size();
  std::vector<float> logits(gens.size() * (size_t)V);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    // Rows of several regions: the layer hook's positions are not one prompt's, so only the interrupt.
    const RunControl stop_only{rc.interrupt, {}};
    Watch w(m, stop_only, 0, nullptr, n > 1);
    m.forward_rows(ids.data(), pos.data(), seqs.data(), n, pick.data(), (int64_t)pick.size(), logits.data());
  } catch (const Interrupted&) {
    for (Generator* g : gens) {
      g->stats_.prompt_ms = ms_since(t0);
      g->stats_.prompt_tokens = g->from_;
      g->stats_.prompt_chunks = 0;
      g->stats_.stop_reason = "interrupted";
    }
    throw;
  }
  const double ms = ms_since(t0);
  const int64_t chunk = n == 1 ? 1 : std::min(m.chunk(), n);
  for (size_t i = 0; i < gens.size(); ++i) {
    Generator* g = gens[i];
    std::copy(logits.begin() + (int64_t)i * V, logits.begin() + ((int64_t)i + 1) * V, g->logits_.begin());
    g->stats_.prompt_chunk = chunk;
    g->stats_.prompt_chunks = (n + chunk - 1) / chunk;
    g->started(ms);
  }
}

Generator::~Generator() {
  // A later object at this address must not take the cache for its own.
  if (m_.kv_owner(seq_) == this) m_.set_kv_owner(nullptr, seq_);
}

void Generator::add_decode_traffic(const CacheStats& before, const CacheStats& after) {
  stats_.decode_hits += after.hits - before.hits;
  stats_.decode_misses += after.misses - before.misses;
  stats_.decode_bytes += after.bytes_streamed - before.bytes_streamed;
}

void Generator::finish(const std::string& reason) {
  if (!done_) stats_.stop_reason = reason;
  done_ = true;
}

void Generator::reclaim_kv() {
  if (m_.kv_owner(seq_) == this) return;
  // Every token but the last, which the coming pass feeds itself. Logits do not depend on how the
  // tokens are chunked (DESIGN.md, invariant 4), so this is the cache an uninterrupted run has.
  const int64_t n = pos_ - 1;
  m_.set_kv_owner(nullptr, seq_);
  m_.forward(tokens_.data(), n, 0, nullptr, false, seq_);
  m_.set_kv_owner(this, seq_);
  stats_.recomputed += n;
}

Generator::Need Generator::need() {
  if (done_) return Need::Ended;
  if (stats_.generated >= p_.max_tokens) {
    finish("max_tokens");
    return Need::Ended;
  }
  if (have_logits_) return Need::Sample;
  if (pos_ >= m_.seq_ctx()) {
    finish("ctx_full");
    return Need::Ended;
  }
  return Need::Pass;
}

int32_t Generator::next(const RunControl& rc) {
  const Need need = this->need();
  if (need == Need::Ended) return -1;
  const bool pass = need == Need::Pass;
  // Decode time covers the passes (forward + sample) after the first token, whose logits came
  // with the prompt; decode tok/s is passes per second, as llama.cpp's eval rate.
  auto t0 = std::chrono::steady_clock::now();
  if (pass) {
    const RunControl stop_only{rc.interrupt, {}};  // a decode pass reports no progress
    try {
      {
        Watch w(m_, stop_only, 0, nullptr, pos_ - 1 > 1);
        reclaim_kv();
      }
      Watch w(m_, stop_only, 0, nullptr, false);
      t0 = std::chrono::steady_clock::now();
      const CacheStats c0 = m_.cache().stats();
      m_.forward(&tokens_.back(), 1, pos_ - 1, logits_.data(), false, seq_);
      add_decode_traffic(c0, m_.cache().stats());
    } catch (const Interrupted&) {
      finish("interrupted");
      throw;
    }
  }
  return sample(pass, ms_since(t0));
}

std::vector<int32_t> next_tokens(Model& m, const std::vector<Generator*>& gens, const RunControl& rc) {
  std::vector<int32_t> out(gens.size(), -1);
  std::vector<size_t> pass;  // the generators the step feeds, by index
  std::vector<uint8_t> taken((size_t)m.seqs(), 0);
  for (size_t i = 0; i < gens.size(); ++i) {
    Generator* g = gens[i];
    STRATA_CHECK(g && &g->m_ == &m, ConfigError, "next_tokens: generator ", i, " is not one of this model's");
    STRATA_CHECK(!taken[(size_t)g->seq_], ConfigError, "next_tokens: generators ", i,
                 " and an earlier one share KV region ", g->seq_, "; a step advances one sequence a region");
    taken[(size_t)g->seq_] = 1;
  }
  std::vector<Generator::Need> needs(gens.size());
  for (size_t i = 0; i < gens.size(); ++i) {
    needs[i] = gens[i]->need();
    if (needs[i] == Generator::Need::Pass) pass.push_back(i);
  }
  double ms = 0;
  if (!pass.empty()) {
    const RunControl stop_only{rc.interrupt, {}};
    const int64_t B = (int64_t)pass.size();
    std::vector<int32_t> ids(B), seqs(B);
    std::vector<int64_t> pos(B);
    std::vector<float> logits((size_t)B * m.spec().V);
    try {
      for (int64_t r = 0; r < B; ++r) {
        Generator* g = gens[pass[r]];
        Watch w(m, stop_only, 0, nullptr, g->pos_ - 1 > 1);
        g->reclaim_kv();
        ids[r] = g->tokens_.back();
        pos[r] = g->pos_ - 1;
        seqs[r] = (int32_t)g->seq_;
      }
      Watch w(m, stop_only, 0, nullptr, false);
      const auto t0 = std::chrono::steady_clock::now();
      const CacheStats c0 = m.cache().stats();
      m.decode_batch(ids.data(), pos.data(), seqs.data(), B, logits.data());
      for (size_t i : pass) gens[i]->add_decode_traffic(c0, m.cache().stats());
      ms = ms_since(t0);
    } catch (const Interrupted&) {
      for (size_t i : pass) gens[i]->finish("interrupted");
      throw;
    }
    const size_t V = (size_t)m.spec().V;
    for (int64_t r = 0; r < B; ++r)
      std::copy(logits.begin() + r * V, logits.begin() + (r + 1) * V, gens[pass[r]]->logits_.begin());
  }
  for (size_t i = 0; i < gens.size(); ++i) {
    if (needs[i] == Generator::Need::Ended) continue;
    const bool fed = needs[i] == Generator::Need::Pass;
    out[i] = gens[i]->sample(fed, fed ? ms : 0.0);
  }
  return out;
}

int32_t Generator::sample(bool pass, double ms) {
  const auto t0 = std::chrono::steady_clock::now();
  const int32_t tok = sampler_->sample(logits_.data(), m_.spec().V, tokens_);
  have_logits_ = false;
  if (pass) {
    stats_.decode_ms += ms + ms_since(t0);
    ++stats_.decode_passes;
  } else {
    stats_.prompt_ms += ms + ms_since(t0);
  }
  if (std::find(p_.stop_ids.begin(), p_.stop_ids.end(), tok) != p_.stop_ids.end()) {
    finish("stop_token");
    return -1;
  }
  tokens_.push_back(tok);
  ++pos_;
  ++stats_.generated;
  return tok;
}

void prompt_logits(Model& m, const int32_t* ids, int64_t n, float* out, const RunControl& rc, int64_t seq) {
  STRATA_CHECK(seq >= 0 && seq < m.seqs(), ConfigError, "sequence ", seq, " is not one of the model's ",
               m.seqs(), " KV regions");
  m.set_kv_owner(nullptr, seq);
  Watch w(m, rc, n, nullptr, n > 1);
  m.forward(ids, n, 0, out, true, seq);
}

void step_logits(Model& m, const int32_t* ids, const int64_t* pos, const int32_t* seqs, int64_t B,
                 float* out) {
  for (int64_t i = 0; i < B; ++i)
    if (seqs[i] >= 0 && seqs[i] < m.seqs()) m.set_kv_owner(nullptr, seqs[i]);
  m.decode_batch(ids, pos, seqs, B, out);
}

}  // namespace strata
