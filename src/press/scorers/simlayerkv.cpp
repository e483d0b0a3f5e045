// SimLayerKV: finds "lazy" layers, whose last queries attend mostly to the first and the most
// recent entries, and keeps only those entries there; other layers keep everything. Per layer, the
// softmax attention of the last n_last queries over the segment (causal, every entry in the
// denominator) is restricted to the entries before the last n_last, averaged over every query head
// of the layer and over the n_last queries, and summed over the first n_initial and the last
// n_recent of those entries; the layer is lazy when that sum exceeds lazy_threshold. A lazy layer
// keeps its first n_initial and last n_recent - n_last entries (kvpress's slice
// keys[-n_recent + n_last:]). Nothing is compressed when lazy_threshold = 1 (kvpress's default:
// the paper recommends 0.9 for Llama 3, 0.65 Llama 2, 0.8 Mistral, 0.85 Qwen) or when a segment
// holds at most n_initial + n_recent + n_last entries. No compression ratio: the ratio follows
// from how many layers are lazy (reported per request).
// Zhang et al., "SimLayerKV: A Simple Framework for Layer-Level KV Cache Reduction",
// arXiv 2410.13846; reference: kvpress/presses/simlayerkv_press.py (SimLayerKVPress).
#include <atomic>

#include <fmt/format.h>

#include "kernels/threads.h"
#include "press/authoring.h"

namespace kvslim {
namespace {

class SimLayerKVPress : public PressImpl {
 public:
  SimLayerKVPress(double threshold, int n_last, int n_recent, int n_initial)
      : thr_(threshold), n_last_(n_last), n_recent_(n_recent), n_initial_(n_initial) {}
  std::string describe() const override {
    return fmt::format("simlayerkv:lazy_threshold={},n_last={},n_recent={},n_initial={}", thr_, n_last_, n_recent_,
                       n_initial_);
  }
  ObservationNeeds needs() const override {
    ObservationNeeds r;
    r.window = n_last_;
    return r;
  }
  void reset() override { lazy_.clear(); }
  std::string report() const override {
    if (lazy_.empty()) return {};
    std::string names;
    int n = 0;
    for (size_t l = 0; l < lazy_.size(); ++l)
      if (lazy_[l]) names += (n++ ? "," : "") + std::to_string(l);
    return fmt::format("simlayerkv: {} of {} layers lazy{}", n, lazy_.size(), n ? " (" + names + ")" : "");
  }
  size_t kept_after(const Target& t) const override { return t.n_context; }
  void apply(KVCache& cache, const Model& model, const Observation& obs, const Target& target) override {
    const int L = cache.n_layer(), H = cache.n_head_kv();
    lazy_.assign(L, 0);
    if (thr_ >= 1.0) return;
    const size_t min_len = static_cast<size_t>(n_initial_ + n_recent_ + n_last_);
    std::vector<char> lazy(L, 0);
    parallel_for(L, [&](int64_t b, int64_t e) {
      for (int64_t l = b; l < e; ++l) {
        bool long_enough = true;
        for (int h = 0; h < H; ++h) long_enough = long_enough && cache.seg(l, h).size() > min_len;
        if (!long_enough || obs.n_window() < n_last_) continue;
        LayerView view(model, cache, obs, static_cast<int>(l), target);
        lazy[l] = layer_score(view) > thr_;
      }
    });
    for (int l = 0; l < L; ++l) {
      lazy_[l] = lazy[l];
      if (!lazy[l]) continue;
      for (int h = 0; h < H; ++h) {
        Segment& s = cache.seg(l, h);
        const int32_t n = static_cast<int32_t>(s.size()), tail = n_recent_ - n_last_;
        std::vector<int32_t> keep;
        for (int32_t i = 0; i < n_initial_; ++i) keep.push_back(i);
        for (int32_t i = n - tail; i < n; ++i) keep.push_back(i);
        s.retain(keep);
      }
    }
  }
  /// Mean over query heads and the last n_last queries of the attention they give to the first
  /// n_initial and the last n_recent entries before the last n_last.
  double layer_score(const LayerView& view) const {
    const int H = view.hp().n_head_kv, G = view.hp().n_group();
    double total = 0;
    for (int h = 0; h < H; ++h) {
      const std::vector<float>& mass = view.window_mass(h, n_last_);  // [G][n], summed over the rows
      const size_t n = view.seg(h).size(), m = n - n_last_;           // entries before the last n_last
      for (int g = 0; g < G; ++g) {
        const float* row = mass.data() + static_cast<size_t>(g) * n;
        for (size_t j = 0; j < static_cast<size_t>(n_initial_); ++j) total += row[j];
        for (size_t j = m - n_recent_; j < m; ++j) total += row[j];
      }
    }
    return total / (double(H) * G * n_last_);
  }

 private:
  double thr_;
  int n_last_, n_recent_, n_initial_;
  std::vector<char> lazy_;
};

PressRegistrar reg({"simlayerkv", "lazy layers (attention on the first and recent entries) keep only those",
                    "Zhang et al. 2024, SimLayerKV: A Simple Framework for Layer-Level KV Cache Reduction, arXiv "
                    "2410.13846; reference: kvpress/presses/simlayerkv_press.py (SimLayerKVPress)",
                    {{"lazy_threshold", "1", {},
                      {.type = ParamType::Float,
                       .help = "a layer is lazy when its last queries give more than this share of their "
                               "attention to the first and recent entries (1: none is)"}},
                     {"n_last", "1", {}, {.help = "the last queries that decide whether a layer is lazy"}},
                     {"n_recent", "1024", {}, {.help = "the recent entries a lazy layer keeps"}},
                     {"n_initial", "4", {}, {.help = "the first entries a lazy layer keeps"}}},
                    [](const PressParams& p) -> std::unique_ptr<PressImpl> {
                      const double t = param_double(p, "simlayerkv", "lazy_threshold");
                      const int last = param_int(p, "simlayerkv", "n_last"),
                                recent = param_int(p, "simlayerkv", "n_recent"),
                                init = param_int(p, "simlayerkv", "n_initial");
                      if (!(t >= 0 && t <= 1))
                        throw Error(fmt::format("press simlayerkv: lazy_threshold={} must be in [0, 1]", t));
                      if (last < 1) throw Error(fmt::format("press simlayerkv: n_last={} must be >= 1", last));
                      if (init < 0) throw Error(fmt::format("press simlayerkv: n_initial={} must be >= 0", init));
                      if (recent <= last)
                        throw Error(fmt::format("press simlayerkv: n_recent={} must be larger than n_last={}", recent,
                                                last));
                      return std::make_unique<SimLayerKVPress>(t, last, recent, init);
                    }}, {"SimLayerKVPress"});

}  // namespace
}  // namespace kvslim
