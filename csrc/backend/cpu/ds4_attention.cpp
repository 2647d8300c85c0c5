// CPU DeepSeek V4 attention: the compressor's softmax pooling of closed windows, the lightning indexer's
// top-k, and attention with a sink over the raw window and the compressed rows. Every output row is
// computed the same way whatever T is and wherever (chunk or ring) its inputs live.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/ds4_ops.h"
#include "core/thread_pool.h"

namespace strata {

namespace {

// a . b in a fixed order: eight lanes over the first n/8*8 elements, a fixed reduction, then the tail.
inline float dot8(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void cpu_compress_pool(const float* kv, const float* score, const float* state_kv, const float* state_score,
                       const float* ape, int64_t pos0, int64_t T, int64_t ratio, int64_t lanes, int64_t hd,
                       float* out, ThreadPool& pool) {
  const int64_t first = pos0 / ratio, last = (pos0 + T) / ratio, width = lanes * hd, slots = lanes * ratio;
  auto kv_row = [&](int64_t q) {
    return q >= pos0 ? kv + (q - pos0) * width : state_kv + (q % slots) * width;
  };
  auto sc_row = [&](int64_t q) {
    return q >= pos0 ? score + (q - pos0) * width : state_score + (q % slots) * width;
  };
  pool.parallel_for(last - first, 1, [&](int64_t b, int64_t e, int) {
    std::vector<float> mx(hd), sum(hd), acc(hd);
    for (int64_t w = first + b; w < first + e; ++w) {
      std::fill(mx.begin(), mx.end(), -INFINITY);
      // (position, column offset in the row, ape row) of every slot of the window, in order.
      struct Slot {
        int64_t q, col, i;
      };
      std::vector<Slot> sl;
      if (lanes == 2 && w > 0)
        for (int64_t i = 0; i < ratio; ++i) sl.push_back({(w - 1) * ratio + i, 0, i});
      for (int64_t i = 0; i < ratio; ++i) sl.push_back({w * ratio + i, lanes == 2 ? hd : 0, i});
      for (const Slot& s : sl) {
        const float* sr = sc_row(s.q) + s.col;
        const float* ap = ape + s.i * width + s.col;
        for (int64_t d = 0; d < hd; ++d) mx[d] = std::max(mx[d], sr[d] + ap[d]);
      }
      std::fill(sum.begin(), sum.end(), 0.f);
      std::fill(acc.begin(), acc.end(), 0.f);
      for (const Slot& s : sl) {
        const float* sr = sc_row(s.q) + s.col;
        const float* ap = ape + s.i * width + s.col;
        const float* vr = kv_row(s.q) + s.col;
        for (int64_t d = 0; d < hd; ++d) {
          const float p = std::exp(sr[d] + ap[d] - mx[d]);
          sum[d] += p;
          acc[d] += p * vr[d];
        }
      }
      float* o = out + (w - first) * hd;
      for (int64_t d = 0; d < hd; ++d) o[d] = acc[d] / sum[d];
    }
  });
}

void cpu_attention_sink(const float* q, const float* kv, const float* win, int64_t window, const float* comp,
                        int64_t ratio, const int32_t* sel, int64_t topk, const float* sinks, int64_t T,
                        int64_t pos0, int64_t H, int64_t hd, float scale, float* out, ThreadPool& pool) {
  pool.parallel_for(T * H, 1, [&](int64_t b, int64_t e, int) {
    std::vector<const float*> keys;
    std::vector<float> lg;
    for (int64_t th = b; th < e; ++th) {
      const int64_t t = th / H, h = th % H, p = pos0 + t;
      keys.clear();
      for (int64_t j = std::max<int64_t>(0, p - window + 1); j <= p; ++j)
        keys.push_back(j >= pos0 ? kv + (j - pos0) * hd : win + (j % window) * hd);
      if (ratio > 0) {
        const int64_t n_vis = (p + 1) / ratio;
        if (sel) {
          for (int64_t k = 0; k < topk && sel[t * topk + k] >= 0; ++k)
            keys.push_back(comp + sel[t * topk + k] * hd);
        } else {
          for (int64_t s = 0; s < n_vis; ++s) keys.push_back(comp + s * hd);
        }
      }
      const float* qh = q + (t * H + h) * hd;
      lg.resize(keys.size());
      float m = sinks[h];
      for (size_t k = 0; k < keys.size(); ++k) m = std::max(m, lg[k] = dot8(qh, keys[k], hd) * scale);
      float den = std::exp(sinks[h] - m);
      for (size_t k = 0; k < keys.size(); ++k) den += (lg[k] = std::exp(lg[k] - m));
      float* o = out + (t * H + h) * hd;
      std::fill(o, o + hd, 0.f);
      for (size_t k = 0; k < keys.size(); ++k) {
        const float pk = lg[k] / den;
        for (int64_t d = 0; d < hd; ++d) o[d] += pk * keys[k][d];
      }
    }
  });
}

void cpu_indexer_topk(const float* q, const float* w, const float* keys, int64_t T, int64_t pos0,
                      int64_t n_heads, int64_t dim, int64_t ratio, int64_t topk, float scale, int32_t* sel,
                      ThreadPool& pool) {
  pool.parallel_for(T, 1, [&](int64_t b, int64_t e, int) {
    std::vector<float> sc;
    std::vector<int32_t> idx;
    for (int64_t t = b; t < e; ++t) {
      const int64_t n_vis = (pos0 + t + 1) / ratio;
      int32_t* st = sel + t * topk;
      std::fill(st, st + topk, -1);
      sc.assign(n_vis, 0.f);
      for (int64_t s = 0; s < n_vis; ++s) {
        float acc = 0.f;
        for (int64_t h = 0; h < n_heads; ++h) {
          const float d = dot8(q + (t * n_heads + h) * dim, keys + s * dim, dim);
          acc += std::max(d, 0.0f) * (w[t * n_heads + h] * scale);
        }
        sc[s] = acc;
      }
      idx.resize(n_vis);
      std::iota(idx.begin(), idx.end(), 0);
      const int64_t k = std::min(topk, n_vis);
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                        [&](int32_t a, int32_t c) { return sc[a] > sc[c] || (sc[a] == sc[c] && a < c); });
      std::sort(idx.begin(), idx.begin() + k);
      std::copy(idx.begin(), idx.begin() + k, st);
    }
  });
}

}  // namespace strata
