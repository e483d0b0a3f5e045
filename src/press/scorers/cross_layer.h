#pragma once
// Cross-layer entry sharing (press `cla`, src/press/scorers/cross_layer.cpp): CLA (arXiv 2405.12981)
// applied after training, layers chosen by the measured difference of their entries (MiniCache,
// arXiv 2405.14366, observes adjacent layers' similarity).
#include "kv/cache.h"

namespace kvslim {

/// Relative squared difference between layer `l`'s entries and layer `src`'s over the entries at
/// positions both hold, every KV head: max(sum ||k_l - k_src||^2 / sum ||k_l||^2, the same for
/// values), summed in float64 (entries decoded as the cache stores them). +inf when no position is
/// shared or layer l's keys or values are all zero.
double cross_layer_difference(const KVCache& cache, int l, int src);

}  // namespace kvslim
