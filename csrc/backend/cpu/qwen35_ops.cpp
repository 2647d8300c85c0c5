// qwen35moe's ops on the CPU (backend/qwen35_ops.h): plain loops, parallel over channels, heads or
// rows and never over tokens, so each output element is computed the same way whatever T is and
// the logits do not depend on the prompt chunking.
#include "backend/cpu/qwen35_ops.h"

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "core/thread_pool.h"

namespace strata {

namespace {
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float silu(float x) { return x * sigmoid(x); }
// torch's softplus (beta 1, threshold 20).
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }
}  // namespace

void cpu_conv1d_silu(const float* x, int64_t T, int64_t C, int64_t Kc, const float* w, const float* state_in,
                     float* state_out, float* y, ThreadPool& pool) {
  const int64_t S = Kc - 1;  // state rows
  pool.parallel_for(C, 64, [&](int64_t c0, int64_t c1, int) {
    // Row r of xx = the state's rows, then x's.
    const auto xx = [&](int64_t r, int64_t c) {
      return r < S ? (state_in ? state_in[r * C + c] : 0.0f) : x[(r - S) * C + c];
    };
    for (int64_t c = c0; c < c1; ++c) {
      const float* wc = w + c * Kc;
      for (int64_t t = 0; t < T; ++t) {
        float acc = 0.0f;
        for (int64_t j = 0; j < Kc; ++j) acc += wc[j] * xx(t + j, c);
        y[t * C + c] = silu(acc);
      }
      for (int64_t r = 0; r < S; ++r) state_out[r * C + c] = xx(T + r, c);
    }
  });
}

void cpu_gated_delta_chunked(const float* qkv, const float* a, const float* b, int64_t T, int64_t pos0,
                             int64_t C, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, const float* A,
                             const float* dt_bias, bool fresh, float* s_cur, float* s_other, float* rows_k,
                             float* rows_d, float* rows_g, float* out, ThreadPool& pool) {
  const int64_t W = 2 * Hk * dk + Hv * dv;  // a row of qkv
  const float scale = 1.0f / std::sqrt((float)dk);
  pool.parallel_for(Hv, 1, [&](int64_t h0, int64_t h1, int) {
    std::vector<float> qn(dk), kS(dv), qS(dv), d(dv), o(dv), em(C), wk(C), wq(C);
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t kh = h % Hk;
      float* S = s_cur + h * dk * dv;  // S_a of the current chunk; the other buffer takes the next one
      float* S_next = s_other + h * dk * dv;
      if (fresh) std::memset(S, 0, (size_t)(dk * dv) * sizeof(float));
      // Slot s's rows of this head.
      const auto key = [&](int64_t s) { return rows_k + (s * Hv + h) * dk; };
      const auto delta = [&](int64_t s) { return rows_d + (s * Hv + h) * dv; };
      const auto logd = [&](int64_t s) -> float& { return rows_g[s * Hv + h]; };
      for (int64_t t = 0; t < T; ++t) {
        const int64_t p = pos0 + t, slot = p % C, n = slot;  // n: the chunk's positions before p
        const float* q = qkv + t * W + kh * dk;
        const float* k = qkv + t * W + Hk * dk + kh * dk;
        const float* v = qkv + t * W + 2 * Hk * dk + h * dv;
        float sq = 0.0f, sk = 0.0f;
        for (int64_t i = 0; i < dk; ++i) {
          sq += q[i] * q[i];
          sk += k[i] * k[i];
        }
        const float rq = 1.0f / std::sqrt(sq + 1e-6f), rk = 1.0f / std::sqrt(sk + 1e-6f);
        float* kn = key(slot);
        for (int64_t i = 0; i < dk; ++i) {
          qn[i] = q[i] * rq * scale;
          kn[i] = k[i] * rk;
        }
        const float g = A[h] * softplus(a[t * Hv + h] + dt_bias[h]);
        const float beta = sigmoid(b[t * Hv + h]);
        logd(slot) = g;
        // The decay from each earlier position m to p, exp(g_{m+1} + ... + g_p), summed back from p: a
        // difference of the two cumulative sums would lose its digits once they are large.
        float acc = g;
        for (int64_t m = n - 1; m >= 0; --m) {
          em[m] = std::exp(acc);
          acc += logd(m);
        }
        const float Gp = std::exp(acc);  // from the chunk's start
        // S_a^T k and S_a^T q, summed over the key dim in order.
        for (int64_t j = 0; j < dv; ++j) kS[j] = qS[j] = 0.0f;
        for (int64_t i = 0; i < dk; ++i) {
          const float* Si = S + i * dv;
          for (int64_t j = 0; j < dv; ++j) {
            kS[j] += Si[j] * kn[i];
            qS[j] += Si[j] * qn[i];
          }
        }
        // The chunk's earlier positions, each weighted by its decay to p and its key's overlap.
        for (int64_t m = 0; m < n; ++m) {
          const float* km = key(m);
          float dkk = 0.0f, dqk = 0.0f;
          for (int64_t i = 0; i < dk; ++i) {
            dkk += kn[i] * km[i];
            dqk += qn[i] * km[i];
          }
          wk[m] = em[m] * dkk;
          wq[m] = em[m] * dqk;
        }
        for (int64_t j = 0; j < dv; ++j) d[j] = v[j] - Gp * kS[j];
        for (int64_t m = 0; m < n; ++m) {
          const float* dm = delta(m);
          for (int64_t j = 0; j < dv; ++j) d[j] -= wk[m] * dm[j];
        }
        float* dp = delta(slot);
        for (int64_t j = 0; j < dv; ++j) dp[j] = d[j] * beta;
        float qk = 0.0f;
        for (int64_t i = 0; i < dk; ++i) qk += qn[i] * kn[i];
        for (int64_t j = 0; j < dv; ++j) o[j] = Gp * qS[j];
        for (int64_t m = 0; m < n; ++m) {
          const float* dm = delta(m);
          for (int64_t j = 0; j < dv; ++j) o[j] += wq[m] * dm[j];
        }
        for (int64_t j = 0; j < dv; ++j) o[j] += qk * dp[j];
        std::memcpy(out + (t * Hv + h) * dv, o.data(), (size_t)dv * sizeof(float));
        if (slot != C - 1) continue;
        // The chunk's last position: the next chunk's state, then the buffers swap roles.
        for (int64_t i = 0; i < dk; ++i)
          for (int64_t j = 0; j < dv; ++j) S_next[i * dv + j] = Gp * S[i * dv + j];
        for (int64_t m = 0; m <= slot; ++m) {
          const float e = m < slot ? em[m] : 1.0f;
          const float *km = key(m), *dm = delta(m);
          for (int64_t i = 0; i < dk; ++i) {
            const float w = e * km[i];
            float* Ni = S_next + i * dv;
            for (int64_t j = 0; j < dv; ++j) Ni[j] += w * dm[j];
          }
        }
        std::swap(S, S_next);
      }
    }
  });
}

void cpu_gated_rms_norm(float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps,
                        ThreadPool& pool) {
  pool.parallel_for(rows, 16, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      float* xr = x + r * n;
      const float* zr = z + r * n;
      float ss = 0.0f;
      for (int64_t i = 0; i < n; ++i) ss += xr[i] * xr[i];
      const float inv = 1.0f / std::sqrt(ss / (float)n + eps);
      for (int64_t i = 0; i < n; ++i) xr[i] = xr[i] * inv * w[i] * silu(zr[i]);
    }
  });
}

void cpu_split_q_gate(const float* qg, int64_t T, int64_t H, int64_t hd, float* q, float* gate,
                      ThreadPool& pool) {
  pool.parallel_for(T * H, 16, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      std::memcpy(q + r * hd, qg + r * 2 * hd, (size_t)hd * sizeof(float));
      std::memcpy(gate + r * hd, qg + r * 2 * hd + hd, (size_t)hd * sizeof(float));
    }
  });
}

void cpu_sigmoid_mul(float* x, const float* g, int64_t n, ThreadPool& pool) {
  pool.parallel_for(n, 4096, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) x[i] *= sigmoid(g[i]);
  });
}

void cpu_add_sigmoid_scaled(float* y, const float* x, const float* s, int64_t T, int64_t D,
                            ThreadPool& pool) {
  pool.parallel_for(T, 1, [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      const float g = sigmoid(s[t]);
      for (int64_t i = 0; i < D; ++i) y[t * D + i] += g * x[t * D + i];
    }
  });
}

}  // namespace strata
