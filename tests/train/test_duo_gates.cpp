// DuoAttention's gate training (arXiv 2410.10819; github.com/mit-han-lab/duo-attention
// duo_attn/train.py), linearised (press/duo_attention.h): the solver by hand and against an
// independent projected-gradient solver in float64, each head's streaming deviation against a
// float64 recomputation of full and streaming attention written here, the objective and its
// gradient against the mixed outputs (g x full + (1 - g) x streaming) and float64 finite
// differences, and the gates on models/retrieval.gguf, whose retrieval head is known by
// construction (models/RETRIEVAL.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "kernels/matmul.h"
#include "kvslim/error.h"
#include "kvslim/quant.h"
#include "model/session.h"
#include "model/layer_hook.h"
#include "press/scorers/duo_attention.h"
#include "train/duo_calibrate.h"
#include "support/press_util.h"

using namespace kvslim;
using press_test::bundled_model;
using press_test::story_tokens;

namespace {

/// An independent solver: projected gradient descent with step 1 / (2 x trace(A)) (below 1 / L,
/// L = 2 lambda_max), many iterations, in float64.
std::vector<double> projected_gradient(const std::vector<double>& A, double c, int n) {
  double tr = 0;
  for (int k = 0; k < n; ++k) tr += A[k * n + k];
  const double step = tr > 0 ? 1.0 / (2.0 * tr) : 1.0;
  std::vector<double> a(n, 1.0);
  for (int it = 0; it < 200000; ++it) {
    std::vector<double> g(n);
    for (int k = 0; k < n; ++k) {
      double r = 0;
      for (int j = 0; j < n; ++j) r += A[k * n + j] * (1 - a[j]);
      g[k] = c - 2 * r;
    }
    for (int k = 0; k < n; ++k) a[k] = std::clamp(a[k] - step * g[k], 0.0, 1.0);
  }
  return a;
}

}  // namespace

// By hand: one gate, f = a (1 - g)^2 + c g, so g* = 1 - c / (2a) clamped to [0, 1]: a = 2, c = 1
// -> 0.75; a = 0.1, c = 1 -> 0 (streaming); a = 0 -> 0. Two gates, A = [[1, 0.5], [0.5, 1]], c =
// 0.5: 2 A beta = c -> beta = 0.25 / 1.5 = 1/6 each, g = 5/6. With c = 0 every gate stays 1.
TEST(DuoGates, SolverByHand) {
  EXPECT_NEAR(duo_solve_gates({2.0}, 1.0)[0], 0.75, 1e-12);
  EXPECT_NEAR(duo_solve_gates({0.1}, 1.0)[0], 0.0, 1e-12);
  EXPECT_NEAR(duo_solve_gates({0.0}, 1.0)[0], 0.0, 1e-12);
  auto g = duo_solve_gates({1.0, 0.5, 0.5, 1.0}, 0.5);
  EXPECT_NEAR(g[0], 5.0 / 6, 1e-10);
  EXPECT_NEAR(g[1], 5.0 / 6, 1e-10);
  g = duo_solve_gates({1.0, 0.5, 0.5, 1.0}, 0.0);
  EXPECT_NEAR(g[0], 1.0, 1e-12);
  EXPECT_NEAR(g[1], 1.0, 1e-12);
  EXPECT_NEAR(duo_gate_objective({1.0, 0.5, 0.5, 1.0}, 0.5, {5.0 / 6, 5.0 / 6}),
              // beta^T A beta + c sum g = (1/36)(1 + 0.5 + 0.5 + 1) + 0.5 x 10/6
              3.0 / 36 + 0.5 * 10.0 / 6, 1e-12);
  EXPECT_THROW(duo_solve_gates({1.0, 2.0, 3.0}, 0.1), Error);
}

// Random positive semi-definite problems (rank-deficient too, with some gates at 0 and some at
// 1): the coordinate-descent optimum matches an independent projected-gradient solver and meets
// the optimality conditions of a box-constrained convex problem.
TEST(DuoGates, SolverMatchesProjectedGradient) {
  std::mt19937 rng(5);
  std::normal_distribution<double> nd(0, 1);
  for (int trial = 0; trial < 6; ++trial) {
    const int n = 3 + trial, r = trial % 2 ? n : n - 2;
    std::vector<double> B(static_cast<size_t>(n) * r), A(static_cast<size_t>(n) * n, 0.0);
    for (double& x : B) x = nd(rng);
    for (int k = 0; k < n; ++k) B[k * r] *= 0.1 * (k + 1);  // spread the scales
    for (int k = 0; k < n; ++k)
      for (int j = 0; j < n; ++j)
        for (int q = 0; q < r; ++q) A[k * n + j] += B[k * r + q] * B[j * r + q] / r;
    const double c = 0.4;
    int sweeps = 0;
    const auto a = duo_solve_gates(A, c, &sweeps);
    const auto b = projected_gradient(A, c, n);
    EXPECT_NEAR(duo_gate_objective(A, c, a), duo_gate_objective(A, c, b), 1e-9) << "trial " << trial;
    EXPECT_LE(duo_gate_objective(A, c, a), duo_gate_objective(A, c, b) + 1e-12);
    const auto g = duo_gate_gradient(A, c, a);
    for (int k = 0; k < n; ++k) {
      ASSERT_GE(a[k], 0.0);
      ASSERT_LE(a[k], 1.0);
      if (a[k] > 1e-9 && a[k] < 1 - 1e-9) {
        EXPECT_NEAR(g[k], 0.0, 1e-8) << trial << " gate " << k;
      }
      if (a[k] <= 1e-9) {
        EXPECT_GE(g[k], -1e-8) << trial << " gate " << k;
      }
      if (a[k] >= 1 - 1e-9) {
        EXPECT_LE(g[k], 1e-8) << trial << " gate " << k;
      }
    }
    EXPECT_LT(sweeps, 100000);
  }
}

namespace {

/// Records the RoPE'd queries of the last T tokens of every layer and the residual stream
/// entering the last layer there.
class QueryRecorder : public LayerHook {
 public:
  QueryRecorder(const HParams& hp, int n, int T)
      : hp_(hp), n_(n), T_(T), q(hp.n_layer, std::vector<float>(static_cast<size_t>(T) * hp.n_head * hp.head_dim)),
        x(static_cast<size_t>(T) * hp.n_embd) {}
  void after_qkv(const LayerStep& s) override {
    if (s.layer != hp_.n_layer - 1) return;
    for (int t = 0; t < s.n; ++t) {
      const int i = s.positions[t] - (n_ - T_);
      if (i >= 0) std::copy(s.input + size_t(t) * hp_.n_embd, s.input + size_t(t + 1) * hp_.n_embd, x.begin() + size_t(i) * hp_.n_embd);
    }
  }
  bool before_attention(const LayerStep& s, std::vector<std::vector<int32_t>>&) override {
    const size_t row = size_t(hp_.n_head) * hp_.head_dim;
    for (int t = 0; t < s.n; ++t) {
      const int i = s.positions[t] - (n_ - T_);
      if (i >= 0) std::copy(s.q + size_t(t) * row, s.q + size_t(t + 1) * row, q[s.layer].begin() + size_t(i) * row);
    }
    return false;
  }
  const HParams& hp_;
  int n_, T_;
  std::vector<std::vector<float>> q;  // [layer][t][n_head][head_dim]
  std::vector<float> x;               // [t][n_embd]
};

}  // namespace

// The streaming deviation e_k(t) of every (layer, KV head) against float64 attention over the
// cache (softmax of q.k / sqrt(head_dim) over all entries up to the query, and over the first
// `sink` and the `recent` newest), W_o and the output norm read from the model; then the loss
// written directly from the paper's mix (g o_full + (1 - g) o_stream per query head, projected
// by W_o, scaled by w_out / rms(x)) against the library's quadratic and its gradient against
// central finite differences.
TEST(DuoGates, DeviationObjectiveAndGradientMatchFloat64) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  const int L = hp.n_layer, H = hp.n_head_kv, G = hp.n_group(), hd = hp.head_dim, d = hp.n_embd, K = L * H;
  const std::vector<Token> toks = story_tokens(120);
  const int n = static_cast<int>(toks.size()), T = 8, sink = 4, recent = 16;
  const DuoGateSample smp = duo_gate_sample(m, toks, T, sink, recent);
  ASSERT_EQ(smp.n_label, T);
  ASSERT_EQ(smp.n_gates, K);
  ASSERT_EQ(smp.n_embd, d);

  SessionOptions so;
  so.key_codec = so.value_codec = KVCodec::F32;
  so.n_ctx = n;
  Session s(m, so);
  QueryRecorder rec(hp, n, T);
  s.forward(toks, false, &rec);
  std::vector<double> inv_rms(T);
  for (int t = 0; t < T; ++t) {
    double ms = 0;
    for (int c = 0; c < d; ++c) ms += double(rec.x[t * d + c]) * rec.x[t * d + c];
    inv_rms[t] = 1 / std::sqrt(ms / d + hp.rms_eps);
  }
  // full[l][qh][t][a], strm[...] in float64.
  std::vector<std::vector<double>> full(L), strm(L), wo(L);
  for (int l = 0; l < L; ++l) {
    full[l].assign(size_t(hp.n_head) * T * hd, 0.0);
    strm[l].assign(full[l].size(), 0.0);
    const WeightView& w = *m.layer(l).wo;
    std::vector<float> row(w.cols);
    wo[l].resize(size_t(d) * w.cols);
    for (int r = 0; r < d; ++r) {
      dequantize_row(w.type, w.row(r), row.data(), w.cols);
      std::copy(row.begin(), row.end(), wo[l].begin() + size_t(r) * w.cols);
    }
    for (int h = 0; h < H; ++h) {
      const Segment& seg = s.cache().seg(l, h);
      std::vector<float> k(hd), v(hd);
      for (int g = 0; g < G; ++g) {
        const int qh = h * G + g;
        for (int t = 0; t < T; ++t) {
          const int pos = n - T + t;
          const float* q = rec.q[l].data() + (size_t(t) * hp.n_head + qh) * hd;
          auto attend = [&](bool streaming, double* out) {
            std::vector<double> sc;
            std::vector<int> js;
            for (int j = 0; j <= pos; ++j) {
              if (streaming && !(j < sink || j > pos - recent)) continue;
              seg.key(j, k.data());
              double dot = 0;
              for (int a = 0; a < hd; ++a) dot += double(q[a]) * k[a];
              sc.push_back(dot / std::sqrt(double(hd)));
              js.push_back(j);
            }
            const double mx = *std::max_element(sc.begin(), sc.end());
            double z = 0;
            for (double& x : sc) z += (x = std::exp(x - mx));
            for (size_t u = 0; u < js.size(); ++u) {
              seg.value(js[u], v.data());
              for (int a = 0; a < hd; ++a) out[a] += sc[u] / z * v[a];
            }
          };
          attend(false, &full[l][(size_t(qh) * T + t) * hd]);
          attend(true, &strm[l][(size_t(qh) * T + t) * hd]);
        }
      }
    }
  }
  const std::vector<float>& w_out = m.output_norm();
  // e from the recomputation.
  double worst = 0, scale = 0;
  for (int t = 0; t < T; ++t)
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h)
        for (int c = 0; c < d; ++c) {
          double D = 0;
          for (int g = 0; g < G; ++g) {
            const int qh = h * G + g;
            for (int a = 0; a < hd; ++a)
              D += wo[l][size_t(c) * hp.n_head * hd + size_t(qh) * hd + a] *
                   (full[l][(size_t(qh) * T + t) * hd + a] - strm[l][(size_t(qh) * T + t) * hd + a]);
          }
          const double want = w_out[c] * D * inv_rms[t];
          const double got = smp.e[(size_t(t) * K + l * H + h) * d + c];
          worst = std::max(worst, std::fabs(got - want));
          scale = std::max(scale, std::fabs(want));
        }
  ASSERT_GT(scale, 0.0) << "streaming changed nothing: the test would prove nothing";
  EXPECT_LT(worst, 1e-4 * scale);

  // The paper's mixed output, directly: per query head o = g o_full + (1 - g) o_stream.
  const double c = 0.05 / K;
  auto loss = [&](const std::vector<double>& gate) {
    double sum = 0;
    for (int t = 0; t < T; ++t)
      for (int ch = 0; ch < d; ++ch) {
        double dh = 0;  // final-norm output, full minus mixed (linearised)
        for (int l = 0; l < L; ++l)
          for (int qh = 0; qh < hp.n_head; ++qh) {
            const double gk = gate[l * H + qh / G];
            for (int a = 0; a < hd; ++a) {
              const double of = full[l][(size_t(qh) * T + t) * hd + a], os = strm[l][(size_t(qh) * T + t) * hd + a];
              dh += wo[l][size_t(ch) * hp.n_head * hd + size_t(qh) * hd + a] * (of - (gk * of + (1 - gk) * os));
            }
          }
        dh *= w_out[ch] * inv_rms[t];
        sum += dh * dh / d;
      }
    double l1 = 0;
    for (double gk : gate) l1 += std::fabs(gk);
    return sum / T + c * l1;
  };
  std::vector<double> A;
  duo_add_gram(smp, A);
  for (double& x : A) x /= T;
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(0.05, 0.95);
  for (int trial = 0; trial < 3; ++trial) {
    std::vector<double> gate(K);
    for (double& x : gate) x = u(rng);
    const double want = loss(gate);
    EXPECT_NEAR(duo_gate_objective(A, c, gate), want, 1e-4 * std::fabs(want));
    const auto grad = duo_gate_gradient(A, c, gate);
    double gscale = 0;
    for (double x : grad) gscale = std::max(gscale, std::fabs(x));
    for (int k = 0; k < K; ++k) {
      auto p = gate, q = gate;
      p[k] += 1e-4;
      q[k] -= 1e-4;
      EXPECT_NEAR(grad[k], (loss(p) - loss(q)) / 2e-4, 1e-4 * gscale + 1e-9) << "gate " << k;
    }
  }
  EXPECT_THROW(duo_gate_sample(m, toks, 0, sink, recent), Error);
  EXPECT_THROW(duo_gate_sample(m, toks, n + 1, sink, recent), Error);
}

// models/retrieval.gguf: layer 1's KV head is the induction head that reads the needle, layer 0's
// previous-token heads read only the last 5 entries (models/RETRIEVAL.md). At the paper's 128
// sinks + 256 recent and reg 0.05 the fitted gate of layer 1 is near 1 (full attention) and layer
// 0's is 0 (streaming changes nothing there: its cost is ~0), and the file keeps them.
TEST(DuoGates, RetrievalModelGatesFindTheRetrievalHead) {
  auto m = Model::load(std::string(KVSLIM_SOURCE_DIR) + "/models/retrieval.gguf");
  DuoCalibration cal;
  cal.samples = 2;
  ASSERT_EQ(cal.method, "gates");
  DuoLabels labels = duo_calibrate(*m, cal);
  ASSERT_EQ(labels.score.size(), 2u);
  EXPECT_EQ(labels.method, "gates");
  EXPECT_GT(labels.score[1][0], 0.5f);  // 0.91 at 4 samples: 1 - c / (2 A_kk)
  EXPECT_LT(labels.score[0][0], 0.01f);
  ASSERT_EQ(labels.cost.size(), 2u);
  EXPECT_GT(labels.cost[1][0], 100 * labels.cost[0][0]);
  auto streaming = labels.streaming(0.5);
  EXPECT_EQ(streaming[0][0], 1);
  EXPECT_EQ(streaming[1][0], 0);
  const std::string path = ::testing::TempDir() + "duo_gates_" + std::to_string(::getpid()) + ".gguf";
  labels.save(path);
  DuoLabels back = DuoLabels::load(path);
  EXPECT_EQ(back.method, "gates");
  EXPECT_NEAR(back.reg, 0.05, 1e-7);
  EXPECT_EQ(back.score, labels.score);
  std::remove(path.c_str());
  cal.method = "nonsense";
  EXPECT_THROW(duo_calibrate(*m, cal), Error);
}

// Heads whose gates tie (several at 0) become streaming in the order of their cost (the loss of
// streaming each alone); without costs (deviation files) in layer, then head, order.
TEST(DuoGates, TiedGatesStreamTheCheapestHeadFirst) {
  DuoLabels d;
  d.method = "gates";
  d.score = {{0.0f, 0.0f, 0.5f}};
  d.cost = {{3.0f, 1.0f, 2.0f}};
  EXPECT_EQ(d.streaming(1.0 / 3)[0], (std::vector<uint8_t>{0, 1, 0}));
  EXPECT_EQ(d.streaming(2.0 / 3)[0], (std::vector<uint8_t>{1, 1, 0}));
  d.cost.clear();
  EXPECT_EQ(d.streaming(1.0 / 3)[0], (std::vector<uint8_t>{1, 0, 0}));
  d.cost = {{3.0f, 1.0f, 2.0f}};
  const std::string path = ::testing::TempDir() + "duo_ties_" + std::to_string(::getpid()) + ".gguf";
  d.save(path);
  DuoLabels back = DuoLabels::load(path);
  EXPECT_EQ(back.cost, d.cost);
  EXPECT_EQ(back.streaming(1.0 / 3)[0], (std::vector<uint8_t>{0, 1, 0}));
  std::remove(path.c_str());
}
