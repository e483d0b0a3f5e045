// KVCompose (kvpress's KVComposePress, arXiv 2509.05165) against its reference rule: budgets
// derived by hand on small score tables, and a whole prefill recomputed in float64 here (the
// context replayed after itself, softmax over context + replay, max over replay queries, mean
// over the GQA group, the mean over heads added, composite tokens, layer 0 as the maximum).
#include <cmath>
#include <numeric>
#include <set>

#include "press/scorers/kvcompose.h"
#include "press/recorders.h"
#include "support/press_util.h"

using namespace press_test;

namespace {

Scores table(std::vector<std::vector<std::vector<float>>> s) { return s; }

TEST(PressKVCompose, LayerBudgetsFromCompositeTokensByHand) {
  // Layer 0 heads sorted: [4 3 2 1], [2 2 0 0] -> composite (mean) [3 2.5 1 0.5]; layer 1: [10 0 0 0],
  // [6 0 0 0] -> [8 0 0 0]; layer 0 takes the maximum: [8 2.5 1 0.5]. Ratio 0.5 keeps int(2 x 4 x
  // 0.5) = 4 composite tokens: 8 (l0), 8 (l1), 2.5 (l0), 1 (l0) -> layer 0 keeps 3, layer 1 keeps 1.
  Scores s = table({{{1, 2, 3, 4}, {0, 2, 0, 2}}, {{0, 10, 0, 0}, {0, 0, 6, 0}}});
  KVComposeOptions o;
  EXPECT_EQ(kvcompose_counts(s, 4, 0.5, o), (KeepCounts{{3, 3}, {1, 1}}));
  // The first 2 ranks of every layer first: l0 8+1e9, 2.5+1e9; l1 8+1e9, 0+1e9 -> 2 and 2.
  o.keep_token_lower_bound = 2;
  EXPECT_EQ(kvcompose_counts(s, 4, 0.5, o), (KeepCounts{{2, 2}, {2, 2}}));
  // Unstructured: one top-k of int(16 x 0.5) = 8 over every head's sorted scores: 10, 6, 4, 3, 2, 2,
  // 2, 1 -> l0h0 4, l0h1 2, l1h0 1, l1h1 1.
  o = KVComposeOptions{};
  o.structured = false;
  EXPECT_EQ(kvcompose_counts(s, 4, 0.5, o), (KeepCounts{{4, 2}, {1, 1}}));
  // agg_head=max: layer 0 [4 3 2 1] vs layer 1 [10 0 0 0] -> layer 0 [10 3 2 1]; top 4: 10, 10, 3, 2.
  o = KVComposeOptions{};
  o.agg_head = ComposeAgg::Max;
  EXPECT_EQ(kvcompose_counts(s, 4, 0.5, o), (KeepCounts{{3, 3}, {1, 1}}));
  // A layer the top-k leaves out still keeps one entry per head.
  o = KVComposeOptions{};
  EXPECT_EQ(kvcompose_counts(s, 4, 0.75, o), (KeepCounts{{1, 1}, {1, 1}}));
}

TEST(PressKVCompose, PrefillMatchesTheReplayRecomputedInFloat64) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  const int n = 48, L = hp.n_layer, H = hp.n_head_kv, G = hp.n_group();
  const double ratio = 0.5;
  auto toks = story_tokens(n);
  // The context, then the same tokens again with every replay query recorded.
  SessionOptions so;
  so.key_codec = so.value_codec = KVCodec::F32;
  so.n_ctx = 4096;
  Session ref(m, so);
  ref.run(toks, nullptr);
  ObservationNeeds needs;
  needs.window = n;
  Observation obs;
  run_observed(ref, toks, needs, obs);
  ASSERT_EQ(obs.n_window(), n);
  std::vector<std::vector<std::vector<double>>> score(L, std::vector<std::vector<double>>(H, std::vector<double>(n, 0.0)));
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      const auto K = keys_of(ref.cache().seg(l, h));
      ASSERT_EQ(K.size(), size_t(2 * n));
      for (int g = 0; g < G; ++g) {
        std::vector<double> best(n, 0.0);
        for (int i = 0; i < n; ++i) {
          auto q = window_query(obs, hp, l, h * G + g, i);
          std::vector<double> z(n + i + 1);
          double mx = -INFINITY, sum = 0;
          for (int j = 0; j <= n + i; ++j) {
            double d = 0;
            for (int c = 0; c < hp.head_dim; ++c) d += q[c] * K[j][c];
            z[j] = d / std::sqrt(double(hp.head_dim));
            mx = std::max(mx, z[j]);
          }
          for (double& x : z) sum += (x = std::exp(x - mx));
          for (int j = 0; j < n; ++j) best[j] = std::max(best[j], z[j] / sum);
        }
        for (int j = 0; j < n; ++j) score[l][h][j] += best[j] / G;
      }
    }
  // The mean over the layer's heads added to every head.
  for (int l = 0; l < L; ++l) {
    std::vector<double> mean(n, 0.0);
    for (int h = 0; h < H; ++h)
      for (int j = 0; j < n; ++j) mean[j] += score[l][h][j] / H;
    for (int h = 0; h < H; ++h)
      for (int j = 0; j < n; ++j) score[l][h][j] += mean[j];
  }
  // Composite tokens (mean of the heads' sorted scores), layer 0 = the maximum over layers.
  std::vector<std::vector<double>> comp(L, std::vector<double>(n, 0.0));
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      auto s = score[l][h];
      std::sort(s.rbegin(), s.rend());
      for (int r = 0; r < n; ++r) comp[l][r] += s[r] / H;
    }
  for (int l = 1; l < L; ++l)
    for (int r = 0; r < n; ++r) comp[0][r] = std::max(comp[0][r], comp[l][r]);
  std::vector<std::pair<double, int>> all;
  for (int l = 0; l < L; ++l)
    for (int r = 0; r < n; ++r) all.emplace_back(comp[l][r], l);
  std::sort(all.begin(), all.end(), [](auto& a, auto& b) { return a.first > b.first; });
  const int n_kept = static_cast<int>(L * n * (1 - ratio));
  std::vector<int> per_layer(L, 0);
  for (int i = 0; i < n_kept; ++i) ++per_layer[all[i].second];

  auto p = make_press_impl("kvcompose", ratio);
  auto s = prefill(*p, toks);
  int total = 0;
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      const int k = std::max(1, per_layer[l]);
      std::vector<int> idx(n);
      std::iota(idx.begin(), idx.end(), 0);
      std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return score[l][h][a] > score[l][h][b]; });
      std::set<int32_t> want(idx.begin(), idx.begin() + k);
      const auto& pos = s->cache().seg(l, h).positions();
      EXPECT_EQ(std::set<int32_t>(pos.begin(), pos.end()), want) << "l" << l << " h" << h;
      total += static_cast<int>(pos.size());
    }
  EXPECT_EQ(total, H * n_kept) << "structured: the layer counts sum to the top-k";
  // The replay is discarded: the session continues right after the context.
  EXPECT_EQ(s->cache().next_position(), n);
}

TEST(PressKVCompose, RatioZeroIsBitIdenticalAndNamesAreAliases) {
  auto toks = story_tokens(40);
  auto none = make_press_impl("none", 0.0);
  auto p = make_press_impl("kvcompose", 0.0);
  EXPECT_TRUE(same_cache(prefill(*p, toks)->cache(), prefill(*none, toks)->cache()));
  EXPECT_EQ(make_press_impl("KVComposePress:compression_ratio=0.4,structured=False,agg_task=mean", 0.0)->describe(),
            make_press_impl("kvcompose:ratio=0.4,structured=0,agg_task=mean", 0.0)->describe());
  EXPECT_THROW(make_press_impl("kvcompose:agg_task=median", 0.5), Error);
  EXPECT_THROW(make_press_impl("kvcompose:keep_token_lower_bound=-1", 0.5), Error);
}

}  // namespace
