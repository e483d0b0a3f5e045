// Shared machinery of score-based presses: the layer view, selection and the uniform budget.
#include "kvslim/press.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "kernels/attention.h"
#include "kernels/threads.h"

namespace kvslim {

LayerView::LayerView(const Model& model, const KVCache& cache, const Observation& obs, int layer)
    : model_(model), cache_(cache), obs_(obs), layer_(layer) {}

const float* LayerView::window_queries(int qh) const {
  if (obs_.queries.size() <= static_cast<size_t>(layer_) || obs_.queries[layer_].empty()) return nullptr;
  return obs_.queries[layer_].data() + static_cast<size_t>(qh) * n_window() * hp().head_dim;
}

const std::vector<float>& LayerView::window_attention(int h) const {
  auto it = attn_.find(h);
  if (it != attn_.end()) return it->second;
  const Segment& s = seg(h);
  const int G = hp().n_group(), hd = hp().head_dim, w = n_window();
  std::vector<float> probs(static_cast<size_t>(G) * w * s.size());
  std::vector<int32_t> vis(static_cast<size_t>(w));
  // A window query sees the entries whose position is at most its own.
  for (int i = 0; i < w; ++i) {
    int32_t p = obs_.window_positions[i];
    vis[i] = static_cast<int32_t>(std::upper_bound(s.positions().begin(), s.positions().end(), p) - s.positions().begin());
  }
  std::vector<float> out(static_cast<size_t>(w) * hd);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int g = 0; g < G; ++g)
    attend_segment(s, window_queries(h * G + g), w, vis.data(), scale, out.data(), hd, nullptr,
                   probs.data() + static_cast<size_t>(g) * w * s.size());
  return attn_.emplace(h, std::move(probs)).first->second;
}

int uniform_keep(size_t n, double ratio) {
  if (n == 0) return 0;
  double k = std::floor(static_cast<double>(n) * (1.0 - ratio) + 1e-9);
  return static_cast<int>(std::clamp<double>(k, 1.0, static_cast<double>(n)));
}

KeepCounts UniformBudget::keep_counts(const Scores& scores, const KVCache& cache, double ratio) const {
  KeepCounts keep(cache.n_layer(), std::vector<int>(cache.n_head_kv()));
  for (int l = 0; l < cache.n_layer(); ++l)
    for (int h = 0; h < cache.n_head_kv(); ++h) keep[l][h] = uniform_keep(cache.seg(l, h).size(), ratio);
  return keep;
}

std::vector<int32_t> select_top(const std::vector<float>& scores, int keep) {
  const int n = static_cast<int>(scores.size());
  int n_prot = 0;
  for (float s : scores) n_prot += s >= kProtected;
  keep = std::clamp(std::max(keep, n_prot), 0, n);
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  if (keep < n) {
    // Highest score first; among equal scores the later entry wins (recency), so the result is
    // deterministic.
    std::nth_element(idx.begin(), idx.begin() + keep, idx.end(), [&](int32_t a, int32_t b) {
      float sa = std::isnan(scores[a]) ? -INFINITY : scores[a], sb = std::isnan(scores[b]) ? -INFINITY : scores[b];
      return sa != sb ? sa > sb : a > b;
    });
    idx.resize(keep);
    std::sort(idx.begin(), idx.end());
  }
  return idx;
}

ScorerPress::ScorerPress(double ratio, std::unique_ptr<BudgetPolicy> policy)
    : ratio_(ratio), policy_(policy ? std::move(policy) : std::make_unique<UniformBudget>()) {}

void ScorerPress::compress(KVCache& cache, const Model& model, const Observation& obs) {
  if (ratio_ <= 0.0) return;  // ratio 0 leaves the cache bit-identical
  const int L = cache.n_layer(), H = cache.n_head_kv();
  Scores scores(L);
  parallel_for(L, [&](int64_t b, int64_t e) {
    for (int64_t l = b; l < e; ++l) {
      LayerView view(model, cache, obs, static_cast<int>(l));
      scores[l].assign(H, {});
      score(view, scores[l]);
      for (int h = 0; h < H; ++h)
        if (scores[l][h].size() != cache.seg(l, h).size())
          throw Error(fmt::format("press {} produced {} scores for {} entries (layer {}, KV head {})", describe(),
                                  scores[l][h].size(), cache.seg(l, h).size(), l, h));
    }
  });
  KeepCounts keep = policy_->keep_counts(scores, cache, ratio_);
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      Segment& s = cache.seg(l, h);
      if (keep[l][h] >= static_cast<int>(s.size())) continue;
      s.retain(select_top(scores[l][h], keep[l][h]));
    }
}

}  // namespace kvslim
