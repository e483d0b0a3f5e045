// ObservedAttention: an entry's score is the mean attention it received from the queries that
// could see it (attention summed over queries, divided by their number, averaged over the GQA
// group), so early entries are not favoured merely for being seen by more queries. As kvpress's
// ObservedAttentionPress (related to H2O, arXiv 2306.14048); over chunked prefill the sums and
// counts run over every chunk so far.
#include <fmt/format.h>

#include "press/authoring.h"
#include "press/attention_acc.h"

namespace kvslim {
namespace {

class ObservedAttentionPress : public ScorerPress {
 public:
  using ScorerPress::ScorerPress;
  std::string describe_scorer() const override { return fmt::format("observed_attention:ratio={}", ratio_); }
  ObservationNeeds scorer_needs() const override {
    ObservationNeeds r;
    r.attention_mass = true;
    return r;
  }
  void observe(const KVCache& cache, const Model& model, const Observation& obs) override {
    acc_.observe(cache, obs, model.hparams().n_group());
  }
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override {
    std::vector<double> mass, count;
    const int G = view.hp().n_group();
    for (int h = 0; h < view.hp().n_head_kv; ++h) {
      const Segment& s = view.seg(h);
      acc_.lookup(s, view.layer(), h, mass, count);
      out[h].resize(s.size());
      for (size_t j = 0; j < s.size(); ++j)
        out[h][j] = count[j] > 0 ? static_cast<float>(mass[j] / (G * count[j])) : 0.0f;
    }
  }
  void reset() override {
    ScorerPress::reset();
    acc_.reset();
  }
  void remap_positions(int l, int h, const std::vector<int32_t>& o, const std::vector<int32_t>& n) override {
    acc_.remap(l, h, o, n);
  }

 private:
  AttentionAccumulator acc_;
};

PressRegistrar reg({"observed_attention", "mean attention received per query that sees the entry",
                    "kvpress ObservedAttentionPress; related to H2O, Zhang et al. 2023, arXiv 2306.14048",
                    {{"ratio", "0"}}, [](const PressParams& p) -> std::unique_ptr<PressImpl> {
                      return std::make_unique<ObservedAttentionPress>(param_double(p, "observed_attention", "ratio"));
                    }},
                   {"ObservedAttentionPress"},
                   {.fields = {{.name = "output_attentions",
                                .help = "accepted for kvpress compatibility and unused (kvslim records attention "
                                        "without it)"}}});

}  // namespace
}  // namespace kvslim
