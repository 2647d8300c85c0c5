// GGUF reader: files written byte by byte round-trip, and every malformation is a FormatError
// naming the file and the field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/ggml_types.h"
#include "core/utf8.h"
#include "gguf/gguf.h"

using namespace strata;
using namespace strata::gguf;
namespace fs = std::filesystem;

namespace {

// Little-endian byte sink for building GGUF files by hand.
struct Bytes {
  std::string b;
  template <class T>
  Bytes& put(T v) {
    b.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Bytes& s(const std::string& v) {
    put<uint64_t>(v.size());
    b += v;
    return *this;
  }
};

struct Tensor {
  std::string name;
  uint32_t type;
  std::vector<uint64_t> ne;  // n_dims = ne.size(), so 0 and 5 dims can be written
  std::string data;
  uint64_t offset = ~uint64_t(0);  // ~0: the next aligned position in the data section
};

// A GGUF writer whose every field can be bent: kv payloads are raw bytes.
struct Builder {
  uint32_t version = 3;
  uint64_t align = 32;  // padding used; write general.alignment separately to declare it
  std::vector<std::pair<std::string, std::string>> kvs;  // key -> (u32 type + value bytes)
  std::vector<Tensor> tensors;

  template <class T>
  Builder& kv(const std::string& key, ValueType t, T v) {
    return raw_kv(key, Bytes().put(uint32_t(t)).put(v).b);
  }
  Builder& kv_str(const std::string& key, const std::string& v) {
    return raw_kv(key, Bytes().put(uint32_t(ValueType::STRING)).s(v).b);
  }
  template <class T>
  Builder& kv_arr(const std::string& key, ValueType et, const std::vector<T>& v) {
    Bytes p;
    p.put(uint32_t(ValueType::ARRAY)).put(uint32_t(et)).put<uint64_t>(v.size());
    for (const T& x : v) p.put(x);
    return raw_kv(key, p.b);
  }
  Builder& kv_strs(const std::string& key, const std::vector<std::string>& v) {
    Bytes p;
    p.put(uint32_t(ValueType::ARRAY)).put(uint32_t(ValueType::STRING)).put<uint64_t>(v.size());
    for (const auto& x : v) p.s(x);
    return raw_kv(key, p.b);
  }
  Builder& raw_kv(const std::string& key, const std::string& payload) {
    kvs.emplace_back(key, payload);
    return *this;
  }

  std::string build() const {
    Bytes h;
    h.b = "GGUF";
    h.put(version).put<uint64_t>(tensors.size()).put<uint64_t>(kvs.size());
    for (const auto& [k, p] : kvs) h.s(k).b += p;
    std::string data;
    for (const auto& t : tensors) {
      while (data.size() % align) data += '\0';
      h.s(t.name).put(uint32_t(t.ne.size()));
      for (uint64_t d : t.ne) h.put(d);
      h.put(t.type).put<uint64_t>(t.offset != ~uint64_t(0) ? t.offset : data.size());
      data += t.data;
    }
    while (h.b.size() % align) h.b += '\0';
    return h.b + data;
  }
};

std::string pattern(size_t n, uint8_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = char(uint8_t(seed + i * 7));
  return s;
}

std::string f32s(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

// A valid file with every value type, arrays, a declared alignment and three tensors.
Builder valid() {
  Builder b;
  b.align = 64;
  b.kv("general.alignment", ValueType::U32, uint32_t(64))
      .kv("u8", ValueType::U8, uint8_t(200))
      .kv("i8", ValueType::I8, int8_t(-5))
      .kv("u16", ValueType::U16, uint16_t(60000))
      .kv("i16", ValueType::I16, int16_t(-300))
      .kv("u32", ValueType::U32, uint32_t(4000000000u))
      .kv("i32", ValueType::I32, int32_t(-2000000000))
      .kv("f32", ValueType::F32, 1.5f)
      .kv("bool", ValueType::BOOL, uint8_t(1))
      .kv_str("general.name", "h\xc3\xa9llo")
      .kv("u64", ValueType::U64, uint64_t(0x8000000000000005ull))
      .kv("i64", ValueType::I64, int64_t(-(int64_t(1) << 40)))
      .kv("f64", ValueType::F64, 3.25)
      .kv_arr<int32_t>("arr.i32", ValueType::I32, {1, -2, 3})
      .kv_arr<uint8_t>("arr.u8", ValueType::U8, {255, 0})
      .kv_arr<uint64_t>("arr.u64", ValueType::U64, {~uint64_t(0)})
      .kv_arr<float>("arr.f32", ValueType::F32, {0.5f, -1.0f})
      .kv_arr<double>("arr.f64", ValueType::F64, {1e300})
      .kv_arr<uint8_t>("arr.bool", ValueType::BOOL, {1, 0, 1})
      .kv_arr<int32_t>("arr.empty", ValueType::I32, {})
      .kv_strs("tokenizer.ggml.tokens", {"a", "", "<s>"});
  b.tensors = {{"tok_embd.weight", 0, {4, 3}, f32s({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})},
               {"blk.0.ffn_up.weight", 8, {64, 2}, pattern(2 * 2 * 34, 3)},
               {"output_norm.weight", 1, {3, 1, 1, 1}, pattern(6, 9)}};
  return b;
}

class Gguf : public ::testing::Test {
 protected:
  fs::path dir;
  void SetUp() override {
    dir = fs::temp_directory_path() / ("strata_gguf_" + std::to_string(getpid()));
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }

  std::string write(const std::string& bytes, const std::string& name = "model.gguf") {
    const std::string p = (dir / name).string();
    std::ofstream(p, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
    return p;
  }
  // Opens the bytes and expects a FormatError naming the file and every given fragment.
  void expect_format_error(const std::string& bytes, std::vector<std::string> parts) {
    const std::string p = write(bytes);
    try {
      File::open(p);
      ADD_FAILURE() << "no error; expected '" << parts[0] << "'";
    } catch (const FormatError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(p), std::string::npos) << msg;
      for (const auto& s : parts)
        EXPECT_NE(msg.find(s), std::string::npos) << "missing '" << s << "' in: " << msg;
    }
  }
};

TEST_F(Gguf, ValidFileRoundTrips) {
  const std::string p = write(valid().build());
  const auto f = File::open(p);
  EXPECT_EQ(f->path(), p);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);
  EXPECT_EQ(f->file_size(), fs::file_size(p));
  ASSERT_EQ(f->metadata().size(), 21u);
  EXPECT_EQ(f->metadata()[1].first, "u8");  // file order kept

  EXPECT_EQ(f->get_int("u8"), 200);
  EXPECT_EQ(f->get_int("i8"), -5);
  EXPECT_EQ(f->get_int("u16"), 60000);
  EXPECT_EQ(f->get_int("i16"), -300);
  EXPECT_EQ(f->get_int("u32"), 4000000000);
  EXPECT_EQ(f->get_int("i32"), -2000000000);
  EXPECT_EQ(f->get_int("i64"), -(int64_t(1) << 40));
  EXPECT_EQ(f->find("u64")->as_uint(), 0x8000000000000005ull);
  EXPECT_THROW(f->find("u64")->as_int(), FormatError);  // does not fit int64
  EXPECT_THROW(f->get_int("u64"), FormatError);
  EXPECT_THROW(f->find("i8")->as_uint(), FormatError);  // negative
  EXPECT_EQ(f->get_float("f32"), 1.5);
  EXPECT_EQ(f->get_float("f64"), 3.25);
  EXPECT_EQ(f->get_float("u16"), 60000.0);  // integers read as floats
  EXPECT_TRUE(f->get_bool("bool", false));
  EXPECT_EQ(f->get_string("general.name"), "h\xc3\xa9llo");
  EXPECT_TRUE(f->find("u8")->is_int());
  EXPECT_FALSE(f->find("bool")->is_int());
  EXPECT_TRUE(f->find("f32")->is_float());

  EXPECT_EQ(f->find("arr.i32")->ints, (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f->find("arr.u8")->ints, (std::vector<int64_t>{255, 0}));
  EXPECT_EQ(uint64_t(f->find("arr.u64")->ints[0]), ~uint64_t(0));
  EXPECT_EQ(f->find("arr.f32")->floats, (std::vector<double>{0.5, -1.0}));
  EXPECT_EQ(f->find("arr.f64")->floats, (std::vector<double>{1e300}));
  EXPECT_EQ(f->find("arr.bool")->ints, (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(f->find("arr.bool")->elem_type, ValueType::BOOL);
  EXPECT_EQ(f->find("arr.empty")->array_size(), 0u);
  EXPECT_EQ(f->find("tokenizer.ggml.tokens")->strings, (std::vector<std::string>{"a", "", "<s>"}));
  EXPECT_EQ(f->find("tokenizer.ggml.tokens")->array_size(), 3u);

  // Defaults apply only when the key is absent; a present key of the wrong type still throws.
  EXPECT_EQ(f->get_int("nope", 7), 7);
  EXPECT_EQ(f->get_float("nope", 2.5), 2.5);
  EXPECT_EQ(f->get_string("nope", "d"), "d");
  EXPECT_FALSE(f->get_bool("nope", false));
  EXPECT_EQ(f->find("nope"), nullptr);
  EXPECT_THROW(f->get_int("general.name", 1), FormatError);
  try {
    f->get_int("llama.block_count");
    ADD_FAILURE();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(p + ": metadata key 'llama.block_count' is missing"),
              std::string::npos);
  }
  try {
    f->get_string("u32");
    ADD_FAILURE();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("'u32' has type u32, expected string"), std::string::npos)
        << e.what();
  }

  const auto b = valid();
  ASSERT_EQ(f->tensors().size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const TensorInfo& t = f->tensors()[i];
    EXPECT_EQ(t.name, b.tensors[i].name);
    EXPECT_EQ(t.type, b.tensors[i].type);
    EXPECT_EQ(t.nbytes, b.tensors[i].data.size());
    EXPECT_EQ(t.offset % 64, 0u);
    EXPECT_EQ(t.data, f->base() + t.offset);
    EXPECT_EQ(std::memcmp(t.data, b.tensors[i].data.data(), t.nbytes), 0) << t.name;
    EXPECT_EQ(&f->tensor(t.name), &t);
  }
  EXPECT_EQ(f->tensors()[0].ne, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(f->tensors()[0].nelements(), 12);
  EXPECT_EQ(f->tensors()[1].nelements(), 128);
  float x;
  std::memcpy(&x, f->tensor("tok_embd.weight").data + 4 * 5, 4);
  EXPECT_EQ(x, 5.0f);
  EXPECT_EQ(f->find_tensor("nope"), nullptr);
  try {
    f->tensor("blk.9.ffn_up.weight");
    ADD_FAILURE();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(p + ": tensor 'blk.9.ffn_up.weight' is missing"), std::string::npos);
  }
}

TEST_F(Gguf, Version2AndDefaultAlignment) {
  Builder b;
  b.version = 2;
  b.kv_str("general.architecture", "llama");
  b.tensors = {{"a", 0, {1}, f32s({1})}, {"b", 0, {2}, f32s({2, 3})}};
  const auto f = File::open(write(b.build()));
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->tensor("b").offset - f->tensor("a").offset, 32u);
  EXPECT_EQ(f->tensor("b").nbytes, 8u);
}

TEST_F(Gguf, EveryTruncationIsAFormatError) {
  const std::string full = valid().build();
  for (size_t cut = 0; cut < full.size(); ++cut) {
    const std::string p = write(full.substr(0, cut));
    try {
      File::open(p);
      ADD_FAILURE() << "cut at " << cut << " of " << full.size() << " was accepted";
    } catch (const FormatError& e) {
      ASSERT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
}

TEST_F(Gguf, TruncationNamesTheField) {
  const std::string full = valid().build();
  expect_format_error(full.substr(0, full.size() - 1),
                      {"truncated: tensor 'output_norm.weight' data", std::to_string(full.size() - 1),
                       "byte offset of the tensor info"});
  // Cut inside a string value: the error names the key and where its length was read.
  Builder b;
  b.kv("u32", ValueType::U32, uint32_t(1)).kv_str("general.name", "a long enough model name");
  const std::string small = b.build();
  const size_t len_at = small.find("general.name") + 12 + 4;
  expect_format_error(small.substr(0, len_at + 8 + 3), {"metadata key #1 'general.name' string length 24",
                                                        "byte offset " + std::to_string(len_at)});
  expect_format_error(full.substr(0, 20), {"file too small"});
}

TEST_F(Gguf, BadMagicAndVersion) {
  std::string bytes = valid().build();
  bytes[0] = 'G', bytes[1] = 'G', bytes[2] = 'M', bytes[3] = 'L';
  expect_format_error(bytes, {"not a GGUF file", "bad magic"});
  for (uint32_t v : {1u, 4u, 0x03000000u}) {
    Builder b = valid();
    b.version = v;
    expect_format_error(b.build(), {"unsupported GGUF version " + std::to_string(v), "byte offset 4"});
  }
  Builder be = valid();
  be.version = 0x03000000u;
  expect_format_error(be.build(), {"big-endian"});
}

TEST_F(Gguf, AbsurdCounts) {
  std::string bytes = valid().build();
  const uint64_t huge = uint64_t(1) << 60;
  std::memcpy(&bytes[8], &huge, 8);
  expect_format_error(bytes, {"n_tensors 1152921504606846976", "byte offset 8"});
  bytes = valid().build();
  std::memcpy(&bytes[16], &huge, 8);
  expect_format_error(bytes, {"n_kv 1152921504606846976", "byte offset 16"});
}

TEST_F(Gguf, HugeLengthsDoNotAllocate) {
  Builder b;
  b.kv_str("general.architecture", "llama");
  b.raw_kv("general.name", Bytes().put(uint32_t(ValueType::STRING)).put(~uint64_t(0) - 3).b);
  expect_format_error(b.build(), {"metadata key #1 'general.name' string length 18446744073709551612",
                                  "byte offset 93", "exceeds"});
  Builder a;
  a.raw_kv("tokenizer.ggml.tokens",
           Bytes().put(uint32_t(ValueType::ARRAY)).put(uint32_t(ValueType::STRING)).put(uint64_t(1) << 58).b);
  expect_format_error(a.build(), {"metadata key #0 'tokenizer.ggml.tokens' array length 288230376151711744"});
  Builder k;  // a huge key length: no padding, so the pair starts right after the header
  k.align = 1;
  std::string bytes = k.build();
  bytes[16] = 1;  // n_kv = 1
  bytes += Bytes().put(uint64_t(1) << 40).b + std::string(16, '\0');
  expect_format_error(bytes, {"metadata key #0 name string length"});
  Builder s;  // a huge string inside an array
  s.raw_kv("arr", Bytes()
                      .put(uint32_t(ValueType::ARRAY))
                      .put(uint32_t(ValueType::STRING))
                      .put(uint64_t(2))
                      .s("ok")
                      .put(uint64_t(1) << 50)
                      .b);
  expect_format_error(s.build(), {"metadata key #0 'arr' array element #1 string length 1125899906842624"});
}

TEST_F(Gguf, UnknownAndNestedValueTypes) {
  Builder b;
  b.kv("weird", ValueType(13), uint32_t(0));
  expect_format_error(b.build(), {"metadata key #0 'weird' value type 13", "byte offset 37", "unknown"});
  Builder a;
  a.raw_kv("arr", Bytes().put(uint32_t(ValueType::ARRAY)).put(uint32_t(77)).put(uint64_t(0)).b);
  expect_format_error(a.build(), {"metadata key #0 'arr' array element type 77", "unknown"});
  Builder n;
  n.raw_kv("nested",
           Bytes().put(uint32_t(ValueType::ARRAY)).put(uint32_t(ValueType::ARRAY)).put(uint64_t(0)).b);
  expect_format_error(n.build(), {"metadata key #0 'nested'", "nested array"});
}

TEST_F(Gguf, DuplicateKeysAndTensors) {
  Builder b;
  b.kv("x", ValueType::U32, uint32_t(1)).kv("x", ValueType::U32, uint32_t(2));
  expect_format_error(b.build(), {"metadata key #1 'x'", "duplicate of metadata key #0"});
  Builder t;
  t.tensors = {{"w", 0, {1}, f32s({1})}, {"w", 0, {1}, f32s({2})}};
  expect_format_error(t.build(), {"tensor 'w'", "duplicate of tensor #0"});
}

TEST_F(Gguf, Alignment) {
  // Below 8 (the GGUF spec's minimum) tensor data could start at an odd address.
  for (uint32_t bad : {0u, 1u, 2u, 4u, 48u}) {
    Builder b;
    b.kv("general.alignment", ValueType::U32, bad);
    expect_format_error(b.build(), {"'general.alignment' is " + std::to_string(bad), "power of two"});
  }
  Builder w;
  w.kv("general.alignment", ValueType::U64, uint64_t(32));
  expect_format_error(w.build(), {"'general.alignment' has type u64, expected u32"});
}

TEST_F(Gguf, SmallestAlignmentKeepsTensorDataWordAligned) {
  Builder b;
  b.align = 8;
  b.kv("general.alignment", ValueType::U32, uint32_t(8));
  b.tensors = {{"a", 0, {1}, f32s({1})}, {"b", 0, {3}, f32s({1, 2, 3})}, {"c", 1, {5}, pattern(10, 1)}};
  const auto f = File::open(write(b.build()));
  EXPECT_EQ(f->alignment(), 8u);
  for (const auto& t : f->tensors()) EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 8, 0u) << t.name;
}

TEST_F(Gguf, BytesThatAreNotUtf8AreEscapedInMessages) {
  Builder k;
  k.kv("bad\xff\xc3key\n", ValueType::U32, uint32_t(1)).kv("bad\xff\xc3key\n", ValueType::U32, uint32_t(2));
  expect_format_error(k.build(), {"metadata key #1 'bad\\xff\\xc3key\\x0a'", "duplicate"});
  Builder t;
  t.tensors = {{"w\x80", 0, {1}, f32s({1})}, {"w\x80", 0, {1}, f32s({2})}};
  expect_format_error(t.build(), {"tensor 'w\\x80'", "duplicate of tensor #0"});
  // Every message is valid UTF-8, whatever it quotes.
  const FormatError e(std::string("name '\xed\xa0\x80\xf5' \xe2\x82\xac ok"));
  EXPECT_STREQ(e.what(), "name '\\xed\\xa0\\x80\\xf5' \xe2\x82\xac ok");
  EXPECT_TRUE(is_utf8(e.what()));
  EXPECT_FALSE(is_utf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(is_utf8("\xf4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_TRUE(is_utf8("\xf0\x9f\x99\x82 h\xc3\xa9"));
}

TEST_F(Gguf, FromMemoryReadsTheSameAsOpen) {
  const std::string bytes = valid().build();
  const auto a = File::open(write(bytes));
  const auto b = File::from_memory("mem.gguf", bytes.data(), bytes.size());
  EXPECT_EQ(b->path(), "mem.gguf");
  ASSERT_EQ(a->tensors().size(), b->tensors().size());
  for (size_t i = 0; i < a->tensors().size(); ++i) {
    EXPECT_EQ(a->tensors()[i].offset, b->tensors()[i].offset);
    EXPECT_EQ(std::memcmp(a->tensors()[i].data, b->tensors()[i].data, a->tensors()[i].nbytes), 0);
  }
  EXPECT_EQ(a->get_string("general.name"), b->get_string("general.name"));
  try {
    File::from_memory("cut.gguf", bytes.data(), bytes.size() / 2);
    ADD_FAILURE() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("cut.gguf: truncated"), std::string::npos) << e.what();
  }
}

TEST_F(Gguf, BadTensorInfos) {
  auto one = [](Tensor t) {
    Builder b;
    b.kv_str("general.architecture", "llama");
    b.tensors = {{"ok", 0, {8}, f32s({0, 1, 2, 3, 4, 5, 6, 7})}, t};
    return b.build();
  };
  expect_format_error(one({"t", 0, {}, ""}), {"tensor 't' n_dims 0", "out of range 1..4"});
  expect_format_error(one({"t", 0, {1, 1, 1, 1, 1}, ""}), {"tensor 't' n_dims 5"});
  expect_format_error(one({"t", 0, {4, 0}, ""}), {"tensor 't' ne[1] = 0", "is zero"});
  expect_format_error(one({"t", 0, {uint64_t(1) << 40, uint64_t(1) << 40}, ""}),
                      {"tensor 't' ne[1]", "overflow"});
  expect_format_error(one({"t", 4, {32}, std::string(18, 'x')}),
                      {"tensor 't' type 4", "not a known ggml type"});
  expect_format_error(one({"t", 99, {32}, std::string(18, 'x')}), {"tensor 't' type 99"});
  expect_format_error(one({"t", 2, {48}, std::string(36, 'x')}),
                      {"tensor 't' ne[0] = 48 is not a multiple of the Q4_0 block size 32"});
  expect_format_error(one({"t", 0, {1}, f32s({1}), 40}),
                      {"tensor 't' offset 40", "multiple of the alignment 32"});
  expect_format_error(one({"t", 0, {1}, f32s({1}), 4096}),
                      {"truncated: tensor 't' data", "past the file size"});
  expect_format_error(one({"t", 0, {1}, f32s({1}), ~uint64_t(0) & ~uint64_t(31)}),
                      {"truncated: tensor 't' data"});
  // Two tensors over the same bytes.
  expect_format_error(one({"t", 0, {2}, f32s({1, 2}), 0}),
                      {"tensor 't' data [offset", "overlaps tensor 'ok'"});
  // Overlapping in part: 't' starts inside 'big' (comparing start offsets alone would pass it).
  {
    Builder b;
    b.kv_str("general.architecture", "llama");
    b.tensors = {{"big", 0, {16}, pattern(64, 1)}, {"t", 0, {2}, f32s({1, 2}), 32}};
    expect_format_error(b.build(), {"tensor 't' data [offset", "overlaps tensor 'big'"});
  }
  // Declared bigger than the bytes that are there (the file ends inside the tensor).
  expect_format_error(one({"t", 0, {16}, f32s({1})}),
                      {"tensor 't' data", "64 bytes] ends past the file size"});
}

TEST_F(Gguf, OpenErrorsAreErrorsNotFormatErrors) {
  const std::string missing = (dir / "missing.gguf").string();
  for (const std::string& p : {missing, dir.string()}) {
    try {
      File::open(p);
      ADD_FAILURE() << p;
    } catch (const FormatError& e) {
      ADD_FAILURE() << "FormatError for an open failure: " << e.what();
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(p + ": cannot open"), std::string::npos) << msg;
    }
  }
  try {
    File::open(missing);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos) << e.what();
  }
}

TEST(GgufTypes, TableMatchesGgml) {
  int64_t bs = 0, ts = 0;
  ASSERT_TRUE(ggml_type_size(12, &bs, &ts));
  EXPECT_EQ(bs, 256);
  EXPECT_EQ(ts, 144);
  EXPECT_STREQ(ggml_type_name(12), "Q4_K");
  EXPECT_STREQ(ggml_type_name(39), "MXFP4");
  EXPECT_EQ(ggml_type_name(4), nullptr);
  EXPECT_FALSE(ggml_type_size(4, &bs, &ts));
  EXPECT_FALSE(ggml_type_size(1000, &bs, &ts));
}

}  // namespace
