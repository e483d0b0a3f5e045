// Threshold policy with a sliding window (DMS-style): the newest `window` tokens are protected;
// an entry outside the window leaves when its score is below tau. The number kept follows from
// the scores, not from a ratio (the ratio is measured from the cache afterwards). With decode=N
// it also acts every N decode steps. Łańcucki et al., "Inference-Time Hyper-Scaling with KV Cache
// Compression" (DMS), arXiv 2506.05345, as kvpress's DMSPress (kvpress/presses/dms_press.py):
// sliding window 128, and no default threshold (tau must be given: its scale is the scorer's). Deviation: kvpress freezes a
// token's score when it is computed and decides once, when the token leaves the window; here the
// scorer re-scores the cache at every compression, so an entry kept once can leave later.
#include <fmt/format.h>

#include "press/authoring.h"

namespace kvslim {
namespace {

class ThresholdBudget : public BudgetPolicy {
 public:
  ThresholdBudget(double tau, int window, int decode) : tau_(tau), window_(window), decode_(decode) {}
  std::string describe() const override {
    return fmt::format("threshold:tau={},window={},decode={}", tau_, window_, decode_);
  }
  bool uses_ratio() const override { return false; }
  double reported_ratio(double) const override { return 0.0; }
  int decode_interval() const override { return decode_; }
  void prepare(Scores& scores, const KVCache& cache, const Target&) const override {
    const int32_t first = cache_next_position(cache) - window_;
    for (int l = 0; l < cache.n_layer(); ++l)
      for (int h = 0; h < cache.n_head_kv(); ++h) {
        const auto& pos = cache.seg(l, h).positions();
        for (size_t i = 0; i < pos.size(); ++i)
          if (pos[i] >= first) scores[l][h][i] = kProtected;
      }
  }
  KeepCounts keep_counts(const BudgetInput& in) const override {
    KeepCounts keep(in.cache.n_layer(), std::vector<int>(in.cache.n_head_kv()));
    for (int l = 0; l < in.cache.n_layer(); ++l)
      for (int h = 0; h < in.cache.n_head_kv(); ++h) {
        int k = 0;
        for (float s : in.scores[l][h]) k += s >= tau_;  // NaN compares false: it leaves
        keep[l][h] = k;
      }
    return keep;
  }

 private:
  double tau_;
  int window_, decode_;
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "threshold";
  i.kvpress = {"DMSPress"};
  i.summary = "budget policy: outside a sliding window of the newest tokens, entries scoring below tau leave "
              "(no ratio); decode=N also acts every N decode steps";
  i.source = "Lancucki et al. 2025, Inference-Time Hyper-Scaling with KV Cache Compression (DMS), arXiv 2506.05345; "
             "reference: kvpress/presses/dms_press.py (DMSPress)";
  i.params = {{"tau", "", "threshold",
               {.type = ParamType::Float,
                .help = "entries the inner press scores below it leave (its scale is the scorer's)",
                .default_value = "0.0"}},
              {"window", "128", "sliding_window_size", {.help = "the newest entries, never evicted"}},
              {"decode", "0", "decoding", {.type = ParamType::Bool, .help = "evict during decode too, at every step"}}};
  i.kind = PressKind::Policy;
  i.default_inner = "knorm";
  i.make_policy = [](const PressParams& p) -> std::unique_ptr<BudgetPolicy> {
    if (p.at("tau").empty())
      throw Error("press threshold: tau is required (entries scoring below tau leave; its scale is the scorer's, "
                  "e.g. threshold(knorm):tau=-4)");
    double tau = param_double(p, "threshold", "tau");
    int w = param_int(p, "threshold", "window"), d = param_int(p, "threshold", "decode");
    if (w < 0) throw Error(fmt::format("press threshold: window={} must be >= 0", w));
    if (d < 0) throw Error(fmt::format("press threshold: decode={} must be >= 0", d));
    return std::make_unique<ThresholdBudget>(tau, w, d);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
