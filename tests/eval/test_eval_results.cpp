// Trustworthy eval output: intervals, summaries without magic values, provenance, end-of-run
// cache statistics, plots at the achieved ratio, the zero-baseline warning, and shards / MPI ranks
// that merge into exactly what one process writes.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "kvslim/error.h"
#include "kvslim/eval.h"
#include "eval/report.h"
#include "kvslim/eval_results.h"
#include "kvslim/eval_run_info.h"
#include "kvslim/model.h"
#include "kvslim/version.h"

using namespace kvslim;

namespace {

const std::string kStories = std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf";

const Model& stories() {
  static std::unique_ptr<Model> m = Model::load(kStories);
  return *m;
}

std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string temp_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "kvslim_" + name + "_" + std::to_string(::getpid());
  std::filesystem::remove_all(d);
  return d;
}

/// samples.jsonl without the run line and without the wall-clock fields (which differ between
/// any two runs); what must be identical between one process and merged shards.
std::string comparable(const std::string& jsonl) {
  std::istringstream in(jsonl);
  std::string line, out;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["kind"] == "run") continue;
    for (const char* k : {"seconds", "prefill_seconds", "press_seconds", "decode_seconds"}) j.erase(k);
    out += j.dump() + "\n";
  }
  return out;
}

TaskRecord task_rec(const std::string& spec, double ratio, double score, size_t kept, size_t index) {
  TaskRecord r;
  r.index = index;
  r.task = "niah";
  r.press = r.press_spec = spec;
  r.ratio = ratio;
  r.length = 100;
  r.depth = 0.5;
  r.outcome.score = score;
  r.outcome.cache.context_tokens = 100;
  r.outcome.cache.entries_total = 100;
  r.outcome.cache.entries_kept = kept;
  r.outcome.end.context_tokens = 100;
  r.outcome.end.context_entries_total = 100;
  r.outcome.end.context_entries = kept;
  r.outcome.end.tokens = 110;
  r.outcome.end.entries_total = 110;
  r.outcome.end.entries = kept + 10;
  r.outcome.end.kv_bytes = (kept + 10) * 4;
  r.outcome.end.full_f16_bytes = 110 * 4;
  return r;
}

}  // namespace

// Expected values from published tables: Student's t 0.975 quantiles; Wilson's interval for 5/10
// (0.2366, 0.7634) and 5/5 (0.5655, 1), as tabulated by Newcombe, Stat. Med. 17 (1998).
TEST(EvalStats, IntervalsMatchPublishedValues) {
  EXPECT_DOUBLE_EQ(student_t975(1), 12.706);
  EXPECT_DOUBLE_EQ(student_t975(10), 2.228);
  EXPECT_NEAR(student_t975(40), 2.021, 0.002);
  EXPECT_NEAR(student_t975(120), 1.980, 0.002);
  EXPECT_THROW(student_t975(0), Error);
  Interval w = wilson_interval(0.5, 10);
  EXPECT_NEAR(w.low, 0.2366, 1e-4);
  EXPECT_NEAR(w.high, 0.7634, 1e-4);
  w = wilson_interval(1.0, 5);
  EXPECT_NEAR(w.low, 0.5655, 1e-4);
  EXPECT_DOUBLE_EQ(w.high, 1.0);
  w = wilson_interval(0.0, 5);
  EXPECT_DOUBLE_EQ(w.low, 0.0);
  EXPECT_NEAR(w.high, 0.4345, 1e-4);
  // {1, 2, 3}: sd 1, half width 4.303 / sqrt(3).
  Interval t = t_interval({1, 2, 3}, 2.0);
  EXPECT_NEAR(t.low, 2.0 - 4.303 / std::sqrt(3.0), 1e-12);
  EXPECT_NEAR(t.high, 2.0 + 4.303 / std::sqrt(3.0), 1e-12);
  t = t_interval({0.7}, 0.7);  // one value: no interval (EvalStats.OneSampleHasNoInterval)
  EXPECT_TRUE(std::isnan(t.low));
  EXPECT_TRUE(std::isnan(t.high));
}

TEST(EvalStats, Sha256OfKnownText) {
  // FIPS 180-2, appendix B.1: SHA-256("abc").
  const std::string p = temp_dir("sha") + ".txt";
  std::ofstream(p, std::ios::binary) << "abc";
  EXPECT_EQ(sha256_file(p), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::filesystem::remove(p);
  EXPECT_THROW(sha256_file("/nonexistent/model.gguf"), Error);
  EXPECT_EQ(shell_quote("eval"), "eval");
  EXPECT_EQ(shell_quote("snapkv:window=8,kernel=3"), "snapkv:window=8,kernel=3");
  EXPECT_EQ(shell_quote("adakv(snapkv)"), "'adakv(snapkv)'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
}

// Regression: summary.csv wrote -1 / -2 for "all lengths" / "all depths" without saying so.
TEST(EvalResults, SummaryCsvSaysAllAndRandom) {
  std::vector<TaskRecord> recs{task_rec("knorm", 0.5, 1.0, 50, 0), task_rec("knorm", 0.5, 0.0, 50, 1)};
  recs[1].depth = -1;
  auto coarse = summarize(recs, false);
  ASSERT_EQ(coarse.size(), 1u);
  EXPECT_EQ(csv_row(coarse[0]).substr(0, 21), "niah,knorm,0.5,all,al");
  auto fine = summarize(recs, true);
  ASSERT_EQ(fine.size(), 2u);
  EXPECT_EQ(csv_row(fine[0]).substr(0, 21), "niah,knorm,0.5,100,0.");
  EXPECT_EQ(csv_row(fine[1]).substr(0, 25), "niah,knorm,0.5,100,random");
  for (const auto& s : {coarse[0], fine[0], fine[1]}) {
    const std::string row = csv_row(s);
    EXPECT_EQ(row.find(",-1,"), std::string::npos) << row;
    EXPECT_EQ(row.find(",-2,"), std::string::npos) << row;
  }
  // The coarse row: 1 of 2, Wilson interval of 0.5 on 2 samples.
  EXPECT_DOUBLE_EQ(coarse[0].score, 0.5);
  EXPECT_NEAR(coarse[0].score_ci.low, wilson_interval(0.5, 2).low, 1e-15);
  // Ratios at the end of the run: 50 of 100 context entries removed; 60 of 110 entries held.
  EXPECT_DOUBLE_EQ(coarse[0].compression_ratio, 0.5);
  EXPECT_DOUBLE_EQ(coarse[0].memory_ratio, 60.0 / 110.0);
}

// Regression: a decoding press showed memory ratio 1.000 because statistics were taken right after
// prefill. decoding(knorm) with size 32 and interval 1 holds 32 entries per KV head after every
// decode step, so at the end of a 64 + 16 token fidelity run the cache holds 32 of 79 tokens.
TEST(EvalResults, DecodingPressIsMeasuredAtTheEnd) {
  FidelitySweep sw;
  sw.context_tokens = 64;
  sw.continuation_tokens = 16;
  sw.samples = 1;
  std::vector<FidelityRecord> recs;
  run_fidelity_sweep(stories(), {{"decoding(knorm):interval=1,size=32", 0.5}}, sw,
                     [&](const FidelityRecord& r) { recs.push_back(r); });
  ASSERT_EQ(recs.size(), 1u);
  const FidelityOutcome& o = recs[0].outcome;
  EXPECT_DOUBLE_EQ(o.cache.compression_ratio(), 0.0);  // prefill is left alone
  EXPECT_DOUBLE_EQ(o.cache.memory_ratio(), 1.0);
  EXPECT_EQ(o.end.tokens, 64 + 15);
  const size_t LH = size_t(stories().hparams().n_layer) * stories().hparams().n_head_kv;
  EXPECT_EQ(o.end.entries_total, 79 * LH);
  EXPECT_LE(o.end.entries, 32 * LH);
  EXPECT_GE(o.end.entries, 31 * LH);
  EXPECT_NEAR(o.end.memory_ratio(), 32.0 / 79.0, 1.0 / 79.0);
  EXPECT_GE(o.end.compression_ratio(), 0.5);  // at most 32 of the 64 context entries remain
  auto sum = summarize(recs);
  EXPECT_DOUBLE_EQ(sum[0].memory_ratio, o.end.memory_ratio());
  EXPECT_DOUBLE_EQ(sum[0].prefill_memory_ratio, 1.0);
}

// Regression: a budget press runs at ratio 0 and its heat map said "at ratio 0.00" over a cache
// that kept 4% of the context; the title now gives only the achieved ratio.
TEST(EvalResults, BudgetHeatMapTitleHasNoRequestedRatio) {
  if (find_gnuplot().empty()) GTEST_SKIP() << "gnuplot not on PATH";
  SweepResults res;
  res.info.kind = "niah";
  res.info.model = "m.gguf";
  res.tasks = {task_rec("none", 0.0, 1.0, 100, 0), task_rec("snapkv:budget=4", 0.0, 1.0, 4, 1)};
  ResultsOptions o;
  o.dir = temp_dir("budget_plots");
  const ResultsReport rep = write_results(res, o);
  EXPECT_EQ(rep.plot_problem, "");
  const std::string gp = read(o.dir + "/niah_snapkv_budget_4_0.00.svg.gp");
  EXPECT_NE(gp.find("NIAH: snapkv:budget=4 (achieved ratio 0.96)"), std::string::npos) << gp;
  EXPECT_EQ(gp.find("at ratio"), std::string::npos) << gp;
  // The full cache removed nothing: its title still says so.
  EXPECT_NE(read(o.dir + "/niah_none_0.00.svg.gp").find("at ratio 0.00 (achieved 0.00)"), std::string::npos);
}

// Regression: points were drawn at the requested ratio (SnapKV at 0.9 with its 0.75 result), with
// no baseline, n, error bars or model in the title; KL was on a linear axis.
TEST(EvalResults, PlotsUseTheAchievedRatioWithBaselineAndIntervals) {
  if (find_gnuplot().empty()) GTEST_SKIP() << "gnuplot not on PATH";
  SweepResults res;
  res.info.kind = "niah";
  res.info.model = "/some/where/tiny-model.gguf";
  res.tasks = {task_rec("none", 0.0, 1.0, 100, 0), task_rec("snapkv", 0.9, 1.0, 25, 1),
               task_rec("none", 0.0, 1.0, 100, 2), task_rec("snapkv", 0.9, 0.0, 25, 3)};
  ResultsOptions o;
  o.dir = temp_dir("plots");
  const ResultsReport rep = write_results(res, o);
  EXPECT_EQ(rep.plot_problem, "");
  const std::string gp = read(o.dir + "/score_vs_ratio.svg.gp");
  EXPECT_NE(gp.find("\n0.75 0.5 "), std::string::npos) << gp;  // achieved 0.75, not requested 0.9
  EXPECT_EQ(gp.find("\n0.9 "), std::string::npos) << gp;
  EXPECT_NE(gp.find("yerrorlines"), std::string::npos);
  EXPECT_NE(gp.find("full cache: 1.00"), std::string::npos) << gp;
  EXPECT_NE(gp.find("tiny-model.gguf"), std::string::npos);
  EXPECT_NE(gp.find("n=2"), std::string::npos);
  EXPECT_NE(gp.find("100 tokens"), std::string::npos);
  const std::string mem = read(o.dir + "/score_vs_memory.svg.gp");
  EXPECT_NE(mem.find(fmt::format("\n{} 0.5 ", 35.0 / 110.0)), std::string::npos) << mem;
  EXPECT_TRUE(std::filesystem::exists(o.dir + "/niah_snapkv_0.90.svg"));
  // Every plot written is listed (the heat maps were written but left out of the list).
  for (const char* f : {"score_vs_ratio.svg", "score_vs_memory.svg", "niah_snapkv_0.90.svg",
                        "needle_kept_snapkv_0.90.svg", "niah_none_0.00.svg"})
    EXPECT_NE(std::find(rep.files.begin(), rep.files.end(), o.dir + "/" + f), rep.files.end()) << f;
  // Fidelity: KL on a log axis.
  SweepResults fr;
  fr.info.kind = "fidelity";
  fr.info.model = "m.gguf";
  FidelityRecord f;
  f.press_spec = "knorm";
  f.ratio = 0.5;
  f.outcome.metrics = FidelityAccumulator::from_sums(10, 9, 0.5, 0.2, 20, 21);
  fr.fidelity = {f};
  o.dir = temp_dir("plots_fid");
  write_results(fr, o);
  const std::string kl = read(o.dir + "/kl_vs_ratio.svg.gp");
  EXPECT_NE(kl.find("set logscale y"), std::string::npos);
  std::filesystem::remove_all(o.dir);
  std::filesystem::remove_all(temp_dir("plots"));
}

// Regression: a heat map of one row (a sweep of a single length, as the README's tour runs) was
// blank: gnuplot's `with image` needs a grid of at least 2 x 2 and silently drew no cell. Each
// cell is now a filled box in the palette's colour for its value: 0 -> #b2182b = rgb(178, 24, 43),
// 1 -> #1a9850 = rgb(26, 152, 80). Counted: the SVG's polygons of that colour larger than 1,000
// square pixels (a cell of these maps is over 170 x 190; the colour box's bands are 26 x 3).
TEST(EvalResults, HeatMapOfOneRowDrawsEveryCell) {
  if (find_gnuplot().empty()) GTEST_SKIP() << "gnuplot is not on PATH";
  const std::string dir = temp_dir("heat1");
  std::filesystem::create_directories(dir);
  auto cells = [](const std::string& svg, const std::string& rgb) {
    const std::string head = "<polygon fill = '" + rgb + "' points = '";
    size_t n = 0;
    for (size_t p = svg.find(head); p != std::string::npos; p = svg.find(head, p + 1)) {
      std::istringstream pts(svg.substr(p + head.size(), svg.find('\'', p + head.size()) - p - head.size()));
      double x0 = 1e9, x1 = -1e9, y0 = 1e9, y1 = -1e9, x, y;
      char comma;
      while (pts >> x >> comma >> y) x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
      n += (x1 - x0) * (y1 - y0) > 1000;
    }
    return n;
  };
  const std::string red = "rgb(178,  24,  43)", green = "rgb( 26, 152,  80)";
  std::string why;
  // One row, three columns: two cells at 1, one at 0.
  ASSERT_TRUE(plot_heatmap({{1.0, 0.0, 1.0}}, {"512"}, {"0", "0.5", "1"}, "t", "depth", "tokens", dir + "/row.svg",
                           "svg", &why, "score"))
      << why;
  const std::string row = read(dir + "/row.svg");
  EXPECT_EQ(cells(row, green), 2u) << row;
  EXPECT_EQ(cells(row, red), 1u) << row;
  // One column of two rows; and a 2 x 2 map (which `with image` did draw).
  ASSERT_TRUE(plot_heatmap({{0.0}, {0.0}}, {"256", "512"}, {"0.5"}, "t", "depth", "tokens", dir + "/col.svg", "svg",
                           &why, "score"))
      << why;
  EXPECT_EQ(cells(read(dir + "/col.svg"), red), 2u);
  ASSERT_TRUE(plot_heatmap({{1.0, 1.0}, {1.0, 0.0}}, {"256", "512"}, {"0", "1"}, "t", "depth", "tokens",
                           dir + "/sq.svg", "svg", &why, "score"))
      << why;
  EXPECT_EQ(cells(read(dir + "/sq.svg"), green), 3u);
  EXPECT_EQ(cells(read(dir + "/sq.svg"), red), 1u);
  std::filesystem::remove_all(dir);
}

// The configuration a sweep records (and that shards must share), written out by hand.
TEST(EvalResults, SweepConfigRecordsEverySetting) {
  const std::vector<PressRun> runs = {{"none", 0.0}, {"snapkv", 0.5}};
  FidelitySweep f;
  f.context_tokens = 64;
  f.continuation_tokens = 16;
  f.samples = 3;
  f.seed = 7;
  f.lmba_window = 8;
  f.lmba_tau = 0.8;
  f.run.session.n_ctx = 512;
  f.run.session.key_codec = KVCodec::Q8_0;
  f.run.session.value_codec = KVCodec::F16;
  f.run.session.kv_quant.kivi_bits = 0;
  f.run.chunk_size = 32;
  const std::string text = temp_dir("sweep_text") + ".txt";
  std::ofstream(text, std::ios::binary) << "abc";
  const nlohmann::json want_f = {
      {"runs", nlohmann::json::array({nlohmann::json::array({"none", 0.0}), nlohmann::json::array({"snapkv", 0.5})})},
      {"samples", 3}, {"seed", 7}, {"ctx_size", 512},
      {"chunk_size", 32}, {"cache_type_k", "q8_0"}, {"cache_type_v", "f16"}, {"kivi_bits", 0},
      {"kivi_group", 32}, {"kivi_residual", 128},
      {"kv_hadamard", false}, {"context_tokens", 64}, {"continuation_tokens", 16}, {"lmba_window", 8},
      {"lmba_tau", 0.8}, {"text", text},
      // FIPS 180-2, appendix B.1: SHA-256("abc").
      {"text_sha256", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}};
  EXPECT_EQ(nlohmann::json::parse(sweep_config(runs, f, text)), want_f) << sweep_config(runs, f, text);
  nlohmann::json no_text = want_f;
  no_text["text"] = "";
  no_text.erase("text_sha256");
  EXPECT_EQ(nlohmann::json::parse(sweep_config(runs, f, "")), no_text);
  TaskSweep t;
  t.tasks = {"niah"};
  t.lengths = {100, 200};
  t.depths = {0.5};
  t.samples = 2;
  t.seed = 9;
  t.run.n_predict = 12;
  t.ruler.multi_keys = 6;
  const nlohmann::json c = nlohmann::json::parse(sweep_config(runs, t, ""));
  EXPECT_EQ(c["tasks"], nlohmann::json({"niah"}));
  EXPECT_EQ(c["lengths"], nlohmann::json({100, 200}));
  EXPECT_EQ(c["depths"], nlohmann::json({0.5}));
  EXPECT_EQ(c["n_predict"], 12);
  EXPECT_EQ(c["samples"], 2);
  EXPECT_EQ(c["seed"], 9);
  EXPECT_EQ(c["text_config"], "");
  EXPECT_FALSE(c.contains("text_config_sha256"));
  EXPECT_EQ(c["ruler"]["multi_keys"], 6);
  EXPECT_EQ(c["ruler"]["vt_hops"], t.ruler.vt_hops);
  EXPECT_EQ(c["cache_type_k"], "f16");
  EXPECT_EQ(nlohmann::json::parse(sweep_config(runs, t, text))["text_config_sha256"], want_f["text_sha256"]);
  // Settings that differ make different sweeps.
  t.ruler.fwe_vocab += 1;
  EXPECT_NE(nlohmann::json::parse(sweep_config(runs, t, "")), c);
  std::filesystem::remove(text);
  EXPECT_THROW(sweep_config(runs, t, "/nonexistent/tasks.json"), Error);
}

// Regression: a model that cannot do the task scored 0 everywhere, silently.
TEST(EvalResults, ZeroBaselineIsALoudWarning) {
  SweepResults res;
  res.info.kind = "niah";
  res.info.model = "stories260K.gguf";
  res.tasks = {task_rec("none", 0.0, 0.0, 100, 0), task_rec("knorm", 0.5, 0.0, 50, 1)};
  ResultsOptions o;
  o.dir = temp_dir("zero");
  o.plots = false;
  ResultsReport rep = write_results(res, o);
  ASSERT_EQ(rep.warnings.size(), 1u);
  EXPECT_NE(rep.warnings[0].find("THE FULL CACHE SCORED 0 on niah"), std::string::npos);
  EXPECT_NE(read(o.dir + "/summary.json").find("THE FULL CACHE SCORED 0"), std::string::npos);
  res.tasks[0].outcome.score = 1.0;
  EXPECT_TRUE(write_results(res, o).warnings.empty());
  res.tasks.erase(res.tasks.begin());
  rep = write_results(res, o);
  ASSERT_EQ(rep.warnings.size(), 1u);
  EXPECT_NE(rep.warnings[0].find("no full-cache baseline"), std::string::npos);
  std::filesystem::remove_all(o.dir);
}

TEST(EvalResults, RecordsRoundTripThroughJson) {
  FidelitySweep sw;
  sw.context_tokens = 40;
  sw.continuation_tokens = 8;
  sw.samples = 2;
  sw.lmba_window = 4;
  SweepResults res;
  res.info.kind = "fidelity";
  res.info.model = "x.gguf";
  res.info.units = run_fidelity_sweep(
      stories(), expand_runs({"knorm"}, {0.5}, true), sw, [&](const FidelityRecord& r) { res.fidelity.push_back(r); },
      [&](int i, const AttentionStats& s) { res.stats.emplace_back(i, s); });
  EXPECT_EQ(res.info.units, 4u);
  const std::string text = results_jsonl(res);
  const SweepResults back = parse_results(text, "test");
  EXPECT_EQ(results_jsonl(back), text);
  ASSERT_EQ(back.fidelity.size(), 4u);
  const auto a = summarize(res.fidelity), b = summarize(back.fidelity);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(csv_row(a[i]), csv_row(b[i]));
  // Malformed input names the place.
  try {
    parse_results(text + "{\"kind\": \"task\"}\n", "shard.jsonl");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shard.jsonl:8: field 'index' is missing"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_results("{\"kind\": \"task\"}\n", "x"), Error);
  EXPECT_THROW(parse_results("not json\n", "x"), Error);
  // The run record's settings are an object, kept as its text.
  EXPECT_EQ(nlohmann::json::parse(back.info.config), nlohmann::json::object());
  std::string bad = text;
  const size_t at = bad.find("\"config\":{}");
  ASSERT_NE(at, std::string::npos) << text.substr(0, 300);
  bad.replace(at, 11, "\"config\":[1]");
  try {
    parse_results(bad, "run.jsonl");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("field 'config' is not an object"), std::string::npos) << e.what();
  }
}

// Shards of a sweep, merged, are what one process produces (timings aside); merging refuses
// parts of different sweeps, missing shards and shards given twice.
TEST(EvalResults, ShardsMergeIntoTheSingleProcessResult) {
  TaskSweep sw;
  sw.tasks = {"niah"};
  sw.lengths = {48, 64};
  sw.depths = {0.0, 1.0};
  sw.samples = 1;
  sw.run.n_predict = 2;
  const auto runs = expand_runs({"streaming_llm", "knorm"}, {0.5}, true);
  auto run = [&](Shard sh) {
    SweepResults r;
    r.info.kind = "niah";
    r.info.model = "m.gguf";
    r.info.model_sha256 = "00";
    r.info.shard_index = sh.index;
    r.info.shard_count = sh.count;
    TaskSweep s = sw;
    s.shard = sh;
    r.info.units = run_task_sweep(stories(), runs, s, [&](const TaskRecord& t) { r.tasks.push_back(t); });
    return r;
  };
  const SweepResults whole = run({0, 1});
  ASSERT_EQ(whole.tasks.size(), 12u);
  std::vector<SweepResults> parts{run({2, 3}), run({0, 3}), run({1, 3})};
  size_t n = 0;
  for (const auto& p : parts) n += p.tasks.size();
  EXPECT_EQ(n, 12u);
  const SweepResults merged = merge_results(parts, {"a", "b", "c"});
  EXPECT_EQ(comparable(results_jsonl(merged)), comparable(results_jsonl(whole)));
  EXPECT_THROW(merge_results({parts[0], parts[1]}, {"a", "b"}), Error);             // shard 1/3 missing
  EXPECT_THROW(merge_results({parts[0], parts[1], parts[1]}, {"a", "b", "c"}), Error);  // shard 0/3 twice
  SweepResults other = parts[2];
  other.info.config = R"({"seed":2})";
  EXPECT_THROW(merge_results({parts[0], parts[1], other}, {"a", "b", "c"}), Error);
  other = parts[2];
  other.info.model_sha256 = "01";
  try {
    merge_results({parts[0], parts[1], other}, {"a", "b", "c"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sha256"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_shard("2/2"), Error);
  EXPECT_THROW(parse_shard("1"), Error);
  EXPECT_THROW(parse_shard("a/3"), Error);
  EXPECT_EQ(parse_shard("1/3").index, 1);
}

// Through the CLI: provenance in samples.jsonl, --shard + eval merge == one process, and (when
// built with MPI and mpirun is installed) mpirun -n 2 == one process.
TEST(EvalResults, CliShardsMergeAndMpiMatchOneProcess) {
  const std::string dir = temp_dir("cli_shards");
  const std::string base = fmt::format(
      "{} eval niah -m {} --lengths 48,64 --depths 0,1 --samples 1 --press streaming_llm knorm --ratios 0.5 -n 2 "
      "--no-progress --no-plot",
      KVSLIM_CLI, kStories);
  auto sh = [&](const std::string& cmd) {
    const int rc = std::system((cmd + " > " + dir + ".log 2>&1").c_str());
    return rc == 0 ? 0 : WEXITSTATUS(rc);
  };
  ASSERT_EQ(sh(base + " -o " + dir + "/one"), 0) << read(dir + ".log");
  EXPECT_NE(read(dir + ".log").find("THE FULL CACHE SCORED 0"), std::string::npos) << read(dir + ".log");
  const std::string one = read(dir + "/one/samples.jsonl");
  const auto info = nlohmann::json::parse(one.substr(0, one.find('\n')));
  EXPECT_EQ(info["kind"], "run");
  EXPECT_EQ(info["kvslim_version"], kVersion);
  EXPECT_EQ(info["model"], kStories);
  EXPECT_EQ(info["model_bytes"], std::filesystem::file_size(kStories));
  EXPECT_NE(info["command"].get<std::string>().find("eval niah -m"), std::string::npos);
  // The hash against coreutils' sha256sum, an independent implementation.
  if (std::system("command -v sha256sum > /dev/null 2>&1") == 0) {
    FILE* p = popen(("sha256sum " + kStories).c_str(), "r");
    char buf[65] = {};
    ASSERT_EQ(fread(buf, 1, 64, p), 64u);
    pclose(p);
    EXPECT_EQ(info["model_sha256"], std::string(buf));
  }
  ASSERT_EQ(sh(base + " --shard 1/2 -o " + dir + "/s1"), 0) << read(dir + ".log");
  EXPECT_FALSE(std::filesystem::exists(dir + "/s1/summary.csv"));
  ASSERT_EQ(sh(base + " --shard 0/2 -o " + dir + "/s0"), 0) << read(dir + ".log");
  // A missing shard is refused, naming it.
  EXPECT_EQ(sh(fmt::format("{} eval merge {}/s0 -o {}/m", KVSLIM_CLI, dir, dir)), 1);
  EXPECT_NE(read(dir + ".log").find("shards 1 of 2 are missing"), std::string::npos) << read(dir + ".log");
  ASSERT_EQ(sh(fmt::format("{} eval merge {}/s0 {}/s1 --no-plot -o {}/m", KVSLIM_CLI, dir, dir, dir)), 0)
      << read(dir + ".log");
  EXPECT_EQ(comparable(read(dir + "/m/samples.jsonl")), comparable(one));
  EXPECT_EQ(read(dir + "/m/summary.csv"), read(dir + "/one/summary.csv"));
  EXPECT_EQ(sh(base + " --shard 2/2 -o " + dir + "/bad"), 1);
  EXPECT_NE(read(dir + ".log").find("shard '2/2'"), std::string::npos);
#if defined(KVSLIM_TEST_MPIRUN)
  // Root in containers needs --allow-run-as-root; two ranks on a small machine need --oversubscribe.
  ASSERT_EQ(sh(fmt::format("{} --allow-run-as-root --oversubscribe -n 2 {} -o {}/mpi", KVSLIM_TEST_MPIRUN, base, dir)),
            0)
      << read(dir + ".log");
  EXPECT_EQ(comparable(read(dir + "/mpi/samples.jsonl")), comparable(one));
  EXPECT_EQ(read(dir + "/mpi/summary.csv"), read(dir + "/one/summary.csv"));
  const auto mi = nlohmann::json::parse(read(dir + "/mpi/samples.jsonl").substr(0, read(dir + "/mpi/samples.jsonl").find('\n')));
  EXPECT_EQ(mi["merged_from"].size(), 2u);
#endif
  std::filesystem::remove_all(dir);
  std::filesystem::remove(dir + ".log");
}

// Regression: the fidelity intervals reached below 0 for KL and above 1 for top-1 agreement.
TEST(EvalStats, FidelityIntervalsStayInTheMetricsRange) {
  std::vector<FidelityRecord> recs(2);
  for (int i = 0; i < 2; ++i) {
    recs[i].press_spec = "knorm";
    recs[i].ratio = 0.5;
    recs[i].sample = i;
  }
  recs[0].outcome.metrics = FidelityAccumulator::from_sums(10, 10, 0.0, 0.0, 5.0, 5.0);
  recs[1].outcome.metrics = FidelityAccumulator::from_sums(10, 5, 1.0, 0.3, 5.0, 6.0);
  const auto s = summarize(recs);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_DOUBLE_EQ(s[0].metrics.mean_kl(), 0.05);
  EXPECT_EQ(s[0].kl_ci.low, 0.0);
  // Half width t(1) * sd / sqrt(2) with sd of {0, 0.1} = 0.1 / sqrt(2): 12.706 * 0.05.
  EXPECT_NEAR(s[0].kl_ci.high, 0.05 + 12.706 * 0.05, 1e-12);
  EXPECT_EQ(s[0].top1_ci.high, 1.0);
  EXPECT_GE(s[0].ppl_ci.low, 1.0);
}

// Regression: one sample gave a zero-width interval [x, x], which reads as certainty. One value
// has no spread: the interval is undefined (NaN; JSON null, "n/a" in the CLI table).
TEST(EvalStats, OneSampleHasNoInterval) {
  std::vector<FidelityRecord> recs(1);
  recs[0].press_spec = "knorm";
  recs[0].ratio = 0.5;
  recs[0].outcome.metrics = FidelityAccumulator::from_sums(10, 5, 1.0, 0.3, 5.0, 6.0);
  const auto s = summarize(recs);
  ASSERT_EQ(s.size(), 1u);
  for (const Interval& i : {s[0].kl_ci, s[0].top1_ci, s[0].ppl_ci}) {
    EXPECT_TRUE(std::isnan(i.low));
    EXPECT_TRUE(std::isnan(i.high));
  }
  EXPECT_TRUE(std::isnan(t_interval({0.25}, 0.25).low));
}
