// SwiGLU's elementwise step (the gate's SiLU times the up projection), on the SIMD level of the
// weight products.
#pragma once

#include <cstdint>

namespace kvslim {

/// g[i] <- silu(g[i]) * u[i] = g[i] / (1 + exp(-g[i])) * u[i] for i in [0, n) (SwiGLU, Shazeer
/// 2020, arXiv:2002.05202). exp is kernels/vexp.h's (relative error about 1e-7, arguments clamped
/// to [-87.3, 88]; where exp(-g) overflows the result is 0), the same operations at every level of
/// qdot::level() (scalar, AVX2, AVX-512) and for every element including a tail, so a result
/// depends neither on the level nor on where the element sits in the array (a batched step keeps
/// the bits of single steps). `exact`: std::exp instead (the exact forward path).
void silu_mul(float* g, const float* u, int64_t n, bool exact = false);

}  // namespace kvslim
