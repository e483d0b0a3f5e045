#pragma once
// ZigZagKV's minimum budget (MBA): how many entries hold a given share of a head's attention.
// Zhong et al., "ZigZagKV: Dynamic KV Cache Compression for Long-context Modeling based on Layer
// Uncertainty", arXiv 2412.09036. One definition for the ZigZagKV policy, `kvslim
// attention-stats` and the evaluation harness.
#include <cstddef>
#include <vector>

#include "press/authoring.h"

namespace kvslim {

/// MBA of one attention distribution p[n]: the fewest entries whose probabilities sum to at least
/// `mass` of the row's total (largest first); 0 for an empty or all-zero row. Throws kvslim::Error
/// for a mass outside (0, 1].
int minimum_budget(const float* p, size_t n, double mass);

/// MBA of every query head of the view's layer (index kv_head * group + g, n_head values), each of
/// the head's attention summed over the last `rows` observation-window queries
/// (LayerView::window_mass). Throws as minimum_budget.
std::vector<int> query_head_mba(const LayerView& view, int rows, double mass);

}  // namespace kvslim
