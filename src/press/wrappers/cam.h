#pragma once
// CaM (kvpress's CAMPress): cache merging during decode. Zhang et al., "CaM: Cache Merging for
// Memory-efficient LLMs Inference", ICML 2024 (openreview.net/forum?id=LCTmppB165); reference:
// kvpress/presses/cam_press.py. Every `interval` decode steps, when a layer holds more than `size`
// entries, the inner scorer's scores averaged over the layer's KV heads choose the `size` entries
// every head keeps; before the others are evicted, the k best-scored of them (k = decode steps
// since the last compression; ties: the later entry) are merged: the value of such an entry i goes,
// divided by the window's size, into each of the next `merge_budget` kept entries after it (fewer
// at the end of the cache), in KV head h with probability clamp(A_h(i) / mean_window A_h, 0, 1),
// A = the attention each entry has accumulated during decode (averaged over the GQA group; 0/0
// counts as 0, x/0 as 1). Keys are not changed.
#include <cstdint>
#include <functional>
#include <vector>

namespace kvslim {

/// CaM's merge for one layer whose n_kv KV heads hold the same n entries. mean_score[n]: the
/// inner scores averaged over the heads; attn[h][n]: accumulated attention; values[h][n * hd]
/// (modified in place: only kept entries receive merges); uniform(): draws in [0, 1) for the
/// Bernoulli masks (entry i merges in head h when the draw is below its probability; one draw per
/// merge candidate and head, candidates in increasing entry order, heads in order). Returns the
/// kept entry indices in increasing order.
std::vector<int32_t> cam_merge_layer(const std::vector<float>& mean_score, const std::vector<std::vector<double>>& attn,
                                     int keep, int k, int merge_budget, std::vector<std::vector<float>>& values, int hd,
                                     const std::function<double()>& uniform);

}  // namespace kvslim
