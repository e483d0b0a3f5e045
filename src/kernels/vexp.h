#pragma once
// exp for the kernels, as one sequence of operations at three widths (a float, 8 lanes with AVX2,
// 16 lanes with AVX-512; the float's template also serves GCC vector types for the generic kernels):
// x = n ln2 + r with ln2 in two parts (Cody-Waite), e^r by Cephes' degree-6 polynomial (about 1e-7
// relative error), then 2^n applied by adding n to the exponent field. Each step is one correctly
// rounded operation or one fma, so the three widths give the same bits. Arguments are
// clamped from below at -87.3 (so y 2^n stays a normal float: where n = -126, r > 0 and y > 1);
// callers whose arguments can exceed 88 clamp them above.
//
// n comes from the bits of t = x log2(e) + 1.5 2^23 (in [2^23, 2^24), where floats are the integers,
// so bits(t) = bits(1.5 2^23) + n) shifted left by 23: the constant's part leaves nothing (its low 9
// bits are 0), so bits(t) << 23 is n << 23. Adding that to y's bits multiplies y by 2^n exactly,
// as a multiply by the float 2^n did, in two integer operations (shift, add) instead of four
// (conversion, add, shift, multiply): one fewer on the fma pipes, where the attention softmax runs one
// exp per 16 fmas.
#include <cstdint>
#include <cstring>
#include <cmath>

#include "kernels/intrinsics.h"

namespace kvslim::vexp {

constexpr float kMin = -87.3f;
constexpr float kLog2e = 1.44269504088896341f, kRound = 12582912.0f;  // 1.5 * 2^23: round to nearest
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                         4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// The vector forms below are always inlined, so no 32-byte vector crosses a call of the baseline
// build and GCC's note on their passing (-Wpsabi) does not apply.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
namespace detail {
/// a * b + c in one rounding for a float; on vector types as written, which the compiler contracts
/// into one fma where the target has them (GCC for x86-64-v3) and rounds twice where it does not.
inline float fmadd(float a, float b, float c) { return std::fma(a, b, c); }
template <class V>
inline __attribute__((always_inline)) V fmadd(V a, V b, V c) {
  return a * b + c;
}
}  // namespace detail

/// e^x lane by lane (each <= 88) on V: float (with UI = uint32_t), or a GCC vector-extension type of
/// float lanes (UI: int32 lanes of the same count), for code compiled without AVX2 too (the generic
/// attention kernels' SSE2 baseline build).
template <class V, class UI>
inline __attribute__((always_inline)) V expv(V x) {
  const V lo = V{} + kMin;
  x = x < lo ? lo : x;
  const V t = detail::fmadd(x, V{} + kLog2e, V{} + kRound), nf = t - kRound;
  V r = detail::fmadd(-nf, V{} + kLn2Hi, x);
  r = detail::fmadd(-nf, V{} + kLn2Lo, r);
  V y = V{} + kP[0];
  for (int i = 1; i < 6; ++i) y = detail::fmadd(y, r, V{} + kP[i]);
  y = detail::fmadd(y, r * r, r) + 1.0f;
  UI tb, yb;
  static_assert(sizeof tb == sizeof t, "UI: 32-bit integer lanes, as many as V's");
  std::memcpy(&tb, &t, sizeof tb);
  std::memcpy(&yb, &y, sizeof yb);
  yb += tb << 23;
  std::memcpy(&y, &yb, sizeof y);
  return y;
}
#pragma GCC diagnostic pop

/// e^x for one float (x <= 88).
inline float exp1(float x) { return expv<float, uint32_t>(x); }

/// e^x on 8 lanes (each <= 88; NaN lanes give unspecified values).
inline __attribute__((always_inline, target("avx2,fma"))) __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(kMin));
  const __m256 rnd = _mm256_set1_ps(kRound);
  const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(kLog2e), rnd), nf = _mm256_sub_ps(t, rnd);
  __m256 r = _mm256_fnmadd_ps(nf, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(nf, _mm256_set1_ps(kLn2Lo), r);
  __m256 y = _mm256_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kP[i]));
  y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(t), 23);
  return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(y), e));
}

/// e^x on 16 lanes (each <= 88; NaN lanes give unspecified values).
inline __attribute__((always_inline, target("avx512f"))) __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(kMin));
  const __m512 rnd = _mm512_set1_ps(kRound);
  const __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(kLog2e), rnd), nf = _mm512_sub_ps(t, rnd);
  __m512 r = _mm512_fnmadd_ps(nf, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(nf, _mm512_set1_ps(kLn2Lo), r);
  __m512 y = _mm512_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kP[i]));
  y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_castps_si512(t), 23);
  return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(y), e));
}

}  // namespace kvslim::vexp
