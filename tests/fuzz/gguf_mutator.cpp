// Structure-aware mutation of GGUF files for the libFuzzer targets: an input is parsed into header,
// metadata, tensor infos and data; one or a few fields are changed (dims, types, offsets, counts,
// string lengths, metadata values and types, keys, names, alignment) and the file is written back.
// Inputs that do not parse are left to libFuzzer's byte-level mutations.
#include "gguf_mutator.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace strata::fuzz {
namespace {

enum : uint32_t { U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64, kTypes };
constexpr size_t kWidth[kTypes] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
bool is_number(uint32_t t) { return t < kTypes && kWidth[t] > 0; }
bool is_float(uint32_t t) { return t == F32 || t == F64; }

// A scalar as its payload: the little-endian bytes of a number, or a string's content.
struct Item {
  std::string bytes;
};

struct Kv {
  std::string key;
  uint32_t type = U32;
  uint32_t elem = U8;       // ARRAY only
  std::vector<Item> items;  // one for a scalar
};

struct Tensor {
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type = 0;
  uint64_t offset = 0;
};

struct Gguf {
  uint32_t version = 3;
  std::vector<Kv> kv;
  std::vector<Tensor> tensors;
  std::string data;
  // Lies told when writing: count deltas, a string whose length field is off, the data padding.
  int64_t n_kv_delta = 0, n_tensors_delta = 0;
  int64_t lie_string = -1, lie_delta = 0;
  uint64_t padding = 0;  // 0: the declared alignment (general.alignment when valid, else 32)
};

class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool take(size_t k, std::string* out) {
    if (k > n_ - pos) return false;
    if (out) out->assign(reinterpret_cast<const char*>(p_ + pos), k);
    pos += k;
    return true;
  }
  template <class T>
  bool get(T* v) {
    std::string b;
    if (!take(sizeof(T), &b)) return false;
    std::memcpy(v, b.data(), sizeof(T));
    return true;
  }
  bool string(std::string* s) {
    uint64_t k = 0;
    return get(&k) && take(k, s);
  }
  bool item(uint32_t t, Item* it) {
    if (t == STRING) return string(&it->bytes);
    return is_number(t) && take(kWidth[t], &it->bytes);
  }
  size_t pos = 0;

 private:
  const uint8_t* p_;
  size_t n_;
};

uint64_t declared_alignment(const Gguf& g) {
  if (g.padding) return g.padding;
  for (const Kv& k : g.kv)
    if (k.key == "general.alignment" && k.type == U32 && k.items.size() == 1) {
      uint32_t a = 0;
      std::memcpy(&a, k.items[0].bytes.data(), 4);
      // A huge declared alignment is kept, but the padding written stays small (a lie worth telling).
      if (a != 0 && (a & (a - 1)) == 0) return a <= (1u << 16) ? a : 32;
    }
  return 32;
}

std::optional<Gguf> parse(const uint8_t* p, size_t n) {
  Reader r(p, n);
  std::string magic;
  Gguf g;
  uint64_t n_t = 0, n_kv = 0;
  if (!r.take(4, &magic) || magic != "GGUF" || !r.get(&g.version) || !r.get(&n_t) || !r.get(&n_kv)) return {};
  if (n_t > n || n_kv > n) return {};
  for (uint64_t i = 0; i < n_kv; ++i) {
    Kv k;
    if (!r.string(&k.key) || !r.get(&k.type)) return {};
    if (k.type == ARRAY) {
      uint64_t len = 0;
      if (!r.get(&k.elem) || !r.get(&len) || len > n || !(is_number(k.elem) || k.elem == STRING)) return {};
      k.items.resize(len);
      for (auto& it : k.items)
        if (!r.item(k.elem, &it)) return {};
    } else {
      k.items.resize(1);
      if (!r.item(k.type, &k.items[0])) return {};
    }
    g.kv.push_back(std::move(k));
  }
  for (uint64_t i = 0; i < n_t; ++i) {
    Tensor t;
    uint32_t nd = 0;
    if (!r.string(&t.name) || !r.get(&nd) || nd > 8) return {};
    t.ne.resize(nd);
    for (auto& d : t.ne)
      if (!r.get(&d)) return {};
    if (!r.get(&t.type) || !r.get(&t.offset)) return {};
    g.tensors.push_back(std::move(t));
  }
  const uint64_t a = declared_alignment(g);
  const uint64_t start = (r.pos + a - 1) / a * a;
  if (start < n) g.data.assign(reinterpret_cast<const char*>(p) + start, n - start);
  return g;
}

std::string serialize(const Gguf& g) {
  std::string out = "GGUF";
  auto put = [&](auto v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); };
  int64_t string_no = 0;
  auto put_string = [&](const std::string& s) {
    uint64_t len = s.size();
    if (string_no++ == g.lie_string) len += (uint64_t)g.lie_delta;
    put(len);
    out += s;
  };
  put(g.version);
  put(uint64_t(g.tensors.size() + g.n_tensors_delta));
  put(uint64_t(g.kv.size() + g.n_kv_delta));
  for (const Kv& k : g.kv) {
    put_string(k.key);
    put(k.type);
    if (k.type == ARRAY) {
      put(k.elem);
      put(uint64_t(k.items.size()));
    }
    const uint32_t t = k.type == ARRAY ? k.elem : k.type;
    for (const Item& it : k.items) {
      if (t == STRING)
        put_string(it.bytes);
      else
        out += it.bytes;
    }
  }
  for (const Tensor& t : g.tensors) {
    put_string(t.name);
    put(uint32_t(t.ne.size()));
    for (uint64_t d : t.ne) put(d);
    put(t.type);
    put(t.offset);
  }
  const uint64_t a = declared_alignment(g);
  out.resize((out.size() + a - 1) / a * a, '\0');
  return out + g.data;
}

// Keys the spec readers and the tokenizer look at: renaming or adding one reaches their checks.
const char* const kKeys[] = {
    "general.architecture",
    "general.alignment",
    "general.name",
    "qwen3moe.block_count",
    "qwen3moe.context_length",
    "qwen3moe.embedding_length",
    "qwen3moe.expert_feed_forward_length",
    "qwen3moe.attention.head_count",
    "qwen3moe.attention.head_count_kv",
    "qwen3moe.attention.key_length",
    "qwen3moe.attention.value_length",
    "qwen3moe.rope.freq_base",
    "qwen3moe.attention.layer_norm_rms_epsilon",
    "qwen3moe.expert_count",
    "qwen3moe.expert_used_count",
    "gpt-oss.block_count",
    "gpt-oss.context_length",
    "gpt-oss.embedding_length",
    "gpt-oss.expert_feed_forward_length",
    "gpt-oss.attention.head_count",
    "gpt-oss.attention.head_count_kv",
    "gpt-oss.attention.key_length",
    "gpt-oss.attention.value_length",
    "gpt-oss.attention.sliding_window",
    "gpt-oss.rope.freq_base",
    "gpt-oss.rope.scaling.type",
    "gpt-oss.rope.scaling.factor",
    "gpt-oss.rope.scaling.original_context_length",
    "gpt-oss.rope.scaling.yarn_beta_fast",
    "gpt-oss.rope.scaling.yarn_beta_slow",
    "gpt-oss.attention.layer_norm_rms_epsilon",
    "gpt-oss.expert_count",
    "gpt-oss.expert_used_count",
    "qwen35moe.block_count",
    "qwen35moe.context_length",
    "qwen35moe.embedding_length",
    "qwen35moe.expert_feed_forward_length",
    "qwen35moe.expert_shared_feed_forward_length",
    "qwen35moe.attention.head_count",
    "qwen35moe.attention.head_count_kv",
    "qwen35moe.attention.key_length",
    "qwen35moe.attention.value_length",
    "qwen35moe.rope.freq_base",
    "qwen35moe.rope.dimension_count",
    "qwen35moe.attention.layer_norm_rms_epsilon",
    "qwen35moe.expert_count",
    "qwen35moe.expert_used_count",
    "qwen35moe.ssm.conv_kernel",
    "qwen35moe.ssm.state_size",
    "qwen35moe.ssm.group_count",
    "qwen35moe.ssm.time_step_rank",
    "qwen35moe.ssm.inner_size",
    "qwen35moe.full_attention_interval",
    "qwen35moe.attention.recurrent_layers",
    "qwen35moe.nextn_predict_layers",
    "gemma4.block_count",
    "gemma4.context_length",
    "gemma4.embedding_length",
    "gemma4.feed_forward_length",
    "gemma4.expert_feed_forward_length",
    "gemma4.attention.head_count",
    "gemma4.attention.head_count_kv",
    "gemma4.attention.key_length",
    "gemma4.attention.value_length",
    "gemma4.attention.key_length_swa",
    "gemma4.attention.value_length_swa",
    "gemma4.attention.sliding_window",
    "gemma4.attention.sliding_window_pattern",
    "gemma4.rope.freq_base",
    "gemma4.rope.freq_base_swa",
    "gemma4.rope.dimension_count",
    "gemma4.rope.dimension_count_swa",
    "gemma4.final_logit_softcapping",
    "gemma4.attention.layer_norm_rms_epsilon",
    "gemma4.expert_count",
    "gemma4.expert_used_count",
    "gemma4.embedding_length_per_layer_input",
    "gemma4.attention.shared_kv_layers",
    "deepseek2.block_count",
    "deepseek2.context_length",
    "deepseek2.embedding_length",
    "deepseek2.feed_forward_length",
    "deepseek2.expert_feed_forward_length",
    "deepseek2.attention.head_count",
    "deepseek2.attention.head_count_kv",
    "deepseek2.attention.key_length",
    "deepseek2.attention.value_length",
    "deepseek2.attention.key_length_mla",
    "deepseek2.attention.value_length_mla",
    "deepseek2.attention.q_lora_rank",
    "deepseek2.attention.kv_lora_rank",
    "deepseek2.rope.dimension_count",
    "deepseek2.rope.freq_base",
    "deepseek2.rope.scaling.type",
    "deepseek2.rope.scaling.factor",
    "deepseek2.rope.scaling.original_context_length",
    "deepseek2.rope.scaling.yarn_log_multiplier",
    "deepseek2.rope.scaling.yarn_beta_fast",
    "deepseek2.rope.scaling.yarn_beta_slow",
    "deepseek2.attention.layer_norm_rms_epsilon",
    "deepseek2.attention.temperature_scale",
    "deepseek2.leading_dense_block_count",
    "deepseek2.expert_count",
    "deepseek2.expert_used_count",
    "deepseek2.expert_shared_count",
    "deepseek2.expert_weights_scale",
    "deepseek2.expert_weights_norm",
    "deepseek2.expert_gating_func",
    "deepseek2.expert_group_count",
    "deepseek2.expert_group_used_count",
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
    "tokenizer.chat_template",
};
const char* const kStrings[] = {
    "qwen3moe",
    "llama",
    "deepseek4",
    "gpt2",
    "qwen2",
    "llama-bpe",
    "default",
    "",
    "\xff\xfe",
    "a\xc3",
    "\xed\xa0\x80",
    "\xc0\xaf",
    "x\n\x1b[2J",
    "<|im_end|>",
    "a b",
    " ",
    "\xc4\xa0 \xc4\xa0",
    "gpt-oss",
    "yarn",
    "qwen35moe",
    "qwen35",
    "gemma4",
    "deepseek2",
    "<0x41>",
};

class Mutator {
 public:
  Mutator(Gguf& g, uint32_t seed) : g_(g), rng_(seed) {}

  void mutate_once() {
    switch (pick(12)) {
      case 0:
      case 1:
        number();
        break;
      case 2:
        coherent_dim();
        break;
      case 3:
        retype();
        break;
      case 4:
        string();
        break;
      case 5:
        key();
        break;
      case 6:
        array_length();
        break;
      case 7:
      case 8:
        tensor();
        break;
      case 9:
        header();
        break;
      case 10:
        lie();
        break;
      default:
        data();
        break;
    }
  }

 private:
  size_t pick(size_t n) { return n ? std::uniform_int_distribution<size_t>(0, n - 1)(rng_) : 0; }
  bool coin() { return pick(2); }

  uint64_t interesting_int(uint64_t orig) {
    static const uint64_t kVals[] = {0,
                                     1,
                                     2,
                                     3,
                                     4,
                                     7,
                                     8,
                                     16,
                                     31,
                                     32,
                                     33,
                                     63,
                                     64,
                                     255,
                                     256,
                                     257,
                                     4096,
                                     65535,
                                     65536,
                                     0x7fffffffull,
                                     0x80000000ull,
                                     0xffffffffull,
                                     0x100000000ull,
                                     1ull << 61,
                                     1ull << 62,
                                     0x7fffffffffffffffull,
                                     0x8000000000000000ull,
                                     ~0ull,
                                     ~1ull};
    switch (pick(6)) {
      case 0:
        return orig + 1;
      case 1:
        return orig - 1;
      case 2:
        return orig * 2;
      case 3:
        return orig / 2;
      case 4:
        return rng_();
      default:
        return kVals[pick(std::size(kVals))];
    }
  }
  double interesting_float(double orig) {
    static const double kVals[] = {0.0,
                                   -0.0,
                                   1.0,
                                   -1.0,
                                   1e-30,
                                   1e30,
                                   1e300,
                                   -1e300,
                                   std::numeric_limits<double>::infinity(),
                                   -std::numeric_limits<double>::infinity(),
                                   std::numeric_limits<double>::quiet_NaN(),
                                   4e-45,
                                   3.5e38,
                                   1e6};
    return pick(4) == 0 ? orig * 2 : kVals[pick(std::size(kVals))];
  }

  // Encodes a value for type t: integers as their bit pattern, floats converted.
  Item encode(uint32_t t, uint64_t bits, double f) {
    Item it;
    if (t == F32) {
      const float x = std::isfinite(f) && std::fabs(f) > 3.4e38 ? (f > 0 ? INFINITY : -INFINITY) : float(f);
      it.bytes.assign(reinterpret_cast<const char*>(&x), 4);
    } else if (t == F64) {
      it.bytes.assign(reinterpret_cast<const char*>(&f), 8);
    } else if (t == STRING) {
      it.bytes = kStrings[pick(std::size(kStrings))];
    } else {
      it.bytes.assign(reinterpret_cast<const char*>(&bits), kWidth[t]);  // little-endian: the low bytes
    }
    return it;
  }
  static uint64_t bits_of(uint32_t t, const Item& it) {
    uint64_t v = 0;
    if (is_number(t) && !is_float(t)) std::memcpy(&v, it.bytes.data(), std::min<size_t>(8, it.bytes.size()));
    return v;
  }
  static double float_of(uint32_t t, const Item& it) {
    if (t == F32 && it.bytes.size() == 4) {
      float f;
      std::memcpy(&f, it.bytes.data(), 4);
      return f;
    }
    if (t == F64 && it.bytes.size() == 8) {
      double f;
      std::memcpy(&f, it.bytes.data(), 8);
      return f;
    }
    return double(int64_t(bits_of(t, it)));
  }

  Kv* any_kv() { return g_.kv.empty() ? nullptr : &g_.kv[pick(g_.kv.size())]; }

  // A number in the metadata (a scalar, or one element of an array) set to an interesting value.
  void number() {
    Kv* k = any_kv();
    if (!k || k->items.empty()) return;
    const uint32_t t = k->type == ARRAY ? k->elem : k->type;
    if (!is_number(t)) return string();
    Item& it = k->items[pick(k->items.size())];
    it = is_float(t) ? encode(t, 0, interesting_float(float_of(t, it)))
                     : encode(t, interesting_int(bits_of(t, it)), 0);
  }

  // A hyperparameter changed together with every tensor dimension equal to it, so the file stays
  // consistent and the load goes past the shape checks with new shapes.
  void coherent_dim() {
    Kv* k = any_kv();
    if (!k || k->type == ARRAY || !is_number(k->type) || is_float(k->type)) return number();
    const uint64_t old = bits_of(k->type, k->items[0]);
    if (old < 2) return number();
    static const uint64_t kSmall[] = {1, 2, 3, 4, 8, 16, 17, 32, 48, 64};
    uint64_t v = pick(3) == 0 ? interesting_int(old) : (coin() ? old / 2 : kSmall[pick(std::size(kSmall))]);
    k->items[0] = encode(k->type, v, 0);
    for (Tensor& t : g_.tensors)
      for (uint64_t& d : t.ne)
        if (d == old) d = v;
  }

  // A value converted to another type: scalar <-> scalar, scalar <-> array, array element type.
  void retype() {
    Kv* k = any_kv();
    if (!k) return;
    const uint32_t nt = pick(5) == 0 ? uint32_t(rng_() % 20) : uint32_t(pick(kTypes));
    if (k->type == ARRAY && coin()) {  // element type
      if (nt == ARRAY || nt >= kTypes) return;
      for (Item& it : k->items) it = encode(nt, bits_of(k->elem, it), float_of(k->elem, it));
      k->elem = nt;
      return;
    }
    if (nt == ARRAY) {  // wrap the scalar into an array
      if (k->type == ARRAY) return;
      k->elem = k->type;
      k->type = ARRAY;
      return;
    }
    if (nt >= kTypes) {
      k->type = nt;  // an unknown type id; the payload stays
      return;
    }
    if (k->type == ARRAY) {  // the first element, or a new scalar
      if (k->items.empty() || k->elem != nt)
        k->items = {encode(nt, interesting_int(0), interesting_float(1))};
      else
        k->items.resize(1);
      k->type = nt;
      return;
    }
    k->items[0] = encode(nt, bits_of(k->type, k->items[0]), float_of(k->type, k->items[0]));
    k->type = nt;
  }

  void bend(std::string& s) {
    switch (pick(6)) {
      case 0:
        s = kStrings[pick(std::size(kStrings))];
        break;
      case 1:
        if (!s.empty()) s[pick(s.size())] = char(0x80 | pick(128));
        break;
      case 2:
        s.resize(pick(s.size() + 1));
        break;
      case 3:
        s.insert(pick(s.size() + 1), kStrings[pick(std::size(kStrings))]);
        break;
      case 4:
        s += s;
        break;
      default:
        if (!s.empty()) s[pick(s.size())] = char(pick(256));
        break;
    }
  }

  // A string value or element: replaced, truncated, grown, bytes that are not UTF-8.
  void string() {
    std::vector<Item*> all;
    for (Kv& k : g_.kv)
      if ((k.type == ARRAY ? k.elem : k.type) == STRING)
        for (Item& it : k.items) all.push_back(&it);
    if (all.empty()) return;
    bend(all[pick(all.size())]->bytes);
  }

  void key() {
    switch (pick(5)) {
      case 0: {  // rename to a key a reader looks at
        if (Kv* k = any_kv()) k->key = kKeys[pick(std::size(kKeys))];
        break;
      }
      case 1: {  // a key that is not UTF-8, or empty
        if (Kv* k = any_kv()) bend(k->key);
        break;
      }
      case 2: {  // delete
        if (!g_.kv.empty()) g_.kv.erase(g_.kv.begin() + pick(g_.kv.size()));
        break;
      }
      case 3: {  // duplicate
        if (Kv* k = any_kv()) g_.kv.insert(g_.kv.begin() + pick(g_.kv.size() + 1), Kv(*k));
        break;
      }
      default: {  // add a key a reader looks at, with a value of any type
        Kv k;
        k.key = kKeys[pick(std::size(kKeys))];
        k.type = uint32_t(pick(kTypes));
        if (k.type == ARRAY) k.type = U32;
        k.items = {encode(k.type, interesting_int(1), interesting_float(1))};
        g_.kv.push_back(std::move(k));
      }
    }
  }

  void array_length() {
    std::vector<Kv*> arrays;
    for (Kv& k : g_.kv)
      if (k.type == ARRAY) arrays.push_back(&k);
    if (arrays.empty()) return;
    Kv& k = *arrays[pick(arrays.size())];
    switch (pick(4)) {
      case 0:
        k.items.clear();
        break;
      case 1:
        k.items.resize(pick(k.items.size() + 1));
        break;
      case 2:
        k.items.resize(std::min<size_t>(2, k.items.size()));
        break;
      default:
        if (!k.items.empty() && k.items.size() < 100000) k.items.push_back(k.items[pick(k.items.size())]);
    }
  }

  void tensor() {
    if (g_.tensors.empty()) return;
    Tensor& t = g_.tensors[pick(g_.tensors.size())];
    switch (pick(8)) {
      case 0:
      case 1:
        if (!t.ne.empty()) {
          uint64_t& d = t.ne[pick(t.ne.size())];
          d = interesting_int(d);
        }
        break;
      case 2:  // n_dims
        if (coin() && !t.ne.empty())
          t.ne.pop_back();
        else
          t.ne.push_back(coin() ? 1 : interesting_int(1));
        break;
      case 3:
        if (t.ne.size() > 1) std::swap(t.ne[0], t.ne[1 + pick(t.ne.size() - 1)]);
        break;
      case 4: {
        static const uint32_t kTypesUsed[] = {0, 1, 8, 12, 14, 17, 30, 2, 10, 39, 4, 31, 41, 42, 1000};
        t.type = coin() ? kTypesUsed[pick(std::size(kTypesUsed))] : uint32_t(pick(48));
        break;
      }
      case 5: {
        static const int64_t kSteps[] = {-1, 1, -8, 8, -32, 32, 64, 256};
        t.offset =
            pick(4) == 0 ? interesting_int(t.offset) : t.offset + uint64_t(kSteps[pick(std::size(kSteps))]);
        break;
      }
      case 6: {  // the name: another tensor's (a duplicate), bytes that are not UTF-8, or gone
        const Tensor& o = g_.tensors[pick(g_.tensors.size())];
        if (coin())
          t.name = o.name;
        else
          bend(t.name);
        break;
      }
      default:
        if (coin())
          g_.tensors.erase(g_.tensors.begin() + pick(g_.tensors.size()));
        else
          g_.tensors.push_back(g_.tensors[pick(g_.tensors.size())]);
    }
  }

  void header() {
    switch (pick(3)) {
      case 0:
        g_.n_kv_delta = int64_t(interesting_int(0));
        break;
      case 1:
        g_.n_tensors_delta = int64_t(interesting_int(0));
        break;
      default: {
        static const uint32_t kVersions[] = {1, 2, 4, 0x03000000, 0x02000000};
        g_.version = kVersions[pick(std::size(kVersions))];
      }
    }
  }

  void lie() {
    if (coin()) {
      g_.lie_string = int64_t(pick(64));
      g_.lie_delta = int64_t(interesting_int(0));
    } else {
      static const uint64_t kPads[] = {1, 2, 4, 8, 16, 64};
      g_.padding = kPads[pick(std::size(kPads))];
    }
  }

  void data() {
    std::string& d = g_.data;
    if (d.empty()) return;
    switch (pick(3)) {
      case 0:
        d.resize(pick(d.size()));
        break;   // the file ends early
      case 1: {  // a run of special floats
        static const uint32_t kF[] = {0x7fc00000u, 0x7f800000u, 0xff800000u, 0x00000001u, 0x7f7fffffu};
        const uint32_t f = kF[pick(std::size(kF))];
        const size_t at = pick(d.size()) & ~size_t(3);
        for (size_t i = at; i + 4 <= d.size() && i < at + 64; i += 4) std::memcpy(&d[i], &f, 4);
        break;
      }
      default:
        for (int i = 0; i < 8; ++i) d[pick(d.size())] = char(rng_());
    }
  }

  Gguf& g_;
  std::mt19937_64 rng_;
};

}  // namespace

size_t mutate_gguf(uint8_t* data, size_t size, size_t max_size, uint32_t seed) {
  std::optional<Gguf> g = parse(data, size);
  if (!g) return 0;
  Mutator m(*g, seed);
  const int n = 1 + int(seed % 3 == 0) + int(seed % 7 == 0);
  for (int i = 0; i < n; ++i) m.mutate_once();
  std::string out = serialize(*g);
  if (out.size() > max_size) out.resize(max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

}  // namespace strata::fuzz

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

// libFuzzer's hook: mostly structural mutations, a quarter of the time (and for every input that
// does not parse) libFuzzer's own byte-level ones.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  if (seed % 4 != 0)
    if (size_t n = strata::fuzz::mutate_gguf(data, size, max_size, seed)) return n;
  return LLVMFuzzerMutate(data, size, max_size);
}
