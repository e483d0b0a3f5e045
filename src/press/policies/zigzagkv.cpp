// ZigZagKV budget policy: layer budgets follow each layer's uncertainty. The MBA of a query head is
// the fewest entries that hold `mass` (90%) of the attention its observation-window queries pay
// (summed over the window); a layer's LMBA is the mean MBA over its query heads. With
// u_l = LMBA_l / sum(LMBA), layer l gets a per-head budget B_bound + (B_avg - B_bound) L u_l, where
// B_avg is the uniform budget floor(n (1 - ratio)) and B_bound = reserve x B_avg is the minimum
// per-layer reserve (equation 6 of the paper), so the total equals the uniform one. Zhong et al.,
// "ZigZagKV: Dynamic KV Cache Compression for Long-context Modeling based on Layer Uncertainty",
// arXiv 2412.09036. The default window (64) equals SnapKV's, so over SnapKV the window attention
// is computed once for both. The per-head split inside a layer is uniform; budgets a segment cannot use
// (capped at its size, floored by its protected entries) are passed to the others by
// water-filling.
#include <algorithm>
#include <functional>

#include <fmt/format.h>

#include "press/budget_util.h"
#include "press/mba.h"

namespace kvslim {
namespace {

class ZigZagBudget : public BudgetPolicy {
 public:
  ZigZagBudget(double reserve, double mass, int window) : reserve_(reserve), mass_(mass), window_(window) {}
  std::string describe() const override {
    return fmt::format("zigzagkv:reserve={},mass={},window={}", reserve_, mass_, window_);
  }
  ObservationNeeds needs() const override {
    ObservationNeeds r;
    r.window = window_;
    return r;
  }
  bool wants_inspect() const override { return true; }
  /// LMBA of the layer over the last `window` observation queries.
  double inspect(const LayerView& view) const override {
    const int w = view.n_window();
    const int use = std::min(w, window_);
    if (use <= 0) return 0.0;
    double sum_mba = 0;
    // A head with no attention at all still counts one entry, so every LMBA is positive.
    for (int m : query_head_mba(view, use, mass_)) sum_mba += std::max(m, 1);
    return sum_mba / view.hp().n_head;
  }
  KeepCounts keep_counts(const BudgetInput& in) const override {
    const KVCache& cache = in.cache;
    const int L = cache.n_layer();
    const double b_avg = in.target.keep(in.target.n_context);
    const double b_bound = reserve_ * b_avg;
    double sum = 0;
    for (double v : in.layer_stat) sum += v;
    return budget::layer_shaped_keep(in, [&](int l) {
      double u = sum > 0 ? in.layer_stat[l] / sum : 1.0 / L;
      return b_bound + (b_avg - b_bound) * L * u;
    });
  }

 private:
  double reserve_, mass_;
  int window_;
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "zigzagkv";
  i.summary = "budget policy: layer budgets proportional to LMBA (attention uncertainty) with a minimum reserve";
  i.source = "Zhong et al. 2024, ZigZagKV: Dynamic KV Cache Compression for Long-context Modeling based on Layer "
             "Uncertainty, arXiv 2412.09036";
  i.params = {{"reserve", "0.2"}, {"mass", "0.9"}, {"window", "64"}};
  i.kind = PressKind::Policy;
  i.default_inner = "snapkv";
  i.make_policy = [](const PressParams& p) -> std::unique_ptr<BudgetPolicy> {
    double r = param_double(p, "zigzagkv", "reserve"), m = param_double(p, "zigzagkv", "mass");
    int w = param_int(p, "zigzagkv", "window");
    if (!(r >= 0 && r <= 1)) throw Error(fmt::format("press zigzagkv: reserve={} must be in [0, 1]", r));
    if (!(m > 0 && m <= 1)) throw Error(fmt::format("press zigzagkv: mass={} must be in (0, 1]", m));
    if (w < 1) throw Error(fmt::format("press zigzagkv: window={} must be >= 1", w));
    return std::make_unique<ZigZagBudget>(r, m, w);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
