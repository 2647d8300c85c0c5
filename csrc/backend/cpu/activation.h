// The expert FFNs' activations on the CPU, through exp_portable (core/exp_portable.h) so that they give the
// bits a GPU kernel gives: eight lanes at a time with AVX2 and FMA where the CPU has them (best_isa()), the
// scalar form elsewhere and in the tails, the same float operations in each (the tests hold them equal).
#pragma once

#include <cstdint>

#include "quant/quant.h"

namespace strata {

class ThreadPool;

// g[i] = silu(g[i]) * u[i], i < n.
void cpu_swiglu(Isa isa, float* g, const float* u, int64_t n, ThreadPool& pool);
// The same with the gate capped at limit and the up clamped to [-limit, limit] first (limit > 0;
// limit <= 0: no clamp).
void cpu_swiglu_clamp(Isa isa, float* g, const float* u, int64_t n, float limit, ThreadPool& pool);
// gpt-oss's: row i of g and u (F wide) is expert ids[rows[i]]'s; x = min(g + gate_b, limit),
// y = clamp(u + up_b, -limit, limit), g = (y + 1) * (x / (1 + e^(-alpha x))).
void cpu_swiglu_oai(Isa isa, float* g, const float* u, const int32_t* ids, const int32_t* rows, int64_t n,
                    int64_t F, const float* gate_b, const float* up_b, float alpha, float limit,
                    ThreadPool& pool);

// exp_portable over n floats (the tests' access to the eight-lane form).
void exp_portable_n(Isa isa, const float* x, float* y, int64_t n);

}  // namespace strata
