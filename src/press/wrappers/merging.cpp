// Merging: merge-on-evict around a scorer press. The scorer keeps floor(n (1 - ratio)) entries per
// segment (at least 1, as the uniform policy); each evicted entry's value is folded into the kept
// entry whose key is most cosine-similar, with weight w = max(sim, 0) x |v_e| / (|v_e| + |v_t| +
// 1e-6) when sim >= similarity_threshold and sim is among the top merge_fraction of the segment's
// similarities; a kept value that received any weight becomes (v_t + sum w v_e) / (1 + sum w).
// Keys are never changed (RoPE-safe). Inspired by Token Merging (arXiv 2210.09461) and D2O
// (arXiv 2406.13035); reference: kvpress/presses/merging_press.py (MergingPress). The merged
// segment is rebuilt in its own codecs (a kept entry's key is decoded and re-encoded, exact for
// f32/f16 caches; LeanKV tiers are not kept).
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "kernels/threads.h"
#include "press/sub_cache.h"

namespace kvslim {
namespace {

constexpr double kEps = 1e-6;

class MergingPress : public SubsetScoringPress {
 public:
  MergingPress(std::unique_ptr<ScorerPress> inner, double threshold, double fraction)
      : SubsetScoringPress(std::move(inner)), thr_(threshold), frac_(fraction) {}
  std::string describe() const override {
    return fmt::format("merging({}):similarity_threshold={},merge_fraction={}", inner_->describe(), thr_, frac_);
  }
  void apply(KVCache& cache, const Model& model, const Observation& obs, const Target& target) override {
    if (target.ratio <= 0) return;
    const int L = cache.n_layer(), H = cache.n_head_kv();
    Scores sc = inner_->score_all(cache, model, obs, target);
    parallel_for(static_cast<int64_t>(L) * H, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        Segment& s = cache.seg(static_cast<int>(i / H), static_cast<int>(i % H));
        const int keep = std::min<int>(target.keep(target.n_for(s)), static_cast<int>(s.size()));
        merge_segment(s, select_top(sc[i / H][i % H], keep));
      }
    });
  }

 private:
  void merge_segment(Segment& s, const std::vector<int32_t>& kept) const {
    const int n = static_cast<int>(s.size()), hd = s.head_dim(), nk = static_cast<int>(kept.size());
    if (nk >= n || nk == 0) return;
    std::vector<float> K(static_cast<size_t>(n) * hd), V(K.size());
    s.keys(0, n, K.data());
    s.values(0, n, V.data());
    std::vector<char> is_kept(n, 0);
    for (int32_t j : kept) is_kept[j] = 1;
    auto unit = [&](int j) {
      std::vector<double> u(K.begin() + static_cast<size_t>(j) * hd, K.begin() + static_cast<size_t>(j + 1) * hd);
      double nn = 0;
      for (double x : u) nn += x * x;
      nn = std::max(std::sqrt(nn), kEps);
      for (double& x : u) x /= nn;
      return u;
    };
    auto vnorm = [&](int j) {
      double nn = 0;
      for (int c = 0; c < hd; ++c) nn += double(V[static_cast<size_t>(j) * hd + c]) * V[static_cast<size_t>(j) * hd + c];
      return std::sqrt(nn);
    };
    std::vector<std::vector<double>> ku;
    for (int32_t j : kept) ku.push_back(unit(j));
    // Nearest kept entry of every evicted one (first of equal similarities, as torch's max).
    std::vector<int> ev, target;
    std::vector<double> sim;
    for (int j = 0; j < n; ++j) {
      if (is_kept[j]) continue;
      std::vector<double> u = unit(j);
      double best = -INFINITY;
      int arg = 0;
      for (int t = 0; t < nk; ++t) {
        double d = 0;
        for (int c = 0; c < hd; ++c) d += u[c] * ku[t][c];
        if (d > best) best = d, arg = t;
      }
      ev.push_back(j);
      target.push_back(arg);
      sim.push_back(best);
    }
    std::vector<char> ok(ev.size());
    for (size_t i = 0; i < ev.size(); ++i) ok[i] = sim[i] >= thr_;
    if (frac_ < 1.0) {
      // torch.quantile(1 - fraction) over the similarities, failed ones at -inf (linear interpolation).
      std::vector<double> v;
      bool any = false;
      for (size_t i = 0; i < ev.size(); ++i) v.push_back(ok[i] ? (any = true, sim[i]) : -INFINITY);
      if (any) {
        std::sort(v.begin(), v.end());
        const double pos = (1.0 - frac_) * (v.size() - 1);
        const size_t lo = static_cast<size_t>(std::floor(pos)), hi = std::min(v.size() - 1, lo + 1);
        const double q = std::isinf(v[lo]) || std::isinf(v[hi]) ? (pos - lo > 0 ? v[hi] : v[lo])
                                                                  : v[lo] + (pos - lo) * (v[hi] - v[lo]);
        for (size_t i = 0; i < ev.size(); ++i) ok[i] = ok[i] && sim[i] >= q;
      }
    }
    std::vector<double> acc(static_cast<size_t>(nk) * hd, 0.0), wsum(nk, 0.0);
    for (size_t i = 0; i < ev.size(); ++i) {
      if (!ok[i]) continue;
      const int t = target[i], j = ev[i];
      const double en = vnorm(j), tn = vnorm(kept[t]);
      const double w = std::max(sim[i], 0.0) * en / (en + tn + kEps);
      for (int c = 0; c < hd; ++c) acc[static_cast<size_t>(t) * hd + c] += w * V[static_cast<size_t>(j) * hd + c];
      wsum[t] += w;
    }
    Segment out(hd, s.key_codec(), s.value_codec(), s.quant());
    std::vector<float> v(hd);
    for (int t = 0; t < nk; ++t) {
      const int j = kept[t];
      for (int c = 0; c < hd; ++c) {
        const double x = V[static_cast<size_t>(j) * hd + c];
        v[c] = wsum[t] > 0 ? static_cast<float>((x + acc[static_cast<size_t>(t) * hd + c]) / (1.0 + wsum[t]))
                           : static_cast<float>(x);
      }
      out.append(K.data() + static_cast<size_t>(j) * hd, v.data(), s.positions()[j]);
    }
    s = std::move(out);
  }
  double thr_, frac_;
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "merging";
  i.kvpress = {"MergingPress"};
  i.summary = "wrapper over a scorer: evicted values are merged into their most key-similar kept entry";
  i.source = "kvpress/presses/merging_press.py (MergingPress), after Token Merging (Bolya et al. 2023, arXiv "
             "2210.09461) and D2O (Wan et al. 2024, arXiv 2406.13035)";
  i.params = {{"similarity_threshold", "0", {},
               {.type = ParamType::Float, .help = "the least key cosine similarity at which an evicted value merges"}},
              {"merge_fraction", "1", {},
               {.type = ParamType::Float, .help = "the fraction of the most similar evicted entries that merge"}}};
  i.kind = PressKind::Wrapper;
  i.default_inner = "snapkv";
  i.make_wrapper = [](const PressParams& p, std::unique_ptr<PressImpl> inner) -> std::unique_ptr<PressImpl> {
    const double t = param_double(p, "merging", "similarity_threshold"), f = param_double(p, "merging", "merge_fraction");
    if (!(t >= 0 && t <= 1)) throw Error(fmt::format("press merging: similarity_threshold={} must be in [0, 1]", t));
    if (!(f > 0 && f <= 1)) throw Error(fmt::format("press merging: merge_fraction={} must be in (0, 1]", f));
    return std::make_unique<MergingPress>(subset_scorer("merging", std::move(inner)), t, f);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
