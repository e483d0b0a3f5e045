// BlockPress: block-wise iterative compression, as block prompt processing in the KeyDiff paper.
// Per segment with n entries and k = floor(n (1 - ratio)) (at least 1; with chunked prefill n is
// the tokens seen so far, as for every ratio-driven press): the first k entries are kept; then,
// block after block of `block` entries, the inner scorer scores the kept entries together with
// the block (on those entries alone) and the best k of them stay. The inner scorer therefore never
// sees more than k + block entries at once. Park et al., "KeyDiff: Key Similarity-Based KV Cache
// Eviction for Long-Context LLM Inference in Resource-Constrained Environments", arXiv 2504.15364;
// reference: kvpress/presses/block_press.py (BlockPress). As there, all entries are computed
// first and then pruned block by block (kvslim's --chunk-size bounds the memory instead).
#include <algorithm>

#include <fmt/format.h>

#include "press/sub_cache.h"

namespace kvslim {
namespace {

class BlockPress : public SubsetScoringPress {
 public:
  BlockPress(std::unique_ptr<ScorerPress> inner, int block) : SubsetScoringPress(std::move(inner)), block_(block) {}
  std::string describe() const override { return fmt::format("block({}):block={}", inner_->describe(), block_); }
  void apply(KVCache& cache, const Model& model, const Observation& obs, const Target& target) override {
    const double r = target.ratio;
    if (r <= 0) return;
    const int L = cache.n_layer(), H = cache.n_head_kv();
    SegmentIndices kept(L, std::vector<std::vector<int32_t>>(H));
    std::vector<std::vector<int32_t>> next(L, std::vector<int32_t>(H));  // first entry of the next block
    bool more = false;
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        const Segment& s = cache.seg(l, h);
        const int32_t k = std::min<int32_t>(static_cast<int32_t>(s.size()), uniform_keep(target.n_for(s), r));
        for (int32_t i = 0; i < k; ++i) kept[l][h].push_back(i);
        next[l][h] = k;
        more = more || k < static_cast<int32_t>(s.size());
      }
    while (more) {
      SegmentIndices cur = kept;
      size_t longest = 0;
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h) {
          const int32_t n = static_cast<int32_t>(cache.seg(l, h).size()), b = next[l][h];
          for (int32_t i = b; i < std::min(n, b + block_); ++i) cur[l][h].push_back(i);
          next[l][h] = std::min(n, b + block_);
          longest = std::max(longest, cur[l][h].size());
        }
      KVCache sub = sub_cache(cache, cur);
      Scores sc = inner_->score_all(sub, model, obs, Target{r, longest});
      more = false;
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h) {
          const auto& c = cur[l][h];
          std::vector<int32_t> chosen;
          for (int32_t j : select_top(sc[l][h], static_cast<int>(kept[l][h].size()))) chosen.push_back(c[j]);
          kept[l][h] = std::move(chosen);
          more = more || next[l][h] < static_cast<int32_t>(cache.seg(l, h).size());
        }
    }
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h)
        if (kept[l][h].size() < cache.seg(l, h).size()) cache.seg(l, h).retain(kept[l][h]);
  }

 private:
  int block_;
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "block";
  i.kvpress = {"BlockPress"};
  i.summary = "wrapper over a scorer: keeps the budget while scanning the context block by block";
  i.source = "Park et al. 2025, KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference in "
             "Resource-Constrained Environments, arXiv 2504.15364; reference: kvpress/presses/block_press.py "
             "(BlockPress)";
  i.params = {{"block", "128", "block_size", {.help = "entries scored together with the kept ones at each step"}}};
  i.kind = PressKind::Wrapper;
  i.default_inner = "keydiff";
  i.make_wrapper = [](const PressParams& p, std::unique_ptr<PressImpl> inner) -> std::unique_ptr<PressImpl> {
    const int b = param_int(p, "block", "block");
    if (b < 1) throw Error(fmt::format("press block: block={} must be >= 1", b));
    return std::make_unique<BlockPress>(subset_scorer("block", std::move(inner)), b);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
