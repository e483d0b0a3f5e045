// Evaluation harness end to end: piece-wise tokenization with a real vocabulary, fidelity and
// task runs on the bundled story model (which cannot retrieve, but exercises every step), a small
// sweep on the retrieval model (skipped until models/retrieval.gguf exists), and the CLI.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "kvslim/eval.h"
#include "eval/report.h"
#include "kvslim/model.h"
#include "model/session.h"

using namespace kvslim;

namespace {

const std::string kStories = std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf";
const std::string kRetrieval = std::string(KVSLIM_SOURCE_DIR) + "/models/retrieval.gguf";
const std::string kRetrievalText = std::string(KVSLIM_SOURCE_DIR) + "/models/retrieval.tasks.json";

const Model& stories() {
  static std::unique_ptr<Model> m = Model::load(kStories);
  return *m;
}

std::string pieces(const Tokenizer& tok, const std::vector<Token>& t, size_t b, size_t e) {
  std::string s;
  for (size_t i = b; i < e; ++i) s += tok.piece(t[i]);
  return s;
}

std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

TEST(EvalE2E, PiecewiseTokenizationKeepsTheNeedleSpan) {
  const Tokenizer& tok = stories().tokenizer();
  PieceEncoder enc(tok);
  ASSERT_TRUE(enc.adds_space_prefix());  // the story model's SentencePiece vocabulary
  const TaskText text = TaskText::defaults();
  const TaskSample s = make_niah(text, 400, 0.5, 3, [&](const std::string& p) { return enc.count(p); });
  const TokenizedSample t = tokenize_sample(s, enc, tok);
  ASSERT_GE(t.context.size(), 2u);
  EXPECT_EQ(t.context[0], tok.bos());
  EXPECT_EQ(std::count(t.context.begin(), t.context.end(), tok.bos()), 1);
  EXPECT_LE(t.context.size(), 400u);
  // The pieces read as one text: decoding the context gives the sample's text back.
  EXPECT_EQ(tok.decode(std::vector<Token>(t.context.begin() + 1, t.context.end())), s.context_text());
  ASSERT_EQ(t.needle_spans.size(), 1u);
  const auto [b, e] = t.needle_spans[0];
  EXPECT_EQ(pieces(tok, t.context, b, e), " " + s.needles[0]);
  EXPECT_EQ(pieces(tok, t.question, 0, t.question.size()), s.question);
  // Depth measured in tokens: within one filler sentence of the request.
  size_t longest = 0;
  for (const auto& f : text.filler) longest = std::max(longest, enc.count(" " + f));
  const double hay = double(t.context.size() - 1 - (e - b));
  EXPECT_NEAR(t.needle_depths[0], 0.5, longest / hay);
}

TEST(EvalE2E, FidelityOfTheFullCacheIsExactAndPerplexityMatchesOneBatch) {
  const Model& m = stories();
  RunOptions opt;
  std::vector<Token> text = sample_text(m, 127, 42, opt.session);
  ASSERT_EQ(text.size(), 127u);
  EXPECT_EQ(text, sample_text(m, 127, 42, opt.session));  // seeded
  std::vector<Token> prefix{m.tokenizer().bos()};
  prefix.insert(prefix.end(), text.begin(), text.begin() + 95);
  std::vector<Token> cont(text.begin() + 95, text.end());
  const FidelityReference ref = fidelity_reference(m, prefix, cont, opt);
  ASSERT_EQ(ref.logits.size(), (cont.size() - 1) * size_t(m.hparams().n_vocab));

  auto none = make_press("none", 0.0);
  const FidelityOutcome full = run_fidelity(m, *none, ref, opt);
  EXPECT_EQ(full.metrics.tokens(), cont.size() - 1);
  EXPECT_EQ(full.metrics.mean_kl(), 0.0);
  EXPECT_EQ(full.metrics.top1_agreement(), 1.0);
  EXPECT_EQ(full.metrics.perplexity_full(), full.metrics.perplexity_compressed());
  EXPECT_EQ(full.cache.entries_kept, full.cache.entries_total);

  // Independent perplexity: one batched forward over prefix + continuation, softmax in float64.
  Session s(m, opt.session);
  std::vector<Token> all = prefix;
  all.insert(all.end(), cont.begin(), cont.end() - 1);
  std::vector<float> logits = s.forward(all, true);
  const size_t V = m.hparams().n_vocab;
  double nll = 0;
  for (size_t i = 0; i + 1 < cont.size(); ++i) {
    const float* l = logits.data() + (prefix.size() + i) * V;
    double z = 0;
    for (size_t v = 0; v < V; ++v) z += std::exp(double(l[v]));
    nll += -std::log(std::exp(double(l[cont[i + 1]])) / z);
  }
  const double ppl = std::exp(nll / (cont.size() - 1));
  EXPECT_NEAR(full.metrics.perplexity_full(), ppl, 1e-3 * ppl);

  auto sl = make_press("streaming_llm", 0.5);
  const FidelityOutcome half = run_fidelity(m, *sl, ref, opt);
  EXPECT_TRUE(half.cache.as_configured);
  EXPECT_EQ(half.cache.entries_kept, size_t(48) * m.hparams().n_layer * m.hparams().n_head_kv);  // floor(96 / 2)
  EXPECT_GT(half.metrics.mean_kl(), 0.0);
  EXPECT_EQ(half.metrics.perplexity_full(), full.metrics.perplexity_full());

  // Regression: the end-of-run reference (a full f16 cache) was sized by the next position, which
  // key re-rotation moves down (and RestoreKV's restore entries up): it is the tokens run, 95 + 1
  // of the prefix and 31 of the continuation, at 720 B each (5 layers x 4 KV heads x 36 B).
  EXPECT_EQ(full.end.full_f16_bytes, size_t(127) * 720);
  auto rr = make_press("key_rerotation(snapkv)", 0.5);
  const FidelityOutcome rot = run_fidelity(m, *rr, ref, opt);
  EXPECT_EQ(rot.end.full_f16_bytes, size_t(127) * 720);
  EXPECT_EQ(rot.end.entries, size_t(48 + 31) * 20);
}

// Regression: the fidelity reference used the run's own cache options, so a quantized cache was
// compared with itself (KL 0). The reference is the full-precision cache: a KIVI-4 or q4_0 cache
// with no press now shows its own error, and the reference equals the f16 cache's logits exactly.
TEST(EvalE2E, QuantizedCacheFidelityIsMeasuredAgainstFullPrecision) {
  const Model& m = stories();
  RunOptions f16;
  std::vector<Token> text = sample_text(m, 96, 7, f16.session);
  std::vector<Token> prefix{m.tokenizer().bos()};
  prefix.insert(prefix.end(), text.begin(), text.begin() + 64);
  std::vector<Token> cont(text.begin() + 64, text.end());
  const FidelityReference ref16 = fidelity_reference(m, prefix, cont, f16);
  auto none = make_press("none", 0.0);
  RunOptions kivi = f16;
  kivi.session.kv_quant.kivi_bits = 4;
  kivi.session.kv_quant.kivi_group = 16;
  kivi.session.kv_quant.kivi_residual = 16;
  RunOptions q4 = f16;
  q4.session.key_codec = q4.session.value_codec = KVCodec::Q4_0;
  for (const RunOptions* opt : {&kivi, &q4}) {
    const FidelityReference ref = fidelity_reference(m, prefix, cont, *opt);
    EXPECT_EQ(ref.logits, ref16.logits);
    const FidelityOutcome out = run_fidelity(m, *none, ref, *opt);
    EXPECT_GT(out.metrics.mean_kl(), 1e-6);
    EXPECT_LT(out.metrics.mean_kl(), 1.0);
    EXPECT_EQ(out.cache.entries_kept, out.cache.entries_total);
  }
}

// Regression: a sweep sampled its texts with the measured cache, so the same seed gave different
// texts (full-cache perplexity 3.90 / 4.34 / 4.25 for f16 / KIVI-4 / q8_0): the tables could not
// be compared row by row. Texts and references now come from the full-precision cache.
TEST(EvalE2E, FidelitySweepTextsDoNotDependOnTheCacheType) {
  FidelitySweep sw;
  sw.context_tokens = 48;
  sw.continuation_tokens = 8;
  sw.samples = 2;
  auto full_ppl = [&](const SessionOptions& so) {
    FidelitySweep s = sw;
    s.run.session = so;
    std::vector<double> ppl;
    run_fidelity_sweep(stories(), {{"none", 0.0}}, s,
                       [&](const FidelityRecord& r) { ppl.push_back(r.outcome.metrics.perplexity_full()); });
    return ppl;
  };
  SessionOptions q8;
  q8.key_codec = q8.value_codec = KVCodec::Q8_0;
  SessionOptions kivi;
  kivi.kv_quant.kivi_bits = 4;
  const std::vector<double> f16 = full_ppl({});
  ASSERT_EQ(f16.size(), 2u);
  EXPECT_EQ(full_ppl(q8), f16);
  EXPECT_EQ(full_ppl(kivi), f16);
}

TEST(EvalE2E, FidelitySweepRecordsEveryRun) {
  FidelitySweep sw;
  sw.context_tokens = 64;
  sw.continuation_tokens = 16;
  sw.samples = 2;
  sw.lmba_window = 4;
  auto runs = expand_runs({"streaming_llm", "knorm"}, {0.5, 0.75}, true);
  std::vector<FidelityRecord> recs;
  std::vector<AttentionStats> stats;
  run_fidelity_sweep(stories(), runs, sw, [&](const FidelityRecord& r) { recs.push_back(r); },
                     [&](int, const AttentionStats& s) { stats.push_back(s); });
  ASSERT_EQ(recs.size(), 2 * runs.size());
  ASSERT_EQ(stats.size(), 2u);
  const HParams& hp = stories().hparams();
  ASSERT_EQ(stats[0].lmba.size(), size_t(hp.n_layer));
  for (double l : stats[0].lmba) {
    EXPECT_GE(l, 1.0);
    EXPECT_LE(l, 64.0);
  }
  for (const auto& r : recs) {
    EXPECT_EQ(r.outcome.metrics.tokens(), 15u);
    EXPECT_EQ(r.outcome.cache.context_tokens, 64);
    EXPECT_TRUE(r.outcome.cache.as_configured) << r.press;
    EXPECT_NEAR(r.outcome.cache.compression_ratio(), r.ratio, 1.0 / 64);
  }
  auto sum = summarize(recs);
  ASSERT_EQ(sum.size(), runs.size());
  EXPECT_EQ(sum[0].samples, 2);
  // Text given: consecutive windows of it; too short a text is an error naming the sizes.
  sw.text = sample_text(stories(), 200, 5, {});
  recs.clear();
  run_fidelity_sweep(stories(), {{"none", 0.0}}, sw, [&](const FidelityRecord& r) { recs.push_back(r); });
  EXPECT_EQ(recs.size(), 2u);
  sw.text.resize(50);
  EXPECT_THROW(run_fidelity_sweep(stories(), {{"none", 0.0}}, sw, [](const FidelityRecord&) {}), Error);
}

TEST(EvalE2E, TaskRunChecksTheCacheAndTheNeedle) {
  const Model& m = stories();
  const Tokenizer& tok = m.tokenizer();
  PieceEncoder enc(tok);
  const TaskSample s = make_niah(TaskText::defaults(), 512, 0.5, 8, [&](const std::string& p) { return enc.count(p); });
  const TokenizedSample t = tokenize_sample(s, enc, tok);
  const size_t n = t.context.size(), L = m.hparams().n_layer, H = m.hparams().n_head_kv;
  RunOptions opt;
  auto none = make_press("none", 0.0);
  const TaskOutcome full = run_task(m, *none, s, t, "\n", opt);
  EXPECT_EQ(full.cache.entries_total, n * L * H);
  EXPECT_EQ(full.cache.entries_kept, n * L * H);
  EXPECT_EQ(full.cache.needle_kept, std::vector<double>{1.0});
  EXPECT_LE(full.generated_tokens, s.n_predict);
  EXPECT_TRUE(full.score == 0.0 || full.score == 1.0);
  // StreamingLLM at 0.75 keeps 4 sinks and the newest quarter: a needle in the middle is gone.
  auto sl = make_press("streaming_llm", 0.75);
  const TaskOutcome cut = run_task(m, *sl, s, t, "\n", opt);
  EXPECT_EQ(cut.cache.entries_kept, size_t(n / 4) * L * H);
  EXPECT_TRUE(cut.cache.as_configured);
  EXPECT_EQ(cut.cache.needle_kept, std::vector<double>{0.0});
  // Same sample, same greedy decoding: reruns agree.
  EXPECT_EQ(run_task(m, *none, s, t, "\n", opt).answer, full.answer);
  // A sample longer than the context size is refused.
  RunOptions tiny;
  tiny.session.n_ctx = 64;
  EXPECT_THROW(run_task(m, *none, s, t, "\n", tiny), Error);
}

// The acceptance check of a retrieval evaluation: on a model that can retrieve, the full cache answers and a press
// that evicts the needle's entries scores lower. Needs models/retrieval.gguf (built by
// tools/retrieval_model/make_retrieval_model.py) and its task text models/retrieval.tasks.json (see models/RETRIEVAL.md).
TEST(EvalE2E, RetrievalModelSweepFullCacheRetrievesAndEvictionLosesTheNeedle) {
  struct stat st;
  if (stat(kRetrieval.c_str(), &st) != 0) GTEST_SKIP() << kRetrieval << " does not exist yet";
  auto model = Model::load(kRetrieval);
  TaskSweep sw;
  sw.tasks = {"niah"};
  sw.lengths = {256, 512};
  sw.depths = {0.25, 0.75};
  sw.samples = 1;
  sw.seed = 99;
  sw.text = TaskText::from_json_file(kRetrievalText);
  auto runs = expand_runs({"streaming_llm"}, {0.9}, true);
  std::vector<TaskRecord> recs;
  run_task_sweep(*model, runs, sw, [&](const TaskRecord& r) { recs.push_back(r); });
  ASSERT_EQ(recs.size(), 2u * 2 * 1 * 2);
  auto sum = summarize(recs, false);
  ASSERT_EQ(sum.size(), 2u);
  ASSERT_EQ(sum[0].press_spec, "none");
  EXPECT_GE(sum[0].score, 0.95) << "full-cache accuracy";
  EXPECT_DOUBLE_EQ(sum[0].needle_kept, 1.0);
  // 4 sinks + the newest 10%: every needle here (depth <= 0.75) is evicted, in every segment.
  EXPECT_DOUBLE_EQ(sum[1].needle_kept, 0.0);
  EXPECT_LT(sum[1].score, sum[0].score - 0.5) << "streaming_llm at 0.9 should lose the needle";
  for (const auto& r : recs) {
    EXPECT_TRUE(r.outcome.cache.as_configured) << r.press << " " << r.length;
    EXPECT_NEAR(r.measured_depth, r.depth, 0.1);
  }
}

// A full cache holds every token run through the model: at the end of a run its entries are
// (context + question + generated - 1) x layers x KV heads (the last sampled token is never run)
// and its memory ratio is exactly 1, however the answer ended. The retrieval model answers the
// vt, cwe and fwe tasks with a token or two and then end-of-generation, a token the answer
// callback never sees: it was left out of the count, and the full cache read 1.002
// (`kvslim eval ruler --tasks vt`: 1322 entries against 1320).
TEST(EvalE2E, FullCacheEndsAtMemoryRatioOneWhenTheAnswerStopsAtEndOfGeneration) {
  struct stat st;
  if (stat(kRetrieval.c_str(), &st) != 0) GTEST_SKIP() << kRetrieval << " does not exist yet";
  auto model = Model::load(kRetrieval);
  const size_t LH = size_t(model->hparams().n_layer) * model->hparams().n_head_kv;
  TaskSweep sw;
  sw.tasks = {"vt", "cwe", "fwe", "niah_single"};
  sw.lengths = {512};
  sw.samples = 1;
  sw.seed = 1;
  sw.text = TaskText::from_json_file(kRetrievalText);
  std::vector<TaskRecord> recs;
  run_task_sweep(*model, expand_runs({}, {}, true), sw, [&](const TaskRecord& r) { recs.push_back(r); });
  ASSERT_EQ(recs.size(), 4u);
  int ended_early = 0;  // answers that stopped at end-of-generation, well before the task's n_predict (>= 24)
  for (const TaskRecord& r : recs) {
    const TaskOutcome& o = r.outcome;
    const size_t run = o.cache.context_tokens + o.question_tokens + o.generated_tokens - 1;
    EXPECT_EQ(o.end.tokens, int(run)) << r.task;
    EXPECT_EQ(o.end.entries, run * LH) << r.task;
    EXPECT_EQ(o.end.entries_total, run * LH) << r.task;
    EXPECT_EQ(o.end.kv_bytes, o.end.full_f16_bytes) << r.task;
    EXPECT_EQ(o.end.memory_ratio(), 1.0) << r.task;
    ended_early += o.generated_tokens < 8;
  }
  EXPECT_GE(ended_early, 1) << "no answer ended at end-of-generation: the case this test is for did not occur";
}

TEST(EvalE2E, CliWritesResultsAndPlots) {
  const std::string dir = ::testing::TempDir() + "kvslim_eval_cli_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const std::string base = fmt::format("{} eval niah -m {} --lengths 96,160 --depths 0,1 --samples 1 --press "
                                       "streaming_llm --ratios 0.5 --no-progress -o {}",
                                       KVSLIM_CLI, kStories, dir);
  ASSERT_EQ(std::system((base + " > " + dir + ".log 2>&1").c_str()), 0) << read(dir + ".log");
  const std::string jsonl = read(dir + "/samples.jsonl");
  EXPECT_EQ(std::count(jsonl.begin(), jsonl.end(), '\n'), 1 + 2 * 2 * 2);  // the run line, lengths x depths x runs
  EXPECT_NE(read(dir + "/summary.csv").find("niah,streaming_llm,0.5"), std::string::npos);
  EXPECT_NE(read(dir + ".log").find("streaming_llm"), std::string::npos);
  if (!find_gnuplot().empty()) {
    EXPECT_TRUE(std::filesystem::exists(dir + "/score_vs_ratio.svg"));
    EXPECT_TRUE(std::filesystem::exists(dir + "/score_vs_memory.svg"));
    EXPECT_TRUE(std::filesystem::exists(dir + "/niah_streaming_llm_0.50.svg"));
    EXPECT_TRUE(std::filesystem::exists(dir + "/needle_kept_streaming_llm_0.50.svg"));
  }
  // Without gnuplot on PATH: a warning, results still written, exit 0.
  std::filesystem::remove_all(dir);
  ASSERT_EQ(std::system(("PATH=/nonexistent " + base + " > " + dir + ".log 2>&1").c_str()), 0) << read(dir + ".log");
  EXPECT_NE(read(dir + ".log").find("warning: gnuplot is not on PATH"), std::string::npos) << read(dir + ".log");
  EXPECT_TRUE(std::filesystem::exists(dir + "/samples.csv"));
  // Bad input: one line naming the value, exit 1.
  const std::string bad = fmt::format("{} eval ruler -m {} --press no_such_press -o {} > {}.log 2>&1", KVSLIM_CLI,
                                      kStories, dir, dir);
  EXPECT_EQ(WEXITSTATUS(std::system(bad.c_str())), 1);
  EXPECT_NE(read(dir + ".log").find("no_such_press"), std::string::npos);
  const std::string bad_task = fmt::format("{} eval ruler -m {} --tasks nonsense -o {} > {}.log 2>&1", KVSLIM_CLI,
                                           kStories, dir, dir);
  EXPECT_EQ(WEXITSTATUS(std::system(bad_task.c_str())), 1);
  EXPECT_NE(read(dir + ".log").find("nonsense"), std::string::npos);
  std::filesystem::remove_all(dir);
  std::filesystem::remove(dir + ".log");
}

// Compress once, answer from the loaded bytes: every record of a NIAH sweep answered from stored
// contexts (written and read back) equals the in-memory sweep's, press by press, and the needle
// is found where the full cache finds it. A press that keeps decode state is refused.
TEST(EvalE2E, TaskSweepFromStoredContextsEqualsInMemory) {
  struct stat st;
  if (stat(kRetrieval.c_str(), &st) != 0) GTEST_SKIP() << kRetrieval << " does not exist yet";
  auto model = Model::load(kRetrieval);
  TaskSweep sw;
  sw.tasks = {"niah"};
  sw.lengths = {512};
  sw.depths = {0.25, 0.75};
  sw.samples = 1;
  sw.seed = 7;
  sw.text = TaskText::from_json_file(kRetrievalText);
  sw.run.session.key_codec = sw.run.session.value_codec = KVCodec::Q8_0;
  auto runs = expand_runs({"adakv(snapkv)", "kvzip"}, {0.75}, true);
  auto sweep = [&](bool stored) {
    sw.run.stored_context = stored;
    std::vector<TaskRecord> recs;
    run_task_sweep(*model, runs, sw, [&](const TaskRecord& r) { recs.push_back(r); });
    return recs;
  };
  const auto memory = sweep(false), stored = sweep(true);
  ASSERT_EQ(memory.size(), 3u * 2);
  ASSERT_EQ(stored.size(), memory.size());
  for (size_t i = 0; i < memory.size(); ++i) {
    SCOPED_TRACE(memory[i].press + " depth " + std::to_string(memory[i].depth));
    EXPECT_EQ(stored[i].press, memory[i].press);
    EXPECT_EQ(stored[i].outcome.answer, memory[i].outcome.answer);
    EXPECT_EQ(stored[i].outcome.score, memory[i].outcome.score);
    EXPECT_EQ(stored[i].outcome.cache.entries_kept, memory[i].outcome.cache.entries_kept);
    EXPECT_EQ(stored[i].outcome.end.entries, memory[i].outcome.end.entries);
  }
  // The full cache retrieves: the comparison is not one of empty answers.
  for (const TaskRecord& r : memory) {
    if (r.press == "none") {
      EXPECT_EQ(r.outcome.score, 1.0);
    }
  }
  runs = expand_runs({"h2o"}, {0.5}, false);
  EXPECT_THROW(sweep(true), Error);
}
