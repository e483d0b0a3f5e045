// silu_mul (kernels/activation.h) at every SIMD level this CPU has: against a float64 SwiGLU step,
// bit-identical between levels, and independent of where an element sits (tails of every length).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/activation.h"
#include "kernels/quant_dot.h"

using namespace kvslim;

namespace {

struct LevelGuard {
  qdot::Level saved = qdot::level();
  ~LevelGuard() { qdot::set_level(saved); }
};

// Gate values over the range a model's feed-forward produces, and the edges of the clamps.
std::vector<float> gate_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  std::vector<float> g(n);
  for (auto& x : g) x = nd(rng);
  const float edges[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 20.0f, -20.0f, 87.0f, -87.0f, 88.5f, -88.5f, 100.0f, -100.0f,
                         1e6f, -1e6f};
  for (size_t i = 0; i < sizeof edges / sizeof edges[0] && i < n; ++i) g[i * 7 % n] = edges[i];
  return g;
}

}  // namespace

TEST(SiluMul, MatchesFloat64AtEveryLevel) {
  LevelGuard guard;
  const size_t n = 1000;
  const std::vector<float> g0 = gate_values(n, 1), u = gate_values(n, 2);
  for (qdot::Level lv : qdot::supported_levels()) {
    qdot::set_level(lv);
    std::vector<float> g = g0;
    silu_mul(g.data(), u.data(), static_cast<int64_t>(n));
    for (size_t i = 0; i < n; ++i) {
      const double x = g0[i], want = x / (1.0 + std::exp(-x)) * u[i];
      EXPECT_NEAR(g[i], want, 4e-7 * std::fabs(want) + 1e-30) << qdot::level_name(lv) << " g " << x << " u " << u[i];
    }
  }
}

TEST(SiluMul, SameBitsAtEveryLevelAndOffset) {
  LevelGuard guard;
  const size_t n = 97;
  const std::vector<float> g0 = gate_values(n, 3), u = gate_values(n, 4);
  std::vector<float> ref;
  for (qdot::Level lv : qdot::supported_levels()) {
    qdot::set_level(lv);
    // Every suffix of the array: element i computed in a tail of any length or in a full vector.
    for (size_t off = 0; off < 40; ++off) {
      std::vector<float> g(g0.begin() + off, g0.end());
      // A sentinel after the end: a tail must not write past n.
      g.push_back(12345.0f);
      silu_mul(g.data(), u.data() + off, static_cast<int64_t>(n - off));
      ASSERT_EQ(g.back(), 12345.0f) << qdot::level_name(lv) << " offset " << off;
      if (ref.empty()) {
        ref.assign(g.begin(), g.end() - 1);
        continue;
      }
      for (size_t i = 0; i + off < n; ++i)
        ASSERT_EQ(std::memcmp(&g[i], &ref[i + off], sizeof(float)), 0)
            << qdot::level_name(lv) << " offset " << off << " element " << i + off << ": " << g[i] << " vs " << ref[i + off];
    }
  }
}

TEST(SiluMul, ExactPathIsStdExp) {
  const float g0[] = {-3.0f, 0.5f, 2.0f};
  const float u[] = {1.0f, -2.0f, 0.25f};
  float g[3] = {g0[0], g0[1], g0[2]};
  silu_mul(g, u, 3, true);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(g[i], g0[i] / (1.0f + std::exp(-g0[i])) * u[i]);
}
