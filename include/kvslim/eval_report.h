#pragma once
// Results of the evaluation harness: JSON lines and CSV records, summaries per press and ratio,
// and plots drawn by gnuplot (run as a subprocess; no plotting code of our own).
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvslim/eval.h"

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

/// Task results averaged over samples for one (task, press spec, ratio[, length, depth]).
struct TaskSummary {
  std::string task, press_spec;
  double ratio = 0;
  int length = -1;     ///< -1 when summed over lengths
  double depth = -2;   ///< requested depth; -1 random; -2 when summed over depths
  int n = 0;
  double score = 0;               ///< mean score
  double compression_ratio = 0;   ///< mean measured
  double memory_ratio = 0;        ///< mean cache bytes / full f16 cache bytes
  double needle_kept = 0;         ///< mean of each sample's smallest needle_kept
  int not_as_configured = 0;      ///< samples whose measured ratio missed the requested one
};

/// Groups by (task, press spec, ratio) and, when `by_length_depth`, by length and depth too;
/// in first-seen order.
std::vector<TaskSummary> summarize(const std::vector<TaskRecord>& recs, bool by_length_depth);

/// Fidelity averaged over samples for one (press spec, ratio), token-weighted.
struct FidelitySummary {
  std::string press_spec;
  double ratio = 0;
  int samples = 0;
  FidelityAccumulator metrics;
  double compression_ratio = 0, memory_ratio = 0;
  int not_as_configured = 0;
};
std::vector<FidelitySummary> summarize(const std::vector<FidelityRecord>& recs);

std::string csv_header(const TaskSummary&);
std::string csv_row(const TaskSummary& s);
std::string csv_header(const FidelitySummary&);
std::string csv_row(const FidelitySummary& s);

/// Path of a runnable `gnuplot` on PATH, "" when there is none.
std::string find_gnuplot();

/// Plot output format: "svg" or "png" (pngcairo). Other values -> kvslim::Error.
void check_plot_format(const std::string& format);

/// One line of a line plot.
struct PlotSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;
};

/// Writes `out_path` (extension given by `format`) with gnuplot, keeping the script next to it
/// as `out_path` + ".gp" so the plot can be redrawn. Returns false, with the reason in `why`,
/// when gnuplot is absent or fails; never throws for that.
bool plot_lines(const std::vector<PlotSeries>& series, const std::string& title, const std::string& xlabel,
                const std::string& ylabel, const std::string& out_path, const std::string& format,
                std::string* why, bool y_unit_range = false);

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
