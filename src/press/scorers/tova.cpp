// TOVA: the attention of the newest token, averaged over every query head of the layer, scores
// the entries; the newest token itself is kept. Oren et al., "Transformers are Multi-State RNNs"
// (Token Omission Via Attention), arXiv 2401.06104; as kvpress's TOVAPress, which gives every KV
// head of a layer the same scores. When the layer's KV heads hold different entries (after a
// head-adaptive budget), an entry's score is the mean over the query heads whose segment holds it.
// The newest token is chosen first but counts against the budget (kvpress pads it with the
// largest score + 1, kvpress/presses/tova_press.py); `protect=1` (kvslim's option) never evicts it.
#include <algorithm>

#include <fmt/format.h>

#include "press/authoring.h"

namespace kvslim {
namespace {

class TOVAPress : public ScorerPress {
 public:
  TOVAPress(double ratio, bool protect) : ScorerPress(ratio), protect_(protect) {}
  std::string describe_scorer() const override { return fmt::format("tova:ratio={},protect={}", ratio_, protect_ ? 1 : 0); }
  ObservationNeeds scorer_needs() const override {
    ObservationNeeds r;
    r.window = 1;
    return r;
  }
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override {
    const int H = view.hp().n_head_kv, G = view.hp().n_group(), nw = view.n_window();
    for (int h = 0; h < H; ++h) out[h].assign(view.seg(h).size(), 0.0f);
    if (nw == 0) return;
    const int32_t last = view.obs().window_positions[nw - 1];
    std::vector<int32_t> all;
    for (int h = 0; h < H; ++h) all.insert(all.end(), view.seg(h).positions().begin(), view.seg(h).positions().end());
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    std::vector<double> sum(all.size(), 0.0);
    std::vector<int> cnt(all.size(), 0);
    for (int h = 0; h < H; ++h) {
      const auto& pos = view.seg(h).positions();
      const size_t n = pos.size();
      const std::vector<float>& p = view.window_mass(h, 1);  // the newest query's attention
      for (size_t j = 0; j < n; ++j) {
        size_t u = std::lower_bound(all.begin(), all.end(), pos[j]) - all.begin();
        for (int g = 0; g < G; ++g) sum[u] += p[static_cast<size_t>(g) * n + j];
        cnt[u] += G;
      }
    }
    for (int h = 0; h < H; ++h) {
      const auto& pos = view.seg(h).positions();
      for (size_t j = 0; j < pos.size(); ++j) {
        size_t u = std::lower_bound(all.begin(), all.end(), pos[j]) - all.begin();
        out[h][j] = pos[j] >= last ? keep_first_score(protect_) : static_cast<float>(sum[u] / cnt[u]);
      }
    }
  }

 private:
  bool protect_;
};

PressRegistrar reg({"tova", "attention of the newest token, averaged over the layer's query heads",
                    "Oren et al. 2024, Transformers are Multi-State RNNs (TOVA), arXiv 2401.06104; reference: "
                    "kvpress/presses/tova_press.py (TOVAPress)",
                    {{"ratio", "0"}, {"protect", "0", {}, kKvslimOnly}},
                    [](const PressParams& p) -> std::unique_ptr<PressImpl> {
                      return std::make_unique<TOVAPress>(param_double(p, "tova", "ratio"), param_bool(p, "tova", "protect"));
                    }}, {"TOVAPress"});

}  // namespace
}  // namespace kvslim
