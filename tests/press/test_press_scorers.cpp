// Every scorer against an independent float64 re-computation of its paper's formula, on a small
// random layer (the bundled model's shape: 8 query heads, 4 KV heads, head_dim 8, ~64 entries).
#include <algorithm>
#include <cstring>
#include <numeric>

#include <fmt/format.h>

#include "kvslim/gguf.h"
#include "support/press_util.h"

using namespace press_test;

namespace {

// Entries at even positions 0..126; window queries at odd positions 113..127, so the window
// queries see different prefixes (causality by position, not by index).
std::vector<int32_t> even_positions(int n) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = 2 * i;
  return p;
}
std::vector<int32_t> odd_window(int first, int w) {
  std::vector<int32_t> p(w);
  for (int i = 0; i < w; ++i) p[i] = first + 2 * i;
  return p;
}

struct Layer {
  const Model& model = bundled_model();
  KVCache cache = random_cache(model, 64, 7, even_positions(64));
  Observation obs = random_window(model, odd_window(113, 8), 11);
  const HParams& hp = model.hparams();
  int G = hp.n_group();
};

Scores score_with(ScorerPress& p, const Layer& L, double ratio = 0.5) {
  return p.score_all(L.cache, L.model, L.obs, Target{ratio, 128});
}

TEST(PressScorer, KNormIsMinusL2NormOfTheKey) {
  Layer L;
  auto p = scorer("knorm", 0.5);
  Scores s = score_with(*p, L);
  for (int l = 0; l < L.hp.n_layer; ++l)
    for (int h = 0; h < L.hp.n_head_kv; ++h) {
      auto K = keys_of(L.cache.seg(l, h));
      for (size_t j = 0; j < K.size(); ++j) {
        double ss = 0;
        for (double x : K[j]) ss += x * x;
        expect_close(s[l][h][j], -std::sqrt(ss), 1e-6, "knorm");
      }
    }
}

TEST(PressScorer, KeyDiffIsMinusCosineToTheMeanNormalizedKey) {
  Layer L;
  auto p = scorer("keydiff", 0.5);
  Scores s = score_with(*p, L);
  for (int l = 0; l < L.hp.n_layer; ++l)
    for (int h = 0; h < L.hp.n_head_kv; ++h) {
      auto K = keys_of(L.cache.seg(l, h));
      const size_t d = K[0].size();
      std::vector<double> anchor(d, 0.0);
      for (auto& k : K) {
        double n = 0;
        for (double x : k) n += x * x;
        for (size_t c = 0; c < d; ++c) anchor[c] += k[c] / std::sqrt(n) / K.size();
      }
      for (size_t j = 0; j < K.size(); ++j) {
        double dot = 0, nk = 0, na = 0;
        for (size_t c = 0; c < d; ++c) dot += K[j][c] * anchor[c], nk += K[j][c] * K[j][c], na += anchor[c] * anchor[c];
        expect_close(s[l][h][j], -dot / std::sqrt(nk * na), 1e-5, "keydiff");
      }
    }
}

TEST(PressScorer, StreamingLLMProtectsSinksAndRanksByRecency) {
  Layer L;
  auto p = scorer("streaming_llm:n_sink=4", 0.5);
  Scores s = score_with(*p, L);
  const auto& pos = L.cache.seg(0, 0).positions();
  for (size_t j = 0; j < pos.size(); ++j) {
    if (j < 4)
      EXPECT_EQ(s[0][0][j], kPreferred);  // chosen first, counted in the budget (kvpress)
    else
      EXPECT_EQ(s[0][0][j], static_cast<float>(pos[j]));
  }
}

/// SnapKV (arXiv 2404.14469, kvpress's definition): mean over the window of the causal softmax,
/// avg-pooled (kernel 5, zero padding, divisor 5) over the entries before the window, averaged
/// over the GQA group; window entries protected.
TEST(PressScorer, SnapKVMatchesFloat64) {
  Layer L;
  const int w = 8, kernel = 5;
  auto p = scorer("snapkv:window=8,kernel=5", 0.5);
  Scores s = score_with(*p, L);
  for (int l = 0; l < L.hp.n_layer; ++l)
    for (int h = 0; h < L.hp.n_head_kv; ++h) {
      const Segment& seg = L.cache.seg(l, h);
      const auto& pos = seg.positions();
      size_t prefix = 0;
      while (prefix < pos.size() && pos[prefix] < L.obs.window_positions[0]) ++prefix;
      ASSERT_EQ(prefix, 57u);
      std::vector<double> vote(prefix, 0.0);
      for (int g = 0; g < L.G; ++g) {
        std::vector<double> m(prefix, 0.0);
        for (int i = 0; i < w; ++i) {
          auto pr = softmax_row(window_query(L.obs, L.hp, l, h * L.G + g, i), L.obs.window_positions[i], seg);
          for (size_t j = 0; j < prefix; ++j) m[j] += pr[j] / w;
        }
        for (size_t j = 0; j < prefix; ++j) {
          double acc = 0;
          for (int o = -kernel / 2; o <= kernel / 2; ++o) {
            long jj = long(j) + o;
            if (jj >= 0 && jj < long(prefix)) acc += m[jj];
          }
          vote[j] += acc / kernel / L.G;
        }
      }
      for (size_t j = 0; j < pos.size(); ++j) {
        if (j < prefix)
          expect_close(s[l][h][j], vote[j], 1e-4, "snapkv");
        else
          EXPECT_EQ(s[l][h][j], kPreferred);  // chosen first, counted in the budget (kvpress)
      }
    }
}

/// TOVA (arXiv 2401.06104, kvpress): the newest query's causal softmax, averaged over every query
/// head of the layer; the newest entry is protected.
TEST(PressScorer, TOVAMatchesFloat64) {
  Layer L;
  // Make the newest window query sit at the last entry's position so that entry is "the token".
  std::vector<int32_t> wp = L.obs.window_positions;
  wp.back() = 126;
  std::sort(wp.begin(), wp.end());
  L.obs.window_positions = wp;
  auto p = scorer("tova", 0.5);
  Scores s = score_with(*p, L);
  const int w = L.obs.n_window();
  for (int l = 0; l < L.hp.n_layer; ++l) {
    std::vector<double> mean(64, 0.0);
    for (int qh = 0; qh < L.hp.n_head; ++qh) {
      auto pr = softmax_row(window_query(L.obs, L.hp, l, qh, w - 1), 126, L.cache.seg(l, qh / L.G));
      for (int j = 0; j < 64; ++j) mean[j] += pr[j] / L.hp.n_head;
    }
    for (int h = 0; h < L.hp.n_head_kv; ++h)
      for (int j = 0; j < 64; ++j) {
        if (j == 63)
          EXPECT_EQ(s[l][h][j], kPreferred);  // chosen first, counted in the budget (kvpress)
        else
          expect_close(s[l][h][j], mean[j], 1e-4, "tova");
      }
  }
}

/// Attention mass the forward pass would record for queries at the newest `q` entries of each
/// segment (summed over queries and the GQA group), in float64; also the per-entry count of
/// queries that see it.
void fake_mass(const Layer& L, const KVCache& cache, int q, uint32_t seed, Observation& obs,
               std::vector<std::vector<std::vector<double>>>& mass, std::vector<std::vector<std::vector<double>>>& count) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.5);
  obs.attention_mass.assign(L.hp.n_layer, std::vector<std::vector<float>>(L.hp.n_head_kv));
  mass.resize(L.hp.n_layer, std::vector<std::vector<double>>(L.hp.n_head_kv));
  count.resize(L.hp.n_layer, std::vector<std::vector<double>>(L.hp.n_head_kv));
  for (int l = 0; l < L.hp.n_layer; ++l)
    for (int h = 0; h < L.hp.n_head_kv; ++h) {
      const Segment& seg = cache.seg(l, h);
      const size_t n = seg.size();
      std::vector<double> m(n, 0.0);
      for (int g = 0; g < L.G; ++g)
        for (int t = 0; t < q; ++t) {
          std::vector<double> qv(L.hp.head_dim);
          for (double& x : qv) x = nd(rng);
          auto pr = softmax_row(qv, seg.positions()[n - q + t], seg);
          for (size_t j = 0; j < n; ++j) m[j] += pr[j];
        }
      obs.attention_mass[l][h].assign(m.begin(), m.end());
      mass[l][h].resize(n, 0.0);
      count[l][h].resize(n, 0.0);
      for (size_t j = 0; j < n; ++j) {
        mass[l][h][j] += m[j];
        for (int t = 0; t < q; ++t) count[l][h][j] += seg.positions()[n - q + t] >= seg.positions()[j];
      }
    }
}

/// H2O (arXiv 2306.14048) and ObservedAttention (kvpress): attention accumulated over two steps
/// (a prefill chunk, then more tokens), H2O = sum / G, ObservedAttention = sum / (G x queries
/// that see the entry).
TEST(PressScorer, H2OAndObservedAttentionAccumulateOverSteps) {
  Layer L;
  for (const char* spec : {"h2o:recent=0", "observed_attention"}) {
    const bool h2o = std::string(spec).rfind("h2o", 0) == 0;
    KVCache cache = random_cache(L.model, 48, 3);
    auto p = scorer(spec, 0.5);
    Observation o1, o2;
    std::vector<std::vector<std::vector<double>>> mass, count;
    fake_mass(L, cache, 16, 5, o1, mass, count);
    p->observe(cache, L.model, o1);
    // Step 2: 16 more entries at positions 48..63, their own queries.
    KVCache more = random_cache(L.model, 16, 4, odd_window(48, 16));
    std::vector<float> k(L.hp.head_dim), v(L.hp.head_dim);
    for (int l = 0; l < L.hp.n_layer; ++l)
      for (int h = 0; h < L.hp.n_head_kv; ++h)
        for (int i = 0; i < 16; ++i) {
          more.seg(l, h).key(i, k.data());
          more.seg(l, h).value(i, v.data());
          cache.seg(l, h).append(k.data(), v.data(), 48 + i);
        }
    for (auto& ml : mass)
      for (auto& mh : ml) mh.resize(64, 0.0);
    for (auto& cl : count)
      for (auto& ch : cl) ch.resize(64, 0.0);
    std::vector<std::vector<std::vector<double>>> mass2, count2;
    fake_mass(L, cache, 16, 6, o2, mass2, count2);
    p->observe(cache, L.model, o2);
    Scores s = p->score_all(cache, L.model, o2, Target{0.5, 64});
    for (int l = 0; l < L.hp.n_layer; ++l)
      for (int h = 0; h < L.hp.n_head_kv; ++h)
        for (int j = 0; j < 64; ++j) {
          double m = mass[l][h][j] + mass2[l][h][j], c = count[l][h][j] + count2[l][h][j];
          double want = h2o ? m / L.G : m / (L.G * c);
          expect_close(s[l][h][j], want, 1e-4, spec);
        }
    // State follows evictions: drop every other entry of segment (0, 0) and score again.
    std::vector<int32_t> keep;
    for (int j = 0; j < 64; j += 2) keep.push_back(j);
    cache.seg(0, 0).retain(keep);
    Observation none;
    p->observe(cache, L.model, none);
    Scores s2 = p->score_all(cache, L.model, none, Target{0.5, 64});
    for (size_t i = 0; i < keep.size(); ++i) EXPECT_EQ(s2[0][0][i], s[0][0][keep[i]]) << spec;
    // A new request starts from nothing.
    p->reset();
    p->observe(cache, L.model, none);
    Scores s3 = p->score_all(cache, L.model, none, Target{0.5, 64});
    EXPECT_EQ(s3[1][1][10], 0.0f) << spec;
  }
}

/// Expected Attention (arXiv 2510.00636, kvpress): Gaussian pre-RoPE queries (mean and population
/// covariance of the window queries un-rotated from their positions), the RoPE matrix averaged
/// over the next n_future positions R, z = (R mu).k / sqrt(d) + k^T (R S R^T) k / (2d), softmax
/// over the non-sink entries, mean over the GQA group, times ||v||; sinks protected.
TEST(PressScorer, ExpectedAttentionMatchesFloat64) {
  Layer L;
  const int d = L.hp.head_dim, F = 16, n_sink = 4;
  auto p = scorer("expected_attention:window=8,n_future=16,n_sink=4", 0.5);
  Scores s = score_with(*p, L);
  // Explicit d x d RoPE matrices in the llama (adjacent pairs) layout of the bundled model.
  ASSERT_FALSE(L.hp.rope_neox);
  auto R = [&](double pos) {
    std::vector<double> M(d * d, 0.0);
    for (int i = 0; i < d / 2; ++i) {
      double th = pos * std::pow(double(L.hp.rope_freq_base), -2.0 * i / d);
      M[(2 * i) * d + 2 * i] = std::cos(th);
      M[(2 * i) * d + 2 * i + 1] = -std::sin(th);
      M[(2 * i + 1) * d + 2 * i] = std::sin(th);
      M[(2 * i + 1) * d + 2 * i + 1] = std::cos(th);
    }
    return M;
  };
  const int w = L.obs.n_window();
  const int32_t next = L.obs.window_positions.back() + 1;
  std::vector<double> Rbar(d * d, 0.0);
  for (int t = 0; t < F; ++t) {
    auto M = R(next + t);
    for (int i = 0; i < d * d; ++i) Rbar[i] += M[i] / F;
  }
  for (int l = 0; l < L.hp.n_layer; ++l)
    for (int h = 0; h < L.hp.n_head_kv; ++h) {
      const Segment& seg = L.cache.seg(l, h);
      auto K = keys_of(seg);
      auto V = values_of(seg);
      const size_t n = K.size();
      std::vector<double> mean(n, 0.0);
      for (int g = 0; g < L.G; ++g) {
        std::vector<std::vector<double>> Q;
        for (int i = 0; i < w; ++i) {
          auto q = window_query(L.obs, L.hp, l, h * L.G + g, i);
          auto M = R(L.obs.window_positions[i]);  // q_post = M q_pre -> q_pre = M^T q_post
          std::vector<double> pre(d, 0.0);
          for (int a = 0; a < d; ++a)
            for (int b = 0; b < d; ++b) pre[a] += M[b * d + a] * q[b];
          Q.push_back(pre);
        }
        std::vector<double> mu(d, 0.0), S(d * d, 0.0);
        for (auto& q : Q)
          for (int a = 0; a < d; ++a) mu[a] += q[a] / w;
        for (auto& q : Q)
          for (int a = 0; a < d; ++a)
            for (int b = 0; b < d; ++b) S[a * d + b] += (q[a] - mu[a]) * (q[b] - mu[b]) / w;
        std::vector<double> mu2(d, 0.0), RS(d * d, 0.0), S2(d * d, 0.0);
        for (int a = 0; a < d; ++a)
          for (int b = 0; b < d; ++b) mu2[a] += Rbar[a * d + b] * mu[b];
        for (int a = 0; a < d; ++a)
          for (int b = 0; b < d; ++b)
            for (int c = 0; c < d; ++c) RS[a * d + b] += Rbar[a * d + c] * S[c * d + b];
        for (int a = 0; a < d; ++a)
          for (int b = 0; b < d; ++b)
            for (int c = 0; c < d; ++c) S2[a * d + b] += RS[a * d + c] * Rbar[b * d + c];
        std::vector<double> z(n, 0.0);
        double mx = -INFINITY;
        for (size_t j = n_sink; j < n; ++j) {
          double lin = 0, quad = 0;
          for (int a = 0; a < d; ++a) {
            lin += mu2[a] * K[j][a];
            for (int b = 0; b < d; ++b) quad += K[j][a] * S2[a * d + b] * K[j][b];
          }
          z[j] = lin / std::sqrt(double(d)) + quad / d / 2;
          mx = std::max(mx, z[j]);
        }
        double sum = 0;
        for (size_t j = n_sink; j < n; ++j) sum += std::exp(z[j] - mx);
        for (size_t j = n_sink; j < n; ++j) mean[j] += std::exp(z[j] - mx) / sum / L.G;
      }
      for (size_t j = 0; j < n; ++j) {
        if (j < static_cast<size_t>(n_sink)) {
          EXPECT_EQ(s[l][h][j], kPreferred);  // chosen first, counted in the budget (kvpress)
          continue;
        }
        double vn = 0;
        for (double x : V[j]) vn += x * x;
        expect_close(s[l][h][j], mean[j] * std::sqrt(vn), 2e-4, "expected_attention");
      }
    }
}

/// CriticalKV (arXiv 2502.03805, kvpress): the top floor(first_stage x budget) entries by the inner
/// score are kept first (ranked above all others), the rest score (s + eps) x mean over the group
/// of ||W_o^g v||_1, with W_o read from the GGUF file.
TEST(PressScorer, CriticalKVMatchesFloat64) {
  Layer L;
  auto inner = scorer("snapkv:window=8", 0.5);
  Scores base = score_with(*inner, L);
  auto p = scorer("criticalkv(snapkv:window=8):epsilon=1e-4,first_stage=0.5", 0.5);
  Scores s = score_with(*p, L, 0.5);
  auto file = GGUFFile::open(std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf");
  const int d = L.hp.head_dim, E = L.hp.n_embd, C = L.hp.n_head * d;
  const int b1 = static_cast<int>(0.5 * std::floor(128 * 0.5));  // budget floor(n (1 - r)), n = 128
  for (int l = 0; l < L.hp.n_layer; ++l) {
    std::vector<float> wo = file->tensor_f32(file->tensor(fmt::format("blk.{}.attn_output.weight", l)));
    ASSERT_EQ(wo.size(), size_t(E) * C);
    for (int h = 0; h < L.hp.n_head_kv; ++h) {
      auto V = values_of(L.cache.seg(l, h));
      const auto& b = base[l][h];
      // Stage 1: the b1 best inner scores (ties: later entry first).
      std::vector<int> order(b.size());
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int x, int y) { return b[x] != b[y] ? b[x] > b[y] : x > y; });
      std::vector<char> first(b.size(), 0);
      for (int r = 0; r < b1; ++r) first[order[r]] = 1;
      for (size_t j = 0; j < b.size(); ++j) {
        if (b[j] >= kProtected) {
          EXPECT_EQ(s[l][h][j], kPreferred);  // chosen first, counted in the budget (kvpress)
        } else if (first[j]) {
          EXPECT_EQ(s[l][h][j], kPreferred);
        } else {
          double norm = 0;
          for (int g = 0; g < L.G; ++g) {
            const int q = h * L.G + g;
            double l1 = 0;
            for (int r = 0; r < E; ++r) {
              double y = 0;
              for (int c = 0; c < d; ++c) y += double(wo[size_t(r) * C + q * d + c]) * V[j][c];
              l1 += std::fabs(y);
            }
            norm += l1 / L.G;
          }
          expect_close(s[l][h][j], (double(b[j]) + 1e-4) * norm, 1e-4, "criticalkv");
        }
      }
    }
  }
}

TEST(PressScorer, RandomIsSeededUniformAndStablePerEntry) {
  Layer L;
  auto a = scorer("random:seed=1", 0.5), b = scorer("random:seed=1", 0.5), c = scorer("random:seed=2", 0.5);
  Scores sa = score_with(*a, L), sb = score_with(*b, L), sc = score_with(*c, L);
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
  double mean = 0;
  size_t n = 0;
  for (auto& l : sa)
    for (auto& h : l)
      for (float x : h) {
        EXPECT_GE(x, 0.0f);
        EXPECT_LT(x, 1.0f);
        mean += x, ++n;
      }
  EXPECT_NEAR(mean / n, 0.5, 0.05);
  EXPECT_NE(sa[0][0], sa[1][0]);  // layers draw different numbers
  // An entry keeps its score when others are evicted (chunked prefill does not reshuffle).
  float s10 = sa[0][0][10];
  L.cache.seg(0, 0).retain({5, 10, 20});
  Scores after = score_with(*a, L);
  EXPECT_EQ(after[0][0][1], s10);
}

}  // namespace
