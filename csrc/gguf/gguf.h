// Read-only, validating GGUF (v2/v3, little-endian) reader: metadata and tensor table over an mmap.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace strata::gguf {

enum class ValueType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12
};
const char* value_type_name(ValueType t);  // "u32", "string", ...; "?" for unknown

// One metadata value. Scalars live in i / u / f / s; arrays in exactly one of
// strings / ints / floats, chosen by elem_type (BOOL arrays hold 0/1 in ints, U64
// arrays hold the bit pattern in ints). Nested arrays are rejected by the reader.
struct Value {
  ValueType type = ValueType::U8;
  ValueType elem_type = ValueType::U8;  // only meaningful for ARRAY
  int64_t i = 0;                        // signed integers and BOOL; unsigned ones too when they fit
  uint64_t u = 0;                       // unsigned integers (the full u64 range)
  double f = 0;                         // F32, F64
  std::string s;                        // STRING
  std::vector<std::string> strings;
  std::vector<int64_t> ints;
  std::vector<double> floats;

  bool is_int() const;    // any integer type (BOOL is not an integer)
  bool is_float() const;  // F32 or F64
  bool is_string() const { return type == ValueType::STRING; }
  bool is_array() const { return type == ValueType::ARRAY; }
  // Accessors throw FormatError on a type mismatch or when the value does not fit.
  int64_t as_int() const;
  uint64_t as_uint() const;
  double as_float() const;  // floats, and integers converted to double
  bool as_bool() const;
  const std::string& as_string() const;
  size_t array_size() const;
};

struct TensorInfo {
  std::string name;
  uint32_t type = 0;        // ggml type id
  std::vector<int64_t> ne;  // ggml order: ne[0] innermost
  uint64_t offset = 0;      // absolute byte offset in the file
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the mapping
  int64_t nelements() const;
};

class File {
 public:
  // Maps and validates the whole header; throws Error (cannot open) or FormatError.
  static std::shared_ptr<File> open(const std::string& path);
  // The same over a copy of `size` bytes in memory, reported as `name` (tests and fuzzing).
  static std::shared_ptr<File> from_memory(const std::string& name, const void* data, size_t size);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return size_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  const uint8_t* base() const { return base_; }

  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const Value* find(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t dflt) const;
  double get_float(const std::string& key) const;
  double get_float(const std::string& key, double dflt) const;
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& dflt) const;
  bool get_bool(const std::string& key, bool dflt) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(const std::string& name) const;
  const TensorInfo& tensor(const std::string& name) const;

 private:
  File() = default;
  void map(const std::string& path);
  void parse();
  const Value& typed(const std::string& key, bool ok(const Value&), const char* want) const;

  std::string path_;
  const uint8_t* base_ = nullptr;
  std::unique_ptr<uint8_t[]> owned_;  // from_memory's copy; otherwise base_ is a mapping
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> kv_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace strata::gguf
