// Generator: prompt, then sample -> decode until a stop token, max tokens or a full context.
#include "generate/generator.h"

#include <algorithm>

#include "core/error.h"

namespace strata {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void Generator::begin(const std::vector<int32_t>& prompt, const GenParams& p) {
  STRATA_CHECK(!prompt.empty(), ConfigError, "the prompt is empty: it must hold at least one token");
  STRATA_CHECK((int64_t)prompt.size() < m_.config().ctx, ConfigError, "the prompt has ", prompt.size(),
               " tokens but ctx is ", m_.config().ctx, "; raise ctx (--ctx) or shorten the prompt");
  STRATA_CHECK(p.max_tokens >= 0, ConfigError, "max_tokens must be >= 0");
  p_ = p;
  sampler_ = std::make_unique<Sampler>(p.sampler);
  stats_ = GenStats{};
  tokens_ = prompt;
  logits_.resize(m_.spec().V);
  const auto t0 = std::chrono::steady_clock::now();
  m_.set_kv_owner(nullptr);  // until the prompt is all in: a throwing pass leaves the cache to no one
  m_.forward(prompt.data(), (int64_t)prompt.size(), 0, logits_.data(), false);
  stats_.prompt_ms = ms_since(t0);
  stats_.prompt_tokens = (int64_t)prompt.size();
  pos_ = (int64_t)prompt.size();
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

int32_t Generator::next() {
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
  if (pass) reclaim_kv();
  // Decode time covers the passes (forward + sample) after the first token, whose logits came
  // with the prompt; decode tok/s is passes per second, as llama.cpp's eval rate.
  const auto t0 = std::chrono::steady_clock::now();
  if (pass) {
    m_.forward(&tokens_.back(), 1, pos_ - 1, logits_.data(), false);
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

void prompt_logits(Model& m, const int32_t* ids, int64_t n, float* out) {
  m.set_kv_owner(nullptr);
  m.forward(ids, n, 0, out, true);
}

}  // namespace strata
