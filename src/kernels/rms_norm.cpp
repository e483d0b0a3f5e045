// RMSNorm (see rms_norm.h): one scalar path and AVX2 / AVX-512 paths with the same sums and
// products lane by lane. The baseline build's scalar loop converted and added one double at a
// time; a batched decode step of 8 rows spent 4% of its time in its norms.
#include "kernels/rms_norm.h"

#include <cmath>

#include "kernels/intrinsics.h"
#include "kernels/quant_dot.h"

namespace kvslim {

namespace {

float scale_of(const double part[8], int64_t n, float eps) {
  const double ss = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  return 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
}

void rms_norm_scalar(const float* x, const float* w, float* y, int64_t n, float eps) {
  double part[8] = {};
  for (int64_t i = 0; i < n; ++i) part[i % 8] += double(x[i]) * x[i];
  const float s = scale_of(part, n, eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s * w[i];
}

__attribute__((target("arch=x86-64-v3"), noinline)) void rms_norm_avx2(const float* x, const float* w, float* y,
                                                                        int64_t n, float eps) {
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();  // sums 0-3 and 4-7
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), b = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    lo = _mm256_add_pd(lo, _mm256_mul_pd(a, a));
    hi = _mm256_add_pd(hi, _mm256_mul_pd(b, b));
  }
  alignas(32) double part[8];
  _mm256_store_pd(part, lo);
  _mm256_store_pd(part + 4, hi);
  for (int64_t j = 0; i + j < n; ++j) part[j] += double(x[i + j]) * x[i + j];
  const float s = scale_of(part, n, eps);
  const __m256 vs = _mm256_set1_ps(s);
  for (i = 0; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs), _mm256_loadu_ps(w + i)));
  for (; i < n; ++i) y[i] = x[i] * s * w[i];
}

__attribute__((target("arch=x86-64-v4"), noinline)) void rms_norm_avx512(const float* x, const float* w, float* y,
                                                                          int64_t n, float eps) {
  __m512d acc = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512d a = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
    acc = _mm512_add_pd(acc, _mm512_mul_pd(a, a));
  }
  alignas(64) double part[8];
  _mm512_store_pd(part, acc);
  for (int64_t j = 0; i + j < n; ++j) part[j] += double(x[i + j]) * x[i + j];
  const float s = scale_of(part, n, eps);
  const __m512 vs = _mm512_set1_ps(s);
  for (i = 0; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vs), _mm512_loadu_ps(w + i)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m,
                          _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vs), _mm512_maskz_loadu_ps(m, w + i)));
  }
}

}  // namespace

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  switch (qdot::level()) {
    case qdot::Level::AVX512: return rms_norm_avx512(x, w, y, n, eps);
    case qdot::Level::AVXVNNI:
    case qdot::Level::AVX2: return rms_norm_avx2(x, w, y, n, eps);
    default: return rms_norm_scalar(x, w, y, n, eps);
  }
}

}  // namespace kvslim
