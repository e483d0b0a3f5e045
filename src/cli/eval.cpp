// `kvslim eval fidelity|niah|ruler`: sweeps of presses x compression ratios x samples, written as
// JSON lines and CSV, summarized on stdout and plotted with gnuplot.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "cli/cache_options.h"
#include "cli/commands.h"
#include "cli/context_size.h"
#include "kernels/threads.h"
#include "kvslim/eval.h"
#include "kvslim/eval_report.h"

namespace kvslim::cli {

namespace {

struct CommonArgs {
  std::string model = "models/stories260K.gguf";
  std::vector<std::string> presses{"streaming_llm", "knorm", "snapkv"};
  std::vector<double> ratios{0.5, 0.75, 0.9};
  bool no_baseline = false;
  int samples = 0;  // 0: the subcommand's default
  uint64_t seed = 1234;
  std::string out;
  std::string plot_format = "svg";
  bool no_plot = false, no_progress = false;
  int threads = 2, ctx = 0, chunk_size = 0;
  std::string cache_type_k = "f16", cache_type_v = "f16";
  KVQuantOptions kv_quant;
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
};

/// A one-line progress bar on stderr: redrawn in place on a terminal, a line every 10% otherwise.
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : on_(enabled), tty_(isatty(2)), t0_(Clock::now()) {}
  void operator()(size_t done, size_t total, const std::string& what) {
    if (!on_ || total == 0) return;
    const double el = std::chrono::duration<double>(Clock::now() - t0_).count();
    const double frac = double(done) / total;
    if (tty_) {
      if (done < total && el - last_ < 0.1 && done != 0) return;
      last_ = el;
      const int w = 30, fill = static_cast<int>(frac * w);
      std::string bar = std::string(fill, '#') + std::string(w - fill, '.');
      std::string eta = done > 0 ? fmt::format("{:.0f}s", el / done * (total - done)) : "?";
      std::string line = fmt::format("[{}] {}/{} {:3.0f}% {:.0f}s eta {} {}", bar, done, total, 100 * frac, el, eta, what);
      if (line.size() > 118) line.resize(118);
      fmt::print(stderr, "\r{:<120}", line);
      if (done == total) fmt::print(stderr, "\n");
    } else {
      const int decile = static_cast<int>(frac * 10);
      if (decile == decile_ && done != total) return;
      if (done == total && decile_ == 10) return;
      decile_ = decile;
      fmt::print(stderr, "progress {}/{} ({:.0f}%, {:.0f}s) {}\n", done, total, 100 * frac, el, what);
    }
    std::fflush(stderr);
  }

 private:
  using Clock = std::chrono::steady_clock;
  bool on_, tty_;
  Clock::time_point t0_;
  double last_ = -1;
  int decile_ = -1;
};

void add_common(CLI::App* sub, CommonArgs& a, const std::string& default_out, int default_samples) {
  a.out = default_out;
  a.samples = default_samples;
  sub->add_option("-m,--model", a.model, "GGUF model file")->capture_default_str();
  sub->add_option("--press", a.presses, "press specs NAME[:key=value,...] (repeat or space-separate)")
      ->capture_default_str();
  sub->add_option("--ratios", a.ratios, "compression ratios (fractions of context entries removed), in [0, 1)")
      ->delimiter(',')->capture_default_str();
  sub->add_flag("--no-baseline", a.no_baseline, "do not run the full cache (press none) as a baseline");
  sub->add_option("--samples", a.samples, "samples per configuration")->capture_default_str()->check(CLI::PositiveNumber);
  sub->add_option("-s,--seed", a.seed, "seed of the sample generators")->capture_default_str();
  sub->add_option("-o,--out", a.out, "output directory (samples.jsonl, samples.csv, summary.csv, plots)")
      ->capture_default_str();
  sub->add_option("--plot-format", a.plot_format, "svg or png")->capture_default_str();
  sub->add_flag("--no-plot", a.no_plot, "skip the gnuplot plots");
  sub->add_flag("--no-progress", a.no_progress, "no progress bar on stderr");
  sub->add_option("-t,--threads", a.threads, "threads")->capture_default_str()->check(CLI::Range(1, 256));
  sub->add_option("-c,--ctx-size", a.ctx, "context size in tokens (0 = the model's)")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--chunk-size", a.chunk_size, "compress after every chunk of this many context tokens (0 = once)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  add_cache_options(sub, a.cache_type_k, a.cache_type_v, a.kv_quant);
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

/// Opens the output files; records are appended and flushed as they come, so an interrupted
/// sweep keeps what it finished.
struct Outputs {
  std::filesystem::path dir;
  std::ofstream jsonl, csv;
  explicit Outputs(const std::string& d) : dir(d) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw Error(fmt::format("{}: cannot create the output directory ({})", d, ec.message()));
    jsonl.open(dir / "samples.jsonl", std::ios::binary);
    csv.open(dir / "samples.csv", std::ios::binary);
    if (!jsonl || !csv) throw Error(fmt::format("{}: cannot write samples.jsonl / samples.csv", d));
  }
  std::string path(const std::string& name) const { return (dir / name).string(); }
  void write_text(const std::string& name, const std::string& text) const {
    std::ofstream f(dir / name, std::ios::binary);
    if (!f) throw Error(fmt::format("{}: cannot write", path(name)));
    f << text;
  }
};

void plot_or_warn(bool ok, const std::string& why, bool& warned) {
  if (ok || warned) return;
  fmt::print(stderr, "warning: {}\n", why);
  warned = true;
}

void warn_not_as_configured(int bad, size_t total) {
  if (bad > 0)
    fmt::print(stderr,
               "warning: {} of {} runs kept a share of entries that differs from the requested ratio by more than the "
               "rounding tolerance (protected windows or chunked compression); see compression_ratio and "
               "as_configured in samples.jsonl\n",
               bad, total);
}

std::string ratio_label(double r) { return fmt::format("{:.2f}", r); }

/// Score-against-ratio series, one per press spec; the full-cache baseline is each line's point at 0.
std::vector<PlotSeries> ratio_series(const std::vector<std::tuple<std::string, double, double>>& pts) {
  std::vector<PlotSeries> out;
  std::map<std::string, size_t> idx;
  double base = 0;
  bool have_base = false;
  for (const auto& [spec, r, y] : pts)
    if (spec.substr(0, spec.find(':')) == "none") {
      base = y;
      have_base = true;
    }
  for (const auto& [spec, r, y] : pts) {
    if (spec.substr(0, spec.find(':')) == "none") continue;
    auto it = idx.find(spec);
    if (it == idx.end()) {
      it = idx.emplace(spec, out.size()).first;
      out.push_back({spec, {}});
      if (have_base) out.back().points.push_back({0.0, base});
    }
    out[it->second].points.push_back({r, y});
  }
  for (auto& s : out) std::sort(s.points.begin(), s.points.end());
  return out;
}

int run_fidelity_cmd(const FidelityArgs& a) {
  check_plot_format(a.plot_format);
  auto runs = expand_runs(a.presses, a.ratios, !a.no_baseline);
  set_num_threads(a.threads);
  auto model = Model::load(a.model);
  warn_context_size(*model, a.ctx);
  FidelitySweep sw;
  sw.context_tokens = a.context_tokens;
  sw.continuation_tokens = a.continuation_tokens;
  sw.samples = a.samples;
  sw.seed = a.seed;
  sw.lmba_window = a.lmba_window;
  sw.lmba_tau = a.lmba_tau;
  sw.run = run_options(a);
  if (!a.text_file.empty()) {
    std::ifstream f(a.text_file, std::ios::binary);
    if (!f) throw Error(fmt::format("{}: cannot open text file", a.text_file));
    std::stringstream ss;
    ss << f.rdbuf();
    sw.text = model->tokenizer().encode(ss.str(), false, false);
  }
  Outputs out(a.out);
  out.csv << csv_header(FidelityRecord{}) << "\n";
  std::vector<FidelityRecord> recs;
  std::vector<AttentionStats> stats;
  ProgressBar bar(!a.no_progress);
  run_fidelity_sweep(
      *model, runs, sw,
      [&](const FidelityRecord& r) {
        out.jsonl << to_json(r).dump() << "\n" << std::flush;
        out.csv << csv_row(r) << "\n" << std::flush;
        recs.push_back(r);
      },
      [&](int i, const AttentionStats& s) {
        out.jsonl << to_json(s, i).dump() << "\n" << std::flush;
        stats.push_back(s);
      },
      [&](size_t d, size_t t, const std::string& w) { bar(d, t, w); });

  auto sum = summarize(recs);
  std::string csv = csv_header(FidelitySummary{}) + "\n";
  for (const auto& s : sum) csv += csv_row(s) + "\n";
  out.write_text("summary.csv", csv);
  const int samples = recs.empty() ? 0 : sum.front().samples;
  fmt::print("fidelity of {} ({} samples: {} context + {} teacher-forced tokens{})\n", a.model, samples,
             a.context_tokens, a.continuation_tokens, a.text_file.empty() ? ", text sampled from the model" : "");
  fmt::print("{:<32} {:>6} {:>10} {:>8} {:>9} {:>9} {:>7} {:>7}\n", "press", "ratio", "KL(nats)", "top-1", "ppl full",
             "ppl comp", "comp.r", "mem.r");
  int bad = 0;
  for (const auto& s : sum) {
    const auto& m = s.metrics;
    fmt::print("{:<32} {:>6.2f} {:>10.4g} {:>8.4f} {:>9.3f} {:>9.3f} {:>7.3f} {:>7.3f}\n", s.press_spec, s.ratio,
               m.mean_kl(), m.top1_agreement(), m.perplexity_full(), m.perplexity_compressed(), s.compression_ratio,
               s.memory_ratio);
    bad += s.not_as_configured;
  }
  warn_not_as_configured(bad, recs.size());
  std::vector<double> lmba;
  if (!stats.empty()) {
    lmba.assign(stats[0].lmba.size(), 0.0);
    for (const auto& s : stats)
      for (size_t l = 0; l < lmba.size(); ++l) lmba[l] += s.lmba[l] / stats.size();
    std::string lm;
    for (size_t l = 0; l < lmba.size(); ++l) lm += fmt::format("{}{:.1f}", l ? " " : "", lmba[l]);
    fmt::print("LMBA per layer (entries for {:.0f}% of the attention of the last {} queries, mean of {} samples): {}\n",
               100 * a.lmba_tau, stats[0].window, stats.size(), lm);
  }
  fmt::print("results: {}, {}, {}\n", out.path("samples.jsonl"), out.path("samples.csv"), out.path("summary.csv"));
  if (!a.no_plot) {
    bool warned = false;
    std::string why;
    std::vector<std::tuple<std::string, double, double>> kl, top1, ppl;
    for (const auto& s : sum) {
      kl.emplace_back(s.press_spec, s.ratio, s.metrics.mean_kl());
      top1.emplace_back(s.press_spec, s.ratio, s.metrics.top1_agreement());
      ppl.emplace_back(s.press_spec, s.ratio, s.metrics.perplexity_compressed());
    }
    const std::string ext = "." + a.plot_format;
    plot_or_warn(plot_lines(ratio_series(kl), "KL(full || compressed) per token", "compression ratio", "KL (nats)",
                            out.path("kl_vs_ratio" + ext), a.plot_format, &why),
                 why, warned);
    plot_or_warn(plot_lines(ratio_series(top1), "top-1 agreement with the full cache", "compression ratio",
                            "top-1 agreement", out.path("top1_vs_ratio" + ext), a.plot_format, &why, true),
                 why, warned);
    plot_or_warn(plot_lines(ratio_series(ppl), "perplexity of the continuation", "compression ratio", "perplexity",
                            out.path("ppl_vs_ratio" + ext), a.plot_format, &why),
                 why, warned);
    if (!lmba.empty())
      plot_or_warn(plot_bars(lmba, fmt::format("LMBA per layer (tau {})", a.lmba_tau), "layer", "entries",
                             out.path("lmba" + ext), a.plot_format, &why),
                   why, warned);
    if (!warned) fmt::print("plots: {}/*{}\n", a.out, ext);
  }
  return 0;
}

int run_task_cmd(const TaskArgs& a, bool niah) {
  check_plot_format(a.plot_format);
  auto runs = expand_runs(a.presses, a.ratios, !a.no_baseline);
  set_num_threads(a.threads);
  auto model = Model::load(a.model);
  warn_context_size(*model, a.ctx);
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
  Outputs out(a.out);
  out.csv << csv_header(TaskRecord{}) << "\n";
  std::vector<TaskRecord> recs;
  ProgressBar bar(!a.no_progress);
  run_task_sweep(
      *model, runs, sw,
      [&](const TaskRecord& r) {
        out.jsonl << to_json(r).dump() << "\n" << std::flush;
        out.csv << csv_row(r) << "\n" << std::flush;
        recs.push_back(r);
      },
      [&](size_t d, size_t t, const std::string& w) { bar(d, t, w); });

  auto fine = summarize(recs, true);
  auto coarse = summarize(recs, false);
  std::string csv = csv_header(TaskSummary{}) + "\n";
  for (const auto& s : coarse) csv += csv_row(s) + "\n";
  for (const auto& s : fine) csv += csv_row(s) + "\n";
  out.write_text("summary.csv", csv);

  fmt::print("{} on {} ({} samples per configuration, lengths", niah ? "needle in a haystack" : "RULER-style tasks",
             a.model, a.samples);
  for (int l : a.lengths) fmt::print(" {}", l);
  fmt::print(")\n{:<16} {:<32} {:>6} {:>6} {:>7} {:>7} {:>7} {:>6}\n", "task", "press", "ratio", "score", "comp.r",
             "mem.r", "needle", "n");
  int bad = 0;
  for (const auto& s : coarse) {
    fmt::print("{:<16} {:<32} {:>6.2f} {:>6.3f} {:>7.3f} {:>7.3f} {:>7.3f} {:>6}\n", s.task, s.press_spec, s.ratio,
               s.score, s.compression_ratio, s.memory_ratio, s.needle_kept, s.n);
    bad += s.not_as_configured;
  }
  fmt::print("(score: mean string-match score; comp.r: measured compression ratio; mem.r: cache bytes / full f16 "
             "cache bytes; needle: mean fraction of the needle's entries kept, smallest needle of each sample)\n");
  warn_not_as_configured(bad, recs.size());
  fmt::print("results: {}, {}, {}\n", out.path("samples.jsonl"), out.path("samples.csv"), out.path("summary.csv"));
  if (a.no_plot) return 0;
  bool warned = false;
  std::string why;
  const std::string ext = "." + a.plot_format;
  // Score against ratio, averaged over tasks (the coarse rows of each run).
  std::map<std::pair<std::string, double>, std::pair<double, int>> avg;
  std::vector<std::pair<std::string, double>> order;
  for (const auto& s : coarse) {
    auto key = std::make_pair(s.press_spec, s.ratio);
    if (!avg.count(key)) order.push_back(key);
    avg[key].first += s.score;
    avg[key].second += 1;
  }
  std::vector<std::tuple<std::string, double, double>> pts;
  for (const auto& k : order) pts.emplace_back(k.first, k.second, avg[k].first / avg[k].second);
  plot_or_warn(plot_lines(ratio_series(pts), niah ? "needle in a haystack" : "RULER-style tasks (mean over tasks)",
                          "compression ratio", "score", out.path("score_vs_ratio" + ext), a.plot_format, &why, true),
               why, warned);
  if (!niah && sw.tasks.size() > 1)
    for (const auto& task : sw.tasks) {
      std::vector<std::tuple<std::string, double, double>> tp;
      for (const auto& s : coarse)
        if (s.task == task) tp.emplace_back(s.press_spec, s.ratio, s.score);
      plot_or_warn(plot_lines(ratio_series(tp), task, "compression ratio", "score",
                              out.path("score_vs_ratio_" + task + ext), a.plot_format, &why, true),
                   why, warned);
    }
  if (niah && !warned) {
    // One heat map per run: rows are lengths, columns depths.
    for (const auto& run : runs) {
      std::vector<std::vector<double>> z(a.lengths.size(), std::vector<double>(a.depths.size(), 0.0));
      for (const auto& s : fine)
        if (s.press_spec == run.spec && s.ratio == run.ratio)
          for (size_t r = 0; r < a.lengths.size(); ++r)
            for (size_t c = 0; c < a.depths.size(); ++c)
              if (s.length == a.lengths[r] && s.depth == a.depths[c]) z[r][c] = s.score;
      std::vector<std::string> rows, cols;
      for (int l : a.lengths) rows.push_back(std::to_string(l));
      for (double d : a.depths) cols.push_back(fmt::format("{:g}", d));
      plot_or_warn(plot_heatmap(z, rows, cols, fmt::format("NIAH: {} at ratio {}", run.spec, ratio_label(run.ratio)),
                                "needle depth", "context tokens",
                                out.path(fmt::format("niah_{}_{}{}", file_safe(run.spec), ratio_label(run.ratio), ext)),
                                a.plot_format, &why),
                   why, warned);
      // What the press left of the needle: explains the score map, and is meaningful even for a
      // model that cannot retrieve.
      for (const auto& s : fine)
        if (s.press_spec == run.spec && s.ratio == run.ratio)
          for (size_t r = 0; r < a.lengths.size(); ++r)
            for (size_t c = 0; c < a.depths.size(); ++c)
              if (s.length == a.lengths[r] && s.depth == a.depths[c]) z[r][c] = s.needle_kept;
      plot_or_warn(plot_heatmap(z, rows, cols,
                                fmt::format("needle entries kept: {} at ratio {}", run.spec, ratio_label(run.ratio)),
                                "needle depth", "context tokens",
                                out.path(fmt::format("needle_kept_{}_{}{}", file_safe(run.spec),
                                                     ratio_label(run.ratio), ext)),
                                a.plot_format, &why, "kept"),
                   why, warned);
    }
  }
  if (!warned) fmt::print("plots: {}/*{}\n", a.out, ext);
  return 0;
}

}  // namespace

void add_eval(CLI::App& app, Action& action) {
  auto* ev = app.add_subcommand("eval", "evaluate presses: fidelity, needle in a haystack, RULER-style tasks");
  ev->require_subcommand(1);

  auto f = std::make_shared<FidelityArgs>();
  auto* fs = ev->add_subcommand("fidelity",
                                "full vs compressed cache over a text: KL(full || compressed), top-1 agreement, "
                                "perplexity, per press and ratio");
  add_common(fs, *f, "eval-out/fidelity", 4);
  fs->add_option("--text", f->text_file, "text file cut into samples (default: text sampled from the model, seeded)");
  fs->add_option("--context-tokens", f->context_tokens, "context (compressed) tokens per sample, BOS included")
      ->capture_default_str()->check(CLI::Range(2, 1 << 24));
  fs->add_option("--continuation-tokens", f->continuation_tokens, "teacher-forced tokens after the context")
      ->capture_default_str()->check(CLI::Range(2, 1 << 24));
  fs->add_option("--lmba-window", f->lmba_window,
                 "also measure LMBA per layer over the attention of this many last context queries (0 = off)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  fs->add_option("--lmba-tau", f->lmba_tau, "attention share LMBA must cover")->capture_default_str();
  fs->callback([f, &action] { action = [f] { return run_fidelity_cmd(*f); }; });

  auto n = std::make_shared<TaskArgs>();
  n->lengths = {256, 512, 1024};
  n->depths = {0.0, 0.25, 0.5, 0.75, 1.0};
  auto* ns = ev->add_subcommand("niah", "needle in a haystack: length x depth grid, greedy answer, string match");
  add_common(ns, *n, "eval-out/niah", 2);
  ns->add_option("--lengths", n->lengths, "context lengths in tokens")->delimiter(',')->capture_default_str();
  ns->add_option("--depths", n->depths, "needle depths in [0, 1]")->delimiter(',')->capture_default_str();
  ns->add_option("--text-config", n->text_config, "JSON file overriding the task text pieces (see TaskText)");
  ns->add_option("-n,--n-predict", n->n_predict, "tokens to decode per answer (0 = 24)")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  ns->callback([n, &action] { action = [n] { return run_task_cmd(*n, true); }; });

  auto r = std::make_shared<TaskArgs>();
  r->tasks = ruler_tasks();
  r->lengths = {512, 1024};
  auto* rs = ev->add_subcommand("ruler", "RULER-style synthetic tasks scored by substring match");
  add_common(rs, *r, "eval-out/ruler", 4);
  rs->add_option("--tasks", r->tasks, "tasks: niah_single niah_multikey niah_multivalue niah_multiquery vt cwe fwe")
      ->delimiter(',')->capture_default_str();
  rs->add_option("--lengths", r->lengths, "context lengths in tokens")->delimiter(',')->capture_default_str();
  rs->add_option("--depths", r->depths, "depths of the asked needle (default: random per sample)")->delimiter(',');
  rs->add_option("--text-config", r->text_config, "JSON file overriding the task text pieces (see TaskText)");
  rs->add_option("-n,--n-predict", r->n_predict, "tokens to decode per answer (0 = the task's default)")
      ->capture_default_str()->check(CLI::NonNegativeNumber);
  rs->add_option("--multi-keys", r->ruler.multi_keys, "niah_multikey: needles in all")->capture_default_str();
  rs->add_option("--multi-values", r->ruler.multi_values, "niah_multivalue: values of the key")->capture_default_str();
  rs->add_option("--multi-queries", r->ruler.multi_queries, "niah_multiquery: keys asked")->capture_default_str();
  rs->add_option("--vt-hops", r->ruler.vt_hops, "vt: assignments after the first")->capture_default_str();
  rs->add_option("--vt-chains", r->ruler.vt_chains, "vt: chains")->capture_default_str();
  rs->callback([r, &action] { action = [r] { return run_task_cmd(*r, false); }; });
}

}  // namespace kvslim::cli
