#pragma once
// LeanKV's split of one segment into precision tiers by score (Zhang et al., "Unifying KV Cache
// Compression for Large Language Models with LeanKV", arXiv 2412.03131). The ranking is a press's
// business; the cache only stores the kept entries and their tier (Segment::retain_tiered).
#include <vector>

#include "kv/cache.h"

namespace kvslim {

/// LeanKV-style split of one segment from its scores (higher = more important): the `n_high`
/// highest-scoring entries stay in the high tier, the next `n_low` go to the low tier, the rest
/// are evicted. Entries scored >= `protect` (a press's protected score) are always high.
/// Ties go to the later entry. Throws kvslim::Error when scores and segment sizes differ.
void apply_precision_tiers(Segment& seg, const std::vector<float>& scores, int n_high, int n_low, KVCodec low_key,
                           KVCodec low_value, float protect = 3.0e38f);


}  // namespace kvslim
