// `kvslim eval fidelity|niah|ruler|merge`: sweeps of presses x compression ratios x samples, split
// over MPI ranks or --shard jobs, written as JSON lines and CSV, summarized on stdout and plotted
// with gnuplot (the library writes the files; this file parses flags and prints).
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "cli/cache_options.h"
#include "cli/flag_names.h"
#include "cli/commands.h"
#include "cli/context_size.h"
#include "cli/options.h"
#include "cli/progress.h"
#include "cli/mpi.h"
#include "kvslim/eval.h"
#include "kvslim/eval_results.h"
#include "tools/tools.h"

namespace kvslim::cli {

namespace {

struct CommonArgs {
  std::string model;
  ModelLoadOptions load;  // --rope-* / --yarn-* over the file's RoPE settings
  std::vector<std::string> presses{"streaming_llm", "knorm", "snapkv"};
  std::vector<double> ratios{0.5, 0.75, 0.9};
  bool no_baseline = false;
  int samples = 0;  // 0: the subcommand's default
  uint64_t seed = 1234;
  std::string out;
  std::string plot_format = "svg";
  bool no_plot = false, no_progress = false;
  int threads = 0, ctx = 0, chunk_size = 0;
  std::string json;
  std::string cache_type_k = "f16", cache_type_v = "f16";
  KVQuantOptions kv_quant;
  std::string shard;  ///< "I/N" or empty
};

struct FidelityArgs : CommonArgs {
  std::string text_file;
  int context_tokens = 256, continuation_tokens = 128;
  int lmba_window = 0;
  double lmba_tau = 0.9;
};

struct TaskArgs : CommonArgs {
  std::vector<std::string> tasks;
  std::vector<int> lengths;
  std::vector<double> depths;
  std::string text_config;
  int n_predict = 0;
  RulerOptions ruler;
  bool stored_context = false;
};

void add_common(CLI::App* sub, CommonArgs& a, const std::string& default_out, int default_samples) {
  a.out = default_out;
  a.samples = default_samples;
  add_model_option(sub, a.model, a.load);
  sub->add_option("--press", a.presses, "press specs NAME[:key=value,...] (repeat or space-separate)")
      ->capture_default_str();
  sub->add_option("--ratios", a.ratios, "compression ratios (fractions of context entries removed), in [0, 1)")
      ->delimiter(',')->capture_default_str();
  sub->add_flag("--no-baseline", a.no_baseline, "do not run the full cache (press none) as a baseline");
  sub->add_option("--samples", a.samples, "samples per configuration")->capture_default_str()->check(int_at_least(1));
  sub->add_option("-s,--seed", a.seed, "seed of the sample generators")->capture_default_str();
  sub->add_option("-o,--out", a.out, "output directory (samples.jsonl, samples.csv, summary.csv, plots)")
      ->capture_default_str();
  sub->add_option("--plot-format", a.plot_format, "svg or png")->capture_default_str();
  sub->add_flag("--no-plot", a.no_plot, "skip the gnuplot plots");
  add_no_progress_flag(sub, a.no_progress);
  add_threads_option(sub, a.threads);
  add_json_option(sub, a.json);
  sub->add_option("-c,--ctx-size", a.ctx, "context size in tokens (0 = the model's)")->capture_default_str()
      ->check(int_at_least(0));
  sub->add_option("--chunk-size", a.chunk_size, "compress after every chunk of this many context tokens (0 = once)")
      ->capture_default_str()->check(int_at_least(0));
  add_cache_options(sub, a.cache_type_k, a.cache_type_v, a.kv_quant);
  sub->add_option("--shard", a.shard,
                  "run part I of N of the sweep (0 <= I < N) and write its samples only; join the parts with "
                  "`kvslim eval merge`");
}

RunOptions run_options(const CommonArgs& a) {
  RunOptions r;
  r.session.n_ctx = a.ctx;
  r.session.key_codec = parse_codec(a.cache_type_k);
  r.session.value_codec = parse_codec(a.cache_type_v);
  r.session.kv_quant = a.kv_quant;
  r.chunk_size = a.chunk_size;
  return r;
}

/// How this process takes part in a sweep: alone, as one --shard job, or as one MPI rank.
struct Part {
  Shard shard;
  bool mpi = false;
  bool whole() const { return mpi || shard.count == 1; }  // this process writes summaries and plots
};

Part part_of(const CommonArgs& a, const MpiWorld& mpi) {
  Part p;
  if (!a.shard.empty()) p.shard = parse_shard(a.shard);
  if (mpi.size() > 1) {
    if (!a.shard.empty())
      throw Error(fmt::format("--shard {} with {} MPI ranks: give one or the other", a.shard, mpi.size()));
    p.shard = {mpi.rank(), mpi.size()};
    p.mpi = true;
  }
  return p;
}

/// samples.jsonl of a process running alone, appended and flushed as records come, so an
/// interrupted sweep keeps what it finished; rewritten in full at the end.
class LiveSamples {
 public:
  LiveSamples(const std::string& dir, const RunInfo& info, bool on) {
    if (!on) return;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw Error(fmt::format("{}: cannot create the output directory ({})", dir, ec.message()));
    const std::string path = (std::filesystem::path(dir) / "samples.jsonl").string();
    f_.open(path, std::ios::binary);
    if (!f_) throw Error(fmt::format("{}: cannot write", path));
    f_ << to_json(info).dump() << "\n" << std::flush;
  }
  void add(const nlohmann::json& j) {
    if (f_.is_open()) f_ << j.dump() << "\n" << std::flush;
  }
  void close() {
    if (f_.is_open()) f_.close();
  }

 private:
  std::ofstream f_;
};

/// Gathers every rank's results on rank 0 and merges them. Returns false on the other ranks.
bool gather(const MpiWorld& mpi, SweepResults& res) {
  if (mpi.size() == 1) return true;
  std::vector<std::string> parts = mpi.gather(results_jsonl(res));
  if (mpi.rank() != 0) return false;
  std::vector<SweepResults> rs;
  std::vector<std::string> names;
  for (size_t i = 0; i < parts.size(); ++i) {
    names.push_back(fmt::format("MPI rank {}", i));
    rs.push_back(parse_results(parts[i], names.back()));
  }
  res = merge_results(rs, names);
  return true;
}

void print_warnings(const ResultsReport& rep) {
  for (const auto& w : rep.warnings) fmt::print(stderr, "warning: {}\n", w);
  if (!rep.plot_problem.empty()) fmt::print(stderr, "warning: {}\n", rep.plot_problem);
}

std::string ci(const Interval& i) {
  if (std::isnan(i.low)) return "n/a (1 sample)";
  return fmt::format("[{:.3g}, {:.3g}]", i.low, i.high);
}

std::string samples_text(int n) { return fmt::format("{} sample{}", n, n == 1 ? "" : "s"); }

void print_fidelity(const SweepResults& res, const ResultsReport& rep, const std::string& out) {
  int n = rep.fidelity.empty() ? 0 : rep.fidelity.front().samples;
  int ctx = res.fidelity.empty() ? 0 : res.fidelity[0].outcome.cache.context_tokens;
  int cont = res.fidelity.empty() ? 0 : static_cast<int>(res.fidelity[0].outcome.metrics.tokens()) + 1;
  fmt::print("fidelity of {} ({}: {} context + {} teacher-forced tokens)\n", res.info.model, samples_text(n), ctx, cont);
  fmt::print("{:<32} {:>6} {:>10} {:>21} {:>8} {:>9} {:>9} {:>7} {:>7}\n", "press", "ratio", "KL(nats)", "KL 95% CI",
             "top-1", "ppl full", "ppl comp", "comp.r", "mem.r");
  for (const auto& s : rep.fidelity) {
    const auto& m = s.metrics;
    fmt::print("{:<32} {:>6.4g} {:>10.4g} {:>21} {:>8.4f} {:>9.3f} {:>9.3f} {:>7.3f} {:>7.3f}\n", s.press_spec, s.ratio,
               m.mean_kl(), ci(s.kl_ci), m.top1_agreement(), m.perplexity_full(), m.perplexity_compressed(),
               s.compression_ratio, s.memory_ratio);
  }
  fmt::print("(comp.r: fraction of the context's entries removed, mem.r: cache bytes / full f16 cache bytes; both "
             "measured at the end of each run)\n");
  if (!rep.lmba.empty()) {
    std::string lm;
    for (size_t l = 0; l < rep.lmba.size(); ++l) lm += fmt::format("{}{:.1f}", l ? " " : "", rep.lmba[l]);
    const AttentionStats& s0 = res.stats.front().second;
    fmt::print("LMBA per layer (entries for {:.0f}% of the attention of the last {} queries, mean of {}): {}\n",
               100 * s0.tau, s0.window, samples_text(static_cast<int>(res.stats.size())), lm);
  }
  fmt::print("results: {0}/samples.jsonl, {0}/samples.csv, {0}/summary.csv, {0}/summary.json\n", out);
}

void print_tasks(const SweepResults& res, const ResultsReport& rep, const std::string& out) {
  std::set<int> lengths;
  for (const auto& r : res.tasks) lengths.insert(r.length);
  fmt::print("{} on {} (lengths", res.info.kind == "niah" ? "needle in a haystack" : "RULER-style tasks",
             res.info.model);
  for (int l : lengths) fmt::print(" {}", l);
  fmt::print(")\n{:<16} {:<32} {:>6} {:>6} {:>15} {:>7} {:>7} {:>7} {:>6}\n", "task", "press", "ratio", "score",
             "95% CI", "comp.r", "mem.r", "needle", "n");
  for (const auto& s : rep.task_coarse)
    fmt::print("{:<16} {:<32} {:>6.4g} {:>6.3f} {:>15} {:>7.3f} {:>7.3f} {:>7.3f} {:>6}\n", s.task, s.press_spec,
               s.ratio, s.score, fmt::format("[{:.2f}, {:.2f}]", s.score_ci.low, s.score_ci.high), s.compression_ratio,
               s.memory_ratio, s.needle_kept, s.n);
  fmt::print("(score: mean string-match score, 95% Wilson interval; comp.r: fraction of the context's entries "
             "removed and mem.r: cache bytes / full f16 cache bytes, both measured at the end of each run; needle: "
             "mean fraction of the needle's entries kept, smallest needle of each sample)\n");
  fmt::print("results: {0}/samples.jsonl, {0}/samples.csv, {0}/summary.csv, {0}/summary.json\n", out);
}

/// Writes what this process holds: the whole sweep's files, or one shard's samples.
int report(const CommonArgs& a, const Part& part, const SweepResults& res) {
  ResultsOptions o;
  o.dir = a.out;
  o.plot_format = a.plot_format;
  o.plots = !a.no_plot;
  o.summaries = part.whole();
  const ResultsReport rep = write_results(res, o);
  if (!part.whole()) {
    fmt::print("shard {}/{}: {} of {} runs written to {}/samples.jsonl; join the shards with `kvslim eval merge "
               "DIR... -o OUT`\n",
               part.shard.index, part.shard.count, res.tasks.size() + res.fidelity.size(), res.info.units, a.out);
    return 0;
  }
  if (res.info.kind == "fidelity")
    print_fidelity(res, rep, a.out);
  else
    print_tasks(res, rep, a.out);
  if (o.plots && rep.plot_problem.empty()) fmt::print("plots: {}/*.{}\n", a.out, a.plot_format);
  print_warnings(rep);
  return 0;
}

/// report(), and the --json summary: summary.json of the sweep (or, for one shard, what it wrote).
int finish(const CommonArgs& a, const Part& part, const SweepResults& res) {
  int rc;
  {
    StdoutToStderr report_to_stderr(a.json == "-");  // stdout holds only the JSON then
    rc = report(a, part, res);
  }
  if (a.json.empty()) return rc;
  nlohmann::ordered_json j = {{"command", "eval " + res.info.kind}, {"out", a.out}};
  if (part.whole()) {
    const std::string path = (std::filesystem::path(a.out) / "summary.json").string();
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(fmt::format("{}: cannot read the summary for --json", path));
    j["summary"] = nlohmann::ordered_json::parse(f);
  } else {
    j["shard"] = fmt::format("{}/{}", part.shard.index, part.shard.count);
    j["runs_written"] = res.tasks.size() + res.fidelity.size();
    j["runs_in_sweep"] = res.info.units;
  }
  write_json(a.json, j);
  return rc;
}

/// Runs `body` on every rank; an error on one rank ends all of them.
int on_all_ranks(const MpiWorld& mpi, const std::function<int()>& body) {
  if (mpi.size() == 1) return body();
  try {
    return body();
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: MPI rank {}: {}\n", mpi.rank(), flags_in(e.what()));
    std::fflush(stderr);
    mpi.abort(1);
  }
}

/// What every sweep command sets up before it runs: the checks, this process's part, the runs, the
/// model, and the results' provenance (kind, shard; each command adds the sweep's configuration).
struct Sweep {
  Part part;
  std::vector<PressRun> runs;
  std::unique_ptr<Model> model;
  SweepResults res;
};

Sweep start_sweep(const CommonArgs& a, const MpiWorld& mpi, const std::string& kind) {
  check_plot_format(a.plot_format);
  Sweep s;
  s.part = part_of(a, mpi);
  s.runs = expand_runs(a.presses, a.ratios, !a.no_baseline);
  if (mpi.rank() == 0) check_json_output(a.json);
  apply_threads(a.threads);
  s.model = Model::load(a.model, a.load);
  if (mpi.rank() == 0) warn_context_size(*s.model, a.ctx);
  s.res.info = make_run_info(kind, a.model);
  s.res.info.shard_index = s.part.shard.index;
  s.res.info.shard_count = s.part.shard.count;
  return s;
}

/// After the records are in: rank 0 gathers every rank's, then the files and the report.
int end_sweep(const CommonArgs& a, const MpiWorld& mpi, Sweep& s) {
  if (!gather(mpi, s.res)) return 0;
  return finish(a, s.part, s.res);
}

int run_fidelity_cmd(const FidelityArgs& a) {
  MpiWorld mpi;
  return on_all_ranks(mpi, [&] {
    Sweep s = start_sweep(a, mpi, "fidelity");
    const Part& part = s.part;
    SweepResults& res = s.res;
    FidelitySweep sw;
    sw.context_tokens = a.context_tokens;
    sw.continuation_tokens = a.continuation_tokens;
    sw.samples = a.samples;
    sw.seed = a.seed;
    sw.lmba_window = a.lmba_window;
    sw.lmba_tau = a.lmba_tau;
    sw.run = run_options(a);
    sw.shard = part.shard;
    if (!a.text_file.empty())
      sw.text = s.model->tokenizer().encode(read_text_file(a.text_file, "--text"), false, false);
    res.info.config = sweep_config(s.runs, sw, a.text_file);
    LiveSamples live(a.out, res.info, !part.mpi);
    Progress bar(!a.no_progress && mpi.rank() == 0);
    res.info.units = run_fidelity_sweep(
        *s.model, s.runs, sw,
        [&](const FidelityRecord& r) {
          live.add(to_json(r));
          res.fidelity.push_back(r);
        },
        [&](int i, const AttentionStats& s) {
          live.add(to_json(s, i));
          res.stats.emplace_back(i, s);
        },
        [&](size_t d, size_t t, const std::string& w) { bar.update(d, t, w); });
    bar.clear();
    live.close();
    return end_sweep(a, mpi, s);
  });
}

int run_task_cmd(const TaskArgs& a, bool niah) {
  MpiWorld mpi;
  return on_all_ranks(mpi, [&] {
    Sweep s = start_sweep(a, mpi, niah ? "niah" : "ruler");
    const Part& part = s.part;
    SweepResults& res = s.res;
    TaskSweep sw;
    sw.tasks = niah ? std::vector<std::string>{"niah"} : a.tasks;
    sw.lengths = a.lengths;
    sw.depths = a.depths;
    sw.samples = a.samples;
    sw.seed = a.seed;
    if (!a.text_config.empty()) sw.text = TaskText::from_json_file(a.text_config);
    sw.ruler = a.ruler;
    sw.run = run_options(a);
    sw.run.n_predict = a.n_predict;
    sw.run.stored_context = a.stored_context;
    sw.shard = part.shard;
    res.info.config = sweep_config(s.runs, sw, a.text_config);
    LiveSamples live(a.out, res.info, !part.mpi);
    Progress bar(!a.no_progress && mpi.rank() == 0);
    // A full cache that fails the first samples is said at once, not after hours of sweep.
    std::map<std::string, std::pair<int, int>> base;  // task -> (baseline runs, with score 0)
    bool told = false;
    res.info.units = run_task_sweep(
        *s.model, s.runs, sw,
        [&](const TaskRecord& r) {
          live.add(to_json(r));
          res.tasks.push_back(r);
          if (r.press_spec.substr(0, r.press_spec.find(':')) != "none" || told) return;
          auto& [n, zero] = base[r.task];
          ++n;
          zero += r.outcome.score == 0;
          if (n == 3 && zero == 3) {
            told = true;
            bar.clear();
            fmt::print(stderr,
                       "\nwarning: the full cache scored 0 on the first 3 samples of {}: {} probably cannot do this "
                       "task as set up (see the warning at the end)\n",
                       r.task, a.model);
          }
        },
        [&](size_t d, size_t t, const std::string& w) { bar.update(d, t, w); });
    bar.clear();
    live.close();
    return end_sweep(a, mpi, s);
  });
}

int run_merge_cmd(const std::vector<std::string>& dirs, const std::string& out, const std::string& plot_format,
                  bool no_plot) {
  check_plot_format(plot_format);
  std::vector<SweepResults> parts;
  for (const auto& d : dirs) parts.push_back(read_results(d));
  SweepResults res = merge_results(parts, dirs);
  CommonArgs a;
  a.out = out;
  a.plot_format = plot_format;
  a.no_plot = no_plot;
  return finish(a, Part{}, res);
}

}  // namespace

void add_eval(CLI::App& app, Action& action) {
  auto* ev = app.add_subcommand("eval",
                                "evaluate presses: fidelity, needle in a haystack, RULER-style tasks; merge shards");
  ev->require_subcommand(1);

  auto f = std::make_shared<FidelityArgs>();
  auto* fs = ev->add_subcommand("fidelity",
                                "full vs compressed cache over a text: KL(full || compressed), top-1 agreement, "
                                "perplexity, per press and ratio");
  add_common(fs, *f, "eval-out/fidelity", 4);
  fs->add_option("--text", f->text_file, "text file cut into samples (default: text sampled from the model, seeded)");
  fs->add_option("--context-tokens", f->context_tokens, "context (compressed) tokens per sample, BOS included")
      ->capture_default_str()->check(int_range(2, 1 << 24));
  fs->add_option("--continuation-tokens", f->continuation_tokens, "teacher-forced tokens after the context")
      ->capture_default_str()->check(int_range(2, 1 << 24));
  fs->add_option("--lmba-window", f->lmba_window,
                 "also measure LMBA per layer over the attention of this many last context queries (0 = off)")
      ->capture_default_str()->check(int_at_least(0));
  fs->add_option("--lmba-tau", f->lmba_tau, "attention share LMBA must cover")->capture_default_str()
      ->check(finite_range(1e-9, 1.0));
  fs->callback([f, &action] { action = [f] { return run_fidelity_cmd(*f); }; });

  auto n = std::make_shared<TaskArgs>();
  n->lengths = {256, 512, 1024};
  n->depths = {0.0, 0.25, 0.5, 0.75, 1.0};
  auto* ns = ev->add_subcommand("niah", "needle in a haystack: length x depth grid, greedy answer, string match");
  add_common(ns, *n, "eval-out/niah", 2);
  ns->add_option("--lengths", n->lengths, "context lengths in tokens")->delimiter(',')->capture_default_str()
      ->check(int_range(1, 1 << 24));
  ns->add_option("--depths", n->depths, "needle depths in [0, 1]")->delimiter(',')->capture_default_str()
      ->check(finite_range(0.0, 1.0));
  ns->add_option("--text-config", n->text_config, "JSON file overriding the task text pieces (filler, needle, question, ...: docs/EVAL.md, Task text)");
  ns->add_option("-n,--n-predict", n->n_predict, "tokens to decode per answer (0 = 24)")->capture_default_str()
      ->check(int_at_least(0));
  ns->add_flag("--stored-context", n->stored_context,
                "answer each question from its context compressed, written as a stored context and read back "
                "(scores equal the in-memory run's)");
  ns->callback([n, &action] { action = [n] { return run_task_cmd(*n, true); }; });

  auto r = std::make_shared<TaskArgs>();
  r->tasks = ruler_tasks();
  r->lengths = {512, 1024};
  auto* rs = ev->add_subcommand("ruler", "RULER-style synthetic tasks scored by substring match");
  add_common(rs, *r, "eval-out/ruler", 4);
  std::string known_tasks;
  for (const std::string& t : ruler_tasks()) known_tasks += (known_tasks.empty() ? "" : ", ") + t;
  // Checked as the arguments are parsed, so the message names the flag (and comes before the model loads).
  rs->add_option("--tasks", r->tasks, "tasks, comma-separated: " + known_tasks)
      ->delimiter(',')->capture_default_str()
      ->check(CLI::Validator(
          [known_tasks](std::string& t) -> std::string {
            for (const std::string& k : ruler_tasks())
              if (t == k) return "";
            return fmt::format("unknown task '{}' (known: {})", printable(t, 60), known_tasks);
          },
          "TASK"));
  rs->add_option("--lengths", r->lengths, "context lengths in tokens")->delimiter(',')->capture_default_str()
      ->check(int_range(1, 1 << 24));
  rs->add_option("--depths", r->depths, "depths of the asked needle (default: random per sample)")->delimiter(',')
      ->check(finite_range(0.0, 1.0));
  rs->add_option("--text-config", r->text_config, "JSON file overriding the task text pieces (filler, needle, question, ...: docs/EVAL.md, Task text)");
  rs->add_option("-n,--n-predict", r->n_predict, "tokens to decode per answer (0 = the task's default)")
      ->capture_default_str()->check(int_at_least(0));
  rs->add_option("--multi-keys", r->ruler.multi_keys, "niah_multikey: needles in all")->capture_default_str()
      ->check(int_range(1, 1 << 16));
  rs->add_option("--multi-values", r->ruler.multi_values, "niah_multivalue: values of the key")->capture_default_str()
      ->check(int_range(1, 1 << 16));
  rs->add_option("--multi-queries", r->ruler.multi_queries, "niah_multiquery: keys asked")->capture_default_str()
      ->check(int_range(1, 1 << 16));
  rs->add_option("--vt-hops", r->ruler.vt_hops, "vt: assignments after the first")->capture_default_str()
      ->check(int_range(1, 1 << 16));
  rs->add_option("--vt-chains", r->ruler.vt_chains, "vt: chains")->capture_default_str()
      ->check(int_range(1, 1 << 16));
  rs->add_flag("--stored-context", r->stored_context,
                "answer each question from its context compressed, written as a stored context and read back "
                "(scores equal the in-memory run's)");
  rs->callback([r, &action] { action = [r] { return run_task_cmd(*r, false); }; });

  struct MergeArgs {
    std::vector<std::string> dirs;
    std::string out = "eval-out/merged", plot_format = "svg";
    bool no_plot = false;
  };
  auto m = std::make_shared<MergeArgs>();
  auto* ms = ev->add_subcommand("merge",
                                "join the --shard parts of one sweep into the results a single process would write");
  ms->add_option("dirs", m->dirs, "result directories (or their samples.jsonl) of every shard")->required();
  ms->add_option("-o,--out", m->out, "output directory")->capture_default_str();
  ms->add_option("--plot-format", m->plot_format, "svg or png")->capture_default_str();
  ms->add_flag("--no-plot", m->no_plot, "skip the gnuplot plots");
  ms->callback([m, &action] { action = [m] { return run_merge_cmd(m->dirs, m->out, m->plot_format, m->no_plot); }; });
}

}  // namespace kvslim::cli
