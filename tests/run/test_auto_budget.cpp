// Auto-budget (RequestOptions::auto_budget): the press's ratio chosen per request for a byte budget
// and/or a KL target. The expected values are re-computed here on plain requests at fixed ratios
// (the cache bytes the runner reports, and the KL in float64 from the logits of a bare session),
// never taken from the auto-budget code itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>

#include "kvslim/request.h"
#include "press/authoring.h"
#include "press/knobs.h"
#include "support/press_util.h"

using namespace kvslim;
using press_test::bundled_model;
using press_test::same_cache;
using press_test::story_tokens;

namespace {

RequestOptions opts() {
  RequestOptions o;
  o.n_predict = 0;
  o.sampling.temp = 0;
  o.session.n_ctx = 1024;
  return o;
}

/// Float64 log-softmax KL(P || Q) of two logit rows, written out here as the independent reference.
double kl64(const float* p, const float* q, size_t n) {
  auto logz = [n](const float* x) {
    double m = -1e300;
    for (size_t i = 0; i < n; ++i) m = std::max(m, double(x[i]));
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += std::exp(double(x[i]) - m);
    return m + std::log(s);
  };
  const double lp = logz(p), lq = logz(q);
  double kl = 0;
  for (size_t i = 0; i < n; ++i) {
    const double a = double(p[i]) - lp, b = double(q[i]) - lq;
    kl += std::exp(a) * (a - b);
  }
  return kl;
}

/// Logits [question.size()][n_vocab] of the question run teacher-forced after `context` prefilled
/// with `spec` at `ratio`.
std::vector<float> question_logits(const std::string& spec, double ratio, const std::vector<Token>& context,
                                   const std::vector<Token>& question) {
  Request req(bundled_model(), make_press_impl(spec, ratio), opts());
  req.set_prompt_tokens(context);
  req.prefill();
  return req.session().forward(question, true);
}

/// Mean float64 KL(full || comp) over the n_rows logit rows of two [n_rows][n_vocab] blocks.
double mean_kl(const std::vector<float>& full, const std::vector<float>& comp, size_t n_rows) {
  const size_t v = full.size() / n_rows;
  double sum = 0;
  for (size_t i = 0; i < n_rows; ++i) sum += kl64(full.data() + i * v, comp.data() + i * v, v);
  return sum / n_rows;
}

/// Mean KL over the question's positions between the full cache and `spec` at `ratio`: each request
/// prefills the context (compressed) and its session then runs the question teacher-forced.
double question_kl(const std::string& spec, double ratio, const std::vector<Token>& context,
                   const std::vector<Token>& question) {
  return mean_kl(question_logits("none", 0.0, context, question), question_logits(spec, ratio, context, question),
                 question.size());
}

size_t bytes_at(const std::string& spec, double ratio, const std::vector<Token>& context) {
  Request req(bundled_model(), make_press_impl(spec, ratio), opts());
  req.set_prompt_tokens(context);
  req.prefill();
  return req.stats().kv_bytes;
}

/// Logits of `question` after `ctx` in an f16 cache whose segments are turned into latent codes by
/// hand (per-request PCA bases of each segment's own keys / values at rank kr[l] / vr[l], energy
/// 0.99, per-channel scales, kb[l] / vb[l] bits for layer l: the latent press's rule). `bytes`: the
/// compressed context's; `out`: the cache after the question (as a request leaves it).
std::vector<float> latent_by_hand(const std::vector<Token>& ctx, const std::vector<Token>& question,
                                  const std::vector<int>& kb, const std::vector<int>& vb, const std::vector<int>& kr,
                                  const std::vector<int>& vr, std::optional<KVCache>* out, size_t* bytes) {
  Request r(bundled_model(), make_press_impl("none", 0.0), opts());
  r.set_prompt_tokens(ctx);
  r.prefill();
  KVCache& c = r.session().cache();
  const int hd = c.head_dim();
  for (int l = 0; l < c.n_layer(); ++l)
    for (int h = 0; h < c.n_head_kv(); ++h) {
      Segment& seg = c.seg(l, h);
      const size_t n = seg.size();
      std::vector<float> ks(n * hd), vs(n * hd);
      seg.keys(0, n, ks.data());
      seg.values(0, n, vs.data());
      seg.to_latent(pca_basis(ks.data(), n, hd, kr[l], 0.99), kb[l], pca_basis(vs.data(), n, hd, vr[l], 0.99), vb[l],
                    LatentScales::Channel);
    }
  if (bytes) *bytes = c.bytes();
  std::vector<float> logits = r.session().forward(question, true);  // appends the question's entries
  if (out) out->emplace(c);
  return logits;
}

}  // namespace

TEST(AutoBudget, ByteBudgetChoosesTheSmallestRatioThatFitsAndLeavesThatPressesCache) {
  const std::vector<Token> ctx = story_tokens(200);
  const size_t full = bytes_at("none", 0.0, ctx);
  const size_t budget = full * 2 / 5;
  RequestOptions o = opts();
  o.auto_budget.kv_budget_bytes = budget;
  Request req(bundled_model(), make_press_impl("knorm", 0.0), o);
  req.set_prompt_tokens(ctx);
  req.prefill();
  const AutoBudgetReport& ab = req.stats().auto_budget;
  ASSERT_TRUE(ab.used);
  EXPECT_TRUE(ab.budget_met);
  EXPECT_LE(req.stats().kv_bytes, budget);
  EXPECT_GT(ab.ratio, 0.5);  // 2/5 of the bytes cannot be had by removing less than 3/5 of the entries
  // Minimal: the ratio one tolerance lower does not fit.
  EXPECT_GT(bytes_at("knorm", ab.ratio - o.auto_budget.tolerance, ctx), budget);
  // The cache is exactly the plain press's at the chosen ratio (trials leave nothing behind).
  Request plain(bundled_model(), make_press_impl("knorm", ab.ratio), opts());
  plain.set_prompt_tokens(ctx);
  plain.prefill();
  EXPECT_TRUE(same_cache(req.cache(), plain.cache()));
  EXPECT_EQ(req.logits(), plain.logits());
  EXPECT_GT(ab.trials, 2);
}

TEST(AutoBudget, KlTargetOnTheQuestionChoosesTheBoundaryRatio) {
  const std::vector<Token> ctx = story_tokens(240);
  const std::vector<Token> question = bundled_model().tokenizer().encode(" Lily and Tom played with the ball", false, false);
  const double target = 0.02;
  RequestOptions o = opts();
  o.auto_budget.target_kl = target;
  Request req(bundled_model(), make_press_impl("knorm", 0.0), o);
  req.set_prompt_tokens(ctx, question);
  req.prefill();
  const AutoBudgetReport& ab = req.stats().auto_budget;
  ASSERT_TRUE(ab.used);
  EXPECT_TRUE(ab.probe_is_question);
  EXPECT_EQ(ab.probe_tokens, static_cast<int>(question.size()));
  ASSERT_TRUE(ab.target_met);
  // The KL it reports is the KL of the plain press at that ratio, re-computed independently.
  const double kl = question_kl("knorm", ab.ratio, ctx, question);
  EXPECT_NEAR(ab.probe_kl, kl, 1e-6 + 1e-4 * kl);
  EXPECT_LE(kl, target);
  // The target binds: a tolerance more compression exceeds it, and the chosen ratio is not trivial.
  ASSERT_LT(ab.ratio, o.auto_budget.max_ratio);
  EXPECT_GT(question_kl("knorm", ab.ratio + o.auto_budget.tolerance, ctx, question), target);
  EXPECT_GT(ab.ratio, 0.0);
  // After the probe trials the question is appended once, at its place.
  EXPECT_EQ(req.position(), static_cast<int32_t>(ctx.size() + question.size()));
}

TEST(AutoBudget, WithoutAQuestionTheContextTailIsHeldOutAndKeptUncompressed) {
  const std::vector<Token> ctx = story_tokens(200);
  RequestOptions o = opts();
  o.auto_budget.target_kl = 0.05;
  o.auto_budget.probe_tokens = 16;
  Request req(bundled_model(), make_press_impl("knorm", 0.0), o);
  req.set_prompt_tokens(ctx);
  req.prefill();
  const AutoBudgetReport& ab = req.stats().auto_budget;
  EXPECT_FALSE(ab.probe_is_question);
  EXPECT_EQ(ab.probe_tokens, 16);
  // Equivalent plain request: the first 184 tokens compressed at the chosen ratio, the last 16 as a question.
  const std::vector<Token> head(ctx.begin(), ctx.end() - 16), tail(ctx.end() - 16, ctx.end());
  Request plain(bundled_model(), make_press_impl("knorm", ab.ratio), opts());
  plain.set_prompt_tokens(head, tail);
  plain.prefill();
  EXPECT_TRUE(same_cache(req.cache(), plain.cache()));
  EXPECT_EQ(req.position(), static_cast<int32_t>(ctx.size()));
  ASSERT_EQ(req.logits().size(), plain.logits().size());
  for (size_t i = 0; i < req.logits().size(); ++i) ASSERT_NEAR(req.logits()[i], plain.logits()[i], 1e-4) << i;
  // Measured figures count the held-out tokens as the context they are.
  EXPECT_EQ(req.stats().entries_total, ctx.size() * req.cache().n_layer() * req.cache().n_head_kv());
  EXPECT_EQ(req.stats().entries_kept, req.cache().entries());
}

TEST(AutoBudget, BudgetWinsOverTheTargetAndAnImpossibleBudgetIsReported) {
  const std::vector<Token> ctx = story_tokens(160);
  RequestOptions o = opts();
  o.auto_budget.kv_budget_bytes = 1;  // nothing fits
  Request req(bundled_model(), make_press_impl("knorm", 0.0), o);
  req.set_prompt_tokens(ctx);
  req.prefill();
  EXPECT_FALSE(req.stats().auto_budget.budget_met);
  EXPECT_DOUBLE_EQ(req.stats().auto_budget.ratio, o.auto_budget.max_ratio);

  // The held-out probe (no question) stays uncompressed and counts against the budget: 8 of 160
  // tokens, within a budget of a quarter of the full cache.
  o.auto_budget.kv_budget_bytes = bytes_at("none", 0.0, ctx) / 4;
  o.auto_budget.probe_tokens = 8;
  o.auto_budget.target_kl = 1e-9;  // unreachable once 70% is removed
  Request both(bundled_model(), make_press_impl("knorm", 0.0), o);
  both.set_prompt_tokens(ctx);
  both.prefill();
  EXPECT_TRUE(both.stats().auto_budget.budget_met);
  EXPECT_FALSE(both.stats().auto_budget.target_met);
  EXPECT_LE(both.stats().kv_bytes, o.auto_budget.kv_budget_bytes);
}

TEST(AutoBudget, CompositionSetsTheFirstStageWithARatio) {
  std::unique_ptr<PressImpl> p = make_press_impl("knorm+snapkv", 0.5);
  p->set_ratio(0.2);
  EXPECT_NEAR(p->ratio(), 1 - 0.8 * 0.5, 1e-12);
  EXPECT_THROW(make_press_impl("none", 0.0)->set_ratio(0.3), Error);
}

TEST(AutoBudget, InvalidUsesAreErrors) {
  const std::vector<Token> ctx = story_tokens(64);
  auto expect_error = [&](RequestOptions o, const std::string& spec, const std::string& part) {
    Request req(bundled_model(), make_press_impl(spec, 0.0), o);
    req.set_prompt_tokens(ctx);
    try {
      req.prefill();
      ADD_FAILURE() << "no error for " << part;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  RequestOptions o = opts();
  o.auto_budget.target_kl = 0.01;
  expect_error(o, "none", "no compression ratio");
  RequestOptions chunked = o;
  chunked.chunk_size = 16;
  expect_error(chunked, "knorm", "chunk");
  RequestOptions bad = opts();
  bad.auto_budget.target_kl = std::nan("");
  bad.auto_budget.kv_budget_bytes = 100;
  expect_error(bad, "knorm", "target KL nan");
  RequestOptions tiny = o;
  Request one(bundled_model(), make_press_impl("knorm", 0.0), tiny);
  one.set_prompt_tokens({ctx[0]});
  EXPECT_THROW(one.prefill(), Error);
}

// The second axis: the latent stage's code bits listed as candidates (k_bits=8/4, v_bits=8/4/2).
// Each (key, value) pair gets its ratio; the pair and ratio with the fewest bytes within the
// target stay. Checked against plain presses with the chosen bits written out, and every other
// pair: any of its caches smaller than the chosen one (one tolerance of ratio beyond the smallest
// ratio that is) exceeds the target, KL recomputed in float64.
TEST(AutoBudget, LatentBitsAreChosenWithTheRatioForTheFewestBytesWithinTheTarget) {
  const std::vector<Token> ctx = story_tokens(240);
  const std::vector<Token> question = bundled_model().tokenizer().encode(" Lily and Tom played with the ball", false, false);
  const double target = 0.03;
  const std::vector<int> kbits = {8, 4}, vbits = {8, 4, 2};
  auto spec_of = [](int kb, int vb) {
    return "knorm+latent:k_rank=8,v_rank=8,k_bits=" + std::to_string(kb) + ",v_bits=" + std::to_string(vb);
  };
  RequestOptions o = opts();
  o.auto_budget.target_kl = target;
  std::unique_ptr<PressImpl> press = make_press_impl("knorm+latent:k_rank=8,v_rank=8,k_bits=8/4,v_bits=8/4/2", 0.0);
  const PressImpl* composed = press.get();
  Request req(bundled_model(), std::move(press), o);
  req.set_prompt_tokens(ctx, question);
  req.prefill();
  const AutoBudgetReport& ab = req.stats().auto_budget;
  ASSERT_TRUE(ab.used);
  ASSERT_TRUE(ab.target_met);
  // The bits as the cache holds them, and as the composition's report names them.
  const int kb = req.cache().seg(0, 0).latent_keys().bits(), vb = req.cache().seg(0, 0).latent_values().bits();
  EXPECT_NE(composed->report().find("keys " + std::to_string(kb) + ", values " + std::to_string(vb)), std::string::npos)
      << composed->report();
  for (int l = 0; l < req.cache().n_layer(); ++l)
    for (int h = 0; h < req.cache().n_head_kv(); ++h) {
      EXPECT_EQ(req.cache().seg(l, h).latent_keys().bits(), kb);
      EXPECT_EQ(req.cache().seg(l, h).latent_values().bits(), vb);
    }
  // The cache is the plain press's with those bits at the chosen ratio, and its KL the plain one's.
  Request plain(bundled_model(), make_press_impl(spec_of(kb, vb), ab.ratio), opts());
  plain.set_prompt_tokens(ctx, question);
  plain.prefill();
  EXPECT_TRUE(same_cache(req.cache(), plain.cache()));
  const size_t chosen = bytes_at(spec_of(kb, vb), ab.ratio, ctx);
  const double kl = question_kl(spec_of(kb, vb), ab.ratio, ctx, question);
  EXPECT_NEAR(ab.probe_kl, kl, 1e-6 + 1e-4 * kl);
  EXPECT_LE(kl, target);
  // Not every pair is as good: the choice is not trivially the cheapest bits (the test would not
  // tell a working search from a fixed pick otherwise).
  EXPECT_FALSE(kb == 4 && vb == 2);
  // Every cheaper cache of another pair exceeds the target: for each pair, the smallest ratio at
  // which its cache is smaller than the chosen one (bisected here on bytes), one tolerance on.
  const double tol = o.auto_budget.tolerance;
  for (int k : kbits)
    for (int v : vbits) {
      if (k == kb && v == vb) continue;
      const std::string s = spec_of(k, v);
      double r = 0.0;
      if (bytes_at(s, 0.0, ctx) >= chosen) {
        double lo = 0.0, hi = o.auto_budget.max_ratio;
        if (bytes_at(s, hi, ctx) >= chosen) continue;  // never smaller
        for (int it = 0; it < 14; ++it) {
          const double mid = 0.5 * (lo + hi);
          (bytes_at(s, mid, ctx) < chosen ? hi : lo) = mid;
        }
        r = hi;
      }
      EXPECT_GT(question_kl(s, std::min(r + tol, o.auto_budget.max_ratio), ctx, question), target)
          << "keys " << k << " values " << v << " at ratio " << r;
    }
}

TEST(AutoBudget, LatentBitCandidatesNeedTheFidelityTargetAndListedValues) {
  const std::vector<Token> ctx = story_tokens(64);
  // Candidates without an auto-budget: the press cannot choose.
  Request no_ab(bundled_model(), make_press_impl("knorm+latent:k_rank=8,v_rank=8,k_bits=8/4,v_bits=8", 0.5), opts());
  no_ab.set_prompt_tokens(ctx);
  try {
    no_ab.prefill();
    ADD_FAILURE() << "candidates compressed without the auto-budget";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("k_bits=8/4"), std::string::npos) << e.what();
  }
  // A byte budget alone cannot compare bit widths.
  RequestOptions o = opts();
  o.auto_budget.kv_budget_bytes = 1000;
  Request budget_only(bundled_model(), make_press_impl("knorm+latent:k_rank=8,v_rank=8,k_bits=8/4,v_bits=8", 0.0), o);
  budget_only.set_prompt_tokens(ctx);
  EXPECT_THROW(budget_only.prefill(), Error);
  // Spec errors name the parameter.
  for (const char* bad : {"latent:k_bits=8/3", "latent:v_bits=8/8", "latent:k_bits=8/", "latent:k_bits=x"}) {
    try {
      make_press_impl(bad, 0.0);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(bad).substr(7, 6)), std::string::npos) << e.what();
    }
  }
  // One value each is the plain press, whatever the auto-budget does.
  EXPECT_EQ(make_press_impl("latent:k_rank=8,v_rank=8,k_bits=8,v_bits=4", 0.0)->describe(),
            "latent:k_rank=8,v_rank=8,energy=0.99,k_bits=8,v_bits=4,scales=channel");
  EXPECT_EQ(make_press_impl("latent:k_rank=8,v_rank=8,k_bits=8/4,v_bits=2", 0.0)->describe(),
            "latent:k_rank=8,v_rank=8,energy=0.99,k_bits=8/4,v_bits=2,scales=channel");
}

// A latent press alone has no ratio: only its bits are chosen. Expected pair computed here from
// plain presses: the fewest bytes among the pairs whose float64 KL is within the target.
TEST(AutoBudget, LatentPressAloneChoosesOnlyItsBits) {
  const std::vector<Token> ctx = story_tokens(200);
  const std::vector<Token> question = bundled_model().tokenizer().encode(" Lily and Tom played with the ball", false, false);
  const double target = 0.01;
  auto spec_of = [](int kb, int vb) {
    return "latent:k_rank=8,v_rank=8,k_bits=" + std::to_string(kb) + ",v_bits=" + std::to_string(vb);
  };
  int want_k = -1, want_v = -1;
  size_t want_bytes = 0;
  double want_kl = 0;
  for (int k : {8, 4})
    for (int v : {8, 4, 2}) {
      const double kl = question_kl(spec_of(k, v), 0.0, ctx, question);
      const size_t b = bytes_at(spec_of(k, v), 0.0, ctx);
      if (kl <= target && (want_k < 0 || b < want_bytes || (b == want_bytes && kl < want_kl))) {
        want_k = k;
        want_v = v;
        want_bytes = b;
        want_kl = kl;
      }
    }
  ASSERT_GE(want_k, 0) << "no pair meets the target: the test needs a looser one";
  RequestOptions o = opts();
  o.auto_budget.target_kl = target;
  Request req(bundled_model(), make_press_impl("latent:k_rank=8,v_rank=8,k_bits=8/4,v_bits=8/4/2", 0.0), o);
  req.set_prompt_tokens(ctx, question);
  req.prefill();
  const AutoBudgetReport& ab = req.stats().auto_budget;
  EXPECT_TRUE(ab.target_met);
  EXPECT_EQ(ab.ratio, 0.0);
  EXPECT_EQ(req.cache().seg(0, 0).latent_keys().bits(), want_k);
  EXPECT_EQ(req.cache().seg(0, 0).latent_values().bits(), want_v);
  EXPECT_EQ(req.stats().kv_bytes, want_bytes);
  EXPECT_NEAR(ab.probe_kl, want_kl, 1e-6 + 1e-4 * want_kl);
}

// Bits per layer (latent:...,per_layer=1): after the best pair for every layer, single layers'
// key or value bits are lowered while the probe KL stays within the target. Every expected figure
// comes from caches built here by hand (the full f16 cache's segments turned into codes in their
// own PCA bases at each layer's bits, as the press's rule says) and from plain presses, with the
// KL in float64.
TEST(AutoBudget, LatentBitsPerLayerLowerSingleLayersWithinTheTarget) {
  const std::vector<Token> ctx = story_tokens(200);
  const std::vector<Token> question = bundled_model().tokenizer().encode(" Lily and Tom played with the ball", false, false);
  const double target = 0.01;
  const std::vector<int> kbits = {8, 4}, vbits = {8, 4, 2};
  auto by_hand = [&](const std::vector<int>& kb, const std::vector<int>& vb, std::optional<KVCache>* out,
                     size_t* bytes) {
    return latent_by_hand(ctx, question, kb, vb, std::vector<int>(kb.size(), 8), std::vector<int>(kb.size(), 8), out,
                          bytes);
  };
  const std::vector<float> ref = question_logits("none", 0.0, ctx, question);
  auto kl_of = [&](const std::vector<float>& q) { return mean_kl(ref, q, question.size()); };

  RequestOptions o = opts();
  o.auto_budget.target_kl = target;
  std::unique_ptr<PressImpl> press = make_press_impl("latent:k_rank=8,v_rank=8,k_bits=8/4,v_bits=8/4/2,per_layer=1", 0.0);
  const PressImpl* latent = press.get();
  Request req(bundled_model(), std::move(press), o);
  req.set_prompt_tokens(ctx, question);
  req.prefill();
  const AutoBudgetReport& ab = req.stats().auto_budget;
  ASSERT_TRUE(ab.target_met);
  EXPECT_EQ(ab.ratio, 0.0);
  const KVCache& got = req.cache();
  const int L = got.n_layer();
  std::vector<int> kb(L), vb(L);
  std::string klist, vlist;
  for (int l = 0; l < L; ++l) {
    kb[l] = got.seg(l, 0).latent_keys().bits();
    vb[l] = got.seg(l, 0).latent_values().bits();
    for (int h = 0; h < got.n_head_kv(); ++h) {
      EXPECT_EQ(got.seg(l, h).latent_keys().bits(), kb[l]);
      EXPECT_EQ(got.seg(l, h).latent_values().bits(), vb[l]);
    }
    klist += (l ? "," : "") + std::to_string(kb[l]);
    vlist += (l ? "," : "") + std::to_string(vb[l]);
  }
  EXPECT_NE(latent->report().find("keys " + klist + ", values " + vlist), std::string::npos) << latent->report();
  // The cache is the hand-built one, to the byte, and its KL the float64 one, within the target.
  std::optional<KVCache> hand;
  size_t hand_bytes = 0;
  const double kl = kl_of(by_hand(kb, vb, &hand, &hand_bytes));
  EXPECT_TRUE(same_cache(got, *hand));
  EXPECT_EQ(req.stats().kv_bytes, hand_bytes);
  EXPECT_NEAR(ab.probe_kl, kl, 1e-6 + 1e-4 * kl);
  EXPECT_LE(kl, target);
  // Fewer bytes than the best single pair for every layer (from plain presses, as above).
  size_t pair_bytes = 0;
  for (int k : kbits)
    for (int v : vbits) {
      const std::string s = "latent:k_rank=8,v_rank=8,k_bits=" + std::to_string(k) + ",v_bits=" + std::to_string(v);
      if (question_kl(s, 0.0, ctx, question) <= target) {
        const size_t b = bytes_at(s, 0.0, ctx);
        if (pair_bytes == 0 || b < pair_bytes) pair_bytes = b;
      }
    }
  ASSERT_GT(pair_bytes, 0u);
  EXPECT_LT(req.stats().kv_bytes, pair_bytes) << "no layer was lowered: the test needs a target that lets one be";
  // Where the search stopped: lowering any one layer's keys or values one more step exceeds the target.
  auto narrower = [](const std::vector<int>& list, int b) {
    int best = -1;
    for (int c : list)
      if (c < b && c > best) best = c;  // the lists hold 8, 4, 2 only
    return best;
  };
  for (int l = 0; l < L; ++l)
    for (int side = 0; side < 2; ++side) {
      std::vector<int> k2 = kb, v2 = vb;
      int& b = side ? v2[l] : k2[l];
      b = narrower(side ? vbits : kbits, b);
      if (b < 0) continue;
      EXPECT_GT(kl_of(by_hand(k2, v2, nullptr, nullptr)), target) << "layer " << l << (side ? " values" : " keys");
    }
}

TEST(AutoBudget, LatentPerLayerNeedsCandidates) {
  try {
    make_press_impl("latent:k_rank=8,v_rank=8,k_bits=8,v_bits=4,per_layer=1", 0.0);
    ADD_FAILURE() << "per_layer=1 without candidates";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("per_layer"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_press_impl("latent:k_bits=8/4,per_layer=2", 0.0), Error);
  EXPECT_EQ(make_press_impl("latent:k_rank=8,v_rank=8,k_bits=8/4,v_bits=2,per_layer=1", 0.0)->describe(),
            "latent:k_rank=8,v_rank=8,energy=0.99,k_bits=8/4,v_bits=2,scales=channel,per_layer=1");
}

// Ranks per layer (k_rank=8/6/4 with per_layer=1, bits fixed): from the largest rank, single
// layers' key or value ranks are lowered while the target holds. Expected figures from caches
// built by hand (per-request PCA bases at each layer's rank) with the KL in float64.
TEST(AutoBudget, LatentRanksPerLayerLowerSingleLayersWithinTheTarget) {
  const std::vector<Token> ctx = story_tokens(200);
  const std::vector<Token> question = bundled_model().tokenizer().encode(" Lily and Tom played with the ball", false, false);
  const double target = 0.01;
  const std::vector<int> ranks = {8, 6, 4};
  const std::vector<float> ref = question_logits("none", 0.0, ctx, question);
  auto kl_of = [&](const std::vector<float>& q) { return mean_kl(ref, q, question.size()); };
  RequestOptions o = opts();
  o.auto_budget.target_kl = target;
  std::unique_ptr<PressImpl> press = make_press_impl("latent:k_rank=8/6/4,v_rank=8/6/4,k_bits=8,v_bits=8,per_layer=1", 0.0);
  const PressImpl* latent = press.get();
  Request req(bundled_model(), std::move(press), o);
  req.set_prompt_tokens(ctx, question);
  req.prefill();
  const AutoBudgetReport& ab = req.stats().auto_budget;
  ASSERT_TRUE(ab.target_met);
  const KVCache& got = req.cache();
  const int L = got.n_layer();
  std::vector<int> kr(L), vr(L), bits8(L, 8);
  std::string klist, vlist;
  for (int l = 0; l < L; ++l) {
    kr[l] = got.seg(l, 0).latent_keys().rank();
    vr[l] = got.seg(l, 0).latent_values().rank();
    for (int h = 0; h < got.n_head_kv(); ++h) {
      EXPECT_EQ(got.seg(l, h).latent_keys().rank(), kr[l]);
      EXPECT_EQ(got.seg(l, h).latent_values().rank(), vr[l]);
      EXPECT_EQ(got.seg(l, h).latent_keys().bits(), 8);
    }
    klist += (l ? "," : "") + std::to_string(kr[l]);
    vlist += (l ? "," : "") + std::to_string(vr[l]);
  }
  EXPECT_NE(latent->report().find("ranks per layer: keys " + klist + ", values " + vlist), std::string::npos)
      << latent->report();
  std::optional<KVCache> hand;
  size_t hand_bytes = 0;
  const double kl = kl_of(latent_by_hand(ctx, question, bits8, bits8, kr, vr, &hand, &hand_bytes));
  EXPECT_TRUE(same_cache(got, *hand));
  EXPECT_EQ(req.stats().kv_bytes, hand_bytes);
  EXPECT_NEAR(ab.probe_kl, kl, 1e-6 + 1e-4 * kl);
  EXPECT_LE(kl, target);
  // Fewer bytes than rank 8 everywhere (the plain press), which is within the target here.
  const std::string plain = "latent:k_rank=8,v_rank=8,k_bits=8,v_bits=8";
  ASSERT_LE(question_kl(plain, 0.0, ctx, question), target);
  EXPECT_LT(req.stats().kv_bytes, bytes_at(plain, 0.0, ctx)) << "no rank was lowered: the test needs another target";
  // Where the search stopped: any one layer's key or value rank one step lower exceeds the target.
  for (int l = 0; l < L; ++l)
    for (int side = 0; side < 2; ++side) {
      std::vector<int> k2 = kr, v2 = vr;
      int& r = side ? v2[l] : k2[l];
      const auto it = std::find(ranks.begin(), ranks.end(), r);
      ASSERT_NE(it, ranks.end());
      if (it + 1 == ranks.end()) continue;
      r = *(it + 1);
      EXPECT_GT(kl_of(latent_by_hand(ctx, question, bits8, bits8, k2, v2, nullptr, nullptr)), target)
          << "layer " << l << (side ? " values" : " keys");
    }
}

TEST(AutoBudget, LatentRankCandidatesNeedPerLayerAndPerRequestBases) {
  for (const char* bad : {"latent:k_rank=8/4", "latent:k_rank=8/0,per_layer=1", "latent:v_rank=8/8,per_layer=1"}) {
    try {
      make_press_impl(bad, 0.0);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(make_press_impl("latent:k_rank=8/6,v_rank=4,k_bits=8,v_bits=8,per_layer=1", 0.0)->describe(),
            "latent:k_rank=8/6,v_rank=4,energy=0.99,k_bits=8,v_bits=8,scales=channel,per_layer=1");
  // Without the auto-budget the press cannot choose.
  Request r(bundled_model(), make_press_impl("latent:k_rank=8/6,v_rank=8,k_bits=8,v_bits=8,per_layer=1", 0.0), opts());
  r.set_prompt_tokens(story_tokens(64));
  EXPECT_THROW(r.prefill(), Error);
}

// The auto-budget searches any press's knobs (press/knobs.h), not only the latent press's: a press
// of this test with one knob, the share of each segment's newest entries it keeps.
namespace {

class KeepNewestPress : public PressImpl, public KnobControl {
 public:
  explicit KeepNewestPress(std::vector<int> keep) : keep_(std::move(keep)) {}
  std::string describe() const override {
    std::string s;
    for (int k : keep_) s += (s.empty() ? "" : "/") + std::to_string(k);
    return "test_keep_newest:keep=" + s;
  }
  KnobControl* knobs() override { return this; }
  void reset() override { clear_knobs(); }
  void apply(KVCache& cache, const Model&, const Observation&, const Target&) override {
    if (set_ < 0 && keep_.size() > 1) throw Error("press test_keep_newest: keep lists candidates for the auto-budget");
    const int keep = set_ >= 0 ? set_ : keep_[0];
    for (int l = 0; l < cache.n_layer(); ++l)
      for (int h = 0; h < cache.n_head_kv(); ++h) {
        Segment& s = cache.seg(l, h);
        const size_t n = s.size(), m = (n * keep + 99) / 100;
        std::vector<int32_t> idx;
        for (size_t i = n - m; i < n; ++i) idx.push_back(static_cast<int32_t>(i));
        s.retain(idx);
      }
  }
  std::vector<Knob> knob_list() const override { return {{"keep", keep_, keep_, true}}; }
  bool knobs_per_layer() const override { return false; }
  void set_knobs(const std::vector<int>& v) override {
    if (v.size() != 1 || std::find(keep_.begin(), keep_.end(), v[0]) == keep_.end())
      throw Error("press test_keep_newest: not a listed keep");
    set_ = v[0];
  }
  void set_knobs_per_layer(const std::vector<std::vector<int>>&) override {
    throw Error("press test_keep_newest: no per-layer knobs");
  }
  void clear_knobs() override { set_ = -1; }

 private:
  std::vector<int> keep_;
  int set_ = -1;
};

PressRegistrar keep_newest({"test_keep_newest", "test press: keeps a share of each segment's newest entries",
                            "none (a test of the auto-budget's knobs)", {{"keep", "100"}},
                            [](const PressParams& p) -> std::unique_ptr<PressImpl> {
                              std::vector<int> keep;
                              for (double v : param_double_list(p, "test_keep_newest", "keep"))
                                keep.push_back(static_cast<int>(v));
                              return std::make_unique<KeepNewestPress>(std::move(keep));
                            }});

TEST(AutoBudget, KnobsOfAnyPressAreSearched) {
  const std::vector<Token> ctx = story_tokens(200);
  const std::vector<Token> question = bundled_model().tokenizer().encode(" Lily and Tom played with the ball", false, false);
  // Each candidate as a plain press; the target between the KL of 50% and of 25% kept makes 50%
  // the answer whenever keeping less costs more KL.
  const double kl50 = question_kl("test_keep_newest:keep=50", 0.0, ctx, question);
  const double kl25 = question_kl("test_keep_newest:keep=25", 0.0, ctx, question);
  ASSERT_LT(kl50, kl25) << "the test needs keeping less to cost more";
  RequestOptions o = opts();
  o.auto_budget.target_kl = 0.5 * (kl50 + kl25);
  Request req(bundled_model(), make_press_impl("test_keep_newest:keep=100/50/25", 0.0), o);
  req.set_prompt_tokens(ctx, question);
  req.prefill();
  const AutoBudgetReport& ab = req.stats().auto_budget;
  EXPECT_TRUE(ab.target_met);
  EXPECT_EQ(req.stats().kv_bytes, bytes_at("test_keep_newest:keep=50", 0.0, ctx));
  EXPECT_NEAR(ab.probe_kl, kl50, 1e-6 + 1e-4 * kl50);
  // Without a fidelity target a byte budget cannot compare candidates: an error naming the knob.
  RequestOptions b = opts();
  b.auto_budget.kv_budget_bytes = 1 << 20;
  Request no_target(bundled_model(), make_press_impl("test_keep_newest:keep=100/50", 0.0), b);
  no_target.set_prompt_tokens(ctx, question);
  try {
    no_target.prefill();
    ADD_FAILURE() << "candidates accepted without a fidelity target";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("several candidates for keep"), std::string::npos) << e.what();
  }
}

}  // namespace
