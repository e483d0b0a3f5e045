#include "press/position_scores.h"

namespace kvslim {

void PositionScores::shape(int n_layer, int n_head_kv) {
  if (scores_.size() != static_cast<size_t>(n_layer) ||
      (n_layer > 0 && scores_[0].size() != static_cast<size_t>(n_head_kv)))
    scores_.assign(n_layer, std::vector<std::map<int32_t, double>>(n_head_kv));
}

const double* PositionScores::find(int layer, int kv_head, int32_t pos) const {
  if (layer < 0 || layer >= static_cast<int>(scores_.size()) || kv_head < 0 ||
      kv_head >= static_cast<int>(scores_[layer].size()))
    return nullptr;
  const auto& m = scores_[layer][kv_head];
  auto it = m.find(pos);
  return it == m.end() ? nullptr : &it->second;
}

void PositionScores::prune(const KVCache& cache) {
  for (size_t l = 0; l < scores_.size(); ++l)
    for (size_t h = 0; h < scores_[l].size(); ++h) {
      std::map<int32_t, double>& m = scores_[l][h];
      std::map<int32_t, double> kept;
      for (int32_t p : cache.seg(static_cast<int>(l), static_cast<int>(h)).positions()) {
        auto it = m.find(p);
        if (it != m.end()) kept.emplace_hint(kept.end(), *it);
      }
      m.swap(kept);
    }
}

void PositionScores::remap(int layer, int kv_head, const std::vector<int32_t>& old_pos,
                           const std::vector<int32_t>& new_pos) {
  if (layer < 0 || layer >= static_cast<int>(scores_.size()) || kv_head < 0 ||
      kv_head >= static_cast<int>(scores_[layer].size()))
    return;
  std::map<int32_t, double>& m = scores_[layer][kv_head];
  std::map<int32_t, double> moved;
  for (size_t i = 0; i < old_pos.size() && i < new_pos.size(); ++i) {
    auto it = m.find(old_pos[i]);
    if (it != m.end()) moved[new_pos[i]] = it->second;
  }
  m.swap(moved);
}

}  // namespace kvslim
