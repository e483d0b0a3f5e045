#pragma once
// KVCompose (kvpress's KVComposePress): attention-guided, layer-adaptive compression with
// composite tokens. Akulov et al., "KVCompose: Efficient Structured KV Cache Compression with
// Composite Tokens", arXiv 2509.05165; reference: kvpress/presses/kvcompose_press.py.
// After the context is prefilled, the context's own tokens are run again after it ("replay":
// positions continue, the replay attends causally to the whole context and to itself); every
// context entry then scores, per query head, the largest (agg_task=max) or mean attention
// probability it receives from the replay queries; scores are aggregated over the GQA group
// (agg_group, mean), optionally multiplied by the value norm, and the mean over the layer's KV
// heads is added to every head (add_mean_across_heads). Budgets: each head's scores sorted in
// descending order form its composite tokens; a layer's composite token r aggregates (agg_head,
// mean) rank r over its heads; layer 0's composite tokens take the maximum over all layers; one
// top-k of int(layers x n x (1 - ratio)) over all layers' composite tokens gives each layer its
// count (the first keep_token_lower_bound ranks of every layer are taken first). Structured (the
// default): every KV head of layer l keeps that many entries, its own best; unstructured: the
// same top-k over every head's sorted scores gives per-head counts.
#include <vector>

#include "press/authoring.h"

namespace kvslim {

/// How a KVCompose statistic is reduced: the largest value or the mean.
enum class ComposeAgg { Max, Mean };

struct KVComposeOptions {
  bool structured = true;
  ComposeAgg agg_task = ComposeAgg::Max;   ///< over the replay queries
  ComposeAgg agg_group = ComposeAgg::Mean; ///< over the query heads of a GQA group
  ComposeAgg agg_head = ComposeAgg::Mean;  ///< over the KV heads of a layer (composite tokens)
  bool add_v_norm = false;
  bool add_mean_across_heads = true;
  int keep_token_lower_bound = 0;
  int batch = 256;  ///< replay tokens per forward call (bounds the recorded queries)
};

/// Keep-counts of KVCompose for final scores scores[layer][kv head][entry] (after the group
/// aggregation and the enhancements): kept[layer][kv head]. `n_total` = the context length the
/// ratio applies to (kvpress: every segment holds it); the top-k keeps int(n_layer x n_total x
/// (1 - ratio)) composite tokens (structured) or int(n_layer x n_head_kv x n_total x (1 - ratio))
/// sorted scores (unstructured). Every count is clamped to [1, segment size]. Ties in the top-k
/// go to the earlier layer (and head), then the lower rank.
KeepCounts kvcompose_counts(const Scores& scores, size_t n_total, double ratio, const KVComposeOptions& opt);

}  // namespace kvslim
