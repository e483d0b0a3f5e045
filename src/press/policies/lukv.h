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

}  // namespace kvslim
