// kernels/vexp.h: e^x at its three widths (a float, 8 lanes with AVX2, 16 with AVX-512) against
// float64 std::exp, and the three bit for bit alike, over the whole argument range: a dense sweep,
// the points where n = round(x log2 e) changes, and the clamp at -87.3 (where n = -126 and the
// result, y 2^n built by adding n to y's exponent field, must stay a normal float).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/quant_dot.h"
#include "kernels/vexp.h"

using namespace kvslim;

namespace {

std::vector<float> arguments() {
  std::vector<float> x;
  for (int i = 0; i <= 400000; ++i) x.push_back(-87.3f + (88.0f + 87.3f) * static_cast<float>(i) / 400000.0f);
  // Either side of every change of n, a few ulps each way.
  for (int n = -126; n <= 127; ++n) {
    float b = static_cast<float>((n + 0.5) * std::log(2.0));
    for (int k = 0; k < 4; ++k) b = std::nextafter(b, -INFINITY);
    for (int k = 0; k < 9; ++k, b = std::nextafter(b, INFINITY))
      if (b >= -87.3f && b <= 88.0f) x.push_back(b);
  }
  float lo = -87.3f;
  for (int k = 0; k < 64; ++k, lo = std::nextafter(lo, INFINITY)) x.push_back(lo);
  for (float e : {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-7f, -1e-7f, 0.5f, -0.5f, 1.0f, -1.0f, 88.0f}) x.push_back(e);
  while (x.size() % 16) x.push_back(0.0f);
  return x;
}

__attribute__((target("avx2,fma"))) void exp8_all(const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; i += 8) _mm256_storeu_ps(y + i, vexp::exp8(_mm256_loadu_ps(x + i)));
}
__attribute__((target("avx512f"))) void exp16_all(const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; i += 16) _mm512_storeu_ps(y + i, vexp::exp16(_mm512_loadu_ps(x + i)));
}

}  // namespace

// Cephes' expf (whose reduction and polynomial these are) is quoted at about 1e-7 relative error;
// 1.2e-7 is one float ulp at the top of a binade. (Every float in [-87.3, 88], checked once by hand
// against float64: at most 8.5e-8.)
TEST(Vexp, ScalarMatchesFloat64OverTheRange) {
  for (float x : arguments()) {
    const float y = vexp::exp1(x);
    const double want = std::exp(static_cast<double>(x));
    ASSERT_NEAR(y, want, 1.2e-7 * want) << "x " << x;
    ASSERT_TRUE(std::isnormal(y)) << "x " << x << " gives " << y;
  }
}

// expv, the vector-extension form for the generic kernels, compiled here for the baseline (no fma:
// its products round on their own), so within float64 by a little more than exp1.
TEST(Vexp, VectorExtensionFormMatchesFloat64) {
  typedef float v4f __attribute__((vector_size(16)));
  typedef int32_t v4i __attribute__((vector_size(16)));
  const std::vector<float> x = arguments();
  for (size_t i = 0; i < x.size(); i += 4) {
    v4f v;
    std::memcpy(&v, &x[i], sizeof v);
    const v4f y = vexp::expv<v4f, v4i>(v);
    for (int j = 0; j < 4; ++j) {
      const double want = std::exp(static_cast<double>(x[i + j]));
      ASSERT_NEAR(y[j], want, 2.5e-7 * want) << "x " << x[i + j];
    }
  }
}

TEST(Vexp, ClampsBelowAtMinus87point3) {
  EXPECT_EQ(vexp::exp1(-1000.0f), vexp::exp1(-87.3f));
  EXPECT_EQ(vexp::exp1(-INFINITY), vexp::exp1(-87.3f));
  EXPECT_GE(vexp::exp1(-87.3f), FLT_MIN);
}

TEST(Vexp, VectorWidthsGiveTheScalarsBits) {
  const std::vector<float> x = arguments();
  std::vector<float> want(x.size()), got(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = vexp::exp1(x[i]);
  int widths = 0;
  if (qdot::cpu_has(qdot::Level::AVX2)) {
    exp8_all(x.data(), got.data(), x.size());
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0) << "exp8, x " << x[i];
    ++widths;
  }
  if (qdot::cpu_has(qdot::Level::AVX512)) {
    exp16_all(x.data(), got.data(), x.size());
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0) << "exp16, x " << x[i];
    ++widths;
  }
  if (widths == 0) GTEST_SKIP() << "no AVX2 on this CPU";
}
