// KVzip (replay scores), KVzap (surrogate training and the threshold press), DuoAttention,
// ClusterKV, and ZigZagKV's attention statistics.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include <fmt/format.h>

#include "eval/attention_stats.h"
#include "attention/attention.h"
#include "kvslim/generate.h"
#include "kvslim/gguf.h"
#include "kvslim/request.h"
#include "press/authoring.h"
#include "press/scorers/clusterkv.h"
#include "press/scorers/duo_attention.h"
#include "run/prefill.h"
#include "train/duo_calibrate.h"
#include "train/kvzap_train.h"
#include "press/scorers/kvzap.h"
#include "press/scorers/kvzip.h"
#include "press/recorders.h"
#include "support/files.h"

using namespace kvslim;

namespace {

const std::string kModel = std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf";
const char* kStory =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her dog. One "
    "day, she saw a big red ball under a tree.";

const Model& model() {
  static std::unique_ptr<Model> m = Model::load(kModel);
  return *m;
}

SessionOptions exact_f32(int n_ctx = 1024) {
  SessionOptions o;
  o.key_codec = KVCodec::F32;
  o.value_codec = KVCodec::F32;
  o.exact = true;
  o.n_ctx = n_ctx;
  return o;
}

std::vector<Token> story_tokens() {
  const Tokenizer& tok = model().tokenizer();
  return tok.encode(kStory, tok.add_bos_default(), false);
}

/// Prefills `ctx` with `press`, then decodes `steps` greedy tokens passing the press's decode
/// request and calling after_decode; returns every logit vector seen.
std::vector<std::vector<float>> run_press(PressImpl& press, const std::vector<Token>& ctx, int steps) {
  Session s(model(), exact_f32());
  press.reset();
  std::vector<std::vector<float>> all;
  all.push_back(prefill_and_compress(s, press, ctx, 0));
  for (int i = 0; i < steps; ++i) {
    Token t = argmax(all.back().data(), all.back().size());
    Observation obs;
    all.push_back(run_observed(s, {t}, press.decode_needs(), obs));
    press.after_decode(s.cache(), model(), obs);
  }
  return all;
}

int run_cli(const std::string& args, std::string* output) {
  std::string cmd = std::string(KVSLIM_CLI) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) output->append(buf, n);
  int rc = pclose(p);
  return WEXITSTATUS(rc);
}

}  // namespace

// ---------------------------------------------------------------- ZigZagKV statistics

TEST(ZigZagAttentionStats, MinimumBudgetOfHandMadeRows) {
  const float row[] = {0.05f, 0.4f, 0.1f, 0.3f, 0.15f};
  // Sorted: 0.4, 0.3, 0.15, 0.1, 0.05 -> cumulative 0.4, 0.7, 0.85, 0.95, 1.0.
  EXPECT_EQ(minimum_budget(row, 5, 0.9), 4);
  EXPECT_EQ(minimum_budget(row, 5, 0.85), 3);  // reached exactly by three entries
  EXPECT_EQ(minimum_budget(row, 5, 0.7), 2);
  EXPECT_EQ(minimum_budget(row, 5, 0.3), 1);
  EXPECT_EQ(minimum_budget(row, 5, 1.0), 5);
  const float unnormalised[] = {2.0f, 8.0f, 0.0f};  // mass is relative to the row's total
  EXPECT_EQ(minimum_budget(unnormalised, 3, 0.8), 1);
  EXPECT_EQ(minimum_budget(unnormalised, 3, 0.81), 2);
  const float zero[] = {0.0f, 0.0f};
  EXPECT_EQ(minimum_budget(zero, 2, 0.9), 0);
  EXPECT_THROW(minimum_budget(row, 5, 0.0), Error);
  EXPECT_THROW(minimum_budget(row, 5, 1.5), Error);
}

TEST(ZigZagAttentionStats, LayerBudgetsAreConsistent) {
  std::vector<Token> t = story_tokens();
  LayerBudgetOptions o;
  o.window = 8;
  LayerBudgets lb = layer_budgets(model(), t, o, exact_f32());
  const HParams& hp = model().hparams();
  ASSERT_EQ(lb.lmbo.size(), static_cast<size_t>(hp.n_layer));
  ASSERT_EQ(lb.attention.mba.size(), static_cast<size_t>(hp.n_layer));
  for (int l = 0; l < hp.n_layer; ++l) {
    double mean = 0;
    for (int v : lb.attention.mba[l]) {
      EXPECT_GE(v, 1);
      EXPECT_LE(v, static_cast<int>(t.size()));
      mean += v;
    }
    EXPECT_NEAR(lb.attention.lmba[l], mean / hp.n_head, 1e-9);
    EXPECT_GE(lb.lmbo[l], 1);
    EXPECT_LE(lb.lmbo[l], static_cast<int>(t.size()));
  }
  // A looser similarity never needs a larger budget.
  o.similarity = 0.5;
  LayerBudgets loose = layer_budgets(model(), t, o, exact_f32());
  for (int l = 0; l < hp.n_layer; ++l) EXPECT_LE(loose.lmbo[l], lb.lmbo[l]);
  o.window = 1000;
  EXPECT_THROW(layer_budgets(model(), t, o, exact_f32()), Error);
}

// ---------------------------------------------------------------- session hooks

TEST(ReplaySession, RewindForgetsTheReplay) {
  std::vector<Token> ctx = story_tokens();
  const int n = static_cast<int>(ctx.size());
  Session a(model(), exact_f32()), b(model(), exact_f32());
  a.forward(ctx);
  b.forward(ctx);
  b.forward({5, 6, 7, 8, 9});
  b.rewind(n);
  EXPECT_EQ(b.next_position(), n);
  EXPECT_EQ(b.cache().entries(), a.cache().entries());
  std::vector<float> la = a.forward({42}), lb = b.forward({42});
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) ASSERT_EQ(la[i], lb[i]) << i;
  EXPECT_THROW(b.rewind(-1), Error);
  EXPECT_THROW(b.rewind(b.next_position() + 1), Error);
}

TEST(ReplaySession, SubsetAttentionMatchesFullAndGatheredSegments) {
  const int hd = 8, n = 37, rows = 3;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  Segment seg(hd, KVCodec::F32, KVCodec::F32);
  std::vector<float> k(hd), v(hd);
  for (int i = 0; i < n; ++i) {
    for (int c = 0; c < hd; ++c) k[c] = nd(rng), v[c] = nd(rng);
    seg.append(k.data(), v.data(), i);
  }
  std::vector<float> q(rows * hd);
  for (float& x : q) x = nd(rng);
  std::vector<int32_t> vis = {n, 20, 5};
  std::vector<int32_t> all(n);
  for (int i = 0; i < n; ++i) all[i] = i;
  std::vector<float> o1(rows * hd), o2(rows * hd);
  const float scale = 1.0f / std::sqrt(float(hd));
  attend_segment(seg, q.data(), rows, vis.data(), scale, o1.data(), hd);
  attend_segment_subset(seg, all.data(), n, q.data(), rows, vis.data(), scale, o2.data(), hd);
  for (int i = 0; i < rows * hd; ++i) EXPECT_NEAR(o1[i], o2[i], 1e-6);
  // A subset equals plain attention over a segment holding only those entries.
  std::vector<int32_t> sub = {0, 1, 2, 7, 8, 15, 30, 36};
  Segment small(hd, KVCodec::F32, KVCodec::F32);
  for (int32_t i : sub) {
    seg.key(i, k.data());
    seg.value(i, v.data());
    small.append(k.data(), v.data(), i);
  }
  std::vector<int32_t> vis_small(rows);
  for (int r = 0; r < rows; ++r) vis_small[r] = static_cast<int32_t>(std::lower_bound(sub.begin(), sub.end(), vis[r]) - sub.begin());
  attend_segment(small, q.data(), rows, vis_small.data(), scale, o1.data(), hd);
  attend_segment_subset(seg, sub.data(), static_cast<int>(sub.size()), q.data(), rows, vis.data(), scale, o2.data(), hd);
  for (int i = 0; i < rows * hd; ++i) EXPECT_NEAR(o1[i], o2[i], 1e-6);
}

// ---------------------------------------------------------------- KVzip

TEST(KVzipReplay, SegmentScoresMatchFloat64Recomputation) {
  const int hd = 8, G = 2, n_q = 5;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud(0.5f, 2.0f);
  Segment seg(hd, KVCodec::F32, KVCodec::F32);
  std::vector<float> k(hd), v(hd);
  const int n = 20;  // sinks [0, 2), other context [2, 3), chunk [3, 9), [9, 12) later, replay [12, 20)
  for (int i = 0; i < n; ++i) {
    for (int c = 0; c < hd; ++c) k[c] = 2.0f * nd(rng), v[c] = nd(rng);
    seg.append(k.data(), v.data(), i);
  }
  const size_t n_sink = 2, cb = 3, ce = 9, rb = 12;
  std::vector<float> q(G * n_q * hd);
  for (float& x : q) x = nd(rng);
  std::vector<int32_t> vis = {1, 3, 4, 8, 6};
  std::vector<float> inv(n_q), wov(G * (ce - cb));
  for (float& x : inv) x = ud(rng);
  for (float& x : wov) x = ud(rng);
  std::vector<float> got(ce - cb, 0.0f);
  kvzip_score_segment(seg, n_sink, cb, ce, rb, q.data(), G, n_q, vis.data(), inv.data(), wov.data(), got.data());
  std::vector<double> want(ce - cb, 0.0);
  for (int g = 0; g < G; ++g)
    for (int r = 0; r < n_q; ++r) {
      std::vector<size_t> keys;
      for (size_t j = 0; j < n_sink; ++j) keys.push_back(j);
      for (size_t j = cb; j < ce; ++j) keys.push_back(j);
      for (int j = 0; j < vis[r]; ++j) keys.push_back(rb + j);
      std::vector<double> lg;
      double mx = -1e300;
      for (size_t j : keys) {
        seg.key(j, k.data());
        double d = 0;
        for (int c = 0; c < hd; ++c) d += double(q[(g * n_q + r) * hd + c]) * k[c];
        lg.push_back(d / std::sqrt(double(hd)));
        mx = std::max(mx, lg.back());
      }
      double z = 0;
      for (double x : lg) z += std::exp(x - mx);
      for (size_t j = cb; j < ce; ++j) {
        const double p = std::exp(lg[n_sink + (j - cb)] - mx) / z;
        want[j - cb] = std::max(want[j - cb], p * wov[g * (ce - cb) + (j - cb)] * inv[r]);
      }
    }
  // Relative 1e-5: the shared softmax's exp is within 2e-6 (entry and sum), the logits are float
  // dot products and the sums float. A real error (a wrong visible range, scale or weight) moves a
  // probability by far more (the scores here differ from each other by 1e-3 and more).
  for (size_t j = 0; j < want.size(); ++j) EXPECT_NEAR(got[j], want[j], 1e-5 * want[j]) << j;
  EXPECT_THROW(kvzip_score_segment(seg, 4, 3, 9, rb, q.data(), G, n_q, vis.data(), nullptr, nullptr, got.data()),
               Error);  // sinks overlapping the chunk
}

TEST(KVzipReplay, ReplayScoresMatchIndependentRecomputation) {
  const Model& m = model();
  const HParams& hp = m.hparams();
  const Tokenizer& tok = m.tokenizer();
  const int L = hp.n_layer, H = hp.n_head_kv, G = hp.n_group(), hd = hp.head_dim, d = hp.n_embd;
  std::vector<Token> ctx = story_tokens();
  const int n = static_cast<int>(ctx.size());
  Session s(m, exact_f32());
  s.forward(ctx);
  KVzipOptions ko;  // one chunk, KVzip+
  Scores got = kvzip_replay_scores(s, ctx, 0, ko);
  EXPECT_EQ(s.next_position(), n);
  EXPECT_EQ(s.cache().entries(), static_cast<size_t>(n) * L * H);

  // Independent: run the replay prompt by hand and recompute every score in float64.
  std::vector<Token> base = tok.encode("x", false, false), xnl = tok.encode("x\n", false, false);
  std::vector<Token> replay = tok.encode("\n\nRepeat the previous context exactly.", false, false);
  replay.insert(replay.end(), xnl.begin() + base.size(), xnl.end());
  replay.insert(replay.end(), ctx.begin() + 1, ctx.end());  // the BOS is not replayed
  const int R = static_cast<int>(replay.size());
  Session r(m, exact_f32());
  r.forward(ctx);
  ObservationNeeds needs;
  needs.window = R;
  needs.hidden_states = true;
  Observation obs;
  run_observed(r, replay, needs, obs);
  ASSERT_EQ(obs.n_window(), R);
  for (int l = 0; l < L; ++l) {
    const TensorInfo& wt = m.file().tensor(fmt::format("blk.{}.attn_output.weight", l));
    std::vector<float> wo = m.file().tensor_f32(wt);  // [n_embd][n_head * head_dim]
    const int dq = hp.n_head * hd;
    std::vector<double> hnorm(R);
    for (int t = 0; t < R; ++t) {
      const float* x = obs.hidden[l].data() + static_cast<size_t>(t) * d;
      double ms = 0;
      for (int c = 0; c < d; ++c) ms += double(x[c]) * x[c];
      const double rs = 1.0 / std::sqrt(ms / d + hp.rms_eps);
      double nn = 0;
      for (int c = 0; c < d; ++c) {
        const double y = x[c] * rs * m.layer(l).attn_norm[c];
        nn += y * y;
      }
      hnorm[t] = std::sqrt(nn);
    }
    for (int h = 0; h < H; ++h) {
      const Segment& seg = r.cache().seg(l, h);
      ASSERT_EQ(seg.size(), static_cast<size_t>(n + R));
      std::vector<std::vector<float>> keys(n + R, std::vector<float>(hd)), vals(n + R, std::vector<float>(hd));
      for (int j = 0; j < n + R; ++j) seg.key(j, keys[j].data()), seg.value(j, vals[j].data());
      for (int j = 0; j < n; ++j) {
        double want = 0;
        for (int g = 0; g < G; ++g) {
          const int qh = h * G + g;
          double wv = 0;
          for (int row = 0; row < d; ++row) {
            double acc = 0;
            for (int c = 0; c < hd; ++c) acc += double(wo[static_cast<size_t>(row) * dq + qh * hd + c]) * vals[j][c];
            wv += acc * acc;
          }
          wv = std::sqrt(wv);
          for (int t = 0; t < R; ++t) {
            // First chunk: no separate sinks; the chunk is the whole context, then the replay causally.
            const float* qv = obs.queries[l].data() + (static_cast<size_t>(qh) * R + t) * hd;
            std::vector<double> lg;
            double mx = -1e300;
            for (int e = 0; e < n + t + 1; ++e) {
              double dd = 0;
              for (int c = 0; c < hd; ++c) dd += double(qv[c]) * keys[e][c];
              lg.push_back(dd / std::sqrt(double(hd)));
              mx = std::max(mx, lg.back());
            }
            double z = 0;
            for (double x : lg) z += std::exp(x - mx);
            want = std::max(want, std::exp(lg[j] - mx) / z * wv / hnorm[t]);
          }
        }
        ASSERT_NEAR(got[l][h][j], want, 2e-4 * want + 1e-9) << "layer " << l << " head " << h << " entry " << j;
      }
    }
  }
}

// A chunk of a chunked prefill is replayed as KVzip's own later chunks are: the instruction quotes
// the previous chunk's last prev_tokens tokens. Its scores are then those of the second chunk of one
// replay over both, bit for bit; before, the chunk was replayed as a first chunk ("Repeat the
// previous context exactly." with no quote).
TEST(KVzipReplay, ALaterPrefillChunkQuotesTheChunkBefore) {
  const HParams& hp = model().hparams();
  const std::vector<Token> ctx = story_tokens();
  const int n = static_cast<int>(ctx.size()), c = (n + 1) / 2;
  ASSERT_GE(n - c, 16);
  KVzipOptions ko;
  ko.chunk = c;  // the one replay's chunks are [0, c) and [c, n): the prefill is split the same way
  const std::vector<Token> a(ctx.begin(), ctx.begin() + c), b(ctx.begin() + c, ctx.end());
  Session s(model(), exact_f32());
  s.forward(a);  // two forward calls, as the press's session below runs them
  s.forward(b);
  const Scores whole = kvzip_replay_scores(s, ctx, 0, ko);
  const Scores quoted = kvzip_replay_scores(s, b, c, ko, a);
  const Scores unquoted = kvzip_replay_scores(s, b, c, ko);
  bool differs = false;
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h)
      for (int i = 0; i < n; ++i) {
        if (i < c) {
          EXPECT_TRUE(std::isnan(quoted[l][h][i]));
          continue;
        }
        ASSERT_EQ(quoted[l][h][i], whole[l][h][i]) << l << "," << h << "," << i;
        differs |= unquoted[l][h][i] != whole[l][h][i];
      }
  EXPECT_TRUE(differs) << "the quote should change the replay";

  // The press quotes the previous step's tail itself: two observed prefill steps score the second
  // chunk as the one replay does.
  auto press = make_press_impl("kvzip:plus=1,chunk=" + std::to_string(c), 0.5);  // KVzipOptions: KVzip+
  press->reset();
  Session t(model(), exact_f32());
  Observation obs;
  obs.runner = &t;
  t.forward(a);
  obs.tokens = a;
  for (int i = 0; i < c; ++i) obs.token_positions.push_back(i);
  press->observe(t.cache(), model(), obs);
  t.forward(b);
  obs.tokens = b;
  obs.token_positions.clear();
  for (int i = c; i < n; ++i) obs.token_positions.push_back(i);
  press->observe(t.cache(), model(), obs);
  auto* scorer = press->scorer();
  ASSERT_NE(scorer, nullptr);
  const Scores stored = scorer->score_all(t.cache(), model(), obs, Target{0.5, size_t(n)});
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h)
      for (int i = c; i < n; ++i) ASSERT_EQ(stored[l][h][i], whole[l][h][i]) << l << "," << h << "," << i;
}

TEST(KVzipReplay, PressKeepsGlobalTopKAndDiscardsTheReplay) {
  const HParams& hp = model().hparams();
  std::vector<Token> ctx = story_tokens();
  const int n = static_cast<int>(ctx.size());
  auto press = make_press_impl("kvzip:chunk=16", 0.5);
  Session s(model(), exact_f32());
  press->reset();
  prefill_and_compress(s, *press, ctx, 0);
  EXPECT_EQ(s.next_position(), n);
  EXPECT_EQ(s.cache().entries(), static_cast<size_t>(hp.n_layer) * hp.n_head_kv * (n / 2));
  bool uneven = false;
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h) {
      const auto& pos = s.cache().seg(l, h).positions();
      ASSERT_GE(pos.size(), 4u);
      for (int i = 0; i < 4; ++i) EXPECT_EQ(pos[i], i);  // sinks kept
      EXPECT_LT(pos.back(), n);                            // no replay entry survives
      uneven |= pos.size() != static_cast<size_t>(n / 2);
    }
  EXPECT_TRUE(uneven) << "one global top-k should give the segments different sizes";
  std::vector<float> lg = s.forward({42});
  for (float x : lg) ASSERT_TRUE(std::isfinite(x));
  // Ratio 0 is bit-identical to no press (and runs no replay).
  auto none = make_press_impl("none", 0.0), zero = make_press_impl("kvzip", 0.0);
  auto a = run_press(*none, ctx, 2), b = run_press(*zero, ctx, 2);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]);
}

TEST(KVzipReplay, AContextWithoutRoomForTheReplayIsRefusedAtTheFirstChunk) {
  // Regression: a chunked prefill whose context left fewer positions after it than the replay of
  // its last chunk needs ran every chunk and failed at the last one (minutes at 131K tokens).
  const std::vector<Token> ctx = story_tokens();
  const int n = static_cast<int>(ctx.size());
  KVzipOptions ko;
  ko.prev_tokens = 8;
  const int need = kvzip_min_replay_positions(model().tokenizer(), ko);
  // The figure is the replay's own limit: one position fewer and the replay itself throws.
  for (int room : {need - 1, need}) {
    Session s(model(), exact_f32(n + room));
    s.forward(ctx);
    if (room < need)
      EXPECT_THROW(kvzip_replay_scores(s, ctx, 0, ko), Error);
    else
      EXPECT_NO_THROW(kvzip_replay_scores(s, ctx, 0, ko));
  }
  RequestOptions ro;
  ro.chunk_size = 32;
  ro.n_predict = 1;
  ro.sampling.temp = 0.0f;
  auto press = make_press_impl("kvzip:budget=24,chunk=16", 0.0);
  ro.session = exact_f32(n + need);
  {
    Request fits(model(), *press, ro);
    fits.set_prompt_tokens(ctx);
    EXPECT_NO_THROW(fits.prefill());
  }
  ro.session = exact_f32(n + need - 1);
  Request short_ctx(model(), *press, ro);
  short_ctx.set_prompt_tokens(ctx);
  try {
    short_ctx.prefill_step();
    ADD_FAILURE() << "the first chunk ran without the replay's room being checked";
  } catch (const Error& e) {
    const std::string want = fmt::format("context ends at position {} and the context size n_ctx is {}; raise n_ctx "
                                         "(-c) to at least {}", n, n + need - 1, n + need);
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- KVzap

TEST(KVzapThreshold, RidgeAndMLPRecoverAKnownLinearTarget) {
  const int n = 3000, d = 12, k = 3;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> Wt(k * d), bt = {0.5f, -1.0f, 2.0f}, X(n * d), Y(n * k);
  for (float& w : Wt) w = nd(rng);
  for (float& x : X) x = nd(rng);
  for (int t = 0; t < n; ++t)
    for (int j = 0; j < k; ++j) {
      double y = bt[j];
      for (int i = 0; i < d; ++i) y += Wt[j * d + i] * X[t * d + i];
      Y[t * k + j] = static_cast<float>(y + 0.01 * nd(rng));
    }
  std::vector<float> W, b;
  ridge_fit(X.data(), Y.data(), n, d, k, 1e-3, W, b);
  for (int i = 0; i < k * d; ++i) EXPECT_NEAR(W[i], Wt[i], 2e-3);
  for (int j = 0; j < k; ++j) EXPECT_NEAR(b[j], bt[j], 2e-3);

  const int n_train = 2500;
  MLPTrainOptions mo;
  mo.hidden = 64;
  mo.epochs = 40;
  mo.batch = 128;
  mo.lr = 5e-3;
  KVzapSurrogate s;
  s.kind = KVzapSurrogate::Kind::MLP;
  s.n_layer = 1;
  s.input_dim = d;
  s.output_dim = k;
  s.hidden_dim = mo.hidden;
  s.w1.resize(1), s.b1.resize(1), s.w2.resize(1), s.b2.resize(1);
  mlp_fit(X.data(), Y.data(), n_train, d, k, mo, s.w1[0], s.b1[0], s.w2[0], s.b2[0]);
  std::vector<float> pred((n - n_train) * k);
  s.predict(0, X.data() + n_train * d, n - n_train, pred.data());
  const double r = pearson(pred.data(), Y.data() + n_train * k, pred.size());
  EXPECT_GT(r, 0.99);
  double mse = 0;
  for (size_t i = 0; i < pred.size(); ++i) mse += std::pow(pred[i] - Y[n_train * k + i], 2);
  EXPECT_LT(mse / pred.size(), 0.05);

  // The file round trip predicts the same numbers.
  const std::string path = temp_path("mlp.gguf");
  s.save(path, "synthetic");
  KVzapSurrogate back = KVzapSurrogate::load(path);
  std::vector<float> pred2(pred.size());
  back.predict(0, X.data() + n_train * d, n - n_train, pred2.data());
  EXPECT_EQ(pred, pred2);
  std::remove(path.c_str());

  const float a[] = {1, 2, 3, 4}, bb[] = {2, 4, 6, 8}, c[] = {4, 3, 2, 1};
  EXPECT_NEAR(pearson(a, bb, 4), 1.0, 1e-12);
  EXPECT_NEAR(pearson(a, c, 4), -1.0, 1e-12);
}

TEST(KVzapThreshold, ThresholdPressScoresAtCreationInPrefillAndDecode) {
  const HParams& hp = model().hparams();
  std::vector<Token> ctx = story_tokens();
  const int n = static_cast<int>(ctx.size());
  auto make = [&](float bias) {
    KVzapSurrogate s;
    s.kind = KVzapSurrogate::Kind::Linear;
    s.n_layer = hp.n_layer;
    s.input_dim = hp.n_embd;
    s.output_dim = hp.n_head_kv;
    for (int l = 0; l < hp.n_layer; ++l) {
      s.w1.emplace_back(static_cast<size_t>(hp.n_head_kv) * hp.n_embd, 0.0f);
      s.b1.emplace_back(hp.n_head_kv, bias);
    }
    const std::string path = temp_path(fmt::format("lin{}.gguf", bias));
    s.save(path, "stories260K");
    return path;
  };
  const std::string low = make(-10.0f), high = make(0.0f);
  // Every prediction under tau: only the sliding window of 8 remains, in prefill and decode.
  auto p = make_press_impl(fmt::format("kvzap:surrogate={},threshold=-4,window=8", low), 0.0);
  Session s(model(), exact_f32());
  p->reset();
  prefill_and_compress(s, *p, ctx, 0);
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h) {
      const auto& pos = s.cache().seg(l, h).positions();
      ASSERT_EQ(pos.size(), 8u);
      EXPECT_EQ(pos.front(), n - 8);
    }
  for (int i = 0; i < 3; ++i) {
    Observation obs;
    run_observed(s, {42}, p->decode_needs(), obs);
    p->after_decode(s.cache(), model(), obs);
    EXPECT_EQ(s.cache().seg(0, 0).size(), 8u);
  }
  // Every prediction above tau: nothing leaves.
  auto q = make_press_impl(fmt::format("kvzap:surrogate={},threshold=-4,window=8", high), 0.0);
  Session s2(model(), exact_f32());
  q->reset();
  prefill_and_compress(s2, *q, ctx, 0);
  EXPECT_EQ(s2.cache().entries(), static_cast<size_t>(n) * hp.n_layer * hp.n_head_kv);
  // A surrogate for another model is refused with the file named.
  KVzapSurrogate bad = KVzapSurrogate::load(low);
  bad.input_dim = 7;
  EXPECT_THROW(bad.check(hp, low), Error);
  std::remove(low.c_str());
  std::remove(high.c_str());
  EXPECT_THROW(make_press_impl("kvzap", 0.0), Error);
  EXPECT_THROW(make_press_impl("kvzap:surrogate=/nonexistent/kvzap.gguf", 0.0), Error);
}

TEST(KVzapThreshold, TrainingDataComeFromKVzipScores) {
  std::vector<Token> ctx = story_tokens();
  KVzipOptions ko;
  KVzapData data = collect_kvzap_data(model(), {ctx, ctx}, 10, 1, ko);
  const HParams& hp = model().hparams();
  ASSERT_EQ(data.rows(), 20u);
  ASSERT_EQ(data.X.size(), static_cast<size_t>(hp.n_layer));
  EXPECT_EQ(data.X[0].size(), 20u * hp.n_embd);
  EXPECT_EQ(data.Y[0].size(), 20u * hp.n_head_kv);
  for (const auto& y : data.Y)
    for (float v : y) {
      EXPECT_TRUE(std::isfinite(v));
      EXPECT_LE(v, std::log(1e6));
    }
}

// ---------------------------------------------------------------- DuoAttention

TEST(DuoAttentionHeads, AllRetrievalHeadsEqualNoPress) {
  const HParams& hp = model().hparams();
  DuoLabels labels;
  labels.sink = 2;
  labels.recent = 4;
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(0, 1);
  labels.score.assign(hp.n_layer, std::vector<float>(hp.n_head_kv));
  for (auto& row : labels.score)
    for (float& x : row) x = u(rng);
  const std::string path = temp_path("duo.gguf");
  labels.save(path);
  DuoLabels back = DuoLabels::load(path);
  EXPECT_EQ(back.score, labels.score);
  EXPECT_EQ(back.sink, 2);
  EXPECT_EQ(back.recent, 4);

  std::vector<Token> ctx = story_tokens();
  auto none = make_press_impl("none", 0.0);
  auto duo0 = make_press_impl(fmt::format("duo_attention:labels={},head_ratio=0", path), 0.0);
  auto a = run_press(*none, ctx, 6), b = run_press(*duo0, ctx, 6);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "step " << i;

  // All streaming: every head keeps its 2 sinks and its 4 newest entries, in decode too.
  auto duo1 = make_press_impl(fmt::format("duo_attention:labels={},head_ratio=1", path), 0.0);
  Session s(model(), exact_f32());
  duo1->reset();
  prefill_and_compress(s, *duo1, ctx, 0);
  const int n = static_cast<int>(ctx.size());
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h) {
      std::vector<int32_t> want = {0, 1, n - 4, n - 3, n - 2, n - 1};
      EXPECT_EQ(s.cache().seg(l, h).positions(), want);
    }
  Observation none_obs;
  s.forward({42});
  duo1->after_decode(s.cache(), model(), none_obs);
  EXPECT_EQ(s.cache().seg(0, 0).positions().back(), n);
  EXPECT_EQ(s.cache().seg(0, 0).size(), 6u);
  // Half streaming: exactly the lowest-scoring half of the heads.
  auto m = labels.streaming(0.5);
  int count = 0;
  for (auto& row : m)
    for (auto x : row) count += x;
  EXPECT_EQ(count, static_cast<int>(std::lround(0.5 * hp.n_layer * hp.n_head_kv)));
  std::remove(path.c_str());
  EXPECT_THROW(labels.streaming(1.5), Error);
}

TEST(DuoAttentionHeads, CalibrationScoresEveryHead) {
  DuoCalibration cal;
  cal.samples = 1;
  cal.length = 120;
  cal.sink = 4;
  cal.recent = 16;
  cal.window = 8;
  DuoLabels l = duo_calibrate(model(), cal);
  const HParams& hp = model().hparams();
  ASSERT_EQ(l.score.size(), static_cast<size_t>(hp.n_layer));
  float mx = 0;
  for (auto& row : l.score) {
    ASSERT_EQ(row.size(), static_cast<size_t>(hp.n_head_kv));
    for (float x : row) {
      EXPECT_TRUE(std::isfinite(x));
      EXPECT_GE(x, 0.0f);
      mx = std::max(mx, x);
    }
  }
  EXPECT_GT(mx, 0.0f);
  cal.length = 20;
  cal.recent = 200;  // prompts not longer than sink + recent + window
  EXPECT_THROW(duo_calibrate(model(), cal), Error);
}

// ---------------------------------------------------------------- ClusterKV

TEST(ClusterKVSelection, KMeansRecoversSeparatedDirections) {
  const int d = 6, per = 10;
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> x;
  std::vector<int> truth;
  for (int i = 0; i < 3 * per; ++i) {
    const int c = i % 3;  // interleaved, so seeding by position is not the answer
    for (int j = 0; j < d; ++j) x.push_back((j == c ? 3.0f : 0.0f) * (1.0f + 0.3f * (i % 4)) + nd(rng));
    truth.push_back(c);
  }
  std::vector<int> assign;
  std::vector<float> cen;
  kmeans_cosine(x.data(), 3 * per, d, 3, 20, assign, cen);
  ASSERT_EQ(cen.size(), 3u * d);
  for (int i = 0; i < 3 * per; ++i)
    for (int j = 0; j < 3 * per; ++j) EXPECT_EQ(truth[i] == truth[j], assign[i] == assign[j]);
}

TEST(ClusterKVSelection, BudgetCoveringTheSequenceIsExactlyFullAttention) {
  std::vector<Token> ctx = story_tokens();
  auto none = make_press_impl("none", 0.0);
  auto ckv = make_press_impl("clusterkv:budget=100000,sink=4,full_layers=0", 0.0);
  auto a = run_press(*none, ctx, 6), b = run_press(*ckv, ctx, 6);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "step " << i;
}

TEST(ClusterKVSelection, SmallBudgetAttendsToWholeClustersAndEvictsNothing) {
  const HParams& hp = model().hparams();
  std::vector<Token> ctx = story_tokens();
  const int n = static_cast<int>(ctx.size());
  // clusterkv:budget=16,sink=4,clusters=5,full_layers=1 (iters at its default, 20).
  auto p = std::make_unique<ClusterKVPress>(0.0, 16, 4, 5, 20, 1);
  ClusterKVPress* ckv = p.get();
  EXPECT_EQ(p->describe(), make_press_impl("clusterkv:budget=16,sink=4,clusters=5,full_layers=1", 0.0)->describe());
  Session s(model(), exact_f32());
  p->reset();
  std::vector<float> lg = prefill_and_compress(s, *p, ctx, 0);
  EXPECT_EQ(s.cache().entries(), static_cast<size_t>(n) * hp.n_layer * hp.n_head_kv);
  for (int i = 0; i < 4; ++i) {
    Observation obs;
    lg = run_observed(s, {argmax(lg.data(), lg.size())}, p->decode_needs(), obs);
    p->after_decode(s.cache(), model(), obs);
    for (float x : lg) ASSERT_TRUE(std::isfinite(x));
  }
  EXPECT_EQ(s.cache().entries(), static_cast<size_t>(n + 4) * hp.n_layer * hp.n_head_kv);
  EXPECT_GT(ckv->work_saved(), 0.2);
  EXPECT_LT(ckv->work_saved(), 1.0);

  // One selection: per query head (the authors' default), the sinks, the best clusters' entries
  // cut at exactly budget - sinks = 12, then every entry after the context.
  std::vector<float> q(static_cast<size_t>(hp.n_head) * hp.head_dim);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.7 * i);
  std::vector<std::vector<int32_t>> sub(hp.n_head_kv);
  ASSERT_TRUE(ckv->select(2, q.data(), 1, s.cache(), sub));
  ASSERT_EQ(sub.size(), static_cast<size_t>(hp.n_head));
  for (int r = 0; r < hp.n_head; ++r) {
    const auto& v = sub[r];
    const int h = r / hp.n_group();
    ASSERT_TRUE(std::is_sorted(v.begin(), v.end()));
    for (int i = 0; i < 4; ++i) EXPECT_EQ(v[i], i);
    const size_t n_old = s.cache().seg(2, h).size() - 1;
    for (size_t i = n; i < n_old; ++i) EXPECT_TRUE(std::binary_search(v.begin(), v.end(), static_cast<int32_t>(i)));
    EXPECT_EQ(v.size(), 16 + (n_old - n)) << "query head " << r;
  }
  // gqa=mean (the authors' qavg): one list per KV head.
  auto pm = std::make_unique<ClusterKVPress>(0.0, 16, 4, 5, 20, 1, false);  // gqa=mean
  ClusterKVPress* cm = pm.get();
  EXPECT_EQ(pm->describe(), make_press_impl("clusterkv:budget=16,sink=4,clusters=5,full_layers=1,gqa=mean", 0.0)->describe());
  pm->reset();
  pm->apply(s.cache(), model(), Observation{}, Target{});
  std::vector<std::vector<int32_t>> sub2(hp.n_head_kv);
  ASSERT_TRUE(cm->select(2, q.data(), 1, s.cache(), sub2));
  ASSERT_EQ(sub2.size(), static_cast<size_t>(hp.n_head_kv));
  for (const auto& v : sub2) EXPECT_EQ(v.size(), 16u);  // the cache holds the context only (apply after decode)
}

// ClusterKV's selection by the reference rule, recomputed here: per query head, clusters ranked by
// q . centroid (centroids = mean key of each cluster), their members in index order, cut at budget
// - sinks; sinks first.
TEST(ClusterKVSelection, PerQueryHeadSelectionMatchesTheReferenceRule) {
  const HParams& hp = model().hparams();
  std::vector<Token> ctx = story_tokens();
  const int n = static_cast<int>(ctx.size()), sink = 4, budget = 20, k = 6;
  auto p = std::make_unique<ClusterKVPress>(0.0, budget, sink, k, 20, 0);
  ClusterKVPress* ckv = p.get();
  EXPECT_EQ(p->describe(),
            make_press_impl(fmt::format("clusterkv:budget={},sink={},clusters={},full_layers=0", budget, sink, k), 0.0)
                ->describe());
  Session s(model(), exact_f32());
  p->reset();
  prefill_and_compress(s, *p, ctx, 0);
  std::vector<float> q(static_cast<size_t>(hp.n_head) * hp.head_dim);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::cos(1.3 * i);
  // A decode step's own entry is in the cache when select runs.
  std::vector<float> kz(hp.head_dim, 0.0f), vz(hp.head_dim, 0.0f);
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h) s.cache().seg(l, h).append(kz.data(), vz.data(), n);
  std::vector<std::vector<int32_t>> sub;
  const int layer = 1;
  ASSERT_TRUE(ckv->select(layer, q.data(), 1, s.cache(), sub));
  ASSERT_EQ(sub.size(), static_cast<size_t>(hp.n_head));
  for (int r = 0; r < hp.n_head; ++r) {
    const Segment& seg = s.cache().seg(layer, r / hp.n_group());
    std::vector<float> keys(static_cast<size_t>(n - sink) * hp.head_dim);
    seg.keys(sink, n, keys.data());
    std::vector<int> assign;
    std::vector<float> cen;
    kmeans_cosine(keys.data(), n - sink, hp.head_dim, k, 20, assign, cen);
    std::vector<std::pair<double, int>> rank;
    for (int j = 0; j < k; ++j) {
      double dot = 0;
      for (int c = 0; c < hp.head_dim; ++c) dot += double(q[static_cast<size_t>(r) * hp.head_dim + c]) * cen[j * hp.head_dim + c];
      rank.push_back({-dot, j});
    }
    std::stable_sort(rank.begin(), rank.end(), [](auto a, auto b) { return a.first < b.first; });
    std::vector<int32_t> want = {0, 1, 2, 3};
    for (auto [negdot, j] : rank)
      for (int i = 0; i < n - sink && static_cast<int>(want.size()) < budget; ++i)
        if (assign[i] == j) want.push_back(sink + i);
    std::sort(want.begin(), want.end());
    EXPECT_EQ(sub[r], want) << "query head " << r;
  }
}

// ---------------------------------------------------------------- CLI

TEST(AttentionStatsAndKVzapCli, AttentionStatsPrintsTableAndPlot) {
  const std::string plot = temp_path("lmba.svg");
  std::string out;
  int rc = run_cli(fmt::format("attention-stats -m {} -p \"{}\" --window 8 --plot {}", kModel, kStory, plot), &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("LMBA"), std::string::npos) << out;
  EXPECT_NE(out.find("LMBO"), std::string::npos) << out;
  EXPECT_TRUE(std::filesystem::exists(plot)) << out;
  std::remove(plot.c_str());
  std::remove((plot + ".gp").c_str());
  out.clear();
  EXPECT_EQ(run_cli(fmt::format("attention-stats -m {} -p hi --window 50", kModel), &out), 1) << out;
  EXPECT_NE(out.find("window 50"), std::string::npos) << out;
}

TEST(AttentionStatsAndKVzapCli, KVzapTrainReportsCorrelationRatioAndCost) {
  const std::string corpus = temp_path("corpus.txt"), out_path = temp_path("kvzap.gguf");
  {
    std::ofstream f(corpus);
    for (int i = 0; i < 6; ++i)
      f << kStory << " Tom said hello to the cat. The sun was warm and the birds sang in the blue sky. ";
  }
  std::string out;
  int rc = run_cli(fmt::format("kvzap-train -m {} --corpus {} --out {} --doc-tokens 48 --per-doc 24 --max-docs 8 "
                               "--epochs 3 --hidden 32 --test-fraction 0.25",
                               kModel, corpus, out_path),
                   &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("mean"), std::string::npos) << out;
  EXPECT_NE(out.find("compression ratio"), std::string::npos) << out;
  EXPECT_NE(out.find("forward pass"), std::string::npos) << out;
  KVzapSurrogate s = KVzapSurrogate::load(out_path);
  EXPECT_EQ(s.kind, KVzapSurrogate::Kind::MLP);
  s.check(model().hparams(), out_path);
  std::remove(corpus.c_str());
  std::remove(out_path.c_str());
}

TEST(ReplayPressSpecs, SpecsParseBackAndBadParametersAreNamed) {
  DuoLabels labels;
  labels.score.assign(model().hparams().n_layer, std::vector<float>(model().hparams().n_head_kv, 0.5f));
  const std::string duo = temp_path("duo_rt.gguf");
  labels.save(duo);
  KVzapSurrogate s;
  s.n_layer = 1;
  s.input_dim = 2;
  s.output_dim = 1;
  s.w1 = {{0.0f, 0.0f}};
  s.b1 = {{0.0f}};
  const std::string zap = temp_path("zap_rt.gguf");
  s.save(zap, "x");
  for (const std::string& spec : {std::string("kvzip:chunk=512,n_sink=2"), "kvzap:surrogate=" + zap + ",threshold=-3",
                                 "duo_attention:labels=" + duo + ",head_ratio=0.25", std::string("clusterkv:budget=64")}) {
    auto p = make_press_impl(spec, 0.5);
    auto q = make_press_impl(p->describe(), 0.0);
    EXPECT_EQ(p->describe(), q->describe()) << spec;
  }
  for (const char* bad : {"kvzip:chunk=4", "kvzip:plus=2", "clusterkv:iters=0", "clusterkv:budget=-1",
                          "duo_attention:head_ratio=1.5", "kvzap:window=-1"}) {
    try {
      make_press_impl(bad, 0.0);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      std::string what = e.what(), key = std::string(bad).substr(std::string(bad).find(':') + 1);
      key = key.substr(0, key.find('='));
      EXPECT_NE(what.find(key), std::string::npos) << what;
    }
  }
  std::remove(duo.c_str());
  std::remove(zap.c_str());
}
