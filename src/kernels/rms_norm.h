// RMSNorm of one row of activations, on the SIMD level of the weight products.
#pragma once

#include <cstdint>

namespace kvslim {

/// y[i] = x[i] * s * w[i] with s = 1 / sqrt(mean(x^2) + eps), over n values (RMSNorm, Zhang and
/// Sennrich 2019, arXiv:1910.07467). The sum of squares is taken in double in 8 partial sums
/// (element i into sum i mod 8), added pairwise; the products (x * s) * w are two float products.
/// Every level of qdot::level() (scalar, AVX2, AVX-512) takes these steps (a square of a float is
/// exact in double), so a row's result depends on the row alone. y may be x.
void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps);

}  // namespace kvslim
