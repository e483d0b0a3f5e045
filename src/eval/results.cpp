// A sweep's results directory: samples, summaries, plots and warnings; reading shards back and
// merging them.
#include "kvslim/eval_results.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "kvslim/error.h"
#include "eval/report.h"

namespace kvslim {

namespace {

bool is_baseline(const std::string& spec) { return spec.substr(0, spec.find(':')) == "none"; }

std::string model_name(const RunInfo& info) { return std::filesystem::path(info.model).filename().string(); }

class Dir {
 public:
  Dir(const std::string& d, ResultsReport& rep) : dir_(d), rep_(rep) {
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) throw Error(fmt::format("{}: cannot create the output directory ({})", d, ec.message()));
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream f(dir_ / name, std::ios::binary);
    f << text;
    if (!f) throw Error(fmt::format("{}: cannot write", path(name)));
    rep_.files.push_back(path(name));
  }

 private:
  std::filesystem::path dir_;
  ResultsReport& rep_;
};

std::string join_ints(const std::set<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

/// "n=4" or "n=2-4": the samples per point of `rows` (anything with a sample count).
template <typename Rows, typename Count>
std::string n_text(const Rows& rows, Count count) {
  if (rows.empty()) return std::string("n=0");
  int lo = 1 << 30, hi = 0;
  for (const auto& r : rows) lo = std::min(lo, count(r)), hi = std::max(hi, count(r));
  return lo == hi ? fmt::format("n={}", lo) : fmt::format("n={}-{}", lo, hi);
}

/// The x axis of a plot against the achieved compression ratio, or against the memory ratio.
void ratio_axis(LinePlot& p, bool memory) {
  p.xlabel = memory ? "memory ratio (cache bytes / full f16 cache bytes, at the end of each run)"
                    : "achieved compression ratio (fraction of the context's entries removed, measured)";
  p.x_unit_range = !memory;
}

/// Adds a point to the line of `spec` (created in first-seen order); `index` maps specs to lines.
void add_point(LinePlot& p, std::map<std::string, size_t>& index, const std::string& spec, const PlotPoint& point) {
  auto it = index.find(spec);
  if (it == index.end()) {
    it = index.emplace(spec, p.series.size()).first;
    p.series.push_back({spec, {}});
  }
  p.series[it->second].points.push_back(point);
}

/// Draws the plots of a results directory, named without the format's extension, until one fails:
/// the first failure becomes the report's plot_problem and later plots are skipped; each plot
/// drawn is listed in the report's files.
struct Drawer {
  const ResultsOptions& opt;
  Dir& dir;
  ResultsReport& rep;
  /// draw(path, format, &why) -> drawn.
  template <typename Draw>
  void operator()(const std::string& name, Draw draw) const {
    if (!rep.plot_problem.empty()) return;
    const std::string path = dir.path(name + "." + opt.plot_format);
    std::string why;
    if (draw(path, opt.plot_format, &why))
      rep.files.push_back(path);
    else
      rep.plot_problem = why;
  }
  /// A line plot, each line's points in x order.
  void operator()(const std::string& name, LinePlot p) const {
    for (auto& s : p.series) std::sort(s.points.begin(), s.points.end());
    (*this)(name, [&](const std::string& path, const std::string& format, std::string* why) {
      return plot_lines(p, path, format, why);
    });
  }
};

/// The warning for runs whose measured ratio missed the requested one (`bad` of `total`).
void ratio_warning(int bad, size_t total, ResultsReport& rep) {
  if (bad > 0)
    rep.warnings.push_back(fmt::format(
        "{} of {} runs kept a share of entries that differs from the requested ratio by more than the rounding "
        "tolerance (protected windows or chunked compression); plots use the measured ratio, see compression_ratio "
        "and as_configured in samples.jsonl",
        bad, total));
}

nlohmann::json interval_json(const Interval& i) { return {i.low, i.high}; }

/// The measured ratios every summary row carries (end of run and after prefill).
template <typename Summary>
nlohmann::json ratios_json(const Summary& s) {
  return {{"compression_ratio", s.compression_ratio},
          {"memory_ratio", s.memory_ratio},
          {"prefill_compression_ratio", s.prefill_compression_ratio},
          {"prefill_memory_ratio", s.prefill_memory_ratio},
          {"not_as_configured", s.not_as_configured}};
}

nlohmann::json summary_json(const TaskSummary& s) {
  nlohmann::json j = {{"task", s.task},
          {"press_spec", s.press_spec},
          {"ratio", s.ratio},
          {"length", s.all_lengths ? nlohmann::json("all") : nlohmann::json(s.length)},
          {"depth", s.all_depths ? nlohmann::json("all") : s.depth < 0 ? nlohmann::json("random") : nlohmann::json(s.depth)},
          {"samples", s.n},
          {"score", s.score},
          {"score_ci95", interval_json(s.score_ci)},
          {"needle_kept", s.needle_kept}};
  j.update(ratios_json(s));
  return j;
}

nlohmann::json summary_json(const FidelitySummary& s) {
  const FidelityAccumulator& m = s.metrics;
  nlohmann::json j = {{"press_spec", s.press_spec},
          {"ratio", s.ratio},
          {"samples", s.samples},
          {"tokens", m.tokens()},
          {"kl", m.mean_kl()},
          {"kl_ci95", interval_json(s.kl_ci)},
          {"kl_max", m.max_kl()},
          {"top1_agreement", m.top1_agreement()},
          {"top1_ci95", interval_json(s.top1_ci)},
          {"ppl_full", m.perplexity_full()},
          {"ppl_compressed", m.perplexity_compressed()},
          {"ppl_ci95", interval_json(s.ppl_ci)}};
  j.update(ratios_json(s));
  return j;
}

/// Pools summary rows of one (press, ratio) over tasks: sample-weighted means, Wilson interval
/// of the pooled score.
struct Pooled {
  std::string spec;
  double ratio = 0;
  int n = 0;
  double score = 0, compression_ratio = 0, memory_ratio = 0;
};

std::vector<Pooled> pool(const std::vector<TaskSummary>& rows, const std::string& task) {
  std::vector<Pooled> out;
  std::map<std::pair<std::string, double>, size_t> at;
  for (const auto& s : rows) {
    if (!task.empty() && s.task != task) continue;
    auto key = std::make_pair(s.press_spec, s.ratio);
    auto it = at.find(key);
    if (it == at.end()) {
      it = at.emplace(key, out.size()).first;
      out.push_back({s.press_spec, s.ratio});
    }
    Pooled& p = out[it->second];
    p.n += s.n;
    p.score += s.score * s.n;
    p.compression_ratio += s.compression_ratio * s.n;
    p.memory_ratio += s.memory_ratio * s.n;
  }
  for (auto& p : out) {
    p.score /= p.n;
    p.compression_ratio /= p.n;
    p.memory_ratio /= p.n;
  }
  return out;
}

/// Score against the achieved compression ratio (or memory ratio), one line per press spec, the
/// full cache as a dashed horizontal line. The title is "`what`: `where`, n=.. per point`flag`",
/// its count taken from the rows drawn (pooled over tasks, it is the sum of the tasks' samples).
LinePlot score_plot(const std::vector<Pooled>& rows, const std::string& what, const std::string& where,
                    const std::string& flag, bool memory) {
  LinePlot p;
  p.title = fmt::format("{}: {}, {} per point{}", what, where, n_text(rows, [](const Pooled& r) { return r.n; }), flag);
  ratio_axis(p, memory);
  p.ylabel = "score (mean, 95% Wilson interval)";
  p.y_unit_range = true;
  std::map<std::string, size_t> idx;
  for (const auto& r : rows) {
    const Interval ci = wilson_interval(r.score, r.n);
    if (is_baseline(r.spec)) {
      p.has_baseline = true;
      p.baseline = r.score;
      p.baseline_label = fmt::format("full cache: {:.2f} [{:.2f}, {:.2f}], n={}", r.score, ci.low, ci.high, r.n);
      continue;
    }
    add_point(p, idx, r.spec, {memory ? r.memory_ratio : r.compression_ratio, r.score, ci.low, ci.high});
  }
  return p;
}

void task_warnings(const SweepResults& res, ResultsReport& rep) {
  std::set<std::string> tasks;
  for (const auto& r : res.tasks) tasks.insert(r.task);
  bool any_baseline = false;
  for (const auto& s : rep.task_coarse) {
    if (!is_baseline(s.press_spec)) continue;
    any_baseline = true;
    if (s.score == 0) {
      // The bundled retrieval model is a copying circuit: suggesting it is only useful for the
      // tasks it does (models/RETRIEVAL.md).
      const bool bundled = model_name(res.info) == "retrieval.gguf";
      const std::string advice =
          bundled ? "The bundled retrieval model answers niah, niah_single and niah_multikey (models/RETRIEVAL.md); "
                    "run one of those, or use a model that does this task"
                  : "Use a model that retrieves, with a task text it can read (the bundled one: "
                    "models/retrieval.gguf with models/retrieval.tasks.json, for niah, niah_single, niah_multikey)";
      rep.warnings.push_back(fmt::format(
          "THE FULL CACHE SCORED 0 on {} ({}, model {}): the model cannot do this task as set up, so the "
          "press scores of this sweep say nothing about the presses. {}",
          s.task, s.n == 1 ? std::string("1 sample") : fmt::format("{} samples", s.n), model_name(res.info), advice));
    }
    else if (s.score < 0.5)
      rep.warnings.push_back(fmt::format(
          "the full cache scored only {:.2f} on {} (n = {}, model {}): press scores are bounded by it", s.score,
          s.task, s.n, model_name(res.info)));
  }
  if (!any_baseline && !res.tasks.empty())
    rep.warnings.push_back("no full-cache baseline in this sweep: a low score cannot be told apart from a model that "
                           "cannot do the task");
  int bad = 0;
  for (const auto& s : rep.task_coarse) bad += s.not_as_configured;
  ratio_warning(bad, res.tasks.size(), rep);
}

void task_plots(const SweepResults& res, const ResultsOptions& opt, Dir& dir, ResultsReport& rep) {
  const bool niah = res.info.kind == "niah";
  std::set<int> lengths_set;
  std::vector<int> lengths;
  std::vector<double> depths;
  std::vector<std::string> tasks;
  for (const auto& r : res.tasks) {
    if (lengths_set.insert(r.length).second) lengths.push_back(r.length);
    if (std::find(depths.begin(), depths.end(), r.depth) == depths.end()) depths.push_back(r.depth);
    if (std::find(tasks.begin(), tasks.end(), r.task) == tasks.end()) tasks.push_back(r.task);
  }
  std::sort(lengths.begin(), lengths.end());
  std::sort(depths.begin(), depths.end());
  const std::string what = niah ? "needle in a haystack" : tasks.size() > 1 ? "RULER-style tasks (pooled)" : tasks[0];
  const std::string where = fmt::format("{}, {} tokens", model_name(res.info), join_ints(lengths_set));
  const bool failed = std::any_of(rep.task_coarse.begin(), rep.task_coarse.end(),
                                  [](const TaskSummary& s) { return is_baseline(s.press_spec) && s.score == 0; });
  const std::string flag = failed ? " [FULL CACHE SCORED 0: scores meaningless]" : "";
  const Drawer draw{opt, dir, rep};
  const auto pooled = pool(rep.task_coarse, "");
  draw("score_vs_ratio", score_plot(pooled, what, where, flag, false));
  draw("score_vs_memory", score_plot(pooled, what, where, flag, true));
  if (!niah && tasks.size() > 1)
    for (const auto& task : tasks) draw("score_vs_ratio_" + task, score_plot(pool(rep.task_coarse, task), task, where, flag, false));
  if (!niah) return;
  std::vector<std::string> rows, cols;
  for (int l : lengths) rows.push_back(std::to_string(l));
  for (double d : depths) cols.push_back(d < 0 ? "random" : fmt::format("{:g}", d));
  std::vector<std::pair<std::string, double>> runs;
  for (const auto& s : rep.task_coarse) runs.emplace_back(s.press_spec, s.ratio);
  for (const auto& [spec, ratio] : runs) {
    std::vector<std::vector<double>> score(lengths.size(), std::vector<double>(depths.size(), 0.0)), kept = score;
    std::vector<TaskSummary> cells;
    double achieved = 0;
    for (const auto& s : rep.task_fine)
      if (s.press_spec == spec && s.ratio == ratio) {
        const size_t r = std::find(lengths.begin(), lengths.end(), s.length) - lengths.begin();
        const size_t c = std::find(depths.begin(), depths.end(), s.depth) - depths.begin();
        score[r][c] = s.score;
        kept[r][c] = s.needle_kept;
        cells.push_back(s);
      }
    for (const auto& s : rep.task_coarse)
      if (s.press_spec == spec && s.ratio == ratio) achieved = s.compression_ratio;
    // A run at ratio 0 that removed entries kept them by its own parameters (a budget): no ratio
    // was asked for, only the achieved one is shown.
    const std::string asked = ratio > 0 || achieved == 0 ? fmt::format(" at ratio {:.2f} (achieved {:.2f})", ratio, achieved)
                                                         : fmt::format(" (achieved ratio {:.2f})", achieved);
    const std::string tail = fmt::format("{}, {}, {} per cell", asked, model_name(res.info),
                                         n_text(cells, [](const TaskSummary& s) { return s.n; }));
    const std::string name = fmt::format("{}_{:.2f}", file_safe(spec), ratio);
    auto heat_map = [&](const std::vector<std::vector<double>>& z, const std::string& title, const std::string& key) {
      draw(key + "_" + name, [&](const std::string& path, const std::string& format, std::string* why) {
        return plot_heatmap(z, rows, cols, title, "needle depth", "context tokens", path, format, why,
                            key == "niah" ? "score" : "kept");
      });
    };
    heat_map(score, fmt::format("NIAH: {}{}{}", spec, tail, flag), "niah");
    // What the press left of the needle: explains the score map, and is meaningful even for a
    // model that cannot retrieve.
    heat_map(kept, fmt::format("needle entries kept: {}{}", spec, tail), "needle_kept");
  }
}

void fidelity_plots(const SweepResults& res, const ResultsOptions& opt, Dir& dir, ResultsReport& rep) {
  int ctx = 0, cont = 0;
  if (!res.fidelity.empty()) {
    ctx = res.fidelity[0].outcome.cache.context_tokens;
    cont = static_cast<int>(res.fidelity[0].outcome.metrics.tokens()) + 1;
  }
  const std::string where =
      fmt::format("{}, {} context + {} continuation tokens", model_name(res.info), ctx, cont);
  enum Metric { KL, TOP1, PPL };
  auto make = [&](Metric m, bool memory) {
    LinePlot p;
    // The count of the title is over the rows drawn: a KL of 0 has no place on the log axis.
    std::vector<FidelitySummary> drawn;
    for (const auto& s : rep.fidelity)
      if (m != KL || s.metrics.mean_kl() > 0) drawn.push_back(s);
    p.title = fmt::format("{}: {}, {} per point",
                          m == KL     ? "KL(full || compressed) per token"
                          : m == TOP1 ? "top-1 agreement with the full cache"
                                      : "perplexity of the continuation",
                          where, n_text(drawn, [](const FidelitySummary& s) { return s.samples; }));
    ratio_axis(p, memory);
    p.ylabel = m == KL ? "KL (nats, log scale; mean, 95% t interval)" : m == TOP1 ? "top-1 agreement (mean, 95% t interval)"
                                                                                   : "perplexity (mean, 95% t interval)";
    p.log_y = m == KL;
    p.y_unit_range = m == TOP1;
    std::map<std::string, size_t> idx;
    for (const auto& s : rep.fidelity) {
      const FidelityAccumulator& a = s.metrics;
      const double y = m == KL ? a.mean_kl() : m == TOP1 ? a.top1_agreement() : a.perplexity_compressed();
      const Interval ci = m == KL ? s.kl_ci : m == TOP1 ? s.top1_ci : s.ppl_ci;
      if (is_baseline(s.press_spec)) {
        // The full cache's perplexity is the reference's; KL 0 / top-1 1 when the cache is the
        // reference's own (f16), not when it is quantized.
        p.has_baseline = true;
        p.baseline = m == PPL ? a.perplexity_full() : y;
        p.baseline_label = fmt::format("full cache: {:.4g}, n={}", p.baseline, s.samples);
        continue;
      }
      // One sample: no interval (NaN), so no error bar.
      const bool none = std::isnan(ci.low);
      add_point(p, idx, s.press_spec, {memory ? s.memory_ratio : s.compression_ratio, y, none ? y : ci.low, none ? y : ci.high});
    }
    return p;
  };
  const Drawer draw{opt, dir, rep};
  draw("kl_vs_ratio", make(KL, false));
  draw("kl_vs_memory", make(KL, true));
  draw("top1_vs_ratio", make(TOP1, false));
  draw("ppl_vs_ratio", make(PPL, false));
  if (!rep.lmba.empty()) {
    const AttentionStats& s0 = res.stats.front().second;
    draw("lmba", [&](const std::string& path, const std::string& format, std::string* why) {
      return plot_bars(rep.lmba,
                       fmt::format("LMBA per layer (tau {}, last {} queries): {}, mean of {} samples", s0.tau,
                                   s0.window, model_name(res.info), res.stats.size()),
                       "layer", "entries", path, format, why);
    });
  }
}

}  // namespace

void SweepResults::sort() {
  std::stable_sort(tasks.begin(), tasks.end(), [](const auto& a, const auto& b) { return a.index < b.index; });
  std::stable_sort(fidelity.begin(), fidelity.end(), [](const auto& a, const auto& b) { return a.index < b.index; });
  std::stable_sort(stats.begin(), stats.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
}

std::string results_jsonl(const SweepResults& res) {
  std::string jsonl = to_json(res.info).dump() + "\n";
  size_t si = 0;
  for (const auto& r : res.fidelity) {
    while (si < res.stats.size() && res.stats[si].first <= r.sample) {
      jsonl += to_json(res.stats[si].second, res.stats[si].first).dump() + "\n";
      ++si;
    }
    jsonl += to_json(r).dump() + "\n";
  }
  for (; si < res.stats.size(); ++si) jsonl += to_json(res.stats[si].second, res.stats[si].first).dump() + "\n";
  for (const auto& r : res.tasks) jsonl += to_json(r).dump() + "\n";
  return jsonl;
}

ResultsReport write_results(const SweepResults& res, const ResultsOptions& opt) {
  if (opt.plots) check_plot_format(opt.plot_format);
  ResultsReport rep;
  Dir dir(opt.dir, rep);
  const bool fid = res.info.kind == "fidelity";
  const std::string jsonl = results_jsonl(res);
  std::string csv;
  if (fid) {
    csv = csv_header(FidelityRecord{}) + "\n";
    for (const auto& r : res.fidelity) csv += csv_row(r) + "\n";
  } else {
    csv = csv_header(TaskRecord{}) + "\n";
    for (const auto& r : res.tasks) csv += csv_row(r) + "\n";
  }
  dir.write("samples.jsonl", jsonl);
  dir.write("samples.csv", csv);
  if (!opt.summaries) return rep;

  nlohmann::json summary = nlohmann::json::array();
  std::string scsv;
  if (fid) {
    rep.fidelity = summarize(res.fidelity);
    scsv = csv_header(FidelitySummary{}) + "\n";
    for (const auto& s : rep.fidelity) {
      scsv += csv_row(s) + "\n";
      summary.push_back(summary_json(s));
    }
    if (!res.stats.empty()) {
      rep.lmba.assign(res.stats[0].second.lmba.size(), 0.0);
      for (const auto& [i, s] : res.stats)
        for (size_t l = 0; l < rep.lmba.size() && l < s.lmba.size(); ++l) rep.lmba[l] += s.lmba[l] / res.stats.size();
    }
    int bad = 0;
    for (const auto& s : rep.fidelity) bad += s.not_as_configured;
    ratio_warning(bad, res.fidelity.size(), rep);
  } else {
    rep.task_coarse = summarize(res.tasks, false);
    rep.task_fine = summarize(res.tasks, true);
    scsv = csv_header(TaskSummary{}) + "\n";
    for (const auto* rows : {&rep.task_coarse, &rep.task_fine})
      for (const auto& s : *rows) {
        scsv += csv_row(s) + "\n";
        summary.push_back(summary_json(s));
      }
    task_warnings(res, rep);
  }
  dir.write("summary.csv", scsv);
  nlohmann::json sj = {{"run", to_json(res.info)}, {"warnings", rep.warnings}, {"summary", summary}};
  if (!rep.lmba.empty()) sj["lmba"] = rep.lmba;
  dir.write("summary.json", sj.dump(2) + "\n");
  if (opt.plots) {
    if (find_gnuplot().empty())
      rep.plot_problem = "gnuplot is not on PATH (Debian package gnuplot-nox); plots skipped";
    else if (fid)
      fidelity_plots(res, opt, dir, rep);
    else
      task_plots(res, opt, dir, rep);
  }
  return rep;
}

SweepResults parse_results(const std::string& text, const std::string& name) {
  std::istringstream f(text);
  SweepResults res;
  std::string line;
  int no = 0;
  bool have_info = false;
  while (std::getline(f, line)) {
    ++no;
    if (line.empty()) continue;
    const std::string what = fmt::format("{}:{}", name, no);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("{}: not JSON ({})", what, printable(e.what())));
    }
    const std::string kind = j.is_object() ? j.value("kind", "") : "";
    if (!have_info) {
      if (kind != "run")
        throw Error(fmt::format("{}: the first line must be the run record (\"kind\": \"run\"), found '{}'", what, printable(kind)));
      res.info = run_info_from_json(j, what);
      have_info = true;
    } else if (kind == "task") {
      res.tasks.push_back(task_record_from_json(j, what));
    } else if (kind == "fidelity") {
      res.fidelity.push_back(fidelity_record_from_json(j, what));
    } else if (kind == "attention") {
      int sample = 0;
      AttentionStats s = attention_stats_from_json(j, &sample, what);
      res.stats.emplace_back(sample, std::move(s));
    } else {
      throw Error(fmt::format("{}: unknown record kind '{}'", what, printable(kind)));
    }
  }
  if (!have_info) throw Error(fmt::format("{}: empty (no run record)", name));
  return res;
}

SweepResults read_results(const std::string& path) {
  std::string file = path;
  if (std::filesystem::is_directory(path)) file = (std::filesystem::path(path) / "samples.jsonl").string();
  std::ifstream f(file, std::ios::binary);
  if (!f) throw Error(fmt::format("{}: cannot open (expected a results directory or its samples.jsonl)", file));
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_results(ss.str(), file);
}

SweepResults merge_results(const std::vector<SweepResults>& parts, const std::vector<std::string>& names) {
  if (parts.empty()) throw Error("merge: no results to merge");
  const RunInfo& a = parts[0].info;
  std::set<int> shards;
  for (size_t i = 0; i < parts.size(); ++i) {
    const RunInfo& b = parts[i].info;
    const std::string& n0 = names.at(0);
    const std::string& ni = names.at(i);
    if (b.kind != a.kind) throw Error(fmt::format("merge: {} is an eval {} but {} is an eval {}", ni, printable(b.kind), n0,
                                                  printable(a.kind)));
    if (b.model_sha256 != a.model_sha256)
      throw Error(fmt::format("merge: {} ran model {} (sha256 {}) but {} ran {} (sha256 {})", ni, printable(b.model),
                              printable(b.model_sha256), n0, printable(a.model), printable(a.model_sha256)));
    if (b.kvslim_version != a.kvslim_version)
      throw Error(fmt::format("merge: {} was written by kvslim {} but {} by {}", ni, printable(b.kvslim_version), n0,
                              printable(a.kvslim_version)));
    if (b.config != a.config)
      throw Error(fmt::format("merge: {} and {} are different sweeps (settings differ: {} vs {})", ni, n0,
                              printable(b.config, 400), printable(a.config, 400)));
    if (b.shard_count != a.shard_count || b.units != a.units)
      throw Error(fmt::format("merge: {} is shard {}/{} of {} runs but {} is shard {}/{} of {} runs", ni,
                              b.shard_index, b.shard_count, b.units, n0, a.shard_index, a.shard_count, a.units));
    if (!shards.insert(b.shard_index).second)
      throw Error(fmt::format("merge: shard {}/{} is given twice ({})", b.shard_index, b.shard_count, ni));
  }
  std::set<int> missing;
  for (int i = 0; i < a.shard_count; ++i)
    if (!shards.count(i)) missing.insert(i);
  if (!missing.empty())
    throw Error(fmt::format("merge: shards {} of {} are missing", join_ints(missing), a.shard_count));
  SweepResults out;
  out.info = a;
  out.info.shard_index = 0;
  out.info.shard_count = 1;
  out.info.command = command_line();
  for (const auto& p : parts) {
    out.info.merged_from.push_back(p.info.command);
    out.tasks.insert(out.tasks.end(), p.tasks.begin(), p.tasks.end());
    out.fidelity.insert(out.fidelity.end(), p.fidelity.begin(), p.fidelity.end());
    out.stats.insert(out.stats.end(), p.stats.begin(), p.stats.end());
  }
  out.sort();
  const size_t n = out.tasks.size() + out.fidelity.size();
  std::vector<size_t> idx;
  for (const auto& r : out.tasks) idx.push_back(r.index);
  for (const auto& r : out.fidelity) idx.push_back(r.index);
  for (size_t i = 0; i < idx.size(); ++i)
    if (idx[i] != i)
      throw Error(fmt::format("merge: run {} is {} (the shards overlap or one was cut short: {} runs of {})", i,
                              i < idx.size() && i > 0 && idx[i] == idx[i - 1] ? "given twice" : "missing", n, a.units));
  if (n != a.units)
    throw Error(fmt::format("merge: {} runs found, the sweep has {} (a shard was cut short)", n, a.units));
  return out;
}

}  // namespace kvslim
