// PyramidKV budget policy: every KV head of layer l keeps a budget that falls linearly with depth,
// from max_num in layer 0 to min_num in the last layer. Cai et al., "PyramidKV: Dynamic KV Cache
// Compression based on Pyramidal Information Funneling", arXiv 2406.02069. The schedule is
// kvpress's PyramidKVPress.get_layer_budget (kvpress/presses/pyramidkv_press.py, after
// KVCache-Factory's pyramidkv/pyramidkv_utils.py), with q = context tokens, r = ratio, w = the
// scorer's observation window:
//   cap = w + q (1 - r);  min_num = (cap - w) / beta;  max_num = 2 (cap - w) - min_num;
//   if max_num >= q - w:  max_num = q - w,  min_num = 2 (cap - w) - max_num;
//   unless q >= max_num >= min_num >= w, every layer keeps round(q (1 - r)) (SnapKV's budget);
//   else layer l keeps round(max_num - l (max_num - min_num) / (L - 1)),
// where round is Python's (half to even) and the window entries count inside the budget. A
// one-layer model keeps round(q (1 - r)); every budget is clamped to [1, entries present].
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "press/authoring.h"

namespace kvslim {

/// PyramidKV's keep-count for layer `layer` of `n_layer` (see the file comment); exposed for tests.
int pyramid_layer_budget(size_t q_len, double ratio, int window, double beta, int layer, int n_layer);

int pyramid_layer_budget(size_t q_len, double ratio, int window, double beta, int layer, int n_layer) {
  const double q = static_cast<double>(q_len), w = window;
  const double cap = w + q * (1 - ratio);
  double min_num = (cap - w) / beta;
  double max_num = (cap - w) * 2 - min_num;
  if (max_num >= q - w) {
    max_num = q - w;
    min_num = (cap - w) * 2 - max_num;
  }
  double b;
  if (!(q >= max_num && max_num >= min_num && min_num >= w) || n_layer < 2)
    b = std::nearbyint(q * (1 - ratio));  // default rounding mode: half to even, as Python's round
  else
    b = std::nearbyint(max_num - layer * ((max_num - min_num) / (n_layer - 1)));
  return static_cast<int>(std::max(1.0, b));
}

namespace {

class PyramidBudget : public BudgetPolicy {
 public:
  PyramidBudget(double beta, int window) : beta_(beta), window_(window) {}
  std::string describe() const override { return fmt::format("pyramidkv:beta={},window={}", beta_, window_); }
  void set_scorer_needs(const ObservationNeeds& scorer) override {
    scorer_window_ = scorer.window > 0 ? scorer.window : 64;
  }
  KeepCounts keep_counts(const BudgetInput& in) const override {
    const KVCache& cache = in.cache;
    const int L = cache.n_layer(), w = window_ > 0 ? window_ : scorer_window_;
    KeepCounts keep(L, std::vector<int>(cache.n_head_kv()));
    for (int l = 0; l < L; ++l) {
      const int b = pyramid_layer_budget(in.target.n_context, in.target.ratio, w, beta_, l, L);
      for (int h = 0; h < cache.n_head_kv(); ++h)
        keep[l][h] = std::min<int>(b, static_cast<int>(cache.seg(l, h).size()));
    }
    return keep;
  }

 private:
  double beta_;
  int window_, scorer_window_ = 64;
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "pyramidkv";
  i.kvpress = {"PyramidKVPress"};
  i.summary = "budget policy: per-head budgets linear in depth (more in lower layers), kvpress's layer schedule";
  i.source = "Cai et al. 2024, PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information Funneling, "
             "arXiv 2406.02069; reference: kvpress/presses/pyramidkv_press.py (PyramidKVPress.get_layer_budget, "
             "after github.com/Zefan-Cai/KVCache-Factory pyramidkv/pyramidkv_utils.py)";
  // PyramidKVPress is kvpress's SnapKVPress with beta: its window_size is the scorer's, which the
  // policy's window follows by default.
  i.params = {{"beta", "20", {},
               {.help = "the steepness: the top layer keeps 1/beta of the mean budget beyond the window"}},
              {"window", "0", "window_size", kKvslimOnly}};
  i.python = {.inner_fields = true};
  i.kind = PressKind::Policy;
  i.default_inner = "snapkv";
  i.make_policy = [](const PressParams& p) -> std::unique_ptr<BudgetPolicy> {
    double beta = param_double(p, "pyramidkv", "beta");
    int w = param_int(p, "pyramidkv", "window");
    if (!(beta >= 1)) throw Error(fmt::format("press pyramidkv: beta={} must be >= 1", beta));
    if (w < 0) throw Error(fmt::format("press pyramidkv: window={} must be >= 0 (0: the scorer's window)", w));
    return std::make_unique<PyramidBudget>(beta, w);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
