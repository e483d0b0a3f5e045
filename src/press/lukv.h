#pragma once
// LU-KV: head-wise budgets read from a precomputed budget curve around a scorer. Tang et al.,
// "Predicting Future Utility: Global Combinatorial Optimization for Task-Agnostic KV Cache
// Eviction", arXiv 2602.08585; reference press: kvpress kvpress/presses/lukv_press.py (the curve
// is a [99][layers][KV heads] array of per-head prune ratios, row round(100 ratio) - 1). kvpress
// downloads one curve (Llama-3.1-8B + Expected Attention) made by the LU-KV repository's scripts;
// kvslim computes curves on the user's model and text with `kvslim lukv-curve` (lukv_profile and
// lukv_allocate below), stored as GGUF.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvslim/model.h"

namespace kvslim {

/// Per-head prune ratios for target ratios 0.01 .. 0.99: prune[(i * n_layer + l) * n_head_kv + h]
/// for ratio (i + 1) / 100.
struct LUKVCurve {
  int n_layer = 0, n_head_kv = 0;
  std::vector<float> prune;  ///< [99][n_layer][n_head_kv]
  float at(int i, int l, int h) const { return prune[(static_cast<size_t>(i) * n_layer + l) * n_head_kv + h]; }
  /// Writes a GGUF file (lukv.* metadata, tensor lukv.curve); `desc` names the model and scorer.
  void save(const std::string& path, const std::string& desc) const;
  /// Reads a file written by save(), or (path ending in .npy) a NumPy array of shape (99, layers,
  /// KV heads), float32 or float64, as kvpress loads LU-KV's published curves. Throws
  /// kvslim::Error naming the file.
  static LUKVCurve load(const std::string& path);
};

/// kvpress's keep-counts of one layer: keep rate clamp(1 - prune_h, 0, 1), ideal count rate x n,
/// total round(sum ideal) (half to even) clamped to [H, H n], floors plus one for the largest
/// fractional parts (ties to the lower head) until the total is met, then each clamped to [1, n].
std::vector<int> lukv_layer_keep(const std::vector<float>& prune, int n);
/// The curve row kvpress reads for `ratio`: round(100 ratio) - 1 (half to even) clamped to [0, 98].
int lukv_row(double ratio);

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
