// CriticalAdaKV: CriticalKV's two-stage selection inside AdaKV's head-adaptive budgets. Per layer,
// with k = floor(n (1 - ratio)) (at least 1) and n_safe = floor(alpha k):
//   1. budgets: every KV head first takes its n_safe best entries by the inner scores (AdaKV's
//      safeguard), then the layer's remaining H k - sum(n_safe) go to the best inner scores over
//      all its heads; head h's budget b_h is how many it got;
//   2. stage 1: head h keeps its floor(first_stage b_h) best entries by the inner scores (and its
//      safeguard entries);
//   3. stage 2: the rest of b_h goes to the best (score + epsilon) x ||W_o v||_1 (the value
//      projected by each query head's slice of the output matrix, L1 norm, averaged over the GQA
//      group) among the entries not yet chosen.
// Feng et al., "Identify Critical KV Cache in LLM Inference from an Output Perturbation
// Perspective", arXiv 2502.03805; reference: kvpress/presses/criticalkv_press.py
// (CriticalAdaKVPress). As with AdaKV, the evicted entries leave the cache (kvpress masks them).
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "press/budget_util.h"
#include "press/output_norm.h"

namespace kvslim {
namespace {

class CriticalAdaKVPress : public ScorerPress {
 public:
  CriticalAdaKVPress(std::unique_ptr<ScorerPress> inner, double alpha, double eps, double first)
      : ScorerPress(inner->ratio(), adakv_policy(alpha)), inner_(std::move(inner)), alpha_(alpha), eps_(eps),
        first_(first) {}
  std::string describe() const override { return describe_scorer(); }
  std::string describe_scorer() const override {
    return fmt::format("critical_adakv({}):alpha={},epsilon={},first_stage={}", inner_->describe(), alpha_, eps_,
                       first_);
  }
  ObservationNeeds scorer_needs() const override { return inner_->needs(); }
  void set_ratio(double r) override {
    ScorerPress::set_ratio(r);
    inner_->set_ratio(r);
  }
  void observe(const KVCache& c, const Model& m, const Observation& o) override { inner_->observe(c, m, o); }
  void reset() override {
    ScorerPress::reset();
    inner_->reset();
  }
  void remap_positions(int l, int h, const std::vector<int32_t>& o, const std::vector<int32_t>& n) override {
    inner_->remap_positions(l, h, o, n);
  }
  /// Marks the entries CriticalAdaKV chooses kPreferred (the AdaKV policy on top, with the same
  /// safeguard and total, then keeps exactly them); the others keep their stage-2 weight, capped
  /// below kPreferred.
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override {
    inner_->score(view, out);
    const int H = view.hp().n_head_kv;
    const int64_t k = view.target().keep(view.target().n_context);
    const int64_t n_safe = static_cast<int64_t>(std::floor(alpha_ * static_cast<double>(k) + 1e-9));
    // 1. head budgets: AdaKV's allocation over this layer's inner scores.
    Scores layer{out};
    std::vector<std::pair<int, int>> segs;
    std::vector<int64_t> must;
    int64_t held = 0;
    for (int h = 0; h < H; ++h) {
      segs.emplace_back(0, h);
      must.push_back(std::min<int64_t>(n_safe, static_cast<int64_t>(out[h].size())));
      held += static_cast<int64_t>(out[h].size());
    }
    const std::vector<int64_t> budget = budget::shared_top(layer, segs, must, std::min<int64_t>(held, H * k));
    for (int h = 0; h < H; ++h) {
      std::vector<float>& sc = out[h];
      const int n = static_cast<int>(sc.size());
      const int b = static_cast<int>(std::min<int64_t>(budget[h], n));
      // 2. stage 1: the best max(floor(first_stage b), n_safe) by the inner scores.
      const int b1 = std::min(b, static_cast<int>(std::max<int64_t>(
                                     static_cast<int64_t>(std::floor(first_ * b + 1e-9)), must[h])));
      std::vector<char> chosen(n, 0);
      std::vector<int32_t> first = select_top(sc, b1);
      int taken = 0;
      for (int32_t j : first)
        if (sc[j] < kProtected) chosen[j] = 1, ++taken;
      // 3. stage 2: (score + epsilon) x ||W_o v||_1 over the others.
      std::vector<int32_t> todo;
      for (int j = 0; j < n; ++j)
        if (!chosen[j] && sc[j] < kProtected) todo.push_back(j);
      const std::vector<double> norm = projected_value_l1(view, h, todo);
      std::vector<float> w(n, -INFINITY);
      for (size_t i = 0; i < todo.size(); ++i) w[todo[i]] = static_cast<float>((double(sc[todo[i]]) + eps_) * norm[i]);
      for (int32_t j : select_top(w, std::max(0, b - taken))) chosen[j] = 1;
      for (int j = 0; j < n; ++j) {
        if (sc[j] >= kProtected) continue;
        sc[j] = chosen[j] ? kPreferred : std::min(w[j], 1.0e29f);
      }
    }
  }

 private:
  static std::unique_ptr<BudgetPolicy> adakv_policy(double alpha) {
    const PressInfo* ada = PressRegistry::instance().find("adakv");
    if (!ada) throw Error("press critical_adakv: the adakv policy is not registered");
    return ada->make_policy({{"alpha", fmt::format("{}", alpha)}});
  }
  std::unique_ptr<ScorerPress> inner_;
  double alpha_, eps_, first_;
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "critical_adakv";
  i.kvpress = {"CriticalAdaKVPress"};
  i.summary = "wrapper over a scorer: CriticalKV's two stages inside AdaKV's head-adaptive budgets";
  i.source = "Feng et al. 2025, Identify Critical KV Cache in LLM Inference from an Output Perturbation "
             "Perspective, arXiv 2502.03805; reference: kvpress/presses/criticalkv_press.py (CriticalAdaKVPress)";
  i.params = {{"alpha", "0.2", "alpha_safeguard",
               {.help = "the fraction of its even share every head keeps whatever the scores (AdaKV's safeguard)"}},
              {"epsilon", "1e-4", {}, {.help = "added to the inner scores before ||W_o v|| weighs them"}},
              {"first_stage", "0.5", "first_stage_ratio",
               {.help = "the fraction of each head's budget stage 1 fills by the inner scores alone"}}};
  i.kind = PressKind::Wrapper;
  i.default_inner = "snapkv";
  i.make_wrapper = [](const PressParams& p, std::unique_ptr<PressImpl> inner) -> std::unique_ptr<PressImpl> {
    auto* sp = inner->scorer();
    if (!sp) throw Error(fmt::format("press critical_adakv needs a scorer press inside, got '{}'", inner->describe()));
    if (sp->policy().describe() != "uniform")
      throw Error(fmt::format("press critical_adakv: '{}' already has a budget policy ({}); critical_adakv brings "
                              "AdaKV's",
                              inner->describe(), sp->policy().describe()));
    const double a = param_double(p, "critical_adakv", "alpha"), fs = param_double(p, "critical_adakv", "first_stage");
    if (!(a >= 0 && a <= 1)) throw Error(fmt::format("press critical_adakv: alpha={} must be in [0, 1]", a));
    if (!(fs >= 0 && fs <= 1))
      throw Error(fmt::format("press critical_adakv: first_stage={} must be in [0, 1]", fs));
    inner.release();
    return std::make_unique<CriticalAdaKVPress>(std::unique_ptr<ScorerPress>(sp), a,
                                                param_double(p, "critical_adakv", "epsilon"), fs);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
