// rms_norm (kernels/rms_norm.h) at every SIMD level this CPU has: within a few float roundings of
// a float64 RMSNorm, bit-identical between levels for every length (tails included), in place too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/quant_dot.h"
#include "kernels/rms_norm.h"

using namespace kvslim;

namespace {

struct LevelGuard {
  qdot::Level saved = qdot::level();
  ~LevelGuard() { qdot::set_level(saved); }
};

std::vector<float> values(size_t n, uint32_t seed, float sd) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

}  // namespace

TEST(RmsNorm, MatchesFloat64AndIsTheSameAtEveryLevel) {
  LevelGuard guard;
  const float eps = 1e-5f;
  std::vector<int> lengths;
  for (int n = 1; n <= 40; ++n) lengths.push_back(n);
  lengths.insert(lengths.end(), {64, 2048, 2051, 5632});
  for (int n : lengths) {
    SCOPED_TRACE("n " + std::to_string(n));
    const std::vector<float> x = values(n, 11 + n, n % 3 == 0 ? 40.0f : 1.0f), w = values(n, 97 + n, 0.5f);
    double ss = 0;
    for (float v : x) ss += double(v) * v;
    const double inv = 1.0 / std::sqrt(ss / n + eps);
    std::vector<float> first;
    for (qdot::Level lv : qdot::supported_levels()) {
      qdot::set_level(lv);
      SCOPED_TRACE(qdot::level_name(lv));
      std::vector<float> y(n);
      rms_norm(x.data(), w.data(), y.data(), n, eps);
      for (int i = 0; i < n; ++i) {
        const double want = x[i] * inv * w[i];
        // The float scale and two float products: within 4 roundings of the value.
        ASSERT_NEAR(y[i], want, 4 * std::ldexp(std::fabs(want), -24) + 1e-30) << i;
      }
      if (first.empty()) first = y;
      ASSERT_EQ(0, std::memcmp(first.data(), y.data(), n * sizeof(float)));
      std::vector<float> inplace = x;
      rms_norm(inplace.data(), w.data(), inplace.data(), n, eps);
      ASSERT_EQ(0, std::memcmp(first.data(), inplace.data(), n * sizeof(float)));
    }
  }
}

// Hand-derived: x = (3, 4), w = (1, 2), eps = 0: mean square 12.5, so y = x / sqrt(12.5) * w.
TEST(RmsNorm, TwoValuesByHand) {
  LevelGuard guard;
  for (qdot::Level lv : qdot::supported_levels()) {
    qdot::set_level(lv);
    const float x[2] = {3.0f, 4.0f}, w[2] = {1.0f, 2.0f};
    float y[2];
    rms_norm(x, w, y, 2, 0.0f);
    EXPECT_NEAR(y[0], 0.848528137, 1e-6);
    EXPECT_NEAR(y[1], 2.262741700, 1e-6);
  }
}
