// ggml's type ids: every name and block geometry, to validate files and name types in errors
// (quant/ has the compute traits of the types strata runs).
#pragma once
#include <cstdint>

namespace strata {

const char* ggml_type_name(uint32_t t);  // nullptr for an unknown id
bool ggml_type_size(uint32_t t, int64_t* block, int64_t* bytes);

}  // namespace strata
