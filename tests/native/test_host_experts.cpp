// The decode step's CPU share (model/host_experts.h) against every backend's decode expert products: an
// expert computed on the host from its source bytes gives the bits the backend's q8_0 products give (the
// pair product of gate and up, swiglu_q8_0, the down product, as the MMQ layout's decode step runs them),
// so the logits do not depend on which side computed it. And a table with leave_absent: the products
// leave an absent expert's rows as they were, the others' as with every expert present.
#include <memory>

#include "backend_ops_harness.h"
#include "expert_cache/expert_source.h"
#include "model/host_experts.h"

namespace {

class HostExpertsOp : public Op {};

INSTANTIATE_TEST_SUITE_P(BackendOps, HostExpertsOp, testing::ValuesIn(backends_under_test()),
                         [](const testing::TestParamInfo<BackendFactory>& i) { return i.param.name; });

// Experts laid out in host memory as slots (ExpertLayerLayout's offsets), as the pinned host copy is.
class SlotSource final : public ExpertSource {
 public:
  SlotSource(const ExpertLayerLayout& lay, const std::vector<uint8_t>& bytes) : lay_(lay), bytes_(bytes) {}
  SourceKind kind() const override { return SourceKind::Host; }
  int copies(int64_t, int64_t e, ExpertCopy out[3]) const override {
    out[0] = {0, bytes_.data() + static_cast<size_t>(e) * lay_.bytes, lay_.bytes};
    return 1;
  }
  bool page_locked() const override { return false; }
  const char* describe() const override { return "test slots"; }

 private:
  const ExpertLayerLayout& lay_;
  const std::vector<uint8_t>& bytes_;
};

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

TEST_P(HostExpertsOp, AnExpertOnTheHostIsTheDecodeProductsBits) {
  std::mt19937 rng(81);
  const int64_t E = 3;
  be().set_phase(Phase::Decode);
  // (gate/up type, down type): each integer type with itself, and a K-quant mix as the UD files have.
  std::vector<std::pair<QType, QType>> pairs;
  for (QType t : kAllTypes)
    if (uses_matmul_q8((uint32_t)t)) pairs.emplace_back(t, t);
  pairs.emplace_back(QType::Q4_K, QType::Q6_K);
  pairs.emplace_back(QType::IQ1_S, QType::IQ1_M);
  for (const auto& [tg, td] : pairs) {
    const int64_t D = std::max(cols_of(tg), cols_of(td)), F = D;  // whole blocks of either type
    ExpertLayerLayout lay;
    lay.gate = {(uint32_t)tg, F, D, static_cast<size_t>(F * row_bytes(tg, D)), nullptr};
    lay.up = lay.gate;
    lay.down = {(uint32_t)td, D, F, static_cast<size_t>(D * row_bytes(td, F)), nullptr};
    lay.gate_off = 0;
    lay.up_off = align256(lay.gate.bytes);
    lay.down_off = lay.up_off + align256(lay.up.bytes);
    lay.bytes = lay.down_off + align256(lay.down.bytes);
    ASSERT_EQ(HostExperts::unsupported(lay), nullptr);
    std::vector<uint8_t> slots(E * lay.bytes, 0);
    for (int64_t e = 0; e < E; ++e) {
      const auto g = random_weights(tg, F, D, rng), u = random_weights(tg, F, D, rng),
                 d = random_weights(td, D, F, rng);
      std::memcpy(&slots[e * lay.bytes + lay.gate_off], g.data(), g.size());
      std::memcpy(&slots[e * lay.bytes + lay.up_off], u.data(), u.size());
      std::memcpy(&slots[e * lay.bytes + lay.down_off], d.data(), d.size());
    }
    const SlotSource src(lay, slots);
    // The backend's table: experts 0 and 2 in slots 1 and 0, expert 1 absent.
    std::vector<uint8_t> arena(2 * lay.bytes);
    std::memcpy(&arena[lay.bytes], &slots[0], lay.bytes);
    std::memcpy(&arena[0], &slots[2 * lay.bytes], lay.bytes);
    const std::vector<int32_t> slot_of = {1, -1, 0}, ids = {0, 1, 2}, order = {0, 1, 2};
    Dev<uint8_t> darena(be(), arena, "slots");
    Dev<int32_t> dslots(be(), slot_of, "slot table"), dids(be(), ids, "ids"), dorder(be(), order, "order");
    // One token's q8_0 row in each of its E rows, as a one-token decode step's expert input. Small enough
    // that no step overflows: with [-2, 2] Q6_K's random scales took the down input's q8_0 scale past fp16's
    // range (inf, then NaN), and a NaN's sign and payload are the platform's (the CPU's -nan against CUDA's
    // nan), not the op's.
    const size_t xrb = D / 32 * 34, hrb = F / 32 * 34;
    const auto x = randf(rng, D, -0.125f, 0.125f);
    std::vector<uint8_t> xq(E * xrb);
    ref::quantize_q8_0(x.data(), xq.data(), D);
    for (int64_t i = 1; i < E; ++i) std::memcpy(&xq[i * xrb], xq.data(), xrb);
    Dev<uint8_t> dxq(be(), xq, "Xq"), dhq(be(), E * hrb, "down input");
    Dev<float> hg(be(), E * F, "gate"), hu(be(), E * F, "up"), yd(be(), E * D, "expert rows");
    for (const bool present : {true, false}) {
      ExpertTable tab;
      tab.E = E;
      tab.slots = dslots.p();
      tab.arena = darena.p();
      tab.slot_bytes = lay.bytes;
      tab.off[0] = lay.gate_off;
      tab.off[1] = lay.up_off;
      tab.off[2] = lay.down_off;
      tab.leave_absent = !present;
      const int64_t n = present ? 1 : E;  // with every expert present: expert 0's row alone
      for (auto* d : {&hg, &hu, &yd}) d->poison();
      be().matmul_q8_experts_pair((uint32_t)tg, tab, 0, 1, F, D, dids.p(), dorder.p(), n, dxq.p(), xrb,
                                  hg.p(), hu.p(), F);
      be().swiglu_q8_0(hg.p(), hu.p(), n, F, dhq.p(), hrb);
      be().matmul_q8_experts((uint32_t)td, tab, 2, D, F, dids.p(), dorder.p(), n, dhq.p(), hrb, yd.p(), D);
      const auto got = yd.get();
      HostExperts host(2);
      const std::string what = str("gate/up ", quant_traits(tg).name, ", down ", quant_traits(td).name);
      for (int64_t e = 0; e < n; ++e) {
        const std::vector<float> row(&got[e * D], &got[(e + 1) * D]);
        if (e == 1) {  // absent: left as it was (poison)
          for (float v : row) ASSERT_TRUE(std::isnan(v)) << what << ": the absent expert's row was written";
          continue;
        }
        std::vector<float> want(D);
        host.run(lay, src, 0, e, xq.data(), want.data());
        for (float v : want) ASSERT_TRUE(std::isfinite(v)) << what << ": the host's row is not finite";
        expect_same(row, want, what + str(": expert ", e, present ? "" : " beside an absent one"));
      }
    }
  }
  be().set_phase(Phase::Any);
}

TEST(HostExperts, RefusesWhatItCannotCompute) {
  ExpertLayerLayout lay;
  lay.gate = {(uint32_t)QType::F16, 64, 64, 64 * 64 * 2, nullptr};
  lay.up = lay.gate;
  lay.down = lay.gate;
  EXPECT_NE(HostExperts::unsupported(lay), nullptr);  // a float type: no integer kernel
  lay.gate.type = lay.up.type = lay.down.type = (uint32_t)QType::Q8_0;
  EXPECT_EQ(HostExperts::unsupported(lay), nullptr);
  lay.down.cols = 96;  // down not D x F
  EXPECT_NE(HostExperts::unsupported(lay), nullptr);
}

}  // namespace
