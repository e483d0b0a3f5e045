#pragma once
// Building blocks of the budget policies (internal to src/press).
#include <cstdint>
#include <functional>
#include <vector>

#include "press/authoring.h"

namespace kvslim::budget {

/// Integers x_i in [lo_i, hi_i] summing to `total`, proportional to `desired` where the bounds
/// allow (water-filling: x_i = clamp(lambda * desired_i, lo_i, hi_i) for the lambda that meets the
/// total, then largest-remainder rounding, ties to the lower index). `total` is first clamped to
/// [sum lo, sum hi]. All-zero `desired` is treated as all ones.
std::vector<int64_t> apportion(const std::vector<double>& desired, const std::vector<int64_t>& lo,
                               const std::vector<int64_t>& hi, int64_t total);

/// The uniform budget of segments `segs` ({layer, head} pairs) pooled: min(entries they hold,
/// |segs| x floor(n (1 - ratio))). What every ratio-driven policy keeps in all.
int64_t uniform_total(const KVCache& cache, const Target& t, const std::vector<std::pair<int, int>>& segs);

/// Per segment of `segs`: kProtected count, capped at the segment size.
std::vector<int64_t> protected_counts(const Scores& scores, const std::vector<std::pair<int, int>>& segs);
/// Per segment of `segs`: what it must keep: its kProtected entries and at least one entry when
/// it holds any (no segment is ever emptied).
std::vector<int64_t> floor_counts(const Scores& scores, const std::vector<std::pair<int, int>>& segs);

/// Head-adaptive selection over a group of segments: each segment first keeps must[i] entries (its
/// highest-scoring ones, kProtected first; at least one when it holds any), then `total - sum(must)` further entries go to the
/// highest scores over the concatenation of the group's remaining entries. Ties rank the later
/// entry of a segment first (as select_top), then the earlier segment. Returns the keep-count of
/// each segment, so select_top(scores, count) keeps exactly the chosen entries.
std::vector<int64_t> shared_top(const Scores& scores, const std::vector<std::pair<int, int>>& segs,
                                const std::vector<int64_t>& must, int64_t total);

/// All segments of the cache, layer-major.
std::vector<std::pair<int, int>> all_segments(const KVCache& cache);
/// Segments of one layer.
std::vector<std::pair<int, int>> layer_segments(const KVCache& cache, int layer);

/// Keep-counts of a layer-shaped policy (PyramidKV, ZigZagKV): every segment of layer l asks for
/// desired(l) entries, and apportion() scales the asks to the uniform total, within each
/// segment's protected floor and size.
KeepCounts layer_shaped_keep(const BudgetInput& in, const std::function<double(int layer)>& desired);

}  // namespace kvslim::budget
