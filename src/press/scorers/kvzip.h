#pragma once
// KVzip: query-agnostic scores from context reconstruction. After the context is prefilled the
// model is asked to repeat it ("replay"); every cached entry scores the largest attention it
// receives from the replay queries. Kim et al., "KVzip: Query-Agnostic KV Cache Compression with
// Context Reconstruction", arXiv 2505.23416. KVzip+ normalisation from Jegou et al., "KVzap: Fast,
// Adaptive, and Faithful KV Cache Pruning", arXiv 2601.07891.
#include <cstdint>
#include <vector>

#include "press/authoring.h"
#include "press/position_scores.h"
#include "model/layer_hook.h"

namespace kvslim {

/// Options of KVzip's replay.
struct KVzipOptions {
  int chunk = 2048;       ///< context tokens replayed per chunk (the paper's m)
  int n_sink = 4;         ///< first entries of a segment: in every later chunk's softmax, and kept
  bool plus = true;       ///< KVzip+ normalisation: x ||W_o v_j|| / ||h_query||
  int batch = 256;        ///< replay tokens per forward call (bounds the recorded queries)
  int prev_tokens = 8;    ///< tokens of the previous chunk quoted by a later chunk's instruction
};

/// Per query head g of layer `layer`: M_g = W_g^T W_g where W_g is W_o restricted to the head's
/// head_dim input columns, so ||W_g v|| = sqrt(v^T M_g v). Returns [n_head][head_dim][head_dim].
std::vector<float> value_output_gram(const Model& model, int layer);
/// sqrt(v^T M v) for a head_dim x head_dim matrix M (float64 accumulation).
float gram_norm(const float* M, const float* v, int head_dim);

/// KVzip's scoring of one (layer, KV head) for a batch of replay queries; a pure function.
/// For query row r (of each of the G query heads of the GQA group) the softmax covers the entries
/// [0, n_sink) (sinks, disjoint from the chunk: n_sink <= ctx_begin), [ctx_begin, ctx_end) (the
/// chunk being reconstructed) and [replay_begin, replay_begin + replay_visible[r]) (the replay's
/// own entries, causally), with logits q.k / sqrt(head_dim). For each chunk entry j,
/// score[j - ctx_begin] = max(score, max over g, r of p_{g,r}(j) * wov[g][j - ctx_begin] * inv_hnorm[r]).
/// q: [G][n_q][head_dim] (RoPE applied). inv_hnorm: [n_q] or nullptr (1). wov: [G][ctx_end -
/// ctx_begin] or nullptr (1). Throws kvslim::Error for ranges outside the segment.
void kvzip_score_segment(const Segment& seg, size_t n_sink, size_t ctx_begin, size_t ctx_end, size_t replay_begin,
                         const float* q, int G, int n_q, const int32_t* replay_visible, const float* inv_hnorm,
                         const float* wov, float* score);

/// Runs KVzip's replay through `session` (the request runner's ModelRunner), whose cache holds the context entries at positions
/// first_pos .. first_pos + tokens.size() - 1 (their tokens are `tokens`; a leading BOS is scored
/// but not replayed). The context is replayed in chunks: an instruction ("Repeat the previous
/// context exactly.", or for later chunks "Repeat the part of the previous context exactly,
/// starting with" + the previous chunk's last tokens), a newline, then the chunk's tokens. After
/// each chunk the replay's entries are discarded and the position counter restored. Returns
/// scores[layer][kv head][entry] aligned with the segments: the (KVzip+) score of entries in the
/// range, NaN elsewhere. Chunks are shortened when the context size would be exceeded; throws
/// kvslim::Error when not even 16 replay tokens fit. `before`: the context tokens just before
/// `tokens` (an earlier chunk of a chunked prefill); when given, the first chunk is replayed as a
/// later one, quoting their last prev_tokens tokens.
Scores kvzip_replay_scores(ModelRunner& session, const std::vector<Token>& tokens, int32_t first_pos,
                           const KVzipOptions& opt, const std::vector<Token>& before = {});

/// Positions the replay needs after the last context token at the least: its instruction, the
/// quoted tail, a newline and 16 replayed tokens (kvzip_replay_scores shortens chunks down to 16).
int kvzip_min_replay_positions(const Tokenizer& tok, const KVzipOptions& opt);

/// The `kvzip` press (kvpress's KVzipPress): replay scores of every prefill step stored by
/// position, sinks and entries no replay scored (a question, RestoreKV's restore entries) never
/// evicted, under `policy` (default: the `global` policy, one top-k over all layers and heads).
/// RestoreKV (press/restorekv.cpp) derives from it as kvpress's RestoreKVPress derives from
/// KVzipPress.
class KVzipPress : public ScorerPress {
 public:
  /// policy: nullptr = the registry's `global` policy.
  KVzipPress(double ratio, KVzipOptions opt, std::unique_ptr<BudgetPolicy> policy = nullptr);
  std::string describe_scorer() const override;
  /// "kvzip:..." under the global policy (it is KVzip's own), "<policy>(kvzip:...)" otherwise.
  std::string describe() const override;
  ObservationNeeds scorer_needs() const override;
  void reset() override;
  /// Replays the step's tokens (obs.runner must own `cache`) and stores their entries' scores by
  /// position. Ratio 0: nothing (the cache stays bit-identical).
  void observe(const KVCache& cache, const Model& model, const Observation& obs) override;
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override;
  void apply(KVCache& cache, const Model& model, const Observation& obs, const Target& target) override;
  void remap_positions(int layer, int kv_head, const std::vector<int32_t>& old_pos,
                       const std::vector<int32_t>& new_pos) override;

 protected:
  const KVzipOptions& options() const { return opt_; }

 private:
  KVzipOptions opt_;
  PositionScores stored_;  // replay scores of the entries still in the cache
  std::vector<Token> tail_;  // the last observed step's last prev_tokens tokens
  int32_t tail_end_ = -1;    // the position after them
};

}  // namespace kvslim
