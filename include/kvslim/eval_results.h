#pragma once
// A sweep's results directory: samples.jsonl (a provenance line, then one record per run),
// samples.csv, summary.csv, summary.json and the plots. Written the same way whether the records
// come from one process, from MPI ranks, or from shards read back and merged, so the three give
// identical files (timings aside).
#include <string>
#include <utility>
#include <vector>

#include "kvslim/eval.h"
#include "kvslim/eval_run_info.h"

namespace kvslim {

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
/// read. Returns JSON object text with sorted keys, as RunInfo::config holds it.
std::string sweep_config(const std::vector<PressRun>& runs, const FidelitySweep& sweep, const std::string& text_file);
std::string sweep_config(const std::vector<PressRun>& runs, const TaskSweep& sweep, const std::string& text_config);

/// Merges the shards of one sweep. Throws kvslim::Error naming the files when they come from
/// different sweeps (eval kind, configuration, model hash, version), when a shard is missing or
/// given twice, or when a unit appears twice.
SweepResults merge_results(const std::vector<SweepResults>& parts, const std::vector<std::string>& names);

}  // namespace kvslim
