#pragma once
// CriticalKV's output-perturbation weight (internal to src/press): how much an entry's value moves
// the attention output, ||W_o^q v||_1, where W_o^q is the slice of the output projection that
// reads query head q (its head_dim input columns). Feng et al., arXiv 2502.03805; kvpress's
// CriticalKVPress.vwl1norm.
#include <cstdint>
#include <vector>

#include "press/authoring.h"

namespace kvslim {

/// For the entries `idx` of segment `kv_head` of the view's layer: ||W_o^q v||_1 averaged over the
/// query heads q of the KV head's GQA group. Returns one value per index, in float64 accumulation
/// over the engine's matmul (for a quantized W_o, its 8-bit-activation kernel). Thread-safe.
std::vector<double> projected_value_l1(const LayerView& view, int kv_head, const std::vector<int32_t>& idx);

}  // namespace kvslim
