// Activation quantization for the MMQ layout (llama.cpp's reference quantize_row_q8_0).
#pragma once
#include <cstdint>

namespace strata {
// n % 32 == 0; writes n / 32 blocks of 34 bytes (f16 d, 32 int8).
void quantize_row_q8_0(const float* x, uint8_t* out, int64_t n);
}  // namespace strata
