// Evaluation harness, without a model: metrics against float64 hand computations, scorers on
// hand-made answers, generators (determinism, needle depth, answers), templates and task text.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "kvslim/error.h"
#include "kvslim/eval.h"
#include "kvslim/eval_metrics.h"
#include "eval/report.h"
#include "kvslim/eval_tasks.h"
#include "kv/cache.h"

using namespace kvslim;

namespace {

// Softmax of logits in float64 the plain way (no log-sum-exp), for small logits only.
std::vector<double> softmax_plain(const std::vector<float>& l) {
  std::vector<double> p(l.size());
  double z = 0;
  for (size_t i = 0; i < l.size(); ++i) z += p[i] = std::exp(double(l[i]));
  for (double& x : p) x /= z;
  return p;
}

size_t words(const std::string& s) {
  std::istringstream in(s);
  size_t n = 0;
  std::string w;
  while (in >> w) ++n;
  return n;
}

const TokenCounter kWords = [](const std::string& s) { return words(s); };

// Words of the sample before its needle number `needle`, and of its whole context.
std::pair<size_t, size_t> words_before(const TaskSample& s, int needle) {
  size_t before = 0, total = 0, nw = 0;
  bool seen = false;
  for (const auto& p : s.context) {
    const size_t w = words(p.text);
    if (p.needle == needle) {
      seen = true;
      nw = w;
    } else if (!seen) {
      before += w;
    }
    total += w;
  }
  EXPECT_TRUE(seen);
  return {before, total - nw};
}

size_t occurrences(const std::string& hay, const std::string& needle) {
  size_t n = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(EvalMetrics, KLMatchesHandComputation) {
  // p = (1/6, 2/6, 3/6), q uniform: KL = 1/6 ln(1/2) + 1/3 ln(1) + 1/2 ln(3/2).
  const std::vector<float> p{0.0f, float(std::log(2.0)), float(std::log(3.0))}, q{0, 0, 0};
  const double want = 1.0 / 6 * std::log(0.5) + 0.5 * std::log(1.5);
  EXPECT_NEAR(kl_divergence_logits(p.data(), q.data(), 3), want, 1e-7);
  // Logits are defined up to a constant: a shift of 1000 must not overflow or change anything.
  std::vector<float> p2 = p, q2 = q;
  for (auto& x : p2) x += 1000.0f;
  for (auto& x : q2) x -= 1000.0f;
  EXPECT_NEAR(kl_divergence_logits(p2.data(), q2.data(), 3), want, 1e-5);
  EXPECT_EQ(kl_divergence_logits(p.data(), p.data(), 3), 0.0);
  // A token the compressed cache rules out that the full cache allows: infinite divergence.
  const std::vector<float> q3{0.0f, -INFINITY, 0.0f};
  EXPECT_TRUE(std::isinf(kl_divergence_logits(p.data(), q3.data(), 3)));
}

TEST(EvalMetrics, KLOnRandomDistributionsMatchesFloat64) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (int t = 0; t < 20; ++t) {
    std::vector<float> a(50), b(50);
    for (auto& x : a) x = nd(rng);
    for (auto& x : b) x = nd(rng);
    const auto pa = softmax_plain(a), pb = softmax_plain(b);
    double want = 0;
    for (size_t i = 0; i < a.size(); ++i) want += pa[i] * std::log(pa[i] / pb[i]);
    EXPECT_NEAR(kl_divergence_logits(a.data(), b.data(), a.size()), want, 1e-9 + 1e-9 * want);
  }
}

TEST(EvalMetrics, NllAndAccumulatorMatchHandComputation) {
  const std::vector<float> l{1, 2, 3};
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_NEAR(nll_logits(l.data(), 3, 0), -std::log(std::exp(1.0) / z), 1e-12);
  EXPECT_THROW(nll_logits(l.data(), 3, 3), Error);
  EXPECT_THROW(nll_logits(l.data(), 3, -1), Error);

  // Two predictions: the first agrees (both peak at 2), the second does not (0 vs 1).
  const std::vector<float> f1{0, 1, 2}, c1{0, 0, 1}, f2{3, 0, 0}, c2{0, 2, 0};
  FidelityAccumulator acc;
  acc.add(f1.data(), c1.data(), 3, 2);
  acc.add(f2.data(), c2.data(), 3, 1);
  auto kl = [](const std::vector<float>& a, const std::vector<float>& b) {
    auto pa = softmax_plain(a), pb = softmax_plain(b);
    double s = 0;
    for (size_t i = 0; i < pa.size(); ++i) s += pa[i] * std::log(pa[i] / pb[i]);
    return s;
  };
  const double k1 = kl(f1, c1), k2 = kl(f2, c2);
  EXPECT_EQ(acc.tokens(), 2u);
  EXPECT_NEAR(acc.mean_kl(), (k1 + k2) / 2, 1e-9);
  EXPECT_NEAR(acc.max_kl(), std::max(k1, k2), 1e-9);
  EXPECT_DOUBLE_EQ(acc.top1_agreement(), 0.5);
  const double nf = -std::log(softmax_plain(f1)[2]) - std::log(softmax_plain(f2)[1]);
  const double nc = -std::log(softmax_plain(c1)[2]) - std::log(softmax_plain(c2)[1]);
  EXPECT_NEAR(acc.perplexity_full(), std::exp(nf / 2), 1e-9);
  EXPECT_NEAR(acc.perplexity_compressed(), std::exp(nc / 2), 1e-9);

  FidelityAccumulator a1, a2;
  a1.add(f1.data(), c1.data(), 3, 2);
  a2.add(f2.data(), c2.data(), 3, 1);
  a1.merge(a2);
  EXPECT_NEAR(a1.mean_kl(), acc.mean_kl(), 1e-15);
  EXPECT_NEAR(a1.perplexity_compressed(), acc.perplexity_compressed(), 1e-12);
  EXPECT_DOUBLE_EQ(a1.top1_agreement(), 0.5);
}

TEST(EvalMetrics, StringMatchOnHandMadeAnswers) {
  EXPECT_DOUBLE_EQ(string_match_all(" The numbers are 4417 and 9021.", {"4417", "9021", "1234"}), 2.0 / 3);
  EXPECT_DOUBLE_EQ(string_match_all("Answer: APPLE, pear", {"apple", "Pear"}), 1.0);  // case-insensitive
  EXPECT_DOUBLE_EQ(string_match_all("nothing here", {"4417"}), 0.0);
  EXPECT_DOUBLE_EQ(string_match_all("anything", {}), 0.0);
  EXPECT_DOUBLE_EQ(string_match_part("it is 9021", {"4417", "9021"}), 1.0);
  EXPECT_DOUBLE_EQ(string_match_part("it is 902", {"4417", "9021"}), 0.0);
}

TEST(EvalTasks, FillTemplate) {
  EXPECT_EQ(fill_template("The {key} is {value}.", {{"key", "red-fox"}, {"value", "42"}}), "The red-fox is 42.");
  EXPECT_EQ(fill_template("no slots", {}), "no slots");
  try {
    fill_template("The {colour} is {value}.", {{"value", "42"}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("{colour}"), std::string::npos) << e.what();
  }
}

TEST(EvalTasks, NiahIsDeterministicForASeed) {
  const TaskText t = TaskText::defaults();
  const TaskSample a = make_niah(t, 500, 0.3, 11, kWords), b = make_niah(t, 500, 0.3, 11, kWords);
  ASSERT_EQ(a.context.size(), b.context.size());
  for (size_t i = 0; i < a.context.size(); ++i) {
    EXPECT_EQ(a.context[i].text, b.context[i].text);
    EXPECT_EQ(a.context[i].needle, b.context[i].needle);
  }
  EXPECT_EQ(a.question, b.question);
  EXPECT_EQ(a.answers, b.answers);
  const TaskSample c = make_niah(t, 500, 0.3, 12, kWords);
  EXPECT_TRUE(c.context_text() != a.context_text() || c.answers != a.answers);
}

TEST(EvalTasks, NiahPlacesTheNeedleAtTheRequestedDepth) {
  const TaskText t = TaskText::defaults();
  size_t longest = 0;
  for (const auto& s : t.filler) longest = std::max(longest, words(s));
  for (int target : {200, 1000, 3000})
    for (double d : {0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0}) {
      const TaskSample s = make_niah(t, target, d, 5, kWords);
      auto [before, hay] = words_before(s, 0);
      ASSERT_GT(hay, 0u);
      // The needle sits at a sentence boundary: at most half a sentence from the exact depth.
      EXPECT_LE(std::fabs(double(before) - d * hay), longest / 2.0 + 1e-9) << "target " << target << " depth " << d;
      // The context (BOS counted as 1) fills the target to within one sentence, never past it.
      const size_t total = words(s.context_text()) + 1;
      EXPECT_LE(total, size_t(target));
      EXPECT_GT(total + longest + 1, size_t(target));
      // The needle holds the answer exactly once; the question names the needle's key.
      ASSERT_EQ(s.answers.size(), 1u);
      EXPECT_EQ(occurrences(s.context_text(), s.answers[0]), 1u);
      EXPECT_NE(s.needles[0].find(s.answers[0]), std::string::npos);
      EXPECT_EQ(s.context_text().find("  "), std::string::npos);
      EXPECT_NE(s.context_text()[0], ' ');
    }
  EXPECT_THROW(make_niah(t, 500, 1.5, 1, kWords), Error);
  EXPECT_THROW(make_niah(t, 5, 0.5, 1, kWords), Error);  // shorter than the needle
}

TEST(EvalTasks, RulerNeedleTasks) {
  const TaskText t = TaskText::defaults();
  RulerOptions o;
  for (const std::string task : {"niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery"}) {
    const TaskSample a = make_ruler(task, t, o, 800, -1, 3, kWords), b = make_ruler(task, t, o, 800, -1, 3, kWords);
    EXPECT_EQ(a.context_text(), b.context_text()) << task;
    EXPECT_EQ(a.question, b.question) << task;
    const std::string ctx = a.context_text();
    for (const auto& ans : a.answers) EXPECT_EQ(occurrences(ctx, ans), 1u) << task << " " << ans;
    EXPECT_TRUE(a.match_all);
    EXPECT_LE(words(ctx) + 1, 800u);
  }
  // Sizes of each task's needles and answers.
  EXPECT_EQ(make_ruler("niah_single", t, o, 800, -1, 3, kWords).needles.size(), 1u);
  const TaskSample mk = make_ruler("niah_multikey", t, o, 800, -1, 3, kWords);
  EXPECT_EQ(mk.needles.size(), 4u);
  EXPECT_EQ(mk.answers.size(), 1u);
  EXPECT_NE(mk.needles[0].find(mk.answers[0]), std::string::npos);  // the asked needle is needle 0
  EXPECT_EQ(make_ruler("niah_multivalue", t, o, 800, -1, 3, kWords).answers.size(), 4u);
  const TaskSample mq = make_ruler("niah_multiquery", t, o, 800, -1, 3, kWords);
  EXPECT_EQ(mq.answers.size(), 4u);
  // A given depth places the asked needle there.
  const TaskSample d = make_ruler("niah_multikey", t, o, 2000, 0.5, 9, kWords);
  auto [before, hay] = words_before(d, 0);
  EXPECT_NEAR(double(before) / hay, 0.5, 0.02);
  EXPECT_THROW(make_ruler("niah_bogus", t, o, 800, -1, 3, kWords), Error);
}

TEST(EvalTasks, RulerVariableTracking) {
  const TaskText t = TaskText::defaults();
  RulerOptions o;
  o.vt_chains = 2;
  const TaskSample s = make_ruler("vt", t, o, 1000, -1, 4, kWords);
  ASSERT_EQ(s.answers.size(), 5u);
  const std::string ctx = s.context_text();
  // The asked chain: VAR a0 = value, then VAR ai = VAR a(i-1), in this order in the text.
  size_t at = 0;
  for (size_t i = 0; i < s.answers.size(); ++i) {
    const std::string stmt = i == 0 ? "VAR " + s.answers[0] + " = " : "VAR " + s.answers[i] + " = VAR " + s.answers[i - 1] + ".";
    const size_t p = ctx.find(stmt, at);
    ASSERT_NE(p, std::string::npos) << stmt;
    at = p;
  }
  const size_t eq = ctx.find("VAR " + s.answers[0] + " = ") + s.answers[0].size() + 7;
  const std::string value = ctx.substr(eq, ctx.find('.', eq) - eq);
  EXPECT_NE(s.question.find(value), std::string::npos);  // the question asks for the chain's value
  EXPECT_EQ(s.needles.size(), 10u);                      // two chains of five
}

TEST(EvalTasks, RulerWordExtraction) {
  const TaskText t = TaskText::defaults();
  RulerOptions o;
  const TaskSample c = make_ruler("cwe", t, o, 3000, -1, 8, kWords);
  std::map<std::string, int> count;
  for (const auto& p : c.context) {
    std::istringstream in(p.text);
    std::string num, w;
    in >> num >> w;
    ++count[w];
  }
  ASSERT_EQ(c.answers.size(), 10u);
  int common_min = 1 << 30, other_max = 0;
  std::set<std::string> ans(c.answers.begin(), c.answers.end());
  for (const auto& [w, n] : count) (ans.count(w) ? common_min = std::min(common_min, n) : other_max = std::max(other_max, n));
  EXPECT_GT(common_min, other_max);
  EXPECT_EQ(common_min, o.cwe_freq_common);
  EXPECT_EQ(other_max, o.cwe_freq_uncommon);
  EXPECT_LE(words(c.context_text()) + 1, 3000u);
  // A short context lowers the frequencies but keeps the common words strictly more frequent.
  const TaskSample cs = make_ruler("cwe", t, o, 300, -1, 8, kWords);
  std::map<std::string, int> cc;
  for (const auto& p : cs.context) {
    std::istringstream in(p.text);
    std::string num, w;
    in >> num >> w;
    ++cc[w];
  }
  std::set<std::string> ans2(cs.answers.begin(), cs.answers.end());
  int cmin = 1 << 30, omax = 0;
  for (const auto& [w, n] : cc) (ans2.count(w) ? cmin = std::min(cmin, n) : omax = std::max(omax, n));
  EXPECT_GT(cmin, omax);

  const TaskSample f = make_ruler("fwe", t, o, 1500, -1, 8, kWords);
  std::map<std::string, int> fc;
  for (const auto& p : f.context) ++fc[std::string(p.text.substr(p.text[0] == ' ' ? 1 : 0))];
  std::vector<int> counts;
  for (const auto& [w, n] : fc) counts.push_back(n);
  std::sort(counts.rbegin(), counts.rend());
  ASSERT_EQ(f.answers.size(), 3u);
  ASSERT_GE(counts.size(), 4u);
  EXPECT_GT(counts[2], counts[3]);  // no tie at the boundary of the answer set
  for (const auto& a : f.answers) EXPECT_GE(fc[a], counts[2]) << a;
  EXPECT_EQ(make_ruler("fwe", t, o, 1500, -1, 8, kWords).context_text(), f.context_text());
}

TEST(EvalTasks, TaskTextFromJson) {
  TaskText t = TaskText::from_json_text(
      R"({"filler": ["Here we go."], "separator": " ", "needle": "The value of key-{key} is {value}.",
          "keys": [], "key_chars": "ABC", "key_length": 2, "value_digits": 3, "_comment": "ignored"})",
      "inline");
  EXPECT_EQ(t.filler, std::vector<std::string>{"Here we go."});
  EXPECT_EQ(t.value_digits, 3);
  const TaskSample s = make_niah(t, 60, 0.5, 2, kWords);
  ASSERT_EQ(s.needles.size(), 1u);
  ASSERT_EQ(s.answers.size(), 1u);
  EXPECT_EQ(s.answers[0].size(), 3u);
  EXPECT_EQ(s.needles[0].substr(0, 17), "The value of key-");
  EXPECT_EQ(s.needles[0].substr(19), " is " + s.answers[0] + ".");
  for (char c : s.needles[0].substr(17, 2)) EXPECT_NE(std::string("ABC").find(c), std::string::npos);
  EXPECT_THROW(TaskText::from_json_text(R"({"needel": "x"})", "inline"), Error);
  EXPECT_THROW(TaskText::from_json_text(R"({"filler": "one sentence"})", "inline"), Error);
  EXPECT_THROW(TaskText::from_json_text(R"({"value_digits": 0})", "inline"), Error);
  EXPECT_THROW(TaskText::from_json_text("{not json", "inline"), Error);
  EXPECT_THROW(TaskText::from_json_file("/nonexistent/task.json"), Error);
}

TEST(EvalSweep, ExpandRuns) {
  auto runs = expand_runs({"streaming_llm", "none", "knorm"}, {0.5, 0.9}, true);
  ASSERT_EQ(runs.size(), 5u);
  EXPECT_EQ(runs[0].spec, "none");
  EXPECT_EQ(runs[1].spec, "streaming_llm");
  EXPECT_DOUBLE_EQ(runs[2].ratio, 0.9);
  EXPECT_EQ(runs[4].spec, "knorm");
  EXPECT_THROW(expand_runs({"no_such_press"}, {0.5}, true), Error);
  EXPECT_THROW(expand_runs({"knorm"}, {1.0}, true), Error);
  EXPECT_THROW(expand_runs({}, {0.5}, false), Error);
}

// A press with a budget keeps N entries per KV head whatever the ratio: the sweep runs it once, at
// ratio 0, instead of once per ratio with identical results.
TEST(EvalSweep, ExpandRunsRunsABudgetPressOnce) {
  auto runs = expand_runs({"snapkv:budget=64", "knorm"}, {0.5, 0.75, 0.9}, true);
  ASSERT_EQ(runs.size(), 5u);
  EXPECT_EQ(runs[1].spec, "snapkv:budget=64");
  EXPECT_DOUBLE_EQ(runs[1].ratio, 0.0);
  EXPECT_EQ(runs[2].spec, "knorm");
  EXPECT_DOUBLE_EQ(runs[2].ratio, 0.5);
  EXPECT_THROW(expand_runs({"snapkv:budget=64"}, {1.0}, true), Error);
}

TEST(EvalReport, InspectCacheCountsTheNeedleEntries) {
  // 2 layers x 2 KV heads over 10 positions; the needle spans positions [3, 6).
  KVCache cache(2, 2, 4, KVCodec::F32, KVCodec::F32);
  const float z[4] = {0, 0, 0, 0};
  const std::vector<std::vector<int>> keep{{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {0, 8, 9}, {3, 4, 9}, {0, 5}};
  for (int s = 0; s < 4; ++s)
    for (int p : keep[s]) cache.seg(s / 2, s % 2).append(z, z, p);
  CacheCheck c = inspect_cache(cache, 10, 0.5, {{3, 6}, {9, 10}});
  EXPECT_EQ(c.entries_total, 40u);
  EXPECT_EQ(c.entries_kept, 18u);
  EXPECT_NEAR(c.compression_ratio(), 1.0 - 18.0 / 40, 1e-15);
  ASSERT_EQ(c.needle_kept.size(), 2u);
  EXPECT_NEAR(c.needle_kept[0], (3 + 0 + 2 + 1) / 12.0, 1e-15);
  EXPECT_NEAR(c.needle_kept[1], 3 / 4.0, 1e-15);
  EXPECT_NEAR(c.min_needle_kept(), 0.5, 1e-15);
  ASSERT_EQ(c.needle_kept_per_layer.size(), 2u);
  EXPECT_NEAR(c.needle_kept_per_layer[0][0], 3 / 6.0, 1e-15);
  EXPECT_NEAR(c.needle_kept_per_layer[0][1], 3 / 6.0, 1e-15);
  EXPECT_NEAR(c.needle_kept_per_layer[1][0], 2 / 2.0, 1e-15);
  EXPECT_NEAR(c.needle_kept_per_layer[1][1], 1 / 2.0, 1e-15);
  EXPECT_EQ(c.kept_per_layer, (std::vector<size_t>{13, 5}));
  EXPECT_TRUE(c.as_configured);  // 0.55 removed against 0.5 asked: within 0.01 + 1/10
  EXPECT_FALSE(inspect_cache(cache, 10, 0.3).as_configured);
  // Ratio 0: no ratio was asked for (a budget or threshold press), so nothing can miss it.
  EXPECT_TRUE(inspect_cache(cache, 10, 0.0).as_configured);
}

TEST(EvalReport, SummariesAverageSamples) {
  std::vector<TaskRecord> recs(3);
  for (int i = 0; i < 3; ++i) {
    recs[i].task = "niah";
    recs[i].press_spec = "knorm";
    recs[i].ratio = 0.5;
    recs[i].length = i < 2 ? 100 : 200;
    recs[i].depth = 0.5;
    recs[i].outcome.score = i == 0 ? 1.0 : 0.0;
    recs[i].outcome.cache.entries_total = 10;
    recs[i].outcome.cache.entries_kept = 5;
    recs[i].outcome.cache.needle_kept = {i * 0.25};
  }
  auto coarse = summarize(recs, false);
  ASSERT_EQ(coarse.size(), 1u);
  EXPECT_EQ(coarse[0].n, 3);
  EXPECT_NEAR(coarse[0].score, 1.0 / 3, 1e-15);
  EXPECT_NEAR(coarse[0].prefill_compression_ratio, 0.5, 1e-15);
  EXPECT_NEAR(coarse[0].needle_kept, 0.25, 1e-15);
  auto fine = summarize(recs, true);
  ASSERT_EQ(fine.size(), 2u);
  EXPECT_EQ(fine[0].n, 2);
  EXPECT_NEAR(fine[0].score, 0.5, 1e-15);
  // Rows of the CSV have as many fields as the header (no field holds a comma here).
  auto fields = [](const std::string& s) { return std::count(s.begin(), s.end(), ',') + 1; };
  EXPECT_EQ(fields(csv_header(TaskSummary{})), fields(csv_row(coarse[0])));
  EXPECT_EQ(fields(csv_header(TaskRecord{})), fields(csv_row(recs[0])));
  EXPECT_EQ(fields(csv_header(FidelityRecord{})), fields(csv_row(FidelityRecord{})));
  EXPECT_EQ(fields(csv_header(FidelitySummary{})), fields(csv_row(FidelitySummary{})));
  EXPECT_EQ(file_safe("snapkv:window=8,kernel=3"), "snapkv_window_8_kernel_3");
  EXPECT_THROW(check_plot_format("gif"), Error);
}
