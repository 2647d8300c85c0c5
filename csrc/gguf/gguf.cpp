// GGUF reader: maps the file, checks every length against the bytes left before using it,
// and builds the metadata list and tensor table; every failure names path, field and offset.
#include "gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "core/error.h"
#include "core/ggml_types.h"
#include "core/utf8.h"

namespace strata::gguf {

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

namespace {

constexpr uint64_t kHeaderBytes = 24;     // magic, version, n_tensors, n_kv
constexpr uint64_t kMinKvBytes = 13;      // key length, value type, a 1-byte value
constexpr uint64_t kMinTensorBytes = 32;  // name length, n_dims, one dim, type, offset
constexpr uint64_t kMinAlignment = 8;

bool known_value_type(uint32_t t) { return t <= uint32_t(ValueType::F64); }

// Fixed size of a scalar, a STRING's minimum (its length field), 0 for ARRAY; by type id.
constexpr uint64_t kMinValueBytes[] = {1, 1, 2, 2, 4, 4, 4, 1, 8, 0, 8, 8, 8};
uint64_t min_value_bytes(ValueType t) { return kMinValueBytes[uint32_t(t)]; }

// Bounds-checked little-endian reads over the mapping. Field names are built lazily
// (a callable) because a tokenizer array holds ~10^5 strings and errors are rare.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* p, uint64_t size) : path_(path), p_(p), size_(size) {}
  uint64_t pos = 0;
  uint64_t left() const { return size_ - pos; }

  template <class F>
  void need(uint64_t n, const F& field) const {
    if (n > left())
      throw FormatError(str(path_, ": truncated: ", field(), " at byte offset ", pos, " needs ", n,
                            " bytes, the file (", size_, " bytes) has ", left(), " left"));
  }
  template <class T, class F>
  T read(const F& field) {
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, p_ + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  template <class F>
  std::string read_string(const F& field) {
    const uint64_t at = pos;
    const uint64_t n = read<uint64_t>([&] { return field() + " string length"; });
    if (n > left())
      throw FormatError(str(path_, ": ", field(), " string length ", n, " (read at byte offset ", at,
                            ") exceeds the ", left(), " bytes left in the file"));
    std::string s(reinterpret_cast<const char*>(p_ + pos), n);
    pos += n;
    return s;
  }
  // Any integer type (and BOOL) as its int64 bit pattern: sign- or zero-extended.
  template <class F>
  int64_t read_int(ValueType t, const F& field) {
    switch (t) {
      case ValueType::U8:
      case ValueType::BOOL:
        return read<uint8_t>(field);
      case ValueType::I8:
        return read<int8_t>(field);
      case ValueType::U16:
        return read<uint16_t>(field);
      case ValueType::I16:
        return read<int16_t>(field);
      case ValueType::U32:
        return read<uint32_t>(field);
      case ValueType::I32:
        return read<int32_t>(field);
      case ValueType::U64:
        return int64_t(read<uint64_t>(field));
      case ValueType::I64:
        return read<int64_t>(field);
      default:
        break;
    }
    throw FormatError(str(path_, ": internal: ", field(), " is not an integer type"));
  }

 private:
  const std::string& path_;
  const uint8_t* p_;
  uint64_t size_;
};

bool is_int_type(ValueType t) {
  return t == ValueType::U8 || t == ValueType::I8 || t == ValueType::U16 || t == ValueType::I16 ||
         t == ValueType::U32 || t == ValueType::I32 || t == ValueType::U64 || t == ValueType::I64;
}
bool is_signed_type(ValueType t) {
  return t == ValueType::I8 || t == ValueType::I16 || t == ValueType::I32 || t == ValueType::I64;
}
bool is_float_type(ValueType t) { return t == ValueType::F32 || t == ValueType::F64; }

std::string type_desc(const Value& v) {
  return v.is_array() ? str("array of ", value_type_name(v.elem_type)) : value_type_name(v.type);
}

}  // namespace

const char* value_type_name(ValueType t) {
  static const char* const names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                      "bool", "string", "array", "u64", "i64", "f64"};
  return known_value_type(uint32_t(t)) ? names[uint32_t(t)] : "?";
}

bool Value::is_int() const { return is_int_type(type); }
bool Value::is_float() const { return is_float_type(type); }

int64_t Value::as_int() const {
  STRATA_CHECK(is_int(), FormatError, "metadata value of type ", type_desc(*this), " is not an integer");
  STRATA_CHECK(type != ValueType::U64 || u <= uint64_t(INT64_MAX), FormatError, "metadata value ", u,
               " does not fit in int64");
  return i;
}
uint64_t Value::as_uint() const {
  STRATA_CHECK(is_int(), FormatError, "metadata value of type ", type_desc(*this), " is not an integer");
  STRATA_CHECK(!is_signed_type(type) || i >= 0, FormatError, "metadata value ", i, " is negative");
  return u;
}
double Value::as_float() const {
  if (is_float()) return f;
  STRATA_CHECK(is_int(), FormatError, "metadata value of type ", type_desc(*this), " is not a number");
  return is_signed_type(type) ? double(i) : double(u);
}
bool Value::as_bool() const {
  STRATA_CHECK(type == ValueType::BOOL, FormatError, "metadata value of type ", type_desc(*this),
               " is not a bool");
  return i != 0;
}
const std::string& Value::as_string() const {
  STRATA_CHECK(is_string(), FormatError, "metadata value of type ", type_desc(*this), " is not a string");
  return s;
}
size_t Value::array_size() const {
  STRATA_CHECK(is_array(), FormatError, "metadata value of type ", type_desc(*this), " is not an array");
  if (elem_type == ValueType::STRING) return strings.size();
  return is_float_type(elem_type) ? floats.size() : ints.size();
}

int64_t TensorInfo::nelements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;  // cannot overflow: the reader checked the product
  return n;
}

std::shared_ptr<File> File::open(const std::string& path) {
  std::shared_ptr<File> f(new File());  // owns the mapping, so a throwing parse() unmaps it
  f->map(path);
  f->parse();
  return f;
}

std::shared_ptr<File> File::from_memory(const std::string& name, const void* data, size_t size) {
  std::shared_ptr<File> f(new File());
  f->path_ = name;
  f->size_ = size;
  // An exact-size heap copy: a sanitizer sees every read past the end, which a page of mapping hides.
  f->owned_.reset(new uint8_t[size > 0 ? size : 1]);
  if (size > 0) std::memcpy(f->owned_.get(), data, size);
  f->base_ = f->owned_.get();
  f->parse();
  return f;
}

File::~File() {
  if (base_ != nullptr && !owned_) munmap(const_cast<uint8_t*>(base_), size_);
}

void File::map(const std::string& path) {
  path_ = path;
  const auto sys_error = [&](const char* what) {
    return Error(str(path, ": ", what, ": ", std::generic_category().message(errno)));
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw sys_error("cannot open");
  struct stat st{};
  if (fstat(fd, &st) != 0) {
    const Error e = sys_error("cannot stat");
    ::close(fd);
    throw e;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(str(path, ": cannot open: ", S_ISDIR(st.st_mode) ? "is a directory" : "not a regular file"));
  }
  size_ = uint64_t(st.st_size);
  if (size_ > 0) {  // mmap rejects length 0; parse() reports the empty file
    void* p = mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const Error e = sys_error("cannot mmap");
      ::close(fd);
      throw e;
    }
    base_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
}

void File::parse() {
  const std::string& P = path_;
  if (size_ >= 4 && std::memcmp(base_, "GGUF", 4) != 0)
    throw FormatError(str(P, ": not a GGUF file: bad magic at byte offset 0: bytes ", std::hex, int(base_[0]),
                          " ", int(base_[1]), " ", int(base_[2]), " ", int(base_[3]),
                          ", expected 47 47 55 46 (\"GGUF\")"));
  STRATA_CHECK(size_ >= kHeaderBytes, FormatError, P, ": truncated: file too small: ", size_,
               " bytes, a GGUF header takes ", kHeaderBytes);
  Cursor c(P, base_, size_);
  c.pos = 4;
  version_ = c.read<uint32_t>([] { return std::string("version"); });
  if (version_ != 2 && version_ != 3) {
    const uint32_t swapped = __builtin_bswap32(version_);
    throw FormatError(
        str(P, ": unsupported GGUF version ", version_, " at byte offset 4 (strata reads versions 2 and 3",
            swapped == 2 || swapped == 3 ? "; this looks like a big-endian file, which is not supported" : "",
            ")"));
  }
  const uint64_t n_tensors = c.read<uint64_t>([] { return std::string("n_tensors"); });
  const uint64_t n_kv = c.read<uint64_t>([] { return std::string("n_kv"); });
  // Counts bound the reservations below, so a corrupt count must not allocate.
  STRATA_CHECK(n_tensors <= c.left() / kMinTensorBytes, FormatError, P, ": n_tensors ", n_tensors,
               " at byte offset 8 is impossible: each tensor info takes at least ", kMinTensorBytes,
               " bytes and only ", c.left(), " bytes follow the header (truncated or corrupt)");
  STRATA_CHECK(n_kv <= (c.left() - n_tensors * kMinTensorBytes) / kMinKvBytes, FormatError, P, ": n_kv ",
               n_kv, " at byte offset 16 is impossible: each metadata pair takes at least ", kMinKvBytes,
               " bytes and only ", c.left(), " bytes follow the header (truncated or corrupt)");

  kv_.reserve(n_kv);
  for (uint64_t k = 0; k < n_kv; ++k) {
    const uint64_t at = c.pos;
    std::string key = c.read_string([&] { return str("metadata key #", k, " name"); });
    const auto F = [&] { return str("metadata key #", k, " '", printable(key), "'"); };
    STRATA_CHECK(!kv_index_.contains(key), FormatError, P, ": ", F(), " at byte offset ", at,
                 " is a duplicate of metadata key #", kv_index_[key]);
    Value v;
    const uint64_t type_at = c.pos;
    const uint32_t t = c.read<uint32_t>([&] { return F() + " value type"; });
    STRATA_CHECK(known_value_type(t), FormatError, P, ": ", F(), " value type ", t, " at byte offset ",
                 type_at, " is unknown (known types are 0..12)");
    v.type = ValueType(t);
    if (v.type == ValueType::ARRAY) {
      const uint64_t et_at = c.pos;
      const uint32_t et = c.read<uint32_t>([&] { return F() + " array element type"; });
      STRATA_CHECK(known_value_type(et), FormatError, P, ": ", F(), " array element type ", et,
                   " at byte offset ", et_at, " is unknown (known types are 0..12)");
      STRATA_CHECK(ValueType(et) != ValueType::ARRAY, FormatError, P, ": ", F(), " at byte offset ", et_at,
                   " is a nested array, which strata does not support");
      v.elem_type = ValueType(et);
      const uint64_t n_at = c.pos;
      const uint64_t n = c.read<uint64_t>([&] { return F() + " array length"; });
      const uint64_t es = min_value_bytes(v.elem_type);
      STRATA_CHECK(n <= c.left() / es, FormatError, P, ": ", F(), " array length ", n, " at byte offset ",
                   n_at, " needs at least ", es, " bytes per ", value_type_name(v.elem_type),
                   " element but only ", c.left(), " bytes are left in the file");
      const auto E = [&](uint64_t j) { return [&, j] { return str(F(), " array element #", j); }; };
      if (v.elem_type == ValueType::STRING) {
        v.strings.reserve(n);
        for (uint64_t j = 0; j < n; ++j) v.strings.push_back(c.read_string(E(j)));
      } else if (v.elem_type == ValueType::F32) {
        v.floats.reserve(n);
        for (uint64_t j = 0; j < n; ++j) v.floats.push_back(c.read<float>(E(j)));
      } else if (v.elem_type == ValueType::F64) {
        v.floats.reserve(n);
        for (uint64_t j = 0; j < n; ++j) v.floats.push_back(c.read<double>(E(j)));
      } else {
        v.ints.reserve(n);
        for (uint64_t j = 0; j < n; ++j) v.ints.push_back(c.read_int(v.elem_type, E(j)));
      }
    } else if (v.type == ValueType::STRING) {
      v.s = c.read_string(F);
    } else if (v.type == ValueType::F32) {
      v.f = c.read<float>([&] { return F() + " value"; });
    } else if (v.type == ValueType::F64) {
      v.f = c.read<double>([&] { return F() + " value"; });
    } else {
      v.i = c.read_int(v.type, [&] { return F() + " value"; });
      v.u = uint64_t(v.i);
    }
    kv_index_.emplace(key, kv_.size());
    kv_.emplace_back(std::move(key), std::move(v));
  }

  if (const Value* a = find("general.alignment")) {
    STRATA_CHECK(a->type == ValueType::U32, FormatError, P, ": metadata key 'general.alignment' has type ",
                 type_desc(*a), ", expected u32");
    // The GGUF spec asks for a multiple of 8; less would let tensor data start at an address the
    // kernels cannot read words from.
    STRATA_CHECK(a->u >= kMinAlignment && std::has_single_bit(a->u), FormatError, P,
                 ": metadata key 'general.alignment' is ", a->u, ", expected a power of two of at least ",
                 kMinAlignment, " (the GGUF spec asks for a multiple of 8)");
    alignment_ = a->u;
  }

  std::vector<uint64_t> info_at(n_tensors);
  tensors_.resize(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    TensorInfo& ti = tensors_[k];
    info_at[k] = c.pos;
    ti.name = c.read_string([&] { return str("tensor #", k, " name"); });
    const auto F = [&] { return str("tensor '", printable(ti.name), "'"); };
    STRATA_CHECK(!tensor_index_.contains(ti.name), FormatError, P, ": ", F(), " at byte offset ", info_at[k],
                 " is a duplicate of tensor #", tensor_index_[ti.name]);
    tensor_index_.emplace(ti.name, k);
    const uint64_t nd_at = c.pos;
    const uint32_t n_dims = c.read<uint32_t>([&] { return F() + " n_dims"; });
    STRATA_CHECK(n_dims >= 1 && n_dims <= 4, FormatError, P, ": ", F(), " n_dims ", n_dims,
                 " at byte offset ", nd_at, " is out of range 1..4");
    int64_t n = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t d_at = c.pos;
      const uint64_t ne = c.read<uint64_t>([&] { return str(F(), " ne[", d, "]"); });
      STRATA_CHECK(ne >= 1 && ne <= uint64_t(INT64_MAX) && !__builtin_mul_overflow(n, int64_t(ne), &n),
                   FormatError, P, ": ", F(), " ne[", d, "] = ", ne, " at byte offset ", d_at,
                   ne == 0 ? " is zero" : " makes the element count overflow int64");
      ti.ne.push_back(int64_t(ne));
    }
    const uint64_t t_at = c.pos;
    ti.type = c.read<uint32_t>([&] { return F() + " type"; });
    int64_t bs = 0, ts = 0;
    STRATA_CHECK(ggml_type_size(ti.type, &bs, &ts), FormatError, P, ": ", F(), " type ", ti.type,
                 " at byte offset ", t_at, " is not a known ggml type");
    STRATA_CHECK(ti.ne[0] % bs == 0, FormatError, P, ": ", F(), " ne[0] = ", ti.ne[0],
                 " is not a multiple of the ", ggml_type_name(ti.type), " block size ", bs,
                 " (byte offset of the tensor info: ", info_at[k], ")");
    int64_t nbytes = 0;
    STRATA_CHECK(!__builtin_mul_overflow(n / bs, ts, &nbytes), FormatError, P, ": ", F(),
                 " byte size overflows int64", " (byte offset of the tensor info: ", info_at[k], ")");
    ti.nbytes = uint64_t(nbytes);
    ti.offset = c.read<uint64_t>([&] { return F() + " offset"; });  // relative until data_offset_ is known
  }

  data_offset_ = (c.pos + alignment_ - 1) / alignment_ * alignment_;
  for (uint64_t k = 0; k < n_tensors; ++k) {
    TensorInfo& ti = tensors_[k];
    const uint64_t rel = ti.offset;
    STRATA_CHECK(rel % alignment_ == 0, FormatError, P, ": tensor '", printable(ti.name), "' offset ", rel,
                 " (relative to the data section) is not a multiple of the alignment ", alignment_,
                 " (byte offset of the tensor info: ", info_at[k], ")");
    uint64_t end = 0;
    const bool overflow = __builtin_add_overflow(data_offset_, rel, &ti.offset) ||
                          __builtin_add_overflow(ti.offset, ti.nbytes, &end);
    STRATA_CHECK(!overflow && end <= size_, FormatError, P, ": truncated: tensor '", printable(ti.name),
                 "' data [offset ", overflow ? std::string("overflows") : std::to_string(ti.offset),
                 " = data section ", data_offset_, " + ", rel, ", ", ti.nbytes,
                 " bytes] ends past the file size ", size_, " (byte offset of the tensor info: ", info_at[k],
                 ")");
    ti.data = base_ + ti.offset;
  }
  // No two tensors share bytes: every size strata derives from the tensors then stays within the
  // file's size (a few bytes of tensor info cannot name the same megabytes a thousand times).
  std::vector<uint64_t> order(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) order[k] = k;
  std::sort(order.begin(), order.end(), [&](uint64_t a, uint64_t b) {
    return std::pair(tensors_[a].offset, a) < std::pair(tensors_[b].offset, b);
  });
  for (uint64_t k = 1; k < n_tensors; ++k) {
    const TensorInfo& a = tensors_[order[k - 1]];
    const TensorInfo& b = tensors_[order[k]];
    STRATA_CHECK(a.offset + a.nbytes <= b.offset, FormatError, P, ": tensor '", printable(b.name),
                 "' data [offset ", b.offset, ", ", b.nbytes, " bytes] overlaps tensor '", printable(a.name),
                 "' data [offset ", a.offset, ", ", a.nbytes,
                 " bytes] (byte offset of the tensor info: ", info_at[order[k]], ")");
  }
}

const Value* File::find(const std::string& key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const Value& File::typed(const std::string& key, bool ok(const Value&), const char* want) const {
  const Value* v = find(key);
  STRATA_CHECK(v != nullptr, FormatError, path_, ": metadata key '", printable(key), "' is missing");
  STRATA_CHECK(ok(*v), FormatError, path_, ": metadata key '", printable(key), "' has type ", type_desc(*v),
               ", expected ", want);
  return *v;
}

namespace {
bool ok_int(const Value& v) { return v.is_int() && (v.type != ValueType::U64 || v.u <= uint64_t(INT64_MAX)); }
bool ok_float(const Value& v) { return v.is_float() || v.is_int(); }
bool ok_string(const Value& v) { return v.is_string(); }
bool ok_bool(const Value& v) { return v.type == ValueType::BOOL; }
}  // namespace

int64_t File::get_int(const std::string& key) const {
  return typed(key, ok_int, "an integer within int64").i;
}
int64_t File::get_int(const std::string& key, int64_t dflt) const { return find(key) ? get_int(key) : dflt; }
double File::get_float(const std::string& key) const { return typed(key, ok_float, "a number").as_float(); }
double File::get_float(const std::string& key, double dflt) const {
  return find(key) ? get_float(key) : dflt;
}
std::string File::get_string(const std::string& key) const { return typed(key, ok_string, "string").s; }
std::string File::get_string(const std::string& key, const std::string& dflt) const {
  return find(key) ? get_string(key) : dflt;
}
bool File::get_bool(const std::string& key, bool dflt) const {
  return find(key) ? typed(key, ok_bool, "bool").i != 0 : dflt;
}

const TensorInfo* File::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& File::tensor(const std::string& name) const {
  const TensorInfo* t = find_tensor(name);
  STRATA_CHECK(t != nullptr, FormatError, path_, ": tensor '", printable(name), "' is missing");
  return *t;
}

}  // namespace strata::gguf
