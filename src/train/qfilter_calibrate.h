#pragma once
// Computing Q-Filters' directions (press/qfilter.h) on a model and a text.
#include <functional>
#include <vector>

#include "kvslim/model.h"
#include "press/scorers/qfilter.h"

namespace kvslim {

/// Computes the filters: every document is run through the model (BOS added when the vocabulary
/// wants it) and every token's queries (RoPE applied, all query heads of the KV head's GQA group
/// stacked) feed C = sum q q^T per (layer, KV head) in float64; the direction is C's top
/// eigenvector (LAPACK dsyevd), signed so that sum <q, u> >= 0. `progress(i, n)`
/// after each document. Throws kvslim::Error when there are no tokens.
QFilters qfilter_calibrate(const Model& model, const std::vector<std::vector<Token>>& docs,
                           const std::function<void(size_t, size_t)>& progress = nullptr);

}  // namespace kvslim
