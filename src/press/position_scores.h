#pragma once
// Scores a press computed once (KVzip's and KVComposer's replays) and reads at later compression
// steps, kept per (layer, KV head) by the entry's position, so they follow the entries while the
// cache compacts and re-rotates around them.
#include <cstdint>
#include <map>
#include <vector>

#include "kv/cache.h"

namespace kvslim {

class PositionScores {
 public:
  /// Forgets every score (a press's reset()).
  void clear() { scores_.clear(); }
  bool empty() const { return scores_.empty(); }
  /// Makes room for n_layer x n_head_kv segments (keeping the scores held when the shape is the same).
  void shape(int n_layer, int n_head_kv);
  /// Sets the score of the entry at `pos` in segment (layer, kv_head); shape() first.
  void set(int layer, int kv_head, int32_t pos, double score) { scores_.at(layer).at(kv_head)[pos] = score; }
  /// The score of the entry at `pos`, or nullptr when none was set (or the segment is outside the shape).
  const double* find(int layer, int kv_head, int32_t pos) const;
  /// Forgets the scores of entries no longer in `cache` (after the press evicted): later chunks
  /// then compete with the kept entries only.
  void prune(const KVCache& cache);
  /// PressImpl::remap_positions: the score of old_pos[i] moves to new_pos[i]; scores at positions not
  /// in old_pos are dropped.
  void remap(int layer, int kv_head, const std::vector<int32_t>& old_pos, const std::vector<int32_t>& new_pos);

 private:
  std::vector<std::vector<std::map<int32_t, double>>> scores_;  // [layer][kv head]: position -> score
};

}  // namespace kvslim
