// ChunkKV budget policy: keeps whole chunks of `chunk` consecutive entries instead of single
// entries. Per layer, the scorer's scores are summed over the KV heads, averaged within each chunk
// (the last, shorter chunk included), and the best max(1, int(chunks x (1 - ratio))) chunks are
// kept in every KV head of the layer; with fewer entries than one chunk the layer falls back to the
// scorer's own top-k. Liu et al., "ChunkKV: Semantic-Preserving KV Cache Compression for
// Efficient Long-Context LLM Inference", arXiv 2502.00299; reference: kvpress/presses/
// chunkkv_press.py (ChunkKVPress). As there, entries the scorer chooses first (a window or sinks,
// which kvpress pads with the largest score + 1) count as that score + 1 in the chunk means.
// Ties between chunks go to the later chunk. When the KV heads of a layer hold different entries
// (after an earlier adaptive step) each head is chunked on its own.
#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "press/authoring.h"

namespace kvslim {
namespace {

class ChunkKVBudget : public BudgetPolicy {
 public:
  explicit ChunkKVBudget(int chunk) : chunk_(chunk) {}
  std::string describe() const override { return fmt::format("chunkkv:chunk={}", chunk_); }
  void prepare(Scores& scores, const KVCache& cache, const Target& target) const override {
    chunked_.assign(cache.n_layer(), std::vector<char>(cache.n_head_kv(), 0));
    for (int l = 0; l < cache.n_layer(); ++l) {
      bool same = true;
      for (int h = 1; h < cache.n_head_kv(); ++h) same = same && scores[l][h].size() == scores[l][0].size();
      if (same) {
        std::vector<int> heads(cache.n_head_kv());
        std::iota(heads.begin(), heads.end(), 0);
        select_chunks(scores[l], heads, target.ratio, chunked_[l]);
      } else {
        for (int h = 0; h < cache.n_head_kv(); ++h) select_chunks(scores[l], {h}, target.ratio, chunked_[l]);
      }
    }
  }
  KeepCounts keep_counts(const BudgetInput& in) const override {
    KeepCounts keep(in.cache.n_layer(), std::vector<int>(in.cache.n_head_kv()));
    for (int l = 0; l < in.cache.n_layer(); ++l)
      for (int h = 0; h < in.cache.n_head_kv(); ++h) {
        const auto& sc = in.scores[l][h];
        if (chunked_.size() > static_cast<size_t>(l) && chunked_[l][h])
          keep[l][h] = static_cast<int>(std::count_if(sc.begin(), sc.end(), [](float s) { return s >= 1.0f; }));
        else  // fewer entries than one chunk: the scorer's own top-k
          keep[l][h] = std::min<int>(in.target.keep(in.target.n_context), static_cast<int>(sc.size()));
      }
    return keep;
  }

 private:
  /// Chooses chunks over the summed scores of `heads` (all of one size) and rewrites their scores
  /// to 1 (kept) or 0 (evicted), kProtected staying; marks them in `done`.
  void select_chunks(std::vector<std::vector<float>>& layer, const std::vector<int>& heads, double ratio,
                     std::vector<char>& done) const {
    const size_t n = layer[heads[0]].size(), C = static_cast<size_t>(chunk_);
    const size_t full = n / C, rem = n % C;
    if (full == 0) return;
    // Scores kept first count as the largest ordinary score + 1 (kvpress's padding).
    double top = -INFINITY;
    for (int h : heads)
      for (float s : layer[h])
        if (s < kPreferred && std::isfinite(s)) top = std::max(top, double(s));
    const double pad = std::isfinite(top) ? top + 1 : 1.0;
    std::vector<double> sum(n, 0.0);
    for (int h : heads)
      for (size_t j = 0; j < n; ++j) {
        const float s = layer[h][j];
        sum[j] += s >= kPreferred ? pad : (std::isnan(s) ? 0.0 : double(s));
      }
    const size_t nc = full + (rem > 0);
    std::vector<double> cs(nc, 0.0);
    for (size_t c = 0; c < nc; ++c) {
      const size_t b = c * C, e = std::min(n, b + C);
      for (size_t j = b; j < e; ++j) cs[c] += sum[j];
      cs[c] /= double(e - b);
    }
    const size_t kept = std::max<size_t>(1, static_cast<size_t>(double(nc) * (1 - ratio)));
    std::vector<size_t> order(nc);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return cs[a] != cs[b] ? cs[a] > cs[b] : a > b; });
    std::vector<char> keep(nc, 0);
    for (size_t i = 0; i < std::min(kept, nc); ++i) keep[order[i]] = 1;
    for (int h : heads) {
      for (size_t j = 0; j < n; ++j)
        if (layer[h][j] < kProtected) layer[h][j] = keep[j / C] ? 1.0f : 0.0f;
      done[h] = 1;
    }
  }
  int chunk_;
  mutable std::vector<std::vector<char>> chunked_;  // [layer][kv head]: chosen by chunks in prepare()
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "chunkkv";
  i.kvpress = {"ChunkKVPress"};
  i.summary = "budget policy: keeps whole chunks of consecutive entries, chosen per layer by their mean score";
  i.source = "Liu et al. 2025, ChunkKV: Semantic-Preserving KV Cache Compression for Efficient Long-Context LLM "
             "Inference, arXiv 2502.00299; reference: kvpress/presses/chunkkv_press.py (ChunkKVPress)";
  i.params = {{"chunk", "20", "chunk_length", {.help = "consecutive entries kept or evicted together"}}};
  i.kind = PressKind::Policy;
  i.default_inner = "snapkv";
  i.make_policy = [](const PressParams& p) -> std::unique_ptr<BudgetPolicy> {
    int c = param_int(p, "chunkkv", "chunk");
    if (c < 1) throw Error(fmt::format("press chunkkv: chunk={} must be >= 1", c));
    return std::make_unique<ChunkKVBudget>(c);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
