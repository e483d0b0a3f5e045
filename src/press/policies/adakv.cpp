// AdaKV budget policy: head-adaptive budgets within each layer. The layer keeps as many entries as
// the uniform policy would (n_head_kv x floor(n (1 - ratio))), chosen by one top-k over the
// concatenated scores of its KV heads, after every head has kept its alpha x floor(n (1 - ratio))
// best entries (the safeguard floor). Feng et al., "Ada-KV: Optimizing KV Cache Eviction by
// Adaptive Budget Allocation for Efficient LLM Inference", arXiv 2407.11550; as kvpress's
// AdaKVPress, except that the evicted entries are removed from the cache (kvpress masks them).
#include <cmath>

#include <fmt/format.h>

#include "press/budget_util.h"

namespace kvslim {
namespace {

class AdaBudget : public BudgetPolicy {
 public:
  explicit AdaBudget(double alpha) : alpha_(alpha) {}
  std::string describe() const override { return fmt::format("adakv:alpha={}", alpha_); }
  KeepCounts keep_counts(const BudgetInput& in) const override {
    const KVCache& cache = in.cache;
    const int L = cache.n_layer(), H = cache.n_head_kv();
    const int64_t k = in.target.keep(in.target.n_context);
    const int64_t floor_k = static_cast<int64_t>(std::floor(alpha_ * static_cast<double>(k) + 1e-9));
    KeepCounts keep(L, std::vector<int>(H));
    for (int l = 0; l < L; ++l) {
      auto segs = budget::layer_segments(cache, l);
      std::vector<int64_t> must;
      for (auto [ll, h] : segs) must.push_back(std::min<int64_t>(floor_k, cache.seg(ll, h).size()));
      auto x = budget::shared_top(in.scores, segs, must, budget::uniform_total(cache, in.target, segs));
      for (int h = 0; h < H; ++h) keep[l][h] = static_cast<int>(x[h]);
    }
    return keep;
  }

 private:
  double alpha_;
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "adakv";
  i.kvpress = {"AdaKVPress"};
  i.summary = "budget policy: head-adaptive within each layer (top-k over the layer's heads), per-head floor alpha";
  i.source = "Feng et al. 2024, Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation for Efficient "
             "LLM Inference, arXiv 2407.11550";
  i.params = {{"alpha", "0.2", "alpha_safeguard",
               {.help = "the fraction of its even share every head keeps whatever the scores (the safeguard)"}}};
  i.kind = PressKind::Policy;
  i.default_inner = "snapkv";
  i.make_policy = [](const PressParams& p) -> std::unique_ptr<BudgetPolicy> {
    double a = param_double(p, "adakv", "alpha");
    if (!(a >= 0 && a <= 1)) throw Error(fmt::format("press adakv: alpha={} must be in [0, 1]", a));
    return std::make_unique<AdaBudget>(a);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
