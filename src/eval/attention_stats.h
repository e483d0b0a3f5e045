#pragma once
// ZigZagKV's attention statistics: how many entries each head and each layer needs. Zhong et al.,
// "ZigZagKV: Dynamic KV Cache Compression for Long-context Modeling based on Layer Uncertainty",
// arXiv 2412.09036.
#include <string>
#include <vector>

#include "kvslim/eval.h"
#include "kvslim/model.h"
#include "model/session.h"
#include "press/mba.h"  // minimum_budget

namespace kvslim {

struct LayerBudgetOptions {
  int window = 32;          ///< last prompt tokens whose queries are analysed (observation window)
  double mass = 0.9;        ///< attention mass an MBA must hold
  double similarity = 0.99; ///< cosine similarity an LMBO budget must reach
};

/// ZigZagKV's budgets of one prompt, full cache.
struct LayerBudgets {
  /// MBA per query head (of the head's attention summed over the window queries, by
  /// minimum_budget) and LMBA per layer (mean MBA over its query heads); `tau` is the mass.
  AttentionStats attention;
  double similarity = 0;
  /// lmbo[layer]: the smallest per-KV-head budget B such that keeping, in every KV head, its B
  /// entries with the most window attention (summed over the GQA group) gives the layer's
  /// attention output (W_o applied) a mean cosine similarity to the full one of at least
  /// `similarity` over the window queries (found by bisection: the similarity is taken as
  /// non-decreasing in B).
  std::vector<int> lmbo;
};

/// Prefills `tokens` (BOS included if wanted) with a full cache and measures MBA, LMBA and LMBO
/// in one pass. Throws kvslim::Error for an empty prompt or bad options.
LayerBudgets layer_budgets(const Model& model, const std::vector<Token>& tokens, const LayerBudgetOptions& opt,
                           const SessionOptions& session = {});

}  // namespace kvslim
