// Presses against their reference rules: budgets, protected entries and defaults as
// kvpress's code (or the authors' where kvpress has none) computes them. Expected values are
// derived by hand from the reference formulas or recomputed in float64 here.
#include <cmath>
#include <set>

#include "press/scorers/duo_attention.h"
#include "train/duo_calibrate.h"
#include "press/recorders.h"
#include "support/press_util.h"

using namespace press_test;

namespace {

std::vector<int32_t> range(int32_t a, int32_t b) {  // [a, b)
  std::vector<int32_t> v;
  for (int32_t i = a; i < b; ++i) v.push_back(i);
  return v;
}

/// Every segment of `cache` holds exactly `want` positions.
void expect_positions(const KVCache& cache, const std::vector<int32_t>& want, const std::string& what) {
  for (int l = 0; l < cache.n_layer(); ++l)
    for (int h = 0; h < cache.n_head_kv(); ++h)
      EXPECT_EQ(cache.seg(l, h).positions(), want) << what << " l" << l << " h" << h;
}

// kvpress keeps int(n (1 - r)) entries with the window padded at the largest score + 1: a budget
// smaller than the window keeps part of the window (here the newest entries: ties go to the later
// entry), so 0.9 requested on 256 tokens removes 90%, not 75%.
TEST(PressReference, SnapKVHonoursTheRatioWhenTheBudgetIsSmallerThanTheWindow) {
  auto toks = story_tokens(256);
  auto p = make_press_impl("snapkv", 0.9);  // window 64, budget int(256 x 0.1) = 25
  expect_positions(prefill(*p, toks)->cache(), range(231, 256), "snapkv r=0.9");
  // kvslim's option: the window is never evicted.
  auto q = make_press_impl("snapkv:protect=1", 0.9);
  expect_positions(prefill(*q, toks)->cache(), range(192, 256), "snapkv protect=1");
  // Every policy over it honours the ratio too (kvpress's AdaKV: the window first, in the budget).
  for (const char* spec : {"adakv(snapkv)", "global(snapkv)"}) {
    auto a = make_press_impl(spec, 0.9);
    auto s = prefill(*a, toks);
    EXPECT_EQ(s->cache().entries(), size_t(25) * s->cache().n_layer() * s->cache().n_head_kv()) << spec;
  }
}

TEST(PressReference, PromptShorterThanTheWindowStillHonoursTheRatio) {
  auto toks = story_tokens(40);
  auto p = make_press_impl("snapkv", 0.5);  // window 64 > 40 tokens: every entry is window, the newest 20 stay
  expect_positions(prefill(*p, toks)->cache(), range(20, 40), "snapkv n=40");
  auto none = make_press_impl("none", 0.0);
  auto q = make_press_impl("snapkv:protect=1", 0.5);
  EXPECT_TRUE(same_cache(prefill(*q, toks)->cache(), prefill(*none, toks)->cache()));
}

TEST(PressReference, OneAndTwoTokenContextsKeepOneEntry) {
  for (const char* spec : {"snapkv", "knorm", "streaming_llm", "tova", "h2o", "expected_attention",
                           "pyramidkv(snapkv)", "observed_attention"})
    for (size_t n : {1, 2}) {
      auto p = make_press_impl(spec, 0.5);
      auto s = prefill(*p, story_tokens(n));
      for (int l = 0; l < s->cache().n_layer(); ++l)
        for (int h = 0; h < s->cache().n_head_kv(); ++h)
          EXPECT_EQ(s->cache().seg(l, h).size(), 1u) << spec << " n=" << n << " l" << l << " h" << h;
    }
}

// kvpress's StreamingLLMPress: n_pruned = n - int(n (1 - r)) entries right after the n_sink sinks
// leave. n = 100, r = 0.5: 50 pruned at positions 4..53; 0..3 and 54..99 stay. With r = 0.99 the
// budget (1) is below n_sink: one entry, a sink, stays.
TEST(PressReference, StreamingLLMPrunesRightAfterTheSinks) {
  auto toks = story_tokens(100);
  auto p = make_press_impl("streaming_llm", 0.5);
  std::vector<int32_t> want = range(0, 4), tail = range(54, 100);
  want.insert(want.end(), tail.begin(), tail.end());
  expect_positions(prefill(*p, toks)->cache(), want, "streaming_llm r=0.5");
  auto q = make_press_impl("streaming_llm", 0.99);
  auto s = prefill(*q, toks);
  for (int l = 0; l < s->cache().n_layer(); ++l)
    for (int h = 0; h < s->cache().n_head_kv(); ++h) {
      ASSERT_EQ(s->cache().seg(l, h).size(), 1u);
      EXPECT_LT(s->cache().seg(l, h).positions()[0], 4);
    }
}

// H2O's budget is split between the recent window and the heavy hitters: n = 120, r = 0.5, budget
// 60 -> recent ceil(60 / 2) = 30 (positions 90..119) + 30 heavy hitters. recent=10 fixes it.
TEST(PressReference, H2OSplitsTheBudgetBetweenRecentAndHeavyHitters) {
  auto toks = story_tokens(120);
  for (auto [spec, first_recent] : {std::pair<const char*, int>{"h2o", 90}, {"h2o:recent=10", 110}}) {
    auto p = make_press_impl(spec, 0.5);
    auto s = prefill(*p, toks);
    for (int l = 0; l < s->cache().n_layer(); ++l)
      for (int h = 0; h < s->cache().n_head_kv(); ++h) {
        const auto& pos = s->cache().seg(l, h).positions();
        ASSERT_EQ(pos.size(), 60u) << spec;
        for (int32_t r = first_recent; r < 120; ++r)
          EXPECT_TRUE(std::binary_search(pos.begin(), pos.end(), r)) << spec << " lost recent " << r;
        // The heavy hitters are older entries.
        EXPECT_EQ(std::count_if(pos.begin(), pos.end(), [fr = first_recent](int32_t x) { return x < fr; }),
                  60 - (120 - first_recent))
            << spec;
      }
  }
}

// A worked case: the bundled 411-token story at 0.5 under pyramidkv(snapkv) (window 64, beta
// 20, 5 layers). By hand: cap = 64 + 205.5 = 269.5; min = 205.5 / 20 = 10.275, max = 411 - 10.275
// = 400.725 >= 411 - 64 = 347 -> max 347, min 411 - 347 = 64; 411 >= 347 >= 64 >= 64 holds; step
// (347 - 64) / 4 = 70.75 -> 347, 276.25, 205.5, 134.75, 64 -> round: 347 276 206 135 64 per KV head.
TEST(PressReference, PyramidKVKeepsTheReferenceScheduleOnTheStory) {
  auto toks = story_tokens(411);
  auto p = make_press_impl("pyramidkv(snapkv)", 0.5);
  auto s = prefill(*p, toks);
  const int H = s->cache().n_head_kv();
  const std::vector<size_t> per_head = {347, 276, 206, 135, 64};
  ASSERT_EQ(s->cache().n_layer(), 5);
  for (int l = 0; l < 5; ++l) EXPECT_EQ(s->cache().entries(l), per_head[l] * H) << "layer " << l;
  // A short prompt never empties a layer: n = 80 at 0.5 -> max 16 < min 64: every layer keeps
  // round(40) = 40 (the SnapKV fallback).
  auto q = make_press_impl("pyramidkv(snapkv)", 0.5);
  auto s2 = prefill(*q, story_tokens(80));
  for (int l = 0; l < 5; ++l) EXPECT_EQ(s2->cache().entries(l), size_t(40) * H) << "layer " << l;
}

/// float64 Expected Attention of one KV head's entries (after n_sink) from pre-RoPE queries
/// `Q[g]` (rows) of each query head g of its group: mean and population covariance, the RoPE
/// matrix averaged over positions next .. next + F - 1, softmax over the entries, mean over the
/// group, times ||v||.
std::vector<double> ea_reference(const std::vector<std::vector<std::vector<double>>>& Q, const Segment& seg,
                                 int n_sink, int32_t next, int F, double base) {
  auto K = keys_of(seg);
  auto V = values_of(seg);
  const int d = seg.head_dim(), G = static_cast<int>(Q.size());
  const size_t n = K.size();
  auto R = [&](double pos) {
    std::vector<double> M(d * d, 0.0);
    for (int i = 0; i < d / 2; ++i) {
      double th = pos * std::pow(base, -2.0 * i / d);
      M[(2 * i) * d + 2 * i] = std::cos(th);
      M[(2 * i) * d + 2 * i + 1] = -std::sin(th);
      M[(2 * i + 1) * d + 2 * i] = std::sin(th);
      M[(2 * i + 1) * d + 2 * i + 1] = std::cos(th);
    }
    return M;
  };
  std::vector<double> Rb(d * d, 0.0);
  for (int t = 0; t < F; ++t) {
    auto M = R(next + t);
    for (int i = 0; i < d * d; ++i) Rb[i] += M[i] / F;
  }
  std::vector<double> out(n, 0.0);
  for (int g = 0; g < G; ++g) {
    const double N = static_cast<double>(Q[g].size());
    std::vector<double> mu(d, 0.0), S(d * d, 0.0), mu2(d, 0.0), T(d * d, 0.0), S2(d * d, 0.0);
    for (auto& q : Q[g])
      for (int a = 0; a < d; ++a) mu[a] += q[a] / N;
    for (auto& q : Q[g])
      for (int a = 0; a < d; ++a)
        for (int b = 0; b < d; ++b) S[a * d + b] += (q[a] - mu[a]) * (q[b] - mu[b]) / N;
    for (int a = 0; a < d; ++a)
      for (int b = 0; b < d; ++b) mu2[a] += Rb[a * d + b] * mu[b];
    for (int a = 0; a < d; ++a)
      for (int b = 0; b < d; ++b)
        for (int c = 0; c < d; ++c) T[a * d + b] += Rb[a * d + c] * S[c * d + b];
    for (int a = 0; a < d; ++a)
      for (int b = 0; b < d; ++b)
        for (int c = 0; c < d; ++c) S2[a * d + b] += T[a * d + c] * Rb[b * d + c];
    std::vector<double> z(n, -INFINITY);
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
    for (size_t j = n_sink; j < n; ++j) out[j] += std::exp(z[j] - mx) / sum / G;
  }
  for (size_t j = n_sink; j < n; ++j) {
    double vn = 0;
    for (double x : V[j]) vn += x * x;
    out[j] *= std::sqrt(vn);
  }
  return out;
}

// kvpress's ExpectedAttentionPress estimates the query statistics from every context query after
// the n_sink sinks (not from a window): recomputed here from every token's recorded query,
// un-rotated in float64, over a prefill in one piece and in chunks of 40 (sums over chunks).
TEST(PressReference, ExpectedAttentionUsesEveryContextQueryAfterTheSinks) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  ASSERT_FALSE(hp.rope_neox);
  ASSERT_TRUE(m.rope_freqs().empty());
  const int n = 96, n_sink = 4, F = 16, d = hp.head_dim, G = hp.n_group();
  auto toks = story_tokens(n);
  // Every token's post-RoPE query from a plain forward pass.
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
    auto p = scorer("expected_attention:n_future=16", 0.0);  // ratio 0: nothing evicted
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
        auto want = ea_reference(Q, s->cache().seg(l, h), n_sink, n, F, hp.rope_freq_base);
        for (int j = 0; j < n; ++j) {
          if (j < n_sink)
            EXPECT_EQ(sc[l][h][j], kPreferred);
          else
            expect_close(sc[l][h][j], want[j], 2e-3, "expected_attention chunk " + std::to_string(chunk));
        }
      }
  }
}

// Defaults read from the references: kvpress's DMSPress (sliding window 128, no default
// threshold), KVzipPress (kvzip_plus_normalization False), DecodingPress (interval 512, target
// 2048), DuoAttention (128 sinks, 256 recent).
TEST(PressReference, DefaultsAreTheReferences) {
  EXPECT_NE(make_press_impl("threshold(knorm):tau=-3", 0.0)->describe().find("window=128"), std::string::npos);
  try {
    make_press_impl("threshold(knorm)", 0.0);
    ADD_FAILURE() << "threshold without tau was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tau is required"), std::string::npos) << e.what();
  }
  EXPECT_NE(make_press_impl("kvzip", 0.5)->describe().find("plus=0"), std::string::npos);
  EXPECT_NE(make_press_impl("decoding(knorm)", 0.5)->describe().find("interval=512,size=2048"), std::string::npos);
  DuoCalibration cal;
  EXPECT_EQ(cal.sink, 128);
  EXPECT_EQ(cal.recent, 256);
  DuoLabels labels;
  EXPECT_EQ(labels.sink, 128);
  EXPECT_EQ(labels.recent, 256);
  // kvpress's DuoAttentionPress: head_compression_ratio 0.0 (no head streams) unless given; the
  // press then leaves the cache as no press does, without calibrating.
  EXPECT_NE(make_press_impl("duo_attention", 0.0)->describe().find("head_ratio=0,"), std::string::npos);
  EXPECT_NE(make_press_impl("DuoAttentionPress", 0.0)->describe().find("head_ratio=0,"), std::string::npos);
  auto duo = make_press_impl("duo_attention", 0.0), none = make_press_impl("none", 0.0);
  const auto toks = press_test::story_tokens(200);
  EXPECT_TRUE(press_test::same_cache(press_test::prefill(*duo, toks)->cache(), press_test::prefill(*none, toks)->cache()));
}

}  // namespace

namespace {

// kvpress's class and parameter names are aliases of ours: the same press, described in our names.
TEST(PressReference, KvpressNamesAreAliases) {
  EXPECT_EQ(make_press_impl("SnapKVPress:compression_ratio=0.3,window_size=32,kernel_size=7", 0.0)->describe(),
            make_press_impl("snapkv:ratio=0.3,window=32,kernel=7", 0.0)->describe());
  EXPECT_EQ(make_press_impl("AdaKVPress(SnapKVPress,alpha_safeguard=0.3)", 0.5)->describe(),
            make_press_impl("adakv(snapkv):alpha=0.3", 0.5)->describe());
  EXPECT_EQ(make_press_impl("ExpectedAttentionPress:n_future_positions=64,use_covariance=False", 0.5)->describe(),
            make_press_impl("expected_attention:n_future=64,covariance=0", 0.5)->describe());
  EXPECT_EQ(make_press_impl("DMSPress(KnormPress):threshold=-4,sliding_window_size=64", 0.0)->describe(),
            make_press_impl("threshold(knorm):tau=-4,window=64", 0.0)->describe());
  EXPECT_EQ(make_press_impl("DecodingPress(KnormPress):compression_interval=8,target_size=100", 0.0)->describe(),
            make_press_impl("decoding(knorm):interval=8,size=100", 0.0)->describe());
  EXPECT_EQ(make_press_impl("StreamingLLMPress:n_sink=8", 0.5)->describe(), make_press_impl("streaming_llm:n_sink=8", 0.5)->describe());
  // An alias and our name for the same parameter is a repeat.
  try {
    make_press_impl("snapkv:window_size=8,window=16", 0.5);
    ADD_FAILURE() << "repeated parameter accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("given twice"), std::string::npos) << e.what();
  }
  // Regression: `kvslim presses` listed expected_attention's aliases twice (two kvpress classes,
  // ExpectedAttentionPress and ExpectedAttentionStatsPress, name that press): each alias once, on
  // its parameter, and both class names on the press.
  const PressInfo* ea = PressRegistry::instance().find("expected_attention");
  ASSERT_NE(ea, nullptr);
  std::set<std::pair<std::string, std::string>> aliases;
  for (const PressParam& pp : ea->params)
    if (!pp.kvpress.empty()) aliases.emplace(pp.kvpress, pp.name);
  const std::set<std::pair<std::string, std::string>> want = {
      {"n_future_positions", "n_future"}, {"use_covariance", "covariance"}, {"use_vnorm", "vnorm"}, {"stats_folder", "stats"}};
  EXPECT_EQ(aliases, want);
  EXPECT_EQ(ea->kvpress, (std::vector<std::string>{"ExpectedAttentionPress", "ExpectedAttentionStatsPress"}));
  // kvpress's target ratio of CompressionRatioDecodingPress is the wrapper's ratio.
  EXPECT_EQ(make_press_impl("CompressionRatioDecodingPress(KnormPress):target_compression_ratio=0.4", 0.0)->describe(),
            make_press_impl("compression_ratio_decoding(knorm):ratio=0.4", 0.0)->describe());
}

}  // namespace

namespace {

/// LagKV (arXiv 2504.04704, kvpress's LagKVPress), recomputed in float64 from the reference's
/// formula: partitions of `lag` after the sinks, each normalised by the next partition's per-channel
/// range, unbiased std over channels, softmax over the partition, keys and values averaged, then
/// rank / lag; sinks and the last partition + remainder score 1.
std::vector<double> lagkv_reference(const Segment& seg, int n_sink, int lag) {
  auto K = keys_of(seg), V = values_of(seg);
  const int n = static_cast<int>(K.size()), d = static_cast<int>(K[0].size());
  std::vector<double> out(n, 1.0);
  auto part = [&](const std::vector<std::vector<double>>& X, int b) {
    std::vector<double> sc(lag);
    for (int i = 0; i < lag; ++i) {
      std::vector<double> z(d);
      double mean = 0;
      for (int c = 0; c < d; ++c) {
        double lo = INFINITY, hi = -INFINITY;
        for (int j = b + lag; j < b + 2 * lag; ++j) lo = std::min(lo, X[j][c]), hi = std::max(hi, X[j][c]);
        z[c] = (X[b + i][c] - lo) / (hi - lo);
        mean += z[c] / d;
      }
      double ss = 0;
      for (double x : z) ss += (x - mean) * (x - mean);
      sc[i] = std::sqrt(ss / (d - 1));
    }
    double sum = 0;
    for (double x : sc) sum += std::exp(x);
    for (double& x : sc) x = std::exp(x) / sum;
    return sc;
  };
  const int parts = (n - n_sink) / lag;
  for (int p = 0; p + 1 < parts; ++p) {
    const int b = n_sink + p * lag;
    auto sk = part(K, b), sv = part(V, b);
    for (int i = 0; i < lag; ++i) {
      const double mine = (sk[i] + sv[i]) / 2;
      int below = 0;
      for (int j = 0; j < lag; ++j) below += (sk[j] + sv[j]) / 2 < mine;
      out[b + i] = double(below) / lag;
    }
  }
  return out;
}

TEST(PressReference, LagKVMatchesFloat64) {
  const Model& m = bundled_model();
  KVCache cache = random_cache(m, 33, 5);  // 4 sinks + 3 partitions of 8 + 5
  auto p = scorer("lagkv:lag=8", 0.5);
  Scores s = p->score_all(cache, m, Observation{}, Target{0.5, 33});
  for (int l = 0; l < cache.n_layer(); ++l)
    for (int h = 0; h < cache.n_head_kv(); ++h) {
      auto want = lagkv_reference(cache.seg(l, h), 4, 8);
      for (int j = 0; j < 33; ++j) EXPECT_NEAR(s[l][h][j], want[j], 1e-6) << "l" << l << " h" << h << " j" << j;
    }
  // Shorter than n_sink + 2 lag: recency (i - n_sink) / (n - n_sink) after sinks scoring 1.
  KVCache small = random_cache(m, 12, 6);
  Scores t = p->score_all(small, m, Observation{}, Target{0.5, 12});
  for (int j = 0; j < 12; ++j) EXPECT_NEAR(t[0][0][j], j < 4 ? 1.0 : (j - 4) / 8.0, 1e-7);
}

}  // namespace

namespace {

// models/retrieval.gguf is built so that layer 1's (only) KV head does the retrieval (induction
// head) and layer 0's previous-token heads read only the last 5 entries (models/RETRIEVAL.md):
// calibration at the paper's 128 sinks + 256 recent must label layer 1 retrieval, layer 0 streaming.
TEST(PressReference, DuoAttentionCalibrationFindsTheConstructedRetrievalHead) {
  auto m = Model::load(std::string(KVSLIM_SOURCE_DIR) + "/models/retrieval.gguf");
  DuoCalibration cal;
  cal.samples = 2;
  DuoLabels labels = duo_calibrate(*m, cal);
  ASSERT_EQ(labels.score.size(), 2u);
  EXPECT_GT(labels.score[1][0], labels.score[0][0]);
  auto streaming = labels.streaming(0.5);
  EXPECT_EQ(streaming[0][0], 1);
  EXPECT_EQ(streaming[1][0], 0);
}

}  // namespace
