// PyramidKV budget policy: per-head budgets fall linearly with depth, from max_num in layer 0 to
// min_num in the last layer, min_num = avg / beta and max_num = 2 avg - min_num (avg = the uniform
// budget n (1 - ratio)), so the total equals the uniform one. Cai et al., "PyramidKV: Dynamic KV
// Cache Compression based on Pyramidal Information Funneling", arXiv 2406.02069; the formula is
// kvpress's PyramidKVPress.get_layer_budget. Deviations: kvpress falls back to uniform budgets when
// min_num would be below its window size; here the pyramid is always applied (protected entries
// are kept whatever the budget, and the total is preserved by water-filling: a layer that cannot
// use its share, because it is capped at its size or floored by its protected entries, passes the
// difference to the others in proportion to their budgets).
#include <fmt/format.h>

#include "press/budget_util.h"

namespace kvslim {
namespace {

class PyramidBudget : public BudgetPolicy {
 public:
  explicit PyramidBudget(double beta) : beta_(beta) {}
  std::string describe() const override { return fmt::format("pyramidkv:beta={}", beta_); }
  KeepCounts keep_counts(const BudgetInput& in) const override {
    const KVCache& cache = in.cache;
    const int L = cache.n_layer();
    const double n = static_cast<double>(in.target.n_context);
    const double avg = n * (1.0 - in.target.ratio);
    double min_n = avg / beta_, max_n = 2 * avg - min_n;
    if (max_n > n) {
      max_n = n;
      min_n = 2 * avg - n;
    }
    return budget::layer_shaped_keep(
        in, [&](int l) { return L > 1 ? max_n - l * (max_n - min_n) / (L - 1) : avg; });
  }

 private:
  double beta_;
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "pyramidkv";
  i.summary = "budget policy: per-head budgets linear in depth (more in lower layers), total as uniform";
  i.source = "Cai et al. 2024, PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information Funneling, "
             "arXiv 2406.02069";
  i.params = {{"beta", "20"}};
  i.kind = PressKind::Policy;
  i.default_inner = "snapkv";
  i.make_policy = [](const PressParams& p) -> std::unique_ptr<BudgetPolicy> {
    double beta = param_double(p, "pyramidkv", "beta");
    if (!(beta >= 1)) throw Error(fmt::format("press pyramidkv: beta={} must be >= 1", beta));
    return std::make_unique<PyramidBudget>(beta);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
