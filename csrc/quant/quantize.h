// Activation quantization for the MMQ layout (llama.cpp's reference quantize_row_q8_0).
#pragma once
#include <cstdint>

namespace strata {
// n % kQK8_0 == 0; writes n / kQK8_0 BlockQ8_0 (formats.h), kQ8_0Bytes apart.
void quantize_row_q8_0(const float* x, uint8_t* out, int64_t n);
}  // namespace strata
