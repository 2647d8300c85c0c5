// One registration function per binding file, called from module.cpp.
#pragma once
#include <pybind11/pybind11.h>

namespace strata {
void bind_gguf(pybind11::module_& m);
void bind_quant(pybind11::module_& m);
void bind_model(pybind11::module_& m);
}  // namespace strata
