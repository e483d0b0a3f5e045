// LeverageScore: geometry-based outlier scores, the approximate statistical leverage of each key
// (before RoPE) within its segment, z-normalised over the layer (see compactor_scores.h). Keys
// before RoPE are recomputed from the recorded hidden states (the whole context in one prefill
// step, as kvpress: prefill only). The Gaussian sketch is seeded (`seed`; kvpress draws it
// unseeded). Chari & Van Durme, "Compactor: Calibrated Query-Agnostic KV Cache Compression with
// Approximate Leverage Scores", arXiv 2507.08143; reference: kvpress/presses/leverage_press.py
// (LeverageScorePress).
#include <fmt/format.h>

#include "press/compactor_scores.h"

namespace kvslim {
namespace {

class LeveragePress : public ScorerPress {
 public:
  LeveragePress(double ratio, int sketch, int seed) : ScorerPress(ratio), sketch_(sketch), seed_(seed) {}
  std::string describe_scorer() const override {
    return fmt::format("leverage:ratio={},sketch={},seed={}", ratio_, sketch_, seed_);
  }
  ObservationNeeds scorer_needs() const override {
    ObservationNeeds r;
    r.hidden_states = true;
    return r;
  }
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override {
    const int H = view.hp().n_head_kv;
    std::vector<int> b(H, 0), e(H);
    for (int h = 0; h < H; ++h) e[h] = static_cast<int>(view.seg(h).size());
    std::vector<std::vector<double>> s;
    leverage_layer_scores(view, b, e, sketch_, static_cast<uint32_t>(seed_), "leverage", s);
    zscore_layer(s);
    for (int h = 0; h < H; ++h) out[h].assign(s[h].begin(), s[h].end());
  }

 private:
  int sketch_, seed_;
};

PressRegistrar reg({"leverage", "approximate leverage of the pre-RoPE keys (Compactor's geometric score)",
                    "Chari & Van Durme 2025, Compactor: Calibrated Query-Agnostic KV Cache Compression with "
                    "Approximate Leverage Scores, arXiv 2507.08143; reference: kvpress/presses/leverage_press.py "
                    "(LeverageScorePress)",
                    {{"ratio", "0"},
                     {"sketch", "48", "sketch_dimension", {.help = "columns of the random sketch"}},
                     {"seed", "42", {}, kKvslimOnly}},
                    [](const PressParams& p) -> std::unique_ptr<PressImpl> {
                      const int k = param_int(p, "leverage", "sketch");
                      if (k < 1) throw Error(fmt::format("press leverage: sketch={} must be >= 1", k));
                      return std::make_unique<LeveragePress>(param_double(p, "leverage", "ratio"), k,
                                                             param_int(p, "leverage", "seed"));
                    }}, {"LeverageScorePress"});

}  // namespace
}  // namespace kvslim
