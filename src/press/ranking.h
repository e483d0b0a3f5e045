#pragma once
// The one entry-ranking rule of kvslim (internal to src/press): select_top (kvslim/press.h), the
// global budget and LeanKV's precision tiers all order entries with it.
#include <cstdint>
#include <vector>

namespace kvslim {

/// Entry indices of one segment from the most to the least important: higher score first, the
/// later entry first among equal scores (recency), NaN last. A total order: deterministic.
std::vector<int32_t> rank_entries(const std::vector<float>& scores);

}  // namespace kvslim
