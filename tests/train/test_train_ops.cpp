// The float64 backward of every training operation (src/train/grad_ops.h) against central finite
// differences: for a random cotangent c, the gradient of L = sum(c * y) with respect to each input
// value equals (L(x + h) - L(x - h)) / 2h.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "train/grad_ops.h"

using namespace kvslim;

namespace {

std::vector<double> rnd(size_t n, uint32_t seed, double sd = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd(0.0, sd);
  std::vector<double> v(n);
  for (double& x : v) x = nd(rng);
  return v;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

/// Compares `analytic` (d loss / d x) with central differences of `loss` over every value of x.
void check_gradient(std::vector<double>& x, const std::function<double()>& loss, const std::vector<double>& analytic,
                    const char* what) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  const double h = 1e-6;
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = loss();
    x[i] = keep - h;
    const double down = loss();
    x[i] = keep;
    const double numeric = (up - down) / (2 * h);
    ASSERT_NEAR(analytic[i], numeric, 1e-6 * std::max(1.0, std::abs(numeric))) << what << " value " << i;
  }
}

}  // namespace

TEST(TrainOps, LinearBackward) {
  const int n = 3, in = 5, out = 4;
  auto x = rnd(n * in, 1), W = rnd(out * in, 2), c = rnd(n * out, 3);
  std::vector<double> y(n * out);
  auto loss = [&] {
    grad::linear(x.data(), W.data(), n, in, out, y.data());
    return dot(c, y);
  };
  std::vector<double> dx(x.size(), 0.0), dW(W.size(), 0.0);
  grad::linear_backward(x.data(), W.data(), c.data(), n, in, out, dx.data(), dW.data());
  check_gradient(x, loss, dx, "x");
  check_gradient(W, loss, dW, "W");
}

TEST(TrainOps, RmsNormBackward) {
  const int n = 2, d = 7;
  auto x = rnd(n * d, 4), w = rnd(d, 5), c = rnd(n * d, 6);
  std::vector<double> y(n * d);
  auto loss = [&] {
    grad::rmsnorm(x.data(), w.data(), n, d, 1e-5, y.data());
    return dot(c, y);
  };
  std::vector<double> dx(x.size(), 0.0);
  grad::rmsnorm_backward(x.data(), w.data(), c.data(), n, d, 1e-5, dx.data());
  check_gradient(x, loss, dx, "x");
}

TEST(TrainOps, RopeBackwardBothLayouts) {
  const int n = 3, heads = 2, hd = 6;
  const std::vector<int> pos = {0, 5, 17};
  std::vector<double> inv(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv[i] = std::pow(10000.0, -2.0 * i / hd);
  for (bool neox : {false, true}) {
    auto x = rnd(n * heads * hd, 7), c = rnd(x.size(), 8);
    auto loss = [&] {
      std::vector<double> y = x;
      grad::rope(y.data(), pos.data(), inv.data(), n, heads, hd, neox);
      return dot(c, y);
    };
    std::vector<double> dx = c;
    grad::rope_backward(dx.data(), pos.data(), inv.data(), n, heads, hd, neox);
    check_gradient(x, loss, dx, neox ? "neox" : "normal");
  }
}

TEST(TrainOps, CausalAttentionBackward) {
  // 3 query rows over 6 entries: rows see 4, 5 and 6 entries (a cached prefix of 3 and the rows'
  // own entries, causally).
  const int m = 3, P = 6, hd = 4;
  const std::vector<int> vis = {4, 5, 6};
  auto q = rnd(m * hd, 9), k = rnd(P * hd, 10), v = rnd(P * hd, 11), c = rnd(m * hd, 12);
  std::vector<double> o(m * hd), p(m * P);
  auto loss = [&] {
    grad::attention(q.data(), k.data(), v.data(), vis.data(), m, P, hd, o.data(), p.data());
    return dot(c, o);
  };
  loss();
  for (int j = 4; j < P; ++j) EXPECT_EQ(p[0 * P + j], 0.0);  // causal: row 0 sees entries 0..3
  std::vector<double> dq(q.size(), 0.0), dk(k.size(), 0.0), dv(v.size(), 0.0);
  grad::attention_backward(q.data(), k.data(), v.data(), p.data(), c.data(), m, P, hd, dq.data(), dk.data(), dv.data());
  check_gradient(q, loss, dq, "q");
  check_gradient(k, loss, dk, "k");
  check_gradient(v, loss, dv, "v");
}

TEST(TrainOps, SwigluBackward) {
  const int n = 9;
  auto g = rnd(n, 13, 2.0), u = rnd(n, 14), c = rnd(n, 15);
  std::vector<double> h(n);
  auto loss = [&] {
    grad::swiglu(g.data(), u.data(), n, h.data());
    return dot(c, h);
  };
  std::vector<double> dg(n, 0.0), du(n, 0.0);
  grad::swiglu_backward(g.data(), u.data(), c.data(), n, dg.data(), du.data());
  check_gradient(g, loss, dg, "g");
  check_gradient(u, loss, du, "u");
}

TEST(TrainOps, KlOfSoftmaxBackwardAndValue) {
  const int V = 11;
  auto t = rnd(V, 16), z = rnd(V, 17);
  std::vector<double> p(V);
  double s = 0;
  for (int i = 0; i < V; ++i) s += (p[i] = std::exp(t[i]));
  for (double& x : p) x /= s;
  auto loss = [&] { return grad::kl_softmax(p.data(), z.data(), V, 1.0, nullptr); };
  std::vector<double> dz(V, 0.0);
  grad::kl_softmax(p.data(), z.data(), V, 1.0, dz.data());
  check_gradient(z, loss, dz, "z");
  // KL(p || p) = 0, and the value by its definition.
  EXPECT_NEAR(grad::kl_softmax(p.data(), t.data(), V, 1.0, nullptr), 0.0, 1e-12);
  double zs = 0;
  for (double x : z) zs += std::exp(x);
  double want = 0;
  for (int i = 0; i < V; ++i) want += p[i] * std::log(p[i] / (std::exp(z[i]) / zs));
  EXPECT_NEAR(loss(), want, 1e-12);
}
