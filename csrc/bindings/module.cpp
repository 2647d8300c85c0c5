// The pybind11 module strata._core: converts types and maps errors, nothing else.
#include <pybind11/pybind11.h>

#include "bindings/bind.h"
#include "core/error.h"

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
  m.doc() = "strata native core";
  auto base = py::register_exception<strata::Error>(m, "Error", PyExc_RuntimeError);
  py::register_exception<strata::FormatError>(m, "FormatError", base.ptr());
  py::register_exception<strata::UnsupportedError>(m, "UnsupportedError", base.ptr());
  py::register_exception<strata::MemoryError>(m, "MemoryError", base.ptr());
  py::register_exception<strata::ConfigError>(m, "ConfigError", base.ptr());
  // Ctrl-C stopped a pass: Python's own exception for it, with the Model left usable.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const strata::Interrupted&) {
      PyErr_SetNone(PyExc_KeyboardInterrupt);
    }
  });
#ifdef STRATA_HAVE_CUDA
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif
  strata::bind_gguf(m);
  strata::bind_quant(m);
  strata::bind_model(m);
}
