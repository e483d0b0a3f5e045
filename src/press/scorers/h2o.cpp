// H2O (Heavy-Hitter Oracle): an entry's score is the attention it has accumulated from every query
// so far (summed over the queries, averaged over the GQA group), over the whole prefill (all
// chunks) and, during decode, over every generated token. The budget is split between the newest
// entries (the paper's recent window) and the heavy hitters: by default the recent window is
// ceil(budget / 2) entries, the heavy hitters floor(budget / 2), as the authors' code (equal
// heavy and recent ratios; github.com/FMInference/H2O, and llama-recipes' H2O: "half of the
// window"); `recent=N` fixes the window instead. The recent window is chosen first but counts
// against the budget; `protect=1` (kvslim's option) never evicts it. During decode, with a ratio > 0, every segment is held at
// the size it had when decoding started: each step evicts the lowest-scored entries beyond it, as
// the paper's fixed KV budget. Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative
// Inference of Large Language Models", arXiv 2306.14048. Question tokens appended without an
// observation start with no accumulated attention.
#include <fmt/format.h>

#include "press/authoring.h"
#include "press/attention_acc.h"

namespace kvslim {
namespace {

class H2OPress : public ScorerPress {
 public:
  H2OPress(double ratio, int recent, bool protect) : ScorerPress(ratio), recent_(recent), protect_(protect) {}
  std::string describe_scorer() const override {
    return fmt::format("h2o:ratio={},recent={},protect={}", ratio_, recent_, protect_ ? 1 : 0);
  }
  ObservationNeeds scorer_needs() const override {
    ObservationNeeds r;
    r.attention_mass = true;
    return r;
  }
  ObservationNeeds decode_needs() const override {
    return ratio_ > 0 || policy_->decode_interval() > 0 ? needs() : ObservationNeeds{};
  }
  void observe(const KVCache& cache, const Model& model, const Observation& obs) override {
    acc_.observe(cache, obs, model.hparams().n_group());
  }
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override {
    score_layer(view.cache(), view.layer(), view.hp().n_group(), out,
                static_cast<size_t>(view.target().keep(view.target().n_context)));
  }
  void after_decode(KVCache& cache, const Model& model, const Observation& obs) override {
    if (policy_->decode_interval() > 0) return ScorerPress::after_decode(cache, model, obs);
    if (ratio_ <= 0) return;
    observe(cache, model, obs);
    const int L = cache.n_layer(), H = cache.n_head_kv();
    if (budget_.empty()) {
      budget_.assign(L, std::vector<size_t>(H));
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h) budget_[l][h] = cache.seg(l, h).size() > 0 ? cache.seg(l, h).size() - 1 : 0;
    }
    for (int l = 0; l < L; ++l) {
      std::vector<std::vector<float>> sc(H);
      for (int h = 0; h < H; ++h) {
        std::vector<std::vector<float>> one(H);
        score_layer(cache, l, model.hparams().n_group(), one, budget_[l][h], h);
        sc[h] = std::move(one[h]);
      }
      for (int h = 0; h < H; ++h) {
        Segment& s = cache.seg(l, h);
        if (s.size() > budget_[l][h]) s.retain(select_top(sc[h], static_cast<int>(budget_[l][h])));
      }
    }
  }
  // With a ratio it holds every segment at its size when decoding started, evicting each step; the
  // ratio may be set after the spec is parsed (outer(...):ratio=, auto-budget), so H2O always
  // counts as a press that evicts during decode (a decode-time selector cannot follow its cache).
  bool evicts_in_decode() const override { return true; }
  void reset() override {
    ScorerPress::reset();
    acc_.reset();
    budget_.clear();
  }
  void remap_positions(int l, int h, const std::vector<int32_t>& o, const std::vector<int32_t>& n) override {
    acc_.remap(l, h, o, n);
  }

 private:
  /// Recent-window size for a segment budget of `budget` entries.
  size_t recent_for(size_t budget) const { return recent_ >= 0 ? static_cast<size_t>(recent_) : budget - budget / 2; }
  /// Scores of layer l (only KV head `only` when >= 0) for a per-segment budget of `budget`.
  void score_layer(const KVCache& cache, int l, int G, std::vector<std::vector<float>>& out, size_t budget,
                   int only = -1) const {
    std::vector<double> mass, count;
    const size_t recent = recent_for(budget);
    const float first = keep_first_score(protect_);
    for (int h = 0; h < cache.n_head_kv(); ++h) {
      if (only >= 0 && h != only) continue;
      const Segment& s = cache.seg(l, h);
      acc_.lookup(s, l, h, mass, count);
      const size_t n = s.size();
      out[h].resize(n);
      for (size_t j = 0; j < n; ++j) out[h][j] = j + recent >= n ? first : static_cast<float>(mass[j] / G);
    }
  }
  int recent_;
  bool protect_;
  AttentionAccumulator acc_;
  std::vector<std::vector<size_t>> budget_;
};

PressRegistrar reg({"h2o", "accumulated attention over all queries (prefill and decode), plus a recent window",
                    "Zhang et al. 2023, H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large "
                    "Language Models, arXiv 2306.14048; reference: github.com/FMInference/H2O (heavy and recent "
                    "budgets equal)",
                    {{"ratio", "0"},
                     {"recent", "-1", {},
                      {.help = "the newest entries kept first, inside the budget (the engine's default -1: half the "
                               "budget)",
                       .default_value = "16"}},
                     {"protect", "0", {}, kKvslimOnly}},
                    [](const PressParams& p) -> std::unique_ptr<PressImpl> {
                      int r = param_int(p, "h2o", "recent");
                      if (r < -1)
                        throw Error(fmt::format("press h2o: recent={} must be >= 0 (or -1: half the budget)", r));
                      return std::make_unique<H2OPress>(param_double(p, "h2o", "ratio"), r, param_bool(p, "h2o", "protect"));
                    }},
                   {}, {.name = "H2OPress"});

}  // namespace
}  // namespace kvslim
