// NonCausalAttention: the attention each entry receives from every query of its chunk of `chunk`
// tokens, non-causally (keys after the query included), summed over the chunk's queries, averaged
// over the GQA group, times the value's L2 norm, average-pooled over 3 neighbours and
// z-normalised over the layer (see compactor_scores.h for the padding of the last chunk). Queries
// are recomputed from the recorded hidden states (the whole context in one prefill step, as
// kvpress: prefill only). Chari & Van Durme, "Compactor", arXiv 2507.08143; reference:
// kvpress/presses/non_causal_attention_press.py (NonCausalAttnPress).
#include <fmt/format.h>

#include "press/compactor_scores.h"

namespace kvslim {
namespace {

class NonCausalAttentionPress : public ScorerPress {
 public:
  NonCausalAttentionPress(double ratio, int chunk) : ScorerPress(ratio), chunk_(chunk) {}
  std::string describe_scorer() const override {
    return fmt::format("non_causal_attention:ratio={},chunk={}", ratio_, chunk_);
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
    noncausal_scores(view, b, e, chunk_, "non_causal_attention", s);
    zscore_layer(s);
    for (int h = 0; h < H; ++h) out[h].assign(s[h].begin(), s[h].end());
  }

 private:
  int chunk_;
};

PressRegistrar reg({"non_causal_attention", "attention received within non-causal chunks x value norm (Compactor)",
                    "Chari & Van Durme 2025, Compactor: Calibrated Query-Agnostic KV Cache Compression with "
                    "Approximate Leverage Scores, arXiv 2507.08143; reference: "
                    "kvpress/presses/non_causal_attention_press.py (NonCausalAttnPress)",
                    {{"ratio", "0"}, {"chunk", "256", "chunk_size", {.help = "entries per non-causal chunk"}}},
                    [](const PressParams& p) -> std::unique_ptr<PressImpl> {
                      const int c = param_int(p, "non_causal_attention", "chunk");
                      if (c < 1) throw Error(fmt::format("press non_causal_attention: chunk={} must be >= 1", c));
                      return std::make_unique<NonCausalAttentionPress>(
                          param_double(p, "non_causal_attention", "ratio"), c);
                    }}, {"NonCausalAttnPress"});

}  // namespace
}  // namespace kvslim
