// Structure-aware GGUF mutation for the libFuzzer targets (see gguf_mutator.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

namespace strata::fuzz {

// Changes one to three fields of the GGUF structure held in data[0..size) (dims, types, offsets,
// counts, string lengths, metadata values, keys, names, alignment) and writes the file back in
// place, cut to max_size. Returns the new size, or 0 when the bytes do not parse as a GGUF.
size_t mutate_gguf(uint8_t* data, size_t size, size_t max_size, uint32_t seed);

}  // namespace strata::fuzz
