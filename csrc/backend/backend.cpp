// The Backend surface's defaults for what only some backends have (graphs, a position source).
#include "backend/backend.h"

#include "core/error.h"

namespace strata {

void Backend::capture_begin() {
  throw UnsupportedError(str("the ", name(), " backend does not record graphs"));
}
GraphId Backend::capture_end() {
  throw UnsupportedError(str("the ", name(), " backend does not record graphs"));
}
void Backend::graph_launch(GraphId) {
  throw UnsupportedError(str("the ", name(), " backend does not record graphs"));
}
void Backend::set_position_source(const int32_t* dev, int64_t) {
  STRATA_CHECK(dev == nullptr, UnsupportedError, "the ", name(),
               " backend reads positions from the host only (no position source)");
}

const uint8_t* expert_matrix(const ExpertTable& t, int m, int64_t e) {
  if (t.slots) {
    const int32_t s = t.slots[e];
    return s < 0 ? nullptr : t.arena + (size_t)s * t.slot_bytes + t.off[m];
  }
  return t.base[m] + (size_t)e * t.stride[m];
}

}  // namespace strata
