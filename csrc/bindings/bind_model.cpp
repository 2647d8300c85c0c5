// Bindings for model (placeholder registration until the model layer lands).
#include "bindings/bind.h"

namespace strata {
void bind_model(pybind11::module_& m) { (void)m; }
}  // namespace strata
