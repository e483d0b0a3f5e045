// Cross-layer entry sharing after training: a layer stops storing keys and values and attends to
// the previous layer's entries instead, as Cross-Layer Attention trains a model to (Brandon et
// al., "Reducing Transformer Key-Value Cache Size with Cross-Layer Attention", arXiv 2405.12981).
// MiniCache (Liu et al., arXiv 2405.14366) observes that adjacent layers' KV states are similar
// in the middle-to-deep layers of trained models and merges them; here the sharing layer reuses
// its source's entries as they are (no merge, no retention of per-layer norms), and which layers
// share is either given or chosen by the measured difference of their entries. The shared
// layer's segments are emptied, so its bytes are freed (KVCache::share_layer); decode entries are
// stored once, in the source layer.
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>

#include "press/authoring.h"
#include "press/scorers/cross_layer.h"

namespace kvslim {

/// Relative squared difference between layer `l`'s entries and layer `src`'s, over the entries
/// at positions both hold (every KV head): max over keys and values of
/// sum ||x_l - x_src||^2 / sum ||x_l||^2, in float64. +inf when no position is shared or layer l
/// holds only zeros.
double cross_layer_difference(const KVCache& cache, int l, int src) {
  const int H = cache.n_head_kv(), hd = cache.head_dim();
  double dk = 0, nk = 0, dv = 0, nv = 0;
  size_t common = 0;
  std::vector<float> a(hd), b(hd);
  for (int h = 0; h < H; ++h) {
    const Segment& s = cache.seg(src, h);
    const Segment& t = cache.seg(l, h);
    std::unordered_map<int32_t, size_t> at;
    for (size_t i = 0; i < s.size(); ++i) at.emplace(s.positions()[i], i);
    for (size_t j = 0; j < t.size(); ++j) {
      auto it = at.find(t.positions()[j]);
      if (it == at.end()) continue;
      ++common;
      t.key(j, a.data());
      s.key(it->second, b.data());
      for (int d = 0; d < hd; ++d) {
        dk += (static_cast<double>(a[d]) - b[d]) * (static_cast<double>(a[d]) - b[d]);
        nk += static_cast<double>(a[d]) * a[d];
      }
      t.value(j, a.data());
      s.value(it->second, b.data());
      for (int d = 0; d < hd; ++d) {
        dv += (static_cast<double>(a[d]) - b[d]) * (static_cast<double>(a[d]) - b[d]);
        nv += static_cast<double>(a[d]) * a[d];
      }
    }
  }
  if (common == 0 || nk <= 0 || nv <= 0) return std::numeric_limits<double>::infinity();
  return std::max(dk / nk, dv / nv);
}

namespace {

class CrossLayerPress : public PressImpl {
 public:
  CrossLayerPress(std::vector<int> layers, double tol, int n) : layers_(std::move(layers)), tol_(tol), n_(n) {}
  std::string describe() const override {
    if (!layers_.empty()) {
      std::string s;
      for (int l : layers_) s += (s.empty() ? "" : "/") + std::to_string(l);
      return "cla:layers=" + s;
    }
    if (n_ > 0) return fmt::format("cla:n={}", n_);
    return fmt::format("cla:tol={}", tol_);
  }
  // Whole layers, not entries of a layer: the other layers keep theirs.
  double ratio() const override { return 0.0; }
  size_t kept_after(const Target& t) const override { return t.n_context; }

  void apply(KVCache& cache, const Model&, const Observation&, const Target&) override {
    const int L = cache.n_layer();
    // With chunked prefill the first chunk decides; later chunks go to the source layers already.
    if (cache.shares_layers()) return;
    for (int l : layers_)
      if (l < 1 || l >= L) throw Error(fmt::format("press cla: layer {} must be in [1, {}] (it reads layer l - 1)", l, L - 1));
    if (!layers_.empty()) {
      for (int l : layers_) cache.share_layer(l, l - 1);
      return;
    }
    if (n_ > L - 1)
      throw Error(fmt::format("press cla: n={} must be at most {} (layers 1 to {} can read their predecessor's entries)",
                              n_, L - 1, L - 1));
    if (n_ > 0) {
      // The n layers whose entries differ least from their predecessor's (before any sharing).
      std::vector<std::pair<double, int>> d;
      for (int l = 1; l < L; ++l) d.emplace_back(cross_layer_difference(cache, l, l - 1), l);
      std::stable_sort(d.begin(), d.end());
      std::vector<int> pick;
      for (int i = 0; i < std::min<int>(n_, static_cast<int>(d.size())); ++i)
        if (std::isfinite(d[i].first)) pick.push_back(d[i].second);
      std::sort(pick.begin(), pick.end());
      for (int l : pick) cache.share_layer(l, l - 1);
      return;
    }
    // tol: from layer 1 up, a layer shares its predecessor's source when its entries differ from
    // that source's by at most tol.
    for (int l = 1; l < L; ++l)
      if (cross_layer_difference(cache, l, cache.source(l - 1)) <= tol_) cache.share_layer(l, l - 1);
  }

 private:
  std::vector<int> layers_;
  double tol_;
  int n_;
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "cla";
  i.summary = "cross-layer entry sharing: a layer attends to the previous layer's keys and values instead of its own, "
              "whose segments are freed (layers=1/3 given; n=N the N layers whose entries differ least from their "
              "predecessor's; tol=T every layer within relative squared difference T of its predecessor's source)";
  i.source = "Brandon et al. 2024, Reducing Transformer Key-Value Cache Size with Cross-Layer Attention, arXiv "
             "2405.12981 (CLA, applied after training); MiniCache, arXiv 2405.14366 (adjacent-layer similarity)";
  i.params = {{"layers", ""}, {"n", "0"}, {"tol", "0"}};
  i.make = [](const PressParams& p) -> std::unique_ptr<PressImpl> {
    std::vector<int> layers;
    const std::string ls = param_str(p, "cla", "layers");
    if (!ls.empty()) {
      std::stringstream in(ls);
      std::string part;
      while (std::getline(in, part, '/')) {
        size_t used = 0;
        int l = -1;
        try {
          l = std::stoi(part, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != part.size() || l < 1)
          throw Error(fmt::format("press cla: layers={} must list layer numbers >= 1 separated by '/'", ls));
        layers.push_back(l);
      }
      std::sort(layers.begin(), layers.end());
      layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
    }
    const int n = param_int(p, "cla", "n");
    const double tol = param_double(p, "cla", "tol");
    if (n < 0) throw Error(fmt::format("press cla: n={} must be >= 0", n));
    if (!(tol >= 0.0)) throw Error(fmt::format("press cla: tol={} must be >= 0", tol));
    if (!layers.empty() && n > 0) throw Error("press cla: give layers= or n=, not both");
    return std::make_unique<CrossLayerPress>(std::move(layers), tol, n);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
