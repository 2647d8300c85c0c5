// Bindings for gguf (placeholder registration until the gguf layer lands).
#include "bindings/bind.h"

namespace strata {
void bind_gguf(pybind11::module_& m) { (void)m; }
}  // namespace strata
