// Compactor: query-agnostic scores blending geometry and attention. The first sink_start and last
// sink_end entries of each segment are set aside (min(sink_start, n), min(sink_end, n - left)); on
// the others, score = blending x z(leverage) + z(non-causal attention) (both z-normalised over the
// layer; see compactor_scores.h); the set-aside entries get the layer's largest score (kvpress pads
// them with scores.max(), so they tie with the best entry and count in the budget). blending
// defaults to the compression ratio (kvpress's default heuristic; `blending=` fixes it).
// Chari & Van Durme, "Compactor: Calibrated Query-Agnostic KV Cache Compression with Approximate
// Leverage Scores", arXiv 2507.08143; reference: kvpress/presses/compactor_press.py
// (CompactorPress). Prefill only, the whole context in one step (hidden states recorded).
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "press/compactor_scores.h"

namespace kvslim {
namespace {

class CompactorPress : public ScorerPress {
 public:
  CompactorPress(double ratio, int start, int end, int chunk, int sketch, double blending, int seed)
      : ScorerPress(ratio), start_(start), end_(end), chunk_(chunk), sketch_(sketch), blending_(blending),
        seed_(seed) {}
  std::string describe_scorer() const override {
    return fmt::format("compactor:ratio={},sink_start={},sink_end={},chunk={},sketch={},blending={},seed={}", ratio_,
                       start_, end_, chunk_, sketch_, std::isnan(blending_) ? std::string("ratio")
                                                                              : fmt::format("{}", blending_),
                       seed_);
  }
  ObservationNeeds scorer_needs() const override {
    ObservationNeeds r;
    r.hidden_states = true;
    return r;
  }
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override {
    const int H = view.hp().n_head_kv;
    std::vector<int> b(H), e(H), n(H);
    for (int h = 0; h < H; ++h) {
      n[h] = static_cast<int>(view.seg(h).size());
      const int left = std::min(start_, n[h]), right = std::min(end_, std::max(0, n[h] - left));
      b[h] = left;
      e[h] = n[h] - right;
    }
    std::vector<std::vector<double>> lev, att;
    leverage_layer_scores(view, b, e, sketch_, static_cast<uint32_t>(seed_), "compactor", lev);
    noncausal_scores(view, b, e, chunk_, "compactor", att);
    zscore_layer(lev);
    zscore_layer(att);
    const double w = std::isnan(blending_) ? view.target().ratio : blending_;
    double top = -INFINITY;
    for (int h = 0; h < H; ++h)
      for (size_t i = 0; i < att[h].size(); ++i) top = std::max(top, w * lev[h][i] + att[h][i]);
    if (!std::isfinite(top)) top = 0;
    for (int h = 0; h < H; ++h) {
      out[h].assign(n[h], static_cast<float>(top));
      for (int i = b[h]; i < e[h]; ++i)
        out[h][i] = static_cast<float>(w * lev[h][i - b[h]] + att[h][i - b[h]]);
    }
  }

 private:
  int start_, end_, chunk_, sketch_;
  double blending_;  // NaN: the compression ratio
  int seed_;
};

PressRegistrar reg({"compactor", "blends leverage (geometry) and non-causal chunked attention, sinks at both ends",
                    "Chari & Van Durme 2025, Compactor: Calibrated Query-Agnostic KV Cache Compression with "
                    "Approximate Leverage Scores, arXiv 2507.08143; reference: kvpress/presses/compactor_press.py "
                    "(CompactorPress)",
                    {{"ratio", "0"},
                     {"sink_start", "8", "sink_size_start", {.help = "the first entries, chosen first"}},
                     {"sink_end", "4", "sink_size_end", {.help = "the last entries, chosen first"}},
                     {"chunk", "256", "chunk_size", {.help = "entries per chunk of the non-causal attention"}},
                     {"sketch", "48", "sketch_dimension", {.help = "columns of the leverage's random sketch"}},
                     {"blending", "ratio", {},
                      {.type = ParamType::Float,
                       .help = "the leverage's weight against the attention's; None: the compression ratio",
                       .default_value = "None"}},
                     {"seed", "42", {}, kKvslimOnly}},
                    [](const PressParams& p) -> std::unique_ptr<PressImpl> {
                      const int s = param_int(p, "compactor", "sink_start"), e = param_int(p, "compactor", "sink_end"),
                                c = param_int(p, "compactor", "chunk"), k = param_int(p, "compactor", "sketch");
                      if (s < 0 || e < 0)
                        throw Error(fmt::format("press compactor: sink_start={} and sink_end={} must be >= 0", s, e));
                      if (c < 1 || k < 1)
                        throw Error(fmt::format("press compactor: chunk={} and sketch={} must be >= 1", c, k));
                      const std::string bl = param_str(p, "compactor", "blending");
                      const double w = bl == "ratio" || bl == "None" ? NAN : param_double(p, "compactor", "blending");
                      return std::make_unique<CompactorPress>(param_double(p, "compactor", "ratio"), s, e, c, k, w,
                                                              param_int(p, "compactor", "seed"));
                    }}, {"CompactorPress"});

}  // namespace
}  // namespace kvslim
