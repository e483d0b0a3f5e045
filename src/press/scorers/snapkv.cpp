// SnapKV: the last `window` context queries vote for the entries they attend to; votes are
// pooled over neighbouring positions and averaged over the GQA group; the window itself is kept.
// Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation", arXiv 2404.14469.
// As kvpress's SnapKVPress (kvpress/presses/snapkv_press.py): mean over the window queries,
// avg_pool1d with zero padding (divisor = kernel), mean over the GQA group; the window is chosen
// first but counts against the budget (kvpress pads it with the largest score + 1), so the ratio
// is honoured. kvslim options, off by default: `pooling=max` (the original repository's,
// github.com/FasterDecoding/SnapKV) and `protect=1` (the window is never evicted).
#include <algorithm>

#include <fmt/format.h>

#include "press/authoring.h"

namespace kvslim {
namespace {

class SnapKVPress : public ScorerPress {
 public:
  SnapKVPress(double ratio, int window, int kernel, bool max_pool, bool protect)
      : ScorerPress(ratio), window_(window), kernel_(kernel), max_pool_(max_pool), protect_(protect) {}
  std::string describe_scorer() const override {
    return fmt::format("snapkv:ratio={},window={},kernel={},pooling={},protect={}", ratio_, window_, kernel_,
                       max_pool_ ? "max" : "avg", protect_ ? 1 : 0);
  }
  ObservationNeeds scorer_needs() const override {
    ObservationNeeds r;
    r.window = window_;
    return r;
  }
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override {
    const int G = view.hp().n_group(), nw = view.n_window();
    // Another part of the press (a policy) may have asked for a longer window: use the newest rows.
    const int w = std::min(nw, window_), w0i = nw - w;
    for (int h = 0; h < view.hp().n_head_kv; ++h) {
      const Segment& s = view.seg(h);
      const size_t n = s.size();
      out[h].assign(n, 0.0f);
      if (w == 0) continue;
      // Entries at or after the first window position are the window: always kept.
      const int32_t w0 = view.obs().window_positions[w0i];
      size_t n_prefix = std::lower_bound(s.positions().begin(), s.positions().end(), w0) - s.positions().begin();
      const std::vector<float>& mass = view.window_mass(h, w);
      std::vector<float> vote(n_prefix, 0.0f);
      for (int g = 0; g < G; ++g) {
        const float* m = mass.data() + static_cast<size_t>(g) * n;
        // Pool over neighbouring entries (zero padding, divisor = kernel, as torch's avg_pool1d).
        const int r = kernel_ / 2;
        for (size_t j = 0; j < n_prefix; ++j) {
          float acc = max_pool_ ? -1.0f : 0.0f;
          for (int o = -r; o <= r; ++o) {
            long jj = static_cast<long>(j) + o;
            float x = (jj >= 0 && jj < static_cast<long>(n_prefix)) ? m[jj] / w : 0.0f;
            acc = max_pool_ ? std::max(acc, x) : acc + x;
          }
          vote[j] += (max_pool_ ? acc : acc / kernel_) / G;
        }
      }
      const float first = keep_first_score(protect_);
      for (size_t j = 0; j < n; ++j) out[h][j] = j < n_prefix ? vote[j] : first;
    }
  }

 private:
  int window_, kernel_;
  bool max_pool_, protect_;
};

PressRegistrar reg({"snapkv", "observation-window attention, pooled, averaged over the GQA group",
                    "Li et al. 2024, SnapKV: LLM Knows What You are Looking for Before Generation, arXiv 2404.14469; "
                    "reference: kvpress/presses/snapkv_press.py (SnapKVPress)",
                    {{"ratio", "0"},
                     {"window", "64", "window_size",
                      {.help = "the last context queries whose attention scores the entries (the observation window)"}},
                     {"kernel", "5", "kernel_size", {.help = "width of the pooling over neighbouring scores (odd)"}},
                     {"pooling", "avg", {}, kKvslimOnly},
                     {"protect", "0", {}, kKvslimOnly}},
                    [](const PressParams& p) -> std::unique_ptr<PressImpl> {
                      int w = param_int(p, "snapkv", "window"), k = param_int(p, "snapkv", "kernel");
                      std::string pool = param_str(p, "snapkv", "pooling");
                      if (w < 1) throw Error(fmt::format("press snapkv: window={} must be >= 1", w));
                      if (k < 1 || k % 2 == 0) throw Error(fmt::format("press snapkv: kernel={} must be odd and >= 1", k));
                      if (pool != "avg" && pool != "max")
                        throw Error(fmt::format("press snapkv: pooling='{}' must be avg or max", pool));
                      return std::make_unique<SnapKVPress>(param_double(p, "snapkv", "ratio"), w, k, pool == "max",
                                                           param_bool(p, "snapkv", "protect"));
                    }}, {"SnapKVPress"});

}  // namespace
}  // namespace kvslim
