// Sampler in llama.cpp's order: penalties, top-k, top-p, min-p, temperature, draw.
#include "generate/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "core/error.h"

namespace strata {

void check_sampler_params(const SamplerParams& p) {
  STRATA_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.f, ConfigError,
               "temperature (--temp) must be >= 0 (0: greedy), got ", p.temperature);
  STRATA_CHECK(p.top_k >= 0, ConfigError, "top_k (--top-k) must be >= 0 (0: off), got ", p.top_k);
  STRATA_CHECK(p.top_p > 0.f && p.top_p <= 1.f, ConfigError,
               "top_p (--top-p) must be in (0, 1] (1: off), got ", p.top_p);
  STRATA_CHECK(p.min_p >= 0.f && p.min_p <= 1.f, ConfigError,
               "min_p (--min-p) must be in [0, 1] (0: off), got ", p.min_p);
  STRATA_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.f, ConfigError,
               "repetition_penalty (--repeat-penalty) must be > 0 (1: off), got ", p.repetition_penalty);
  STRATA_CHECK(p.penalty_last_n >= -1, ConfigError,
               "repeat_last_n (--repeat-last-n) must be >= -1 (-1: every token, 0: none), got ",
               p.penalty_last_n);
}

Sampler::Sampler(const SamplerParams& p) : p_(p), rng_(p.seed) { check_sampler_params(p); }

int32_t Sampler::sample(const float* logits, int64_t V, const std::vector<int32_t>& history) {
  work_.assign(logits, logits + V);
  if (p_.repetition_penalty != 1.0f && p_.penalty_last_n != 0) {
    const size_t n =
        p_.penalty_last_n < 0 ? history.size() : std::min(history.size(), (size_t)p_.penalty_last_n);
    std::unordered_set<int32_t> seen(history.end() - n, history.end());
    for (int32_t t : seen) {
      float& l = work_[t];
      l = l > 0 ? l / p_.repetition_penalty : l * p_.repetition_penalty;
    }
  }
  if (p_.temperature == 0.f) {
    // Greedy: the first maximum, so ties resolve to the lower id.
    return (int32_t)(std::max_element(work_.begin(), work_.end()) - work_.begin());
  }
  cand_.resize(V);
  for (int64_t i = 0; i < V; ++i) cand_[i] = {work_[i], (int32_t)i};
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t n = V;
  if (p_.top_k > 0 && (size_t)p_.top_k < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    n = p_.top_k;
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Probabilities at temperature 1 decide the top-p and min-p cut, as llama.cpp does.
  std::vector<double> pr(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += (pr[i] = std::exp((double)cand_[i].first - cand_[0].first));
  if (p_.top_p < 1.f) {
    double cum = 0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += pr[i] / sum;
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
  }
  if (p_.min_p > 0.f) {
    size_t keep = 1;
    while (keep < n && pr[keep] >= p_.min_p * pr[0]) ++keep;
    n = keep;
  }
  std::vector<double> w(n);
  double ws = 0;
  for (size_t i = 0; i < n; ++i)
    ws += (w[i] = std::exp(((double)cand_[i].first - cand_[0].first) / p_.temperature));
  std::uniform_real_distribution<double> u(0.0, ws);
  double r = u(rng_);
  for (size_t i = 0; i < n; ++i) {
    r -= w[i];
    if (r < 0) return cand_[i].second;
  }
  return cand_[n - 1].second;
}

}  // namespace strata
