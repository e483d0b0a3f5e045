#pragma once
// The memory a run will need, printed before the prefill and checked against what the machine (or
// its limits) leaves: the weights, the KV cache at the run's codecs and the tokens it can reach
// (bounded by a press that keeps a per-head budget or a ratio during chunked prefill), and the
// forward pass's activation buffers at the prefill batch size.
#include <cstddef>
#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "kvslim/model.h"
#include "kvslim/press.h"
#include "tools/tools.h"

namespace kvslim::cli {

/// Bytes of one segment (one layer and KV head) holding `n` entries at codecs `k`, `v` and `q`:
/// KVCache::bytes of a segment filled that far (keys, values, scales, KIVI groups and residual
/// window, positions), measured on a small segment and extrapolated linearly past it.
size_t segment_bytes(KVCodec k, KVCodec v, const KVQuantOptions& q, int head_dim, size_t n);

/// Bytes of the forward pass's activation buffers for a batch of `n` rows (Session's scratch:
/// residual, norm and output rows, q/k/v, attention output, gate and up rows, the RoPE tables)
/// and the logits it returns (`all_logits`: one row per token).
size_t scratch_bytes(const HParams& hp, int n, bool all_logits = false);

/// Entries a segment reaches over a run of `context` prompt tokens (the part a press compresses)
/// and `later` tokens after it (question, generated tokens), at most `n_ctx` (0 = no cap): all of
/// them, unless prefill is chunked (`chunk_size` > 0) under a press whose ratio or per-head budget
/// bounds the cache: then the press's kept size of the context plus one chunk (held before the
/// last compression), or the kept size plus the later tokens, whichever is larger.
size_t kv_entries(const Press* press, size_t context, size_t later, int chunk_size, size_t n_ctx);

/// What a run needs.
struct MemoryEstimate {
  size_t weights = 0, kv = 0, scratch = 0;
  std::string kv_codecs;     ///< e.g. "f16" or "k=q8_0 v=q4_0"
  size_t kv_tokens = 0;      ///< entries per (layer, KV head) the KV figure counts
  size_t kv_sequences = 1;   ///< caches (serve: parallel slots)
  int n_layer = 0, n_head_kv = 0;
  size_t total() const { return weights + kv + scratch; }
};

/// The estimate for `sequences` caches of `kv_tokens` entries per segment each, a prefill batch of
/// `batch` rows.
MemoryEstimate estimate_memory(const Model& model, KVCodec k, KVCodec v, const KVQuantOptions& q, size_t kv_tokens,
                               int batch, size_t sequences = 1);

/// Bytes this process may still allocate: MemAvailable (/proc/meminfo), lowered by RLIMIT_AS and
/// RLIMIT_DATA (less what the process already holds under them) and by the cgroup's memory.max
/// (less memory.current) when they are set. 0 when nothing can be read.
size_t available_memory();

/// "memory: weights 1.10 GiB + KV cache 0.53 GiB (f16, 131072 tokens, 16 layers x 8 KV heads) + scratch
/// 0.20 GiB = 1.83 GiB; available 21.3 GiB".
std::string describe(const MemoryEstimate& e, size_t available);

/// Prints describe() on stderr and, when the total exceeds `available` (taken before the model was
/// loaded; 0 = unknown) and `check` is set, throws kvslim::Error naming both figures and what lowers
/// the estimate (-c, --cache-type-k/v, a press with budget=; --no-memory-check to run anyway).
void report_memory(const MemoryEstimate& e, size_t available, bool check);
/// The same, printing `shown` but refusing only when `needed` does not fit (serve: every slot full is
/// shown, one slot at its full context must fit).
void report_memory(const MemoryEstimate& shown, const MemoryEstimate& needed, size_t available, bool check);

/// "--no-memory-check": run even when the estimate exceeds the memory available.
CLI::Option* add_memory_check_flag(CLI::App* sub, bool& no_memory_check);

}  // namespace kvslim::cli
