// SwiGLU's elementwise step (see activation.h): a scalar path, AVX2 and AVX-512 paths with the
// same operations lane by lane (the exp from kernels/vexp.h).
#include "kernels/activation.h"

#include <cmath>

#include "kernels/intrinsics.h"
#include "kernels/quant_dot.h"
#include "kernels/vexp.h"

namespace kvslim {

namespace {

// silu(x) u = x / (1 + e^-x) u with vexp's exp (the same bits at every width). Where e^-x overflows
// (-x > 88) the quotient is taken as 0 (x / inf), as with std::exp.
constexpr float kMaxArg = 88.0f;

float silu_mul_one(float x, float u) {
  const float a = -x;
  return x / (a > kMaxArg ? INFINITY : vexp::exp1(a > kMaxArg ? kMaxArg : a) + 1.0f) * u;
}

void silu_mul_scalar(float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = silu_mul_one(g[i], u[i]);
}

#define ACT_AVX2 inline __attribute__((always_inline, target("arch=x86-64-v3")))
#define ACT_AVX512 inline __attribute__((always_inline, target("arch=x86-64-v4")))

ACT_AVX2 __m256 silu_mul8(__m256 x, __m256 u) {
  const __m256 a = _mm256_sub_ps(_mm256_setzero_ps(), x), top = _mm256_set1_ps(kMaxArg);
  const __m256 e1 = _mm256_add_ps(vexp::exp8(_mm256_min_ps(a, top)), _mm256_set1_ps(1.0f));
  const __m256 den = _mm256_blendv_ps(e1, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(a, top, _CMP_GT_OQ));
  return _mm256_mul_ps(_mm256_div_ps(x, den), u);
}

__attribute__((target("arch=x86-64-v3"), noinline)) void silu_mul_avx2(float* g, const float* u, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(g + i, silu_mul8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
  if (i < n) {
    // The tail through the same lanes, masked: zeros in the unused lanes give finite values that
    // are not stored.
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - i)),
                                         _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 y = silu_mul8(_mm256_maskload_ps(g + i, m), _mm256_maskload_ps(u + i, m));
    _mm256_maskstore_ps(g + i, m, y);
  }
}

ACT_AVX512 __m512 silu_mul16(__m512 x, __m512 u) {
  const __m512 a = _mm512_sub_ps(_mm512_setzero_ps(), x), top = _mm512_set1_ps(kMaxArg);
  const __m512 e1 = _mm512_add_ps(vexp::exp16(_mm512_min_ps(a, top)), _mm512_set1_ps(1.0f));
  const __m512 den = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, top, _CMP_GT_OQ), e1, _mm512_set1_ps(INFINITY));
  return _mm512_mul_ps(_mm512_div_ps(x, den), u);
}

__attribute__((target("arch=x86-64-v4"), noinline)) void silu_mul_avx512(float* g, const float* u, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(g + i, silu_mul16(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(g + i, m, silu_mul16(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i)));
  }
}

}  // namespace

void silu_mul(float* g, const float* u, int64_t n, bool exact) {
  if (exact) {
    for (int64_t i = 0; i < n; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    return;
  }
  switch (qdot::level()) {
    case qdot::Level::AVX512: return silu_mul_avx512(g, u, n);
    case qdot::Level::AVXVNNI:
    case qdot::Level::AVX2: return silu_mul_avx2(g, u, n);
    default: return silu_mul_scalar(g, u, n);
  }
}

}  // namespace kvslim
