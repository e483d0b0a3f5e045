#pragma once
// Computing Expected Attention's query statistics (press/ea_stats.h) on a model and a text.
#include <functional>
#include <vector>

#include "kvslim/model.h"
#include "press/ea_stats.h"

namespace kvslim {

/// Runs every sample through the model (BOS first when the vocabulary wants it) and accumulates, in
/// float64, the pre-RoPE queries (biases added) of tokens at positions >= n_sink (f32 KV cache). Throws
/// kvslim::Error when fewer than 2 queries were counted. `progress(i, n)` after each sample.
QueryStatsFile compute_query_stats(const Model& model, const std::vector<std::vector<Token>>& samples, int n_sink,
                                   const std::function<void(size_t, size_t)>& progress = nullptr);

}  // namespace kvslim
