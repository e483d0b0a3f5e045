// Budget policies on hand-made scores whose keep-counts are derived by hand.
#include <numeric>

#include "support/press_util.h"

using namespace press_test;

namespace {

/// A cache of `sizes[l][h]` f32 entries (head_dim 2) at positions 0..size-1.
KVCache sized_cache(const std::vector<std::vector<int>>& sizes) {
  KVCache c(static_cast<int>(sizes.size()), static_cast<int>(sizes[0].size()), 2, KVCodec::F32, KVCodec::F32);
  float kv[2] = {1, 1};
  for (size_t l = 0; l < sizes.size(); ++l)
    for (size_t h = 0; h < sizes[l].size(); ++h)
      for (int i = 0; i < sizes[l][h]; ++i) c.seg(l, h).append(kv, kv, i);
  return c;
}

/// Scores 1, 2, ..., n times `scale` in every segment.
Scores ramp(const KVCache& c, const std::vector<std::vector<double>>& scale) {
  Scores s(c.n_layer(), std::vector<std::vector<float>>(c.n_head_kv()));
  for (int l = 0; l < c.n_layer(); ++l)
    for (int h = 0; h < c.n_head_kv(); ++h)
      for (size_t i = 0; i < c.seg(l, h).size(); ++i) s[l][h].push_back(static_cast<float>((i + 1) * scale[l][h]));
  return s;
}

KeepCounts run_policy(const std::string& spec, const Scores& s, const KVCache& c, Target t,
                      std::vector<double> stat = {}) {
  auto p = scorer(spec, t.ratio);
  Scores sc = s;
  p->policy().prepare(sc, c, t);
  if (stat.empty()) stat.assign(c.n_layer(), 0.0);
  return p->policy().keep_counts(BudgetInput{sc, c, t, stat});
}

TEST(PressPolicy, UniformKeepsFloorOfRatio) {
  KVCache c = sized_cache({{10, 10}, {10, 10}});
  KeepCounts k = run_policy("uniform(knorm)", ramp(c, {{1, 1}, {1, 1}}), c, {0.55, 10});
  for (auto& l : k)
    for (int v : l) EXPECT_EQ(v, 4);  // floor(10 * 0.45)
  // never below 1
  k = run_policy("knorm", ramp(c, {{1, 1}, {1, 1}}), c, {0.99, 10});
  EXPECT_EQ(k[0][0], 1);
  EXPECT_EQ(uniform_keep(10, 0.0), 10);
  EXPECT_EQ(uniform_keep(7, 0.5), 3);
  EXPECT_EQ(uniform_keep(0, 0.5), 0);
  EXPECT_EQ(uniform_keep(100, 0.7), 30);  // 100 * 0.3 = 29.999999999999996 in binary
}

// One layer, two heads of 10; head 0's scores are all above head 1's. Uniform budget 5 per head,
// floor alpha * 5 = 1: head 1 keeps its floor, head 0 takes the other 9 of the layer's 10.
TEST(PressPolicy, AdaKVSharesTheLayerBudgetWithAFloor) {
  KVCache c = sized_cache({{10, 10}});
  Scores s = ramp(c, {{1, 0.01}});
  KeepCounts k = run_policy("adakv(knorm):alpha=0.2", s, c, {0.5, 10});
  EXPECT_EQ(k[0][0], 9);
  EXPECT_EQ(k[0][1], 1);
  // alpha = 1: each head keeps the uniform budget.
  k = run_policy("adakv(knorm):alpha=1", s, c, {0.5, 10});
  EXPECT_EQ(k[0][0], 5);
  EXPECT_EQ(k[0][1], 5);
  // Head 1 has 3 protected entries: they count against the layer's total.
  s[0][1][0] = s[0][1][1] = s[0][1][2] = kProtected;
  k = run_policy("adakv(knorm):alpha=0.2", s, c, {0.5, 10});
  EXPECT_EQ(k[0][1], 3);
  EXPECT_EQ(k[0][0], 7);
  // The counts select exactly the top entries of the concatenation: interleaved scores.
  Scores t(1, std::vector<std::vector<float>>(2));
  t[0][0] = {9, 7, 5, 3, 1, 0, 0, 0, 0, 0};
  t[0][1] = {8, 6, 4, 2, 0, 0, 0, 0, 0, 0};
  // Budget 5 per head, 10 in all: the 9 non-zero scores, then one of the tied zeros, which goes
  // to the earlier head.
  k = run_policy("adakv(knorm):alpha=0", t, c, {0.5, 10});
  EXPECT_EQ(k[0][0], 6);
  EXPECT_EQ(k[0][1], 4);
  k = run_policy("adakv(knorm):alpha=0", t, c, {0.7, 10});  // budget 3 per head, 6 in all: 9 8 7 6 5 4
  EXPECT_EQ(k[0][0], 3);
  EXPECT_EQ(k[0][1], 3);
  k = run_policy("adakv(knorm):alpha=0", t, c, {0.75, 10});  // budget floor(2.5) = 2, 4 in all: 9 8 7 6
  EXPECT_EQ(k[0][0], 2);
  EXPECT_EQ(k[0][1], 2);
}

// kvpress's PyramidKVPress.get_layer_budget, by hand (5 layers of one head, beta 20):
// n = 100, r = 0.5, w = 16: cap = 16 + 50 = 66; min = 50 / 20 = 2.5, max = 100 - 2.5 = 97.5 >=
// n - w = 84 -> max = 84, min = 100 - 84 = 16; 100 >= 84 >= 16 >= 16 holds; step (84 - 16) / 4
// = 17 -> 84 67 50 33 16.
TEST(PressPolicy, PyramidKVFollowsTheReferenceSchedule) {
  KVCache c = sized_cache({{101}, {101}, {101}, {101}, {101}});
  Scores s = ramp(c, {{1}, {1}, {1}, {1}, {1}});
  KeepCounts k = run_policy("pyramidkv(knorm):beta=20,window=16", s, c, {0.5, 100});
  EXPECT_EQ(k, (KeepCounts{{84}, {67}, {50}, {33}, {16}}));
  // r = 0.2: cap 96, min 4, max 156 -> max 84, min 160 - 84 = 76; step 2 -> 84 82 80 78 76.
  k = run_policy("pyramidkv(knorm):beta=20,window=16", s, c, {0.2, 100});
  EXPECT_EQ(k, (KeepCounts{{84}, {82}, {80}, {78}, {76}}));
  // n = 101, r = 0.5: cap - w = 50.5, min 2.525, max 98.475 -> max 85, min 16; step 17.25 ->
  // 85, 67.75, 50.5, 33.25, 16 -> Python's round (half to even): 85 68 50 33 16.
  k = run_policy("pyramidkv(knorm):beta=20,window=16", s, c, {0.5, 101});
  EXPECT_EQ(k, (KeepCounts{{85}, {68}, {50}, {33}, {16}}));
  // A window of 64 (the default, knorm records none): max 36 < min 64, the pyramid is invalid ->
  // every layer keeps round(100 x 0.5) = 50 (the SnapKV fallback).
  k = run_policy("pyramidkv(knorm):beta=20", s, c, {0.5, 100});
  EXPECT_EQ(k, (KeepCounts{{50}, {50}, {50}, {50}, {50}}));
  // The fallback rounds, it does not floor: n = 101, r = 0.5 -> round(50.5) = 50, r = 0.25 ->
  // round(75.75) = 76.
  k = run_policy("pyramidkv(knorm):beta=20", s, c, {0.25, 101});
  EXPECT_EQ(k, (KeepCounts{{76}, {76}, {76}, {76}, {76}}));
  // The scorer's window is the pyramid's: snapkv:window=16 gives the first schedule.
  k = run_policy("pyramidkv(snapkv:window=16):beta=20", s, c, {0.5, 100});
  EXPECT_EQ(k, (KeepCounts{{84}, {67}, {50}, {33}, {16}}));
}

// kvpress's ChunkKVPress by hand: one layer, two KV heads of 10 entries, chunk 4 -> chunks [0,4),
// [4,8), [8,10). Head scores a = 5 0 0 0 | 1 1 1 1 | 0 9 and b = 0 0 0 3 | 1 1 1 1 | 0 0; summed
// 5 0 0 3 | 2 2 2 2 | 0 9 -> chunk means 2, 2, 4.5. Ratio 0.5: max(1, int(3 x 0.5)) = 1 chunk ->
// entries 8, 9 in both heads. Ratio 0.3: int(2.1) = 2 chunks -> 4.5, then the tie 2 = 2 goes to the
// later chunk: entries 4..9.
TEST(PressPolicy, ChunkKVKeepsWholeChunksByMeanScoreSummedOverHeads) {
  KVCache c = sized_cache({{10, 10}});
  Scores s(1, std::vector<std::vector<float>>(2));
  s[0][0] = {5, 0, 0, 0, 1, 1, 1, 1, 0, 9};
  s[0][1] = {0, 0, 0, 3, 1, 1, 1, 1, 0, 0};
  auto run = [&](double r) {
    auto p = scorer("chunkkv(knorm):chunk=4", r);
    Scores sc = s;
    Target t{r, 10};
    p->policy().prepare(sc, c, t);
    KeepCounts k = p->policy().keep_counts(BudgetInput{sc, c, t, {0.0}});
    std::vector<std::vector<int32_t>> kept;
    for (int h = 0; h < 2; ++h) kept.push_back(select_top(sc[0][h], k[0][h]));
    return kept;
  };
  EXPECT_EQ(run(0.5), (std::vector<std::vector<int32_t>>{{8, 9}, {8, 9}}));
  EXPECT_EQ(run(0.3), (std::vector<std::vector<int32_t>>{{4, 5, 6, 7, 8, 9}, {4, 5, 6, 7, 8, 9}}));
  // Fewer entries than one chunk: the scorer's own top-k (floor(3 x 0.5) = 1: the highest score).
  KVCache small = sized_cache({{3}});
  Scores t3(1, std::vector<std::vector<float>>(1, std::vector<float>{2, 7, 1}));
  auto p = scorer("chunkkv(knorm):chunk=4", 0.5);
  Target t{0.5, 3};
  p->policy().prepare(t3, small, t);
  KeepCounts k = p->policy().keep_counts(BudgetInput{t3, small, t, {0.0}});
  EXPECT_EQ(select_top(t3[0][0], k[0][0]), (std::vector<int32_t>{1}));
}

// 4 layers, n = 100, ratio 0.5: B_avg 50, reserve 0.2 -> B_bound 10; LMBA 1, 1, 2, 4 ->
// u = 1/8, 1/8, 1/4, 1/2 -> 10 + 40 * 4 * u = 30, 30, 50, 90.
TEST(PressPolicy, ZigZagKVFollowsLMBAWithAReserve) {
  KVCache c = sized_cache({{100}, {100}, {100}, {100}});
  Scores s = ramp(c, {{1}, {1}, {1}, {1}});
  KeepCounts k = run_policy("zigzagkv(knorm):reserve=0.2", s, c, {0.5, 100}, {1, 1, 2, 4});
  EXPECT_EQ(k, (KeepCounts{{30}, {30}, {50}, {90}}));
  // LMBA 0, 0, 0, 8 -> 10, 10, 10, 170 capped at 100: the 70 left over go to the others in
  // proportion to their budgets (equal): 10 + 70/3 each -> 33.33 -> 34 33 33 100.
  k = run_policy("zigzagkv(knorm):reserve=0.2", s, c, {0.5, 100}, {0, 0, 0, 8});
  EXPECT_EQ(k, (KeepCounts{{34}, {33}, {33}, {100}}));
}

TEST(PressPolicy, ZigZagKVComputesMBAFromWindowAttention) {
  // LMBA = mean over query heads of the fewest entries holding 90% of the window's attention,
  // re-computed in float64.
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  KVCache c = random_cache(m, 40, 21);
  std::vector<int32_t> wp;
  for (int i = 32; i < 40; ++i) wp.push_back(i);
  Observation obs = random_window(m, wp, 22);
  auto p = scorer("zigzagkv(knorm):window=8,mass=0.9", 0.5);
  std::vector<double> stat;
  p->score_all(c, m, obs, Target{0.5, 40}, &stat);
  for (int l = 0; l < hp.n_layer; ++l) {
    double sum = 0;
    for (int qh = 0; qh < hp.n_head; ++qh) {
      std::vector<double> mass(40, 0.0);
      for (int i = 0; i < 8; ++i) {
        auto pr = softmax_row(window_query(obs, hp, l, qh, i), wp[i], c.seg(l, qh / hp.n_group()));
        for (int j = 0; j < 40; ++j) mass[j] += pr[j];
      }
      std::sort(mass.begin(), mass.end(), std::greater<double>());
      double acc = 0;
      int k = 0;
      while (acc < 0.9 * 8 - 1e-9) acc += mass[k++];
      sum += k;
    }
    EXPECT_NEAR(stat[l], sum / hp.n_head, 1e-9) << "layer " << l;
  }
}

// Two layers of two heads; layer 1's scores dominate: the global top-k over all 4 x 10 entries at
// ratio 0.5 keeps 20, all in layer 1.
TEST(PressPolicy, GlobalTopKAcrossLayersAndHeads) {
  KVCache c = sized_cache({{10, 10}, {10, 10}});
  Scores s = ramp(c, {{0.01, 0.01}, {1, 1}});
  // Total 20 = 4 x floor(10 x 0.5). Every segment first keeps one entry (no segment is ever
  // emptied: it used to be {{0, 0}, {10, 10}}), the other 16 go to the highest scores (layer 1).
  KeepCounts k = run_policy("global(knorm)", s, c, {0.5, 10});
  EXPECT_EQ(k, (KeepCounts{{1, 1}, {9, 9}}));
  // A protected entry is that segment's floor, not one more.
  s[0][0][3] = kProtected;
  k = run_policy("global(knorm)", s, c, {0.5, 10});
  EXPECT_EQ(k, (KeepCounts{{1, 1}, {9, 9}}));
  EXPECT_EQ(select_top(s[0][0], 1), (std::vector<int32_t>{3}));
}

// Threshold: window of 3 newest tokens, tau 0.5. Scores 0.9 0.1 0.6 0.2 0.7 0.3 0.1 0.1 0.1 0.1
// at positions 0..9 -> entries 0, 2, 4 pass, 7 8 9 are in the window: 6 kept.
TEST(PressPolicy, ThresholdKeepsScoresAboveTauAndTheSlidingWindow) {
  KVCache c = sized_cache({{10}});
  Scores s(1, std::vector<std::vector<float>>(1));
  s[0][0] = {0.9f, 0.1f, 0.6f, 0.2f, 0.7f, 0.3f, 0.1f, 0.1f, 0.1f, 0.1f};
  auto p = scorer("threshold(knorm):tau=0.5,window=3", 0.0);
  Scores sc = s;
  p->policy().prepare(sc, c, {0, 10});
  KeepCounts k = p->policy().keep_counts(BudgetInput{sc, c, {0, 10}, {0.0}});
  EXPECT_EQ(k[0][0], 6);
  EXPECT_EQ(select_top(sc[0][0], k[0][0]), (std::vector<int32_t>{0, 2, 4, 7, 8, 9}));
}

TEST(PressPolicy, PerLayerRatios) {
  KVCache c = sized_cache({{10, 10}, {10, 10}});
  KeepCounts k = run_policy("per_layer(knorm,ratios=0.2/0.7)", ramp(c, {{1, 1}, {1, 1}}), c, {0.0, 10});
  EXPECT_EQ(k, (KeepCounts{{8, 8}, {3, 3}}));
  EXPECT_THROW(run_policy("per_layer(knorm,ratios=0.2)", ramp(c, {{1, 1}, {1, 1}}), c, {0.0, 10}), Error);
  EXPECT_DOUBLE_EQ(make_press_impl("per_layer(knorm,ratios=0.2/0.6)", 0.0)->ratio(), 0.4);
}

TEST(PressPolicy, ApportionMeetsTheTotalWithinBounds) {
  KVCache c = sized_cache({{12}, {12}, {12}});
  Scores s = ramp(c, {{1}, {1}, {1}});
  KeepCounts k = run_policy("zigzagkv(knorm):reserve=0", s, c, {0.6667, 12}, {1, 2, 3});
  // uniform budget floor(12 * 0.3333) = 3 per layer, 9 in all; LMBA 1:2:3 -> 1.5 3 4.5 ->
  // floors 1 3 4 + largest remainders (.5 .5: the first) -> 2 3 4.
  EXPECT_EQ(k, (KeepCounts{{2}, {3}, {4}}));
}

}  // namespace
