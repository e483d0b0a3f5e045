// CriticalKV: a two-stage selection that accounts for what an entry adds to the output. Stage 1
// keeps the first_stage share of the budget by the inner press's scores; stage 2 ranks the rest by
// (score + epsilon) x ||W_o^h v||_1 (the L1 norm of the value projected by the output matrix
// slice of each query head h of the GQA group, averaged over the group). Feng et al., "Identify
// Critical KV Cache in LLM Inference from an Output Perturbation Perspective", arXiv 2502.03805;
// as kvpress's CriticalKVPress. The stage-1 size is floor(first_stage x floor(n (1 - ratio))), the
// uniform budget, whatever budget policy runs on top (kvpress's CriticalAdaKV sizes it from the
// adaptive head budgets instead).
#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "press/authoring.h"
#include "press/output_norm.h"

namespace kvslim {
namespace {

class CriticalKVPress : public ScorerPress {
 public:
  CriticalKVPress(std::unique_ptr<ScorerPress> inner, double eps, double first_stage)
      : ScorerPress(inner->ratio()), inner_(std::move(inner)), eps_(eps), first_(first_stage) {}
  std::string describe_scorer() const override {
    return fmt::format("criticalkv({}):epsilon={},first_stage={}", inner_->describe(), eps_, first_);
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
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override {
    inner_->score(view, out);
    const int H = view.hp().n_head_kv;
    const int stage1_keep = view.target().keep(view.target().n_context);
    for (int h = 0; h < H; ++h) {
      std::vector<float>& sc = out[h];
      const size_t n = sc.size();
      const int b1 = static_cast<int>(std::floor(first_ * stage1_keep + 1e-9));
      std::vector<int32_t> first = select_top(sc, std::min<int>(b1, static_cast<int>(n)));
      std::vector<char> in_first(n, 0);
      // select_top also returns every protected entry; only the top b1 count as stage 1.
      for (int32_t j : first) in_first[j] = 1;
      // Entries that stage 2 must weigh (not protected, not chosen by stage 1).
      std::vector<int32_t> todo;
      for (size_t j = 0; j < n; ++j) {
        if (sc[j] >= kProtected) continue;
        if (in_first[j])
          sc[j] = kPreferred;
        else
          todo.push_back(static_cast<int32_t>(j));
      }
      const std::vector<double> norm = projected_value_l1(view, h, todo);
      for (size_t i = 0; i < todo.size(); ++i) {
        float& x = sc[todo[i]];
        x = static_cast<float>((double(x) + eps_) * norm[i]);
      }
    }
  }

 private:
  std::unique_ptr<ScorerPress> inner_;
  double eps_, first_;
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "criticalkv";
  i.kvpress = {"CriticalKVPress"};
  i.summary = "wrapper over a scorer: stage 1 keeps first_stage of the budget by its scores, stage 2 reweights "
              "by ||W_o v||_1";
  i.source = "Feng et al. 2025, Identify Critical KV Cache in LLM Inference from an Output Perturbation "
             "Perspective, arXiv 2502.03805";
  i.params = {{"epsilon", "1e-4", {}, {.help = "added to the inner scores before ||W_o v|| weighs them"}},
              {"first_stage", "0.5", "first_stage_ratio",
               {.help = "the fraction of the budget stage 1 fills by the inner scores alone"}}};
  i.kind = PressKind::Wrapper;
  i.default_inner = "snapkv";
  i.make_wrapper = [](const PressParams& p, std::unique_ptr<PressImpl> inner) -> std::unique_ptr<PressImpl> {
    auto* sp = inner->scorer();
    if (!sp) throw Error(fmt::format("press criticalkv needs a scorer press inside, got '{}'", inner->describe()));
    // CriticalKV splits a ratio-sized budget in two stages; a press that decides by a threshold
    // (KVzap, threshold(...)) has no budget to split and would make it remove nothing.
    if (!sp->policy().uses_ratio())
      throw Error(fmt::format("press criticalkv: the inner press {} keeps entries by its {} policy, not by a "
                              "compression ratio; criticalkv needs a ratio-driven scorer (e.g. criticalkv(snapkv))",
                              inner->describe(), sp->policy().describe()));
    double fs = param_double(p, "criticalkv", "first_stage");
    if (!(fs >= 0 && fs <= 1)) throw Error(fmt::format("press criticalkv: first_stage={} must be in [0, 1]", fs));
    inner.release();
    return std::make_unique<CriticalKVPress>(std::unique_ptr<ScorerPress>(sp), param_double(p, "criticalkv", "epsilon"),
                                             fs);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
