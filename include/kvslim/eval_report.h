#pragma once
// Results of the evaluation harness: JSON lines and CSV records, summaries per press and ratio,
// and plots drawn by gnuplot (run as a subprocess; no plotting code of our own).
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvslim/eval.h"
#include "kvslim/eval_run_info.h"

namespace kvslim {

/// One JSON object per result (written one per line to a .jsonl file).
nlohmann::json to_json(const TaskRecord& r);
nlohmann::json to_json(const FidelityRecord& r);
nlohmann::json to_json(const AttentionStats& s, int sample);

/// Per-sample CSV: a header line and one row per record (lists joined with ';').
std::string csv_header(const TaskRecord&);
std::string csv_row(const TaskRecord& r);
std::string csv_header(const FidelityRecord&);
std::string csv_row(const FidelityRecord& r);

/// A 95% confidence interval of a mean.
struct Interval {
  double low = 0, high = 0;
};

/// The 0.975 quantile of Student's t distribution with `df` degrees of freedom (df >= 1): a
/// table for df <= 30, beyond it the Cornish-Fisher expansion z + (z^3 + z) / (4 df) (error
/// below 0.003). Throws kvslim::Error for df < 1.
double student_t975(int df);

/// Wilson's 95% score interval for a proportion `p` measured on `n` samples (n >= 1): stays
/// inside [0, 1] and has width even at p = 0 or 1 (a 5/5 result is not "certain"). Scores that
/// are fractions (RULER's string_match_all) are treated as proportions; an approximation there.
/// Wilson, "Probable inference...", JASA 1927. n < 1 -> {p, p}.
Interval wilson_interval(double p, int n);

/// mean +- t(0.975, n-1) * sd / sqrt(n) of `values`, centred on `centre` (the token-weighted
/// mean, which a sweep reports). Fewer than 2 values -> {NaN, NaN}: one sample has no spread to
/// measure (reports print n/a, JSON null).
Interval t_interval(const std::vector<double>& values, double centre);

/// Task results averaged over samples for one (task, press spec, ratio[, length, depth]).
struct TaskSummary {
  std::string task, press_spec;
  double ratio = 0;
  bool all_lengths = true;        ///< averaged over every length (then `length` is 0)
  int length = 0;
  bool all_depths = true;         ///< averaged over every depth (then `depth` is 0)
  double depth = 0;               ///< requested depth; -1 = drawn at random per sample
  int n = 0;
  double score = 0;               ///< mean score
  Interval score_ci;              ///< Wilson 95% interval of the mean score
  double compression_ratio = 0;   ///< mean fraction of the context's entries removed, at the end of the run
  double memory_ratio = 0;        ///< mean cache bytes / full f16 cache bytes of the sequence, at the end
  double prefill_compression_ratio = 0;  ///< the same right after the context was compressed
  double prefill_memory_ratio = 0;
  double needle_kept = 0;         ///< mean of each sample's smallest needle_kept
  int not_as_configured = 0;      ///< samples whose measured ratio missed the requested one
};

/// Groups by (task, press spec, ratio) and, when `by_length_depth`, by length and depth too;
/// in first-seen order.
std::vector<TaskSummary> summarize(const std::vector<TaskRecord>& recs, bool by_length_depth);

/// Fidelity averaged over samples for one (press spec, ratio), token-weighted; intervals from
/// the spread of the per-sample means (t_interval), cut to each metric's range (KL >= 0, top-1 in
/// [0, 1], perplexity >= 1).
struct FidelitySummary {
  std::string press_spec;
  double ratio = 0;
  int samples = 0;
  FidelityAccumulator metrics;
  Interval kl_ci, top1_ci, ppl_ci;  ///< ppl_ci: perplexity with the compressed cache
  double compression_ratio = 0, memory_ratio = 0;                 ///< at the end of the run
  double prefill_compression_ratio = 0, prefill_memory_ratio = 0; ///< after the context was compressed
  int not_as_configured = 0;
};
std::vector<FidelitySummary> summarize(const std::vector<FidelityRecord>& recs);

std::string csv_header(const TaskSummary&);
std::string csv_row(const TaskSummary& s);
std::string csv_header(const FidelitySummary&);
std::string csv_row(const FidelitySummary& s);

/// Records read back from JSON (samples.jsonl); every field the reports use round-trips exactly.
/// Throws kvslim::Error naming `what` and the field when one is missing or mistyped.
TaskRecord task_record_from_json(const nlohmann::json& j, const std::string& what);
FidelityRecord fidelity_record_from_json(const nlohmann::json& j, const std::string& what);
AttentionStats attention_stats_from_json(const nlohmann::json& j, int* sample, const std::string& what);

/// Path of a runnable `gnuplot` on PATH, "" when there is none.
std::string find_gnuplot();

/// Plot output format: "svg" or "png" (pngcairo). Other values -> kvslim::Error.
void check_plot_format(const std::string& format);

/// One point of a line plot; `low`/`high` is its error bar (equal to y: none).
struct PlotPoint {
  double x = 0, y = 0, low = 0, high = 0;
  bool operator<(const PlotPoint& o) const { return x < o.x; }
};

/// One line of a line plot.
struct PlotSeries {
  std::string name;
  std::vector<PlotPoint> points;
};

/// A line plot with error bars and an optional horizontal reference line (the full cache).
struct LinePlot {
  std::string title, xlabel, ylabel;
  std::vector<PlotSeries> series;
  bool has_baseline = false;
  double baseline = 0;
  std::string baseline_label;
  bool log_y = false;         ///< logarithmic y axis (non-positive values are left out)
  bool y_unit_range = false;  ///< y axis fixed to [0, 1]
  bool x_unit_range = true;   ///< x axis fixed to [0, 1]; otherwise from 0 to the data
};

/// Writes `out_path` (extension given by `format`) with gnuplot, keeping the script next to it
/// as `out_path` + ".gp" so the plot can be redrawn. Returns false, with the reason in `why`,
/// when gnuplot is absent or fails; never throws for that.
bool plot_lines(const LinePlot& plot, const std::string& out_path, const std::string& format, std::string* why);

/// Heat map: z[row][col] in [0, 1], rows labelled by `row_labels` (y axis), columns by `col_labels`.
bool plot_heatmap(const std::vector<std::vector<double>>& z, const std::vector<std::string>& row_labels,
                  const std::vector<std::string>& col_labels, const std::string& title, const std::string& xlabel,
                  const std::string& ylabel, const std::string& out_path, const std::string& format, std::string* why,
                  const std::string& cblabel = "score");

/// Bars, one per layer: values[layer].
bool plot_bars(const std::vector<double>& values, const std::string& title, const std::string& xlabel,
               const std::string& ylabel, const std::string& out_path, const std::string& format, std::string* why);

/// A file-name-safe version of `s` (letters, digits, '.', '-', '_' kept; others -> '_').
std::string file_safe(const std::string& s);

}  // namespace kvslim
