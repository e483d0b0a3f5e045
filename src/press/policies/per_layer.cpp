// Per-layer ratios: layer l keeps floor(n (1 - ratios[l])) entries per KV head (kvpress's
// PerLayerCompressionPress, arXiv-less). The press reports the mean of the ratios, as kvpress does;
// the measured ratio comes from the cache.
#include <fmt/format.h>

#include "press/authoring.h"

namespace kvslim {
namespace {

class PerLayerBudget : public BudgetPolicy {
 public:
  explicit PerLayerBudget(std::vector<double> r) : r_(std::move(r)) {}
  std::string describe() const override {
    std::string s;
    for (double v : r_) s += fmt::format("{}{}", s.empty() ? "" : "/", v);
    return "per_layer:ratios=" + s;
  }
  bool uses_ratio() const override { return false; }
  KeepCounts keep_counts(const BudgetInput& in) const override {
    const KVCache& cache = in.cache;
    if (static_cast<int>(r_.size()) != cache.n_layer())
      throw Error(fmt::format("press per_layer: {} ratios given for a model of {} layers", r_.size(), cache.n_layer()));
    KeepCounts keep(cache.n_layer(), std::vector<int>(cache.n_head_kv()));
    for (int l = 0; l < cache.n_layer(); ++l) {
      const int k = uniform_keep(in.target.n_context, r_[l]);
      for (int h = 0; h < cache.n_head_kv(); ++h) keep[l][h] = std::min<int>(k, cache.seg(l, h).size());
    }
    return keep;
  }
  double reported_ratio(double) const override {
    double s = 0;
    for (double v : r_) s += v;
    return r_.empty() ? 0 : s / r_.size();
  }

 private:
  std::vector<double> r_;
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "per_layer";
  i.kvpress = {"PerLayerCompressionPress"};
  i.summary = "budget policy: one compression ratio per layer, ratios=r0/r1/... (one per layer)";
  i.source = "kvpress PerLayerCompressionPress";
  i.params = {{"ratios", "", "compression_ratios",
               {.type = ParamType::FloatList, .help = "the compression ratio of each layer, one per layer"}}};
  i.kind = PressKind::Policy;
  i.default_inner = "knorm";
  i.make_policy = [](const PressParams& p) -> std::unique_ptr<BudgetPolicy> {
    auto r = param_double_list(p, "per_layer", "ratios");
    if (r.empty()) throw Error("press per_layer: give ratios=r0/r1/... (one per layer)");
    for (double v : r) check_ratio(v, "per_layer");
    return std::make_unique<PerLayerBudget>(std::move(r));
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
