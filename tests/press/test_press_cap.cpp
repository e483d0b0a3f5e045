// CAPKV (kvpress's CapPress, arXiv 2604.25975) against its reference rule recomputed in float64
// here: the anchor from every context query after the sinks (un-rotated from the recorded
// post-RoPE queries), the averaged future RoPE rotation built as a matrix, cosine weights, the
// capacity matrix inverted by Gauss-Jordan elimination, the GQA mean.
#include <cmath>

#include "press/recorders.h"
#include "support/press_util.h"

using namespace press_test;

namespace {

/// x = M^-1 b for a dense d x d matrix (Gauss-Jordan with partial pivoting, float64).
std::vector<double> solve(std::vector<double> M, std::vector<double> b, int d) {
  for (int c = 0; c < d; ++c) {
    int p = c;
    for (int r = c + 1; r < d; ++r)
      if (std::fabs(M[r * d + c]) > std::fabs(M[p * d + c])) p = r;
    for (int k = 0; k < d; ++k) std::swap(M[c * d + k], M[p * d + k]);
    std::swap(b[c], b[p]);
    for (int r = 0; r < d; ++r) {
      if (r == c) continue;
      const double f = M[r * d + c] / M[c * d + c];
      for (int k = 0; k < d; ++k) M[r * d + k] -= f * M[c * d + k];
      b[r] -= f * b[c];
    }
  }
  for (int c = 0; c < d; ++c) b[c] /= M[c * d + c];
  return b;
}

/// kvpress's CapPress.score for one KV head: Q[g] = the group's pre-RoPE context queries after the
/// sinks, K/V = the segment's rows, next = tokens seen, F future positions, llama pair layout.
std::vector<double> cap_reference(const std::vector<std::vector<std::vector<double>>>& Q, const Segment& seg,
                                  size_t n_sink, int64_t next, int F, double base, double tau, double eps) {
  const auto K = keys_of(seg), V = values_of(seg);
  const size_t n = K.size();
  const int d = static_cast<int>(K[0].size()), G = static_cast<int>(Q.size());
  // Averaged rotation matrix: mean over t of the RoPE matrix of position next + t.
  std::vector<double> R(d * d, 0.0);
  for (int t = 0; t < F; ++t)
    for (int i = 0; i < d / 2; ++i) {
      const double th = double(next + t) * std::pow(base, -2.0 * i / d);
      R[(2 * i) * d + 2 * i] += std::cos(th) / F;
      R[(2 * i) * d + 2 * i + 1] += -std::sin(th) / F;
      R[(2 * i + 1) * d + 2 * i] += std::sin(th) / F;
      R[(2 * i + 1) * d + 2 * i + 1] += std::cos(th) / F;
    }
  std::vector<double> out(n, 0.0);
  for (int g = 0; g < G; ++g) {
    std::vector<double> mu(d, 0.0), a(d, 0.0);
    for (const auto& q : Q[g])
      for (int x = 0; x < d; ++x) mu[x] += q[x] / double(Q[g].size());
    for (int r = 0; r < d; ++r)
      for (int c = 0; c < d; ++c) a[r] += R[r * d + c] * mu[c];
    auto norm = [&](const std::vector<double>& x) {
      double s = 0;
      for (double v : x) s += v * v;
      return std::sqrt(s);
    };
    std::vector<double> stat(n), w(n);
    double mx = -INFINITY;
    for (size_t j = n_sink; j < n; ++j) {
      double dot = 0;
      for (int x = 0; x < d; ++x) dot += a[x] * K[j][x];
      stat[j] = std::clamp(dot / norm(a) / norm(K[j]), -1.0, 1.0);
      mx = std::max(mx, tau * stat[j]);
    }
    std::vector<double> A(d * d, 0.0);
    for (int x = 0; x < d; ++x) A[x * d + x] = 1.0;
    for (size_t j = n_sink; j < n; ++j) {
      w[j] = std::exp(tau * stat[j] - mx);
      for (int r = 0; r < d; ++r)
        for (int c = 0; c < d; ++c) A[r * d + c] += (w[j] + eps) * V[j][r] * V[j][c];
    }
    for (size_t j = n_sink; j < n; ++j) {
      auto x = solve(A, V[j], d);
      double lev = 0;
      for (int r = 0; r < d; ++r) lev += V[j][r] * x[r];
      out[j] += w[j] * lev / G;
    }
  }
  return out;
}

TEST(PressCap, ScoresAreKvpressCapPressRecomputedInFloat64) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  ASSERT_FALSE(hp.rope_neox);
  ASSERT_TRUE(m.rope_freqs().empty());
  const int n = 96, n_sink = 4, F = 16, d = hp.head_dim, G = hp.n_group();
  auto toks = story_tokens(n);
  SessionOptions so;
  so.key_codec = so.value_codec = KVCodec::F32;
  so.n_ctx = 4096;
  Session ref(m, so);
  ObservationNeeds needs;
  needs.window = n;
  Observation obs;
  run_observed(ref, toks, needs, obs);
  ASSERT_EQ(obs.n_window(), n);
  for (int chunk : {0, 40}) {
    auto p = scorer("cap:n_future=16", 0.0);  // ratio 0: nothing evicted, the scores are read after
    auto s = prefill(*p, toks, chunk);
    Scores sc = p->score_all(s->cache(), m, Observation{}, Target{0.5, size_t(n)});
    for (int l = 0; l < hp.n_layer; ++l)
      for (int h = 0; h < hp.n_head_kv; ++h) {
        std::vector<std::vector<std::vector<double>>> Q(G);
        for (int g = 0; g < G; ++g)
          for (int i = n_sink; i < n; ++i) {
            auto q = window_query(obs, hp, l, h * G + g, i);
            std::vector<double> pre(d);
            for (int k = 0; k < d / 2; ++k) {  // rotate back by the query's position
              double th = -double(obs.window_positions[i]) * std::pow(double(hp.rope_freq_base), -2.0 * k / d);
              pre[2 * k] = q[2 * k] * std::cos(th) - q[2 * k + 1] * std::sin(th);
              pre[2 * k + 1] = q[2 * k] * std::sin(th) + q[2 * k + 1] * std::cos(th);
            }
            Q[g].push_back(pre);
          }
        auto want = cap_reference(Q, s->cache().seg(l, h), n_sink, n, F, hp.rope_freq_base, 5.0, 1e-6);
        for (int j = 0; j < n; ++j) {
          if (j < n_sink)
            EXPECT_EQ(sc[l][h][j], kPreferred);
          else
            expect_close(sc[l][h][j], want[j], 2e-3,
                         "cap chunk " + std::to_string(chunk) + " l" + std::to_string(l) + " j" + std::to_string(j));
        }
      }
  }
}

// The sinks are chosen first but count against the budget (kvpress pads them with max + 1), and
// int(n (1 - r)) entries stay; protect=1 keeps them past any budget.
TEST(PressCap, SinksChosenFirstInTheBudget) {
  auto toks = story_tokens(64);
  auto p = make_press_impl("cap", 0.5);
  auto s = prefill(*p, toks);
  for (int l = 0; l < s->cache().n_layer(); ++l)
    for (int h = 0; h < s->cache().n_head_kv(); ++h) {
      const auto& pos = s->cache().seg(l, h).positions();
      ASSERT_EQ(pos.size(), 32u);
      for (int j = 0; j < 4; ++j) EXPECT_EQ(pos[j], j);
    }
  auto q = make_press_impl("cap:protect=1", 0.97);  // budget int(64 x 0.03) = 1 < 4 sinks
  auto t = prefill(*q, toks);
  EXPECT_EQ(t->cache().seg(0, 0).positions(), (std::vector<int32_t>{0, 1, 2, 3}));
  auto r = make_press_impl("cap", 0.97);
  EXPECT_EQ(prefill(*r, toks)->cache().seg(0, 0).size(), 1u);
}

TEST(PressCap, KvpressNamesAreAliases) {
  EXPECT_EQ(make_press_impl("CapPress:compression_ratio=0.3,n_future_positions=64,tau=2", 0.0)->describe(),
            make_press_impl("cap:ratio=0.3,n_future=64,tau=2", 0.0)->describe());
  EXPECT_EQ(make_press_impl("ThinKPress:key_channel_compression_ratio=0.25,window_size=16", 0.0)->describe(),
            make_press_impl("think:key_ratio=0.25,window=16", 0.0)->describe());
  EXPECT_THROW(make_press_impl("cap:n_future=0", 0.5), Error);
  EXPECT_THROW(make_press_impl("cap:epsilon=-1", 0.5), Error);
}

}  // namespace
