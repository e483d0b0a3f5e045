#pragma once
// The evaluation harness (architecture section 6): fidelity of a compressed cache against the
// full cache, synthetic long-context tasks scored by string match, attention statistics, and
// sweeps over presses x compression ratios x samples.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kvslim/eval_metrics.h"
#include "kvslim/eval_tasks.h"
#include "kvslim/press.h"
#include "kvslim/request.h"
#include "kvslim/kv_options.h"

namespace kvslim {

class KVCache;  // internal (src/kv/cache.h); Request::cache() hands it to inspect_end

/// What the cache holds after the context was compressed, measured from the cache.
struct CacheCheck {
  int context_tokens = 0;
  double requested_ratio = 0;          ///< the compression ratio asked for
  size_t entries_total = 0;            ///< context tokens x layers x KV heads
  size_t entries_kept = 0;
  std::vector<size_t> kept_per_layer;
  size_t kv_bytes = 0;
  size_t full_f16_bytes = 0;           ///< a full f16 cache of the context
  size_t shared_bytes = 0;             ///< shared latent bases in use (once per process; not in kv_bytes)
  /// Per needle: the fraction of its entries (tokens x layers x KV heads) still in the cache.
  std::vector<double> needle_kept;
  /// Per needle, per layer: the fraction of its entries (tokens x KV heads) in that layer kept.
  std::vector<std::vector<double>> needle_kept_per_layer;
  /// The measured compression ratio is within tolerance() of the requested one (always true when
  /// none was requested, ratio 0: a budget or threshold press).
  bool as_configured = true;
  double compression_ratio() const { return entries_total ? 1.0 - double(entries_kept) / entries_total : 0.0; }
  double memory_ratio() const { return full_f16_bytes ? double(kv_bytes) / full_f16_bytes : 0.0; }
  /// Allowed |measured - requested|: 0.01 plus one entry per segment of rounding.
  double tolerance() const { return 0.01 + (context_tokens ? 1.0 / context_tokens : 0.0); }
  /// Smallest needle_kept (1 when there is no needle).
  double min_needle_kept() const;
};

/// What the cache holds at the end of a run (after the question and every decoded or
/// teacher-forced token), measured from the cache. A decoding press evicts during decode, so only
/// this measurement shows what it saved; for a press that acts on the context alone the context
/// part equals the CacheCheck taken after prefill.
struct EndCheck {
  int context_tokens = 0;
  int tokens = 0;                   ///< sequence length at the end (context + question + decoded)
  size_t entries = 0;               ///< entries in the cache (all positions)
  size_t entries_total = 0;         ///< tokens x layers x KV heads: a full cache at the end
  size_t context_entries = 0;       ///< entries whose position is inside the context
  size_t context_entries_total = 0; ///< context tokens x layers x KV heads
  size_t kv_bytes = 0;
  size_t full_f16_bytes = 0;        ///< a full f16 cache of all `tokens`
  /// Fraction of the context's entries removed by the end of the run.
  double compression_ratio() const {
    return context_entries_total ? 1.0 - double(context_entries) / context_entries_total : 0.0;
  }
  /// Cache bytes at the end / a full f16 cache of the whole sequence.
  double memory_ratio() const { return full_f16_bytes ? double(kv_bytes) / full_f16_bytes : 0.0; }
};

/// Measures `cache` at the end of a run whose context held `context_tokens` tokens at positions
/// 0..context_tokens-1 and whose sequence is now `tokens` long.
EndCheck inspect_end(const KVCache& cache, int context_tokens, int tokens);

/// Measures `cache` after compressing a context of `context_tokens` tokens at positions
/// 0..context_tokens-1; `spans` are needle token spans [begin, end) (= positions).
CacheCheck inspect_cache(const KVCache& cache, int context_tokens, double requested_ratio,
                         const std::vector<std::pair<int, int>>& spans = {});

/// How a sample is run: the request options of every request a sample makes (session, chunked
/// compression), greedy whatever `sampling` says (answers are scored by string match), and two
/// settings of evaluation's own.
struct RunOptions : RequestOptions {
  /// n_predict here is the tokens to decode for a task answer; 0 (the default) = the sample's own
  /// suggestion.
  RunOptions() { n_predict = 0; }
  /// Task samples only: each context, once compressed, is written as a stored context's bytes and
  /// read back (kvslim/context.h), and the question is answered from the loaded context. Scores
  /// must equal those of the in-memory run; a press that cannot be stored is an error.
  bool stored_context = false;
};

/// One task sample run: prefill + compress the context, forward the question, greedy decode.
struct TaskOutcome {
  std::string answer;
  double score = 0;         ///< string_match_all or _part, as the sample asks
  int question_tokens = 0;
  int generated_tokens = 0;
  CacheCheck cache;  ///< after the context was compressed
  EndCheck end;      ///< after the last decoded token
  double prefill_seconds = 0, press_seconds = 0, decode_seconds = 0;
};

/// Runs one sample with `press` (reset first). Decoding is greedy and stops at end-of-generation,
/// after n_predict tokens, or when the answer holds the sample's stop string after some
/// non-space text. Throws kvslim::Error when the sample does not fit the context size.
TaskOutcome run_task(const Model& model, Press& press, const TaskSample& sample, const TokenizedSample& toks,
                     const std::string& stop, const RunOptions& opt);

/// Full-cache reference of a teacher-forced continuation: the logits of every continuation
/// token after the first, [continuation.size() - 1][n_vocab] (the first continuation token is
/// fed, not predicted, so each prediction is made after the press acted).
struct FidelityReference {
  std::vector<Token> prefix;        ///< the context: compressed by the press (BOS included)
  std::vector<Token> continuation;  ///< teacher-forced, never compressed
  std::vector<float> logits;
  int n_vocab = 0;
};

/// The full-precision cache of `opt`: its quantized codecs (q8_0, q4_0) become f16 and KIVI /
/// Hadamard are off. Fidelity references, sampled texts and attention statistics use it, so they
/// are the same whatever cache a sweep measures.
SessionOptions full_precision(SessionOptions opt);

/// Runs the full cache over prefix + continuation. The full cache is also full precision
/// (full_precision(opt.session)), so a quantized cache is measured against the cache it
/// approximates. Throws kvslim::Error when the prefix is
/// empty, the continuation has fewer than 2 tokens, or the whole does not fit the context size.
FidelityReference fidelity_reference(const Model& model, std::vector<Token> prefix, std::vector<Token> continuation,
                                     const RunOptions& opt);

struct FidelityOutcome {
  FidelityAccumulator metrics;
  CacheCheck cache;  ///< after the context was compressed
  EndCheck end;      ///< after the last teacher-forced token
  double seconds = 0;
};

/// Compresses the prefix with `press` (reset first), teacher-forces the continuation and compares
/// each next-token distribution with the reference: KL(full || compressed), top-1 agreement,
/// perplexity of both.
FidelityOutcome run_fidelity(const Model& model, Press& press, const FidelityReference& ref, const RunOptions& opt);

/// Attention statistics of a full cache: for each query head, MBA = the fewest entries whose
/// attention, summed over the last `window` queries, holds at least `tau` of the total
/// (minimum_budget in src/eval/attention_stats.h); LMBA = the mean MBA of a layer's heads. Zhong et al., "ZigZagKV: Dynamic KV Cache Compression for
/// Long-context Modeling based on Layer Uncertainty", arXiv 2412.09036.
struct AttentionStats {
  int context_tokens = 0;
  int window = 0;
  double tau = 0;
  std::vector<std::vector<int>> mba;  ///< [layer][query head], entries
  std::vector<double> lmba;           ///< [layer], entries
};

/// Prefills `tokens` with a full cache and measures AttentionStats. Throws kvslim::Error for
/// window < 1, tau outside (0, 1], or window longer than the tokens.
AttentionStats attention_stats(const Model& model, const std::vector<Token>& tokens, int window, double tau,
                               const SessionOptions& session);

/// One (press spec, compression ratio) of a sweep.
struct PressRun {
  std::string spec;
  double ratio = 0;
};

/// The runs of a sweep: the full-cache baseline ("none" at 0) first when `baseline`, then every
/// press at every ratio ("none" is not repeated; a press that does not keep its entries by a ratio,
/// such as one with a per-head `budget`, runs once at ratio 0). Throws kvslim::Error for an unknown press or a
/// ratio outside [0, 1) (via make_press).
std::vector<PressRun> expand_runs(const std::vector<std::string>& presses, const std::vector<double>& ratios,
                                  bool baseline);

/// Which part of a sweep one process runs: the sweep's units (one sample run with one press and
/// ratio, numbered in the order a single process runs them) are cut into `count` contiguous
/// blocks and this process runs block `index`. Contiguous blocks keep a sample's units together,
/// so a fidelity reference is computed by as few shards as possible.
struct Shard {
  int index = 0;
  int count = 1;
  /// Units [begin, end) of a sweep of `total` units.
  size_t begin(size_t total) const { return total * index / count; }
  size_t end(size_t total) const { return total * (index + 1) / count; }
};

/// Parses "I/N" (0 <= I < N). Throws kvslim::Error naming the text otherwise.
Shard parse_shard(const std::string& text);

/// Reports progress: runs done, runs in all, and what runs now.
using ProgressFn = std::function<void(size_t done, size_t total, const std::string& what)>;

/// A task sweep: tasks x lengths x depths x samples, each sample run with every PressRun.
struct TaskSweep {
  std::vector<std::string> tasks;  ///< "niah" and/or names from ruler_tasks()
  std::vector<int> lengths;        ///< context tokens, BOS included
  std::vector<double> depths;      ///< needle depths; empty -> one random depth per sample
  int samples = 1;                 ///< per (task, length, depth)
  uint64_t seed = 0;
  TaskText text = TaskText::defaults();
  RulerOptions ruler;
  RunOptions run;
  Shard shard;  ///< the part of the sweep to run (default: all of it)
};

/// One task result.
struct TaskRecord {
  size_t index = 0;            ///< the unit's place in the whole sweep (the order of a single process)
  std::string task, press, press_spec;
  double ratio = 0;
  int length = 0;              ///< requested context tokens
  double depth = -1;           ///< requested depth of the asked needle (-1: drawn at random)
  double measured_depth = -1;  ///< from the tokens
  int sample = 0;
  uint64_t seed = 0;
  std::vector<std::string> answers;
  std::vector<std::pair<int, int>> needle_spans;
  TaskOutcome outcome;
};

/// Runs the sweep (the shard of it `sweep.shard` names); `on_record` receives each result as soon
/// as it exists. Returns the number of runs in the whole sweep (all shards). Samples depend only
/// on (seed, task, length, depth, sample index), so every press sees the same samples.
size_t run_task_sweep(const Model& model, const std::vector<PressRun>& runs, const TaskSweep& sweep,
                    const std::function<void(const TaskRecord&)>& on_record, const ProgressFn& progress = nullptr);

/// A fidelity sweep over samples of a text.
struct FidelitySweep {
  int context_tokens = 256;       ///< prefix (BOS included), compressed
  int continuation_tokens = 128;  ///< teacher-forced
  int samples = 4;
  uint64_t seed = 0;
  /// Token sequence to cut samples from (consecutive windows). Empty -> each sample is sampled
  /// from the model itself (temperature 1, end-of-generation masked, seeded).
  std::vector<Token> text;
  int lmba_window = 0;  ///< > 0: also measure AttentionStats of each sample's prefix
  double lmba_tau = 0.9;
  RunOptions run;
  Shard shard;  ///< the part of the sweep to run (default: all of it)
};

struct FidelityRecord {
  size_t index = 0;  ///< the unit's place in the whole sweep (the order of a single process)
  std::string press, press_spec;
  double ratio = 0;
  int sample = 0;
  FidelityOutcome outcome;
};

/// Runs the sweep (the shard of it `sweep.shard` names) and returns the number of runs in the
/// whole sweep (all shards). `on_stats` (may be null) receives each sample's AttentionStats when asked (from
/// the shard that runs the sample's first unit).
/// Throws kvslim::Error when the text is too short for one sample.
size_t run_fidelity_sweep(const Model& model, const std::vector<PressRun>& runs, const FidelitySweep& sweep,
                        const std::function<void(const FidelityRecord&)>& on_record,
                        const std::function<void(int sample, const AttentionStats&)>& on_stats = nullptr,
                        const ProgressFn& progress = nullptr);

/// Samples `n` tokens from the model after BOS at temperature 1 (end-of-generation masked so the
/// text never stops), seeded: a text of the model's own distribution for fidelity runs.
std::vector<Token> sample_text(const Model& model, int n, uint64_t seed, const SessionOptions& session);

}  // namespace kvslim
