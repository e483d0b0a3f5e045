#pragma once
// A sweep's results directory: samples.jsonl (a provenance line, then one record per run),
// samples.csv, summary.csv, summary.json and the plots. Written the same way whether the records
// come from one process, from MPI ranks, or from shards read back and merged, so the three give
// identical files (timings aside).
#include <string>
#include <utility>
#include <vector>

#include "kvslim/eval.h"
#include "kvslim/eval_report.h"
#include "kvslim/eval_run_info.h"

namespace kvslim {

/// Everything one sweep produced.
struct SweepResults {
  RunInfo info;
  std::vector<TaskRecord> tasks;                       ///< niah / ruler
  std::vector<FidelityRecord> fidelity;                ///< fidelity
  std::vector<std::pair<int, AttentionStats>> stats;   ///< fidelity: (sample, statistics)
  /// Restores the single-process order (records by index, statistics by sample).
  void sort();
};

/// Options of write_results.
struct ResultsOptions {
  std::string dir;
  std::string plot_format = "svg";  ///< svg or png
  bool plots = true;
  bool summaries = true;            ///< false: samples only (one shard of a sweep)
};

/// What write_results produced.
struct ResultsReport {
  std::vector<TaskSummary> task_coarse;     ///< per (task, press, ratio)
  std::vector<TaskSummary> task_fine;       ///< per (task, press, ratio, length, depth)
  std::vector<FidelitySummary> fidelity;    ///< per (press, ratio)
  std::vector<double> lmba;                 ///< mean LMBA per layer (empty without statistics)
  /// Problems a reader must see before trusting the numbers (a full cache that scored 0, runs
  /// that missed their ratio, a missing baseline), one sentence each.
  std::vector<std::string> warnings;
  std::string plot_problem;                 ///< why plots were skipped ("" when drawn or not asked)
  std::vector<std::string> files;           ///< files written
};

/// Writes the results directory (created if needed). Throws kvslim::Error when a file cannot be
/// written; a missing gnuplot only sets plot_problem.
ResultsReport write_results(const SweepResults& results, const ResultsOptions& opt);

/// samples.jsonl's text: the run record, then per sample its attention statistics and its runs.
std::string results_jsonl(const SweepResults& results);

/// Parses samples.jsonl text; `name` names it in errors (file name, or "rank 3").
SweepResults parse_results(const std::string& text, const std::string& name);

/// Reads `DIR/samples.jsonl` (or the file itself when given one). Throws kvslim::Error naming
/// the file and line on anything malformed.
SweepResults read_results(const std::string& path);

/// RunInfo::config of a sweep: the settings that make it this sweep, so shards merge only when they
/// are equal. The runs (spec, ratio), samples, seed, context size, chunk size, the cache's codecs
/// and KIVI / Hadamard settings (from sweep.run), the sweep's own settings, and the file its text
/// came from ("" = none: sampled from the model, or the default task text) with the file's SHA-256.
/// The CLI and the Python binding both record this. Throws kvslim::Error when the file cannot be
/// read.
nlohmann::json sweep_config(const std::vector<PressRun>& runs, const FidelitySweep& sweep, const std::string& text_file);
nlohmann::json sweep_config(const std::vector<PressRun>& runs, const TaskSweep& sweep, const std::string& text_config);

/// Merges the shards of one sweep. Throws kvslim::Error naming the files when they come from
/// different sweeps (eval kind, configuration, model hash, version), when a shard is missing or
/// given twice, or when a unit appears twice.
SweepResults merge_results(const std::vector<SweepResults>& parts, const std::vector<std::string>& names);

}  // namespace kvslim
