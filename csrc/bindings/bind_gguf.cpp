// Bindings for gguf: GGUFFile, its header, metadata and tensor table as Python values.
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

py::dict metadata_dict(const gguf::File& f) {
  py::dict md;
  for (const auto& [key, value] : f.metadata()) md[to_str(key)] = to_py(value);
  return md;
}

py::list tensor_list(const gguf::File& f) {
  py::list tensors;
  for (const auto& t : f.tensors()) {
    py::dict d;
    d["name"] = to_str(t.name);
    d["type"] = t.type;
    d["type_name"] = ggml_type_name(t.type);
    d["shape"] = py::cast(t.ne);
    d["offset"] = t.offset;
    d["nbytes"] = t.nbytes;
    tensors.append(d);
  }
  return tensors;
}

}  // namespace

void bind_gguf(py::module_& m) {
  // Shared with the Models built on it: the file is mapped and its header validated once per load.
  py::class_<gguf::File, std::shared_ptr<gguf::File>>(
      m, "GGUFFile", "A mapped, validated GGUF file: header, metadata and tensor table.")
      .def(py::init(&gguf::File::open), py::arg("path"), "Maps and validates `path`; raises FormatError.")
      .def_property_readonly("path", &gguf::File::path)
      .def_property_readonly("version", &gguf::File::version)
      .def_property_readonly("alignment", &gguf::File::alignment)
      .def_property_readonly("data_offset", &gguf::File::data_offset)
      .def_property_readonly("file_size", &gguf::File::file_size)
      .def_property_readonly("metadata", &metadata_dict,
                             "key -> int/float/bool/str/list (a new dict each read)")
      .def_property_readonly(
          "tensors", &tensor_list,
          "name, type, type_name, shape in ggml order, absolute offset, nbytes per tensor");
}

}  // namespace strata
