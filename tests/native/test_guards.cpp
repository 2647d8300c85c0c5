// The guard bytes that catch a prompt chunk writing outside its plan: after every borrowed chunk,
// Model checks the region's tail past bytes_needed and the guards around the slot arena. A backend
// whose kernel writes one byte too far (a planted overrun) must make forward() fail with the error
// that says so, and give the slots back; a write at the last planned byte must not.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "expert_cache/expert_cache.h"
#include "forwarding_backend.h"
#include "gguf/gguf.h"
#include "model/model.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {

// A tiny qwen3moe GGUF (F32 tensors of random values) written field by field.
class TinyQwen3Moe {
 public:
  static constexpr int64_t L = 2, D = 32, H = 2, KV = 1, HD = 16, E = 4, K = 2, F = 32, V = 64;

  explicit TinyQwen3Moe(const fs::path& path) {
    kv_u32("qwen3moe.block_count", L);
    kv_u32("qwen3moe.embedding_length", D);
    kv_u32("qwen3moe.attention.head_count", H);
    kv_u32("qwen3moe.attention.head_count_kv", KV);
    kv_u32("qwen3moe.attention.key_length", HD);
    kv_u32("qwen3moe.attention.value_length", HD);
    kv_u32("qwen3moe.expert_count", E);
    kv_u32("qwen3moe.expert_used_count", K);
    kv_u32("qwen3moe.expert_feed_forward_length", F);
    kv_f32("qwen3moe.attention.layer_norm_rms_epsilon", 1e-5f);
    kv_f32("qwen3moe.rope.freq_base", 1e4f);
    tensor("token_embd.weight", {D, V}, 1.0f);
    tensor("output_norm.weight", {D}, 0.f);
    tensor("output.weight", {D, V}, 0.2f);
    for (int64_t l = 0; l < L; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      tensor(p + "attn_norm.weight", {D}, 0.f);
      tensor(p + "attn_q.weight", {D, H * HD}, 0.2f);
      tensor(p + "attn_k.weight", {D, KV * HD}, 0.2f);
      tensor(p + "attn_v.weight", {D, KV * HD}, 0.2f);
      tensor(p + "attn_output.weight", {H * HD, D}, 0.2f);
      tensor(p + "attn_q_norm.weight", {HD}, 0.f);
      tensor(p + "attn_k_norm.weight", {HD}, 0.f);
      tensor(p + "ffn_norm.weight", {D}, 0.f);
      tensor(p + "ffn_gate_inp.weight", {D, E}, 0.2f);
      tensor(p + "ffn_gate_exps.weight", {D, F, E}, 0.2f);
      tensor(p + "ffn_up_exps.weight", {D, F, E}, 0.2f);
      tensor(p + "ffn_down_exps.weight", {F, D, E}, 0.2f);
    }
    std::string out = "GGUF";
    put<uint32_t>(out, 3);
    put<uint64_t>(out, n_tensors_);
    put<uint64_t>(out, n_kv_ + 1);
    str(out, "general.architecture");
    put<uint32_t>(out, 8);  // STRING
    str(out, "qwen3moe");
    out += kvs_ + infos_;
    out.append((32 - out.size() % 32) % 32, '\0');
    out += data_;
    std::ofstream(path, std::ios::binary).write(out.data(), (std::streamsize)out.size());
  }

 private:
  template <class T>
  static void put(std::string& s, T v) {
    s.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  static void str(std::string& s, const std::string& v) {
    put<uint64_t>(s, v.size());
    s += v;
  }
  void kv_u32(const std::string& k, int64_t v) {
    str(kvs_, k);
    put<uint32_t>(kvs_, 4);  // UINT32
    put<uint32_t>(kvs_, (uint32_t)v);
    ++n_kv_;
  }
  void kv_f32(const std::string& k, float v) {
    str(kvs_, k);
    put<uint32_t>(kvs_, 6);  // FLOAT32
    put<float>(kvs_, v);
    ++n_kv_;
  }
  // std 0: a norm weight of ones plus a little noise; else N(0, std).
  void tensor(const std::string& name, const std::vector<int64_t>& ne, float std) {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    str(infos_, name);
    put<uint32_t>(infos_, (uint32_t)ne.size());
    for (int64_t d : ne) put<uint64_t>(infos_, (uint64_t)d);
    put<uint32_t>(infos_, 0);  // F32
    put<uint64_t>(infos_, data_.size());
    std::normal_distribution<float> nd(0.f, 1.f);
    for (int64_t i = 0; i < n; ++i) put<float>(data_, std == 0.f ? 1.f + 0.05f * nd(rng_) : std * nd(rng_));
    data_.append((32 - data_.size() % 32) % 32, '\0');
    ++n_tensors_;
  }

  std::mt19937 rng_{42};
  std::string kvs_, infos_, data_;
  uint64_t n_kv_ = 0, n_tensors_ = 0;
};

// Forwards to the CPU, except that once armed, the first `add` kernel of a chunk (the attention
// residual) also writes one byte at `target(region_tail)`: a kernel that overran its buffer.
class OverrunBackend final : public testing_support::ForwardingBackend {
 public:
  std::function<uint8_t*(uint8_t*)> target;  // region tail -> the byte to write; null: disarmed
  int overruns = 0;

  void fill(void* p, uint8_t value, size_t bytes) override {
    inner().fill(p, value, bytes);
    if (value == ExpertCache::kGuard)
      tail_ = static_cast<uint8_t*>(p);  // the latest guard: the region's tail
  }
  void add(float* x, const float* y, int64_t n) override {
    inner().add(x, y, n);
    if (target && tail_) {
      *target(tail_) ^= 0xFF;
      ++overruns;
      tail_ = nullptr;
    }
  }

 private:
  uint8_t* tail_ = nullptr;
};

class Guards : public ::testing::Test {
 protected:
  static constexpr int64_t kChunk = 5;  // the region: one slot, most of it past bytes_needed

  void SetUp() override {
    path_ = fs::temp_directory_path() / ("strata_guards_" + std::to_string(::getpid()) + ".gguf");
    TinyQwen3Moe{path_};
    be_ = std::make_shared<OverrunBackend>();
    ModelConfig cfg;
    cfg.ctx = 64;
    cfg.cache = CacheKind::Size;
    cfg.cache_bytes = 16 << 20;  // every expert and the region
    cfg.source = "host";
    cfg.prefill_mode = PrefillMode::Fixed;
    cfg.prefill = kChunk;
    model_ = std::make_unique<Model>(gguf::File::open(path_.string()), cfg, be_);
    ASSERT_FALSE(model_->cache().all_resident());
    const size_t need = model_->prefill().bytes_needed(kChunk, true);
    ASSERT_GT(model_->slots_for(kChunk) * model_->expert_layout().slot_bytes, need) << "no tail to guard";
  }
  void TearDown() override {
    model_.reset();
    fs::remove(path_);
  }
  void forward() {
    std::vector<int32_t> ids(kChunk);
    for (int64_t i = 0; i < kChunk; ++i) ids[i] = (int32_t)(7 * i + 3);
    std::vector<float> logits(TinyQwen3Moe::V);
    model_->forward(ids.data(), kChunk, 0, logits.data(), false);
  }
  void expect_overrun_caught() {
    try {
      forward();
      FAIL() << "the overrun was not caught";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("wrote outside its planned"), std::string::npos) << e.what();
    }
    EXPECT_EQ(be_->overruns, 1);
    EXPECT_EQ(model_->cache().stats().slots_lent, 0u) << "the region was not given back";
  }

  fs::path path_;
  std::shared_ptr<OverrunBackend> be_;
  std::unique_ptr<Model> model_;
};

}  // namespace

TEST_F(Guards, CleanChunksPass) {
  forward();
  forward();
  EXPECT_TRUE(model_->cache().guards_intact());
  EXPECT_EQ(model_->cache().stats().lends, 2u);
}

TEST_F(Guards, LastPlannedBytePasses) {
  be_->target = [](uint8_t* tail) { return tail - 1; };
  forward();
  EXPECT_EQ(be_->overruns, 1);
}

TEST_F(Guards, OneBytePastThePlanFails) {
  be_->target = [](uint8_t* tail) { return tail; };
  expect_overrun_caught();
}

TEST_F(Guards, LastByteOfTheRegionFails) {
  const size_t tail = model_->slots_for(kChunk) * model_->expert_layout().slot_bytes -
                      model_->prefill().bytes_needed(kChunk, true);
  be_->target = [tail](uint8_t* t) { return t + tail - 1; };
  expect_overrun_caught();
}

TEST_F(Guards, WritesAroundTheSlotArenaFail) {
  ExpertCache& c = model_->cache();
  uint8_t* base = const_cast<uint8_t*>(c.wait_base_for_tests());
  uint8_t* end = base + (size_t)c.n_slots() * c.slot_bytes();
  be_->target = [end](uint8_t*) { return end; };
  expect_overrun_caught();
  EXPECT_FALSE(c.guards_intact());
  *end ^= 0xFF;  // repaired
  EXPECT_TRUE(c.guards_intact());
  be_->overruns = 0;
  be_->target = [base](uint8_t*) { return base - 1; };
  expect_overrun_caught();
}
