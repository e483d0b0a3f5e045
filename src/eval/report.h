#pragma once
// How the evaluation harness writes its results: JSON lines and CSV records and summaries, and
// plots drawn by gnuplot (run as a subprocess; no plotting code of our own).
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvslim/eval.h"
#include "kvslim/eval_results.h"
#include "kvslim/eval_run_info.h"

namespace kvslim {

/// The run record (the first line of samples.jsonl).
nlohmann::json to_json(const RunInfo& info);
/// Throws kvslim::Error naming `what` and the field when a field is missing or mistyped, or when
/// `config` is not a JSON object.
RunInfo run_info_from_json(const nlohmann::json& j, const std::string& what);

/// One JSON object per result (written one per line to a .jsonl file).
nlohmann::json to_json(const TaskRecord& r);
nlohmann::json to_json(const FidelityRecord& r);
nlohmann::json to_json(const AttentionStats& s, int sample);

/// Per-sample CSV: a header line and one row per record (lists joined with ';').
std::string csv_header(const TaskRecord&);
std::string csv_row(const TaskRecord& r);
std::string csv_header(const FidelityRecord&);
std::string csv_row(const FidelityRecord& r);

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
