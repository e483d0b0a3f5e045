#pragma once
// Accumulated attention per cache entry (H2O, ObservedAttention): the attention each entry has
// received from every recorded query so far, and how many recorded queries could see it. State is
// keyed by position, so it survives any eviction (by this press or another) and chunked prefill.
// Internal to src/press.
#include <cstdint>
#include <vector>

#include "kv/cache.h"
#include "press/authoring.h"

namespace kvslim {

class AttentionAccumulator {
 public:
  /// Follows the cache (drops evicted entries, adds new ones with nothing accumulated) and adds
  /// the step's Observation::attention_mass when it was recorded (sizes match the segments). The
  /// step's queries are its newest tokens: their number is the step's total mass / group size
  /// (each query's softmax sums to one over the group's G heads), and an entry at position p
  /// gains one count per step query at a position >= p (causal visibility).
  void observe(const KVCache& cache, const Observation& obs, int group);
  /// Per entry of the segment as it is now: accumulated mass (summed over the GQA group) and
  /// count of queries that saw it. Entries not observed get 0.
  void lookup(const Segment& seg, int layer, int kv_head, std::vector<double>& mass, std::vector<double>& count) const;
  void remap(int layer, int kv_head, const std::vector<int32_t>& old_pos, const std::vector<int32_t>& new_pos);
  void reset() { segs_.clear(); }

 private:
  struct Entry {
    int32_t pos;
    double mass;
    double count;
  };
  int n_head_kv_ = 0;
  std::vector<std::vector<Entry>> segs_;  // [layer * n_head_kv + kv head]
};

}  // namespace kvslim
