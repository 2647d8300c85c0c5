// Bindings for gguf: read_gguf(path) -> dict of header, metadata and tensor table.
#include <pybind11/stl.h>

#include "bindings/bind.h"
#include "core/ggml_types.h"
#include "gguf/gguf.h"

namespace py = pybind11;

namespace strata {
namespace {

// GGUF strings should be UTF-8 but tokenizer vocabularies sometimes are not; surrogateescape
// keeps every byte (s.encode("utf-8", "surrogateescape") gives the original back).
py::object to_str(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), Py_ssize_t(s.size()), "surrogateescape");
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(o);
}

py::object to_int(gguf::ValueType t, int64_t bits) {
  if (t == gguf::ValueType::BOOL) return py::bool_(bits != 0);
  if (t == gguf::ValueType::U64) return py::int_(uint64_t(bits));  // ints hold U64 as a bit pattern
  return py::int_(bits);
}

py::object to_py(const gguf::Value& v) {
  using gguf::ValueType;
  if (v.is_string()) return to_str(v.s);
  if (v.is_float()) return py::float_(v.f);
  if (!v.is_array()) return v.type == ValueType::U64 ? py::int_(v.u) : to_int(v.type, v.i);
  py::list out(v.array_size());
  for (size_t j = 0; j < v.array_size(); ++j) {
    if (v.elem_type == ValueType::STRING)
      out[j] = to_str(v.strings[j]);
    else if (v.elem_type == ValueType::F32 || v.elem_type == ValueType::F64)
      out[j] = py::float_(v.floats[j]);
    else
      out[j] = to_int(v.elem_type, v.ints[j]);
  }
  return out;
}

py::dict read_gguf(const std::string& path) {
  const auto f = gguf::File::open(path);
  py::dict md;
  for (const auto& [key, value] : f->metadata()) md[to_str(key)] = to_py(value);
  py::list tensors;
  for (const auto& t : f->tensors()) {
    py::dict d;
    d["name"] = to_str(t.name);
    d["type"] = t.type;
    d["type_name"] = ggml_type_name(t.type);
    d["shape"] = py::cast(t.ne);
    d["offset"] = t.offset;
    d["nbytes"] = t.nbytes;
    tensors.append(d);
  }
  py::dict out;
  out["path"] = f->path();
  out["version"] = f->version();
  out["alignment"] = f->alignment();
  out["data_offset"] = f->data_offset();
  out["file_size"] = f->file_size();
  out["metadata"] = md;
  out["tensors"] = tensors;
  return out;
}

}  // namespace

void bind_gguf(py::module_& m) {
  m.def("read_gguf", &read_gguf, py::arg("path"),
        "Validate a GGUF file and return its header, metadata (key -> int/float/bool/str/list) and tensor "
        "table (name, type, type_name, shape in ggml order, absolute offset, nbytes). Raises FormatError.");
}

}  // namespace strata
