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

void Generator::begin(const std::vector<int32_t>& prompt, const GenParams& p, const RunControl& rc,
                      const Generator* reuse) {
  STRATA_CHECK(!prompt.empty(), ConfigError, "the prompt is empty: it must hold at least one token");
  STRATA_CHECK((int64_t)prompt.size() < m_.config().ctx, ConfigError, "the prompt has ", prompt.size(),
               " tokens but ctx is ", m_.config().ctx, "; raise ctx (-c/--ctx) or shorten the prompt");
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
  if (reuse && reuse != this && m_.kv_owner() == reuse) {
    const int64_t valid = std::min<int64_t>(reuse->kv_valid(), n - 1);
    while (from < valid && reuse->tokens_[from] == prompt[from]) ++from;
  }
  const int64_t run = n - from;
  stats_.prompt_reused = from;
  stats_.prompt_chunk = run == 1 ? 1 : std::min(m_.chunk(), run);
  stats_.prompt_chunks = (run + stats_.prompt_chunk - 1) / stats_.prompt_chunk;
  const auto t0 = std::chrono::steady_clock::now();
  m_.set_kv_owner(nullptr);  // until the prompt is all in: a throwing pass leaves the cache to no one
  int64_t complete = from;
  try {
    Watch w(m_, rc, n, &complete, run > 1);
    m_.forward(prompt.data() + from, run, from, logits_.data(), false);
  } catch (const Interrupted&) {
    stats_.prompt_ms = ms_since(t0);
    stats_.prompt_tokens = complete;
    stats_.prompt_chunks = (complete - from + stats_.prompt_chunk - 1) / stats_.prompt_chunk;
    stats_.stop_reason = "interrupted";
    done_ = true;
    throw;
  }
  stats_.prompt_ms = ms_since(t0);
  stats_.prompt_tokens = n;
  pos_ = n;
  have_logits_ = true;
  done_ = false;
  m_.set_kv_owner(this);
}

Generator::~Generator() {
  // A later object at this address must not take the cache for its own.
  if (m_.kv_owner() == this) m_.set_kv_owner(nullptr);
}

void Generator::finish(const std::string& reason) {
  if (!done_) stats_.stop_reason = reason;
  done_ = true;
}

void Generator::reclaim_kv() {
  if (m_.kv_owner() == this) return;
  // Every token but the last, which the coming pass feeds itself. Logits do not depend on how the
  // tokens are chunked (DESIGN.md, invariant 4), so this is the cache an uninterrupted run has.
  const int64_t n = pos_ - 1;
  m_.set_kv_owner(nullptr);
  m_.forward(tokens_.data(), n, 0, nullptr, false);
  m_.set_kv_owner(this);
  stats_.recomputed += n;
}

int32_t Generator::next(const RunControl& rc) {
  if (done_) return -1;
  if (stats_.generated >= p_.max_tokens) {
    finish("max_tokens");
    return -1;
  }
  const bool pass = !have_logits_;
  if (pass && pos_ >= m_.config().ctx) {
    finish("ctx_full");
    return -1;
  }
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
      m_.forward(&tokens_.back(), 1, pos_ - 1, logits_.data(), false);
    } catch (const Interrupted&) {
      finish("interrupted");
      throw;
    }
  }
  const int32_t tok = sampler_->sample(logits_.data(), m_.spec().V, tokens_);
  have_logits_ = false;
  if (pass) {
    stats_.decode_ms += ms_since(t0);
    ++stats_.decode_passes;
  } else {
    stats_.prompt_ms += ms_since(t0);
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

void prompt_logits(Model& m, const int32_t* ids, int64_t n, float* out, const RunControl& rc) {
  m.set_kv_owner(nullptr);
  Watch w(m, rc, n, nullptr, n > 1);
  m.forward(ids, n, 0, out, true);
}

}  // namespace strata
