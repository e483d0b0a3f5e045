#pragma once
// LU-KV's offline profiling (arXiv 2602.08585, after the paper's description): the per-head
// budget curve the `lukv` policy (press/lukv.h) reads, computed on a model and a text.
#include <string>
#include <vector>

#include "kvslim/model.h"
#include "press/policies/lukv.h"

namespace kvslim {

/// The allocation: each head's utility curve u[h][s] (retained utility when keeping s of `steps`
/// equal parts of its entries, s = 0 .. steps), replaced by its upper concave envelope; the `budget`
/// parts go to the steepest envelope segments first (greedy on marginal utility: optimal for the
/// envelopes, a segment may be cut; ties to the lower head). Returns the kept fraction of each head.
std::vector<double> lukv_allocate(const std::vector<std::vector<double>>& u, int steps, double budget);

/// Offline profiling (kvslim's, after the paper's description): each document is cut into a
/// context (its first `context_fraction` of tokens) and a future (the rest). The scorer `scorer_spec`
/// scores the context's entries; an entry's utility is the attention it receives from the future's
/// queries (summed over them and the GQA group, over their count x group size: the share of the
/// future's attention it holds). u[l][h][s] = utility kept by the scorer's best s/100 of the
/// context (averaged over documents). Then for every ratio r = 1..99 % the per-head kept fractions
/// come from lukv_allocate with a budget of (1 - r) x layers x heads. `progress(i, n)` after each
/// document. Throws kvslim::Error without documents or for a scorer that is not a scorer press.
LUKVCurve lukv_profile(const Model& model, const std::vector<std::vector<Token>>& docs, const std::string& scorer_spec,
                       double context_fraction, const std::function<void(size_t, size_t)>& progress = nullptr);

}  // namespace kvslim
