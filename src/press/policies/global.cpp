// Global budget policy: one top-k over the scores of every (layer, KV head), keeping in all as many
// entries as the uniform policy (n_layer x n_head_kv x floor(n (1 - ratio))). Used by KVzip (Kim
// et al., "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction", arXiv
// 2505.23416) with scores comparable across layers; with other scorers the layers compete on raw
// scores, which is the point of trying it.
#include "press/budget_util.h"

namespace kvslim {
namespace {

class GlobalBudget : public BudgetPolicy {
 public:
  std::string describe() const override { return "global"; }
  KeepCounts keep_counts(const BudgetInput& in) const override {
    const KVCache& cache = in.cache;
    auto segs = budget::all_segments(cache);
    auto x = budget::shared_top(in.scores, segs, std::vector<int64_t>(segs.size(), 0),
                                budget::uniform_total(cache, in.target, segs));
    KeepCounts keep(cache.n_layer(), std::vector<int>(cache.n_head_kv()));
    for (size_t i = 0; i < segs.size(); ++i) keep[segs[i].first][segs[i].second] = static_cast<int>(x[i]);
    return keep;
  }
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "global";
  i.summary = "budget policy: one top-k over all layers and KV heads, total as uniform";
  i.source = "Kim et al. 2025, KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction, arXiv 2505.23416";
  i.kind = PressKind::Policy;
  i.default_inner = "snapkv";
  i.make_policy = [](const PressParams&) -> std::unique_ptr<BudgetPolicy> { return std::make_unique<GlobalBudget>(); };
  return i;
}());

}  // namespace
}  // namespace kvslim
