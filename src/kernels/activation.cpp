// SwiGLU's elementwise step (see activation.h): a scalar path, AVX2 and AVX-512 paths with the
// same operations lane by lane.
#include "kernels/activation.h"

#include <cmath>

#include "kernels/quant_dot.h"

#include "kernels/intrinsics.h"

namespace kvslim {

namespace {

// The constants of exp(x): x = n ln2 + r with ln2 split in two (Cody-Waite), e^r by Cephes'
// polynomial, 2^n from the exponent bits. The order of operations below is the contract between
// the three paths: each step is one correctly rounded operation or one fma. Where e^-x overflows
// (-x > 88) the quotient is taken as 0 (x / inf), as with std::exp.
constexpr float kLog2e = 1.44269504088896341f, kRound = 12582912.0f;  // 1.5 * 2^23: round to nearest
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                         4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

float silu_mul_one(float x, float u) {
  float a = -x;
  const bool big = a > 88.0f;
  a = a < -87.3f ? -87.3f : a;
  a = big ? 88.0f : a;
  const float nf = std::fma(a, kLog2e, kRound) - kRound;
  float r = std::fma(-nf, kLn2Hi, a);
  r = std::fma(-nf, kLn2Lo, r);
  float y = kP[0];
  for (int i = 1; i < 6; ++i) y = std::fma(y, r, kP[i]);
  y = std::fma(y, r * r, r) + 1.0f;
  const int32_t bits = (static_cast<int32_t>(nf) + 127) << 23;
  float p;
  __builtin_memcpy(&p, &bits, sizeof p);
  return x / (big ? INFINITY : std::fma(y, p, 1.0f)) * u;
}

void silu_mul_scalar(float* g, const float* u, int64_t n) {
  for (int64_t i = 0; i < n; ++i) g[i] = silu_mul_one(g[i], u[i]);
}

#define ACT_AVX2 inline __attribute__((always_inline, target("arch=x86-64-v3")))
#define ACT_AVX512 inline __attribute__((always_inline, target("arch=x86-64-v4")))

ACT_AVX2 __m256 silu_mul8(__m256 x, __m256 u) {
  __m256 a = _mm256_sub_ps(_mm256_setzero_ps(), x);
  const __m256 big = _mm256_cmp_ps(a, _mm256_set1_ps(88.0f), _CMP_GT_OQ);
  a = _mm256_max_ps(a, _mm256_set1_ps(-87.3f));
  a = _mm256_min_ps(a, _mm256_set1_ps(88.0f));
  const __m256 rnd = _mm256_set1_ps(kRound);
  const __m256 nf = _mm256_sub_ps(_mm256_fmadd_ps(a, _mm256_set1_ps(kLog2e), rnd), rnd);
  __m256 r = _mm256_fnmadd_ps(nf, _mm256_set1_ps(kLn2Hi), a);
  r = _mm256_fnmadd_ps(nf, _mm256_set1_ps(kLn2Lo), r);
  __m256 y = _mm256_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kP[i]));
  y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(nf), _mm256_set1_epi32(127)), 23);
  const __m256 den = _mm256_blendv_ps(_mm256_fmadd_ps(y, _mm256_castsi256_ps(e), _mm256_set1_ps(1.0f)),
                                      _mm256_set1_ps(INFINITY), big);
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
  __m512 a = _mm512_sub_ps(_mm512_setzero_ps(), x);
  const __mmask16 big = _mm512_cmp_ps_mask(a, _mm512_set1_ps(88.0f), _CMP_GT_OQ);
  a = _mm512_max_ps(a, _mm512_set1_ps(-87.3f));
  a = _mm512_min_ps(a, _mm512_set1_ps(88.0f));
  const __m512 rnd = _mm512_set1_ps(kRound);
  const __m512 nf = _mm512_sub_ps(_mm512_fmadd_ps(a, _mm512_set1_ps(kLog2e), rnd), rnd);
  __m512 r = _mm512_fnmadd_ps(nf, _mm512_set1_ps(kLn2Hi), a);
  r = _mm512_fnmadd_ps(nf, _mm512_set1_ps(kLn2Lo), r);
  __m512 y = _mm512_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kP[i]));
  y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(nf), _mm512_set1_epi32(127)), 23);
  const __m512 den = _mm512_mask_blend_ps(big, _mm512_fmadd_ps(y, _mm512_castsi512_ps(e), _mm512_set1_ps(1.0f)),
                                          _mm512_set1_ps(INFINITY));
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
