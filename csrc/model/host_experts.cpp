#include "model/host_experts.h"

#include "backend/cpu/activation.h"
#include "core/error.h"
#include "quant/formats.h"
#include "quant/quant.h"
#include "quant/quantize.h"

namespace strata {

namespace {

// Matrix m (0 gate, 1 up, 2 down) of expert e in host memory: the source's copy that holds its slot offset.
const uint8_t* host_matrix(const ExpertLayerLayout& lay, const ExpertSource& src, int64_t layer, int64_t e,
                           int m) {
  const size_t off = m == 0 ? lay.gate_off : m == 1 ? lay.up_off : lay.down_off;
  ExpertCopy c[3];
  const int n = src.copies(layer, e, c);
  for (int i = 0; i < n; ++i)
    if (off >= c[i].dst_off && off < c[i].dst_off + c[i].bytes) return c[i].src + (off - c[i].dst_off);
  STRATA_CHECK(false, Error, "internal error: expert ", e, " of layer ", layer,
               ": no source bytes for matrix ", m);
  return nullptr;
}

}  // namespace

const char* HostExperts::unsupported(const ExpertLayerLayout& lay) {
  for (const ExpertTensor* t : {&lay.gate, &lay.up, &lay.down})
    if (!uses_matmul_q8(t->type)) return "an expert matrix type without an integer (q8_0) kernel";
  if (lay.gate.rows != lay.up.rows || lay.gate.cols != lay.up.cols || lay.down.rows != lay.gate.cols ||
      lay.down.cols != lay.gate.rows)
    return "gate, up and down matrices of other shapes than F x D, F x D, D x F";
  if (lay.gate.cols % kQK8_0 != 0 || lay.down.cols % kQK8_0 != 0)
    return "rows that are not whole q8_0 blocks";
  return nullptr;
}

void HostExperts::run(const ExpertLayerLayout& lay, const ExpertSource& src, int64_t layer, int64_t e,
                      const uint8_t* xq, float* y) {
  const int64_t F = lay.gate.rows, D = lay.gate.cols;
  g_.resize(F);
  u_.resize(F);
  hq_.resize(static_cast<size_t>(F / kQK8_0) * kQ8_0Bytes);
  const int64_t xrb = D / kQK8_0 * kQ8_0Bytes;
  const QType tg = quant_traits(lay.gate.type, "expert gate").type,
              tu = quant_traits(lay.up.type, "expert up").type,
              td = quant_traits(lay.down.type, "expert down").type;
  matmul_q8(tg, host_matrix(lay, src, layer, e, 0), F, D, xq, xrb, 1, g_.data(), F, pool_);
  matmul_q8(tu, host_matrix(lay, src, layer, e, 1), F, D, xq, xrb, 1, u_.data(), F, pool_);
  cpu_swiglu(best_isa(), g_.data(), u_.data(), F, pool_);
  quantize_row_q8_0(g_.data(), hq_.data(), F);
  matmul_q8(td, host_matrix(lay, src, layer, e, 2), D, F, hq_.data(), static_cast<int64_t>(hq_.size()), 1, y,
            D, pool_);
}

}  // namespace strata
