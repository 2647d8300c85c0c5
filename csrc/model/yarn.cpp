// YaRN inverse frequencies (see yarn.h).
#include "model/yarn.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace strata {

std::vector<float> yarn_inv_freq(int64_t n_dims, double base, const Yarn& y) {
  const int64_t half = n_dims / 2;
  std::vector<float> inv(half);
  double low = 0, high = 0;
  if (y.factor > 1) {
    const auto corr = [&](double rot) {
      return n_dims * std::log((double)y.orig_ctx / (rot * 2 * std::numbers::pi)) / (2 * std::log(base));
    };
    low = corr(y.beta_fast);
    high = corr(y.beta_slow);
    if (y.truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, (double)(n_dims - 1));
    if (low == high) high += 0.001;
  }
  for (int64_t i = 0; i < half; ++i) {
    const float pos_freq = std::pow((float)base, (float)(2 * i) / (float)n_dims);
    const float extra = 1.0f / pos_freq;
    if (y.factor <= 1) {
      inv[i] = extra;
      continue;
    }
    const float inter = 1.0f / ((float)y.factor * pos_freq);
    const float ramp = std::clamp((float)(((double)i - low) / (high - low)), 0.f, 1.f);
    const float ext = 1.0f - ramp;
    inv[i] = inter * (1.0f - ext) + extra * ext;
  }
  return inv;
}

}  // namespace strata
