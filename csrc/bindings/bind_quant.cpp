// Bindings for quant (placeholder registration until the quant layer lands).
#include "bindings/bind.h"

namespace strata {
void bind_quant(pybind11::module_& m) { (void)m; }
}  // namespace strata
