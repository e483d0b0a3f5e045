// LagKV: scores an entry by how much it stands out from the next partition of the sequence. After
// the n_sink sinks the entries are cut into partitions of `lag`; each key (and value) channel of
// a partition is min-max normalised by the next partition's range on that channel, the standard
// deviation over channels (unbiased) is softmaxed over the partition, keys and values averaged,
// and (without cross_scoring) the result replaced by its rank within the partition divided by
// lag. Sinks and the last full partition with the remainder (no reference after them) score 1;
// a segment shorter than n_sink + 2 lag scores its non-sink entries (i - n_sink) / (n - n_sink)
// (recency). Liang et al., "LagKV: Lag-Relative Information of the KV Cache Tells Which Tokens
// Are Important", arXiv 2504.04704; reference: kvpress/presses/lagkv_press.py (LagKVPress).
#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "press/authoring.h"

namespace kvslim {
namespace {

class LagKVPress : public ScorerPress {
 public:
  LagKVPress(double ratio, int n_sink, int lag, bool cross) : ScorerPress(ratio), n_sink_(n_sink), lag_(lag), cross_(cross) {}
  std::string describe_scorer() const override {
    return fmt::format("lagkv:ratio={},n_sink={},lag={},cross_scoring={}", ratio_, n_sink_, lag_, cross_ ? 1 : 0);
  }
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override {
    const int hd = view.hp().head_dim;
    for (int h = 0; h < view.hp().n_head_kv; ++h) {
      const Segment& s = view.seg(h);
      const size_t n = s.size(), ns = static_cast<size_t>(n_sink_), lag = static_cast<size_t>(lag_);
      out[h].assign(n, 1.0f);
      if (n < ns + 2 * lag) {
        for (size_t i = ns; i < n; ++i) out[h][i] = static_cast<float>(double(i - ns) / double(n - ns));
        continue;
      }
      const size_t parts = (n - ns) / lag;  // the last one is only a reference
      std::vector<float> keys(n * hd), vals(n * hd);
      s.keys(0, n, keys.data());
      s.values(0, n, vals.data());
      std::vector<double> sk(lag), sv(lag);
      for (size_t p = 0; p + 1 < parts; ++p) {
        const size_t b = ns + p * lag;
        part_score(keys.data(), b, lag, hd, sk);
        part_score(vals.data(), b, lag, hd, sv);
        std::vector<double> sc(lag);
        for (size_t i = 0; i < lag; ++i) sc[i] = (sk[i] + sv[i]) / 2;
        if (!cross_) {
          std::vector<size_t> order(lag);
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t c) { return sc[a] < sc[c]; });
          for (size_t r = 0; r < lag; ++r) sc[order[r]] = double(r) / double(lag);
        }
        for (size_t i = 0; i < lag; ++i) out[h][b + i] = static_cast<float>(sc[i]);
      }
    }
  }

 private:
  /// Scores of the `lag` rows starting at b of x [n][hd] against the next `lag` rows: per row, the
  /// unbiased standard deviation over channels of (x - min_ref) / (max_ref - min_ref), softmaxed
  /// over the partition.
  static void part_score(const float* x, size_t b, size_t lag, int hd, std::vector<double>& out) {
    std::vector<double> lo(hd, INFINITY), hi(hd, -INFINITY);
    for (size_t i = b + lag; i < b + 2 * lag; ++i)
      for (int c = 0; c < hd; ++c) {
        lo[c] = std::min(lo[c], double(x[i * hd + c]));
        hi[c] = std::max(hi[c], double(x[i * hd + c]));
      }
    double mx = -INFINITY;
    for (size_t i = 0; i < lag; ++i) {
      double mean = 0, ss = 0;
      std::vector<double> z(hd);
      for (int c = 0; c < hd; ++c) mean += (z[c] = (x[(b + i) * hd + c] - lo[c]) / (hi[c] - lo[c])) / hd;
      for (int c = 0; c < hd; ++c) ss += (z[c] - mean) * (z[c] - mean);
      out[i] = hd > 1 ? std::sqrt(ss / (hd - 1)) : 0.0;
      mx = std::max(mx, out[i]);
    }
    double sum = 0;
    for (size_t i = 0; i < lag; ++i) sum += (out[i] = std::exp(out[i] - mx));
    for (size_t i = 0; i < lag; ++i) out[i] /= sum;
  }
  int n_sink_, lag_;
  bool cross_;
};

PressRegistrar reg({"lagkv", "lag-relative scores: each partition normalised by the next one's range",
                    "Liang et al. 2025, LagKV: Lag-Relative Information of the KV Cache Tells Which Tokens Are "
                    "Important, arXiv 2504.04704; reference: kvpress/presses/lagkv_press.py (LagKVPress)",
                    {{"ratio", "0"},
                     {"n_sink", "4", {}, {.help = "the first entries, always kept"}},
                     {"lag", "128", "lag_size", {.help = "entries per partition"}},
                     {"cross_scoring", "0", {},
                      {.type = ParamType::Bool,
                       .help = "keep the scores instead of their ranks within the partition"}}},
                    [](const PressParams& p) -> std::unique_ptr<PressImpl> {
                      int s = param_int(p, "lagkv", "n_sink"), lag = param_int(p, "lagkv", "lag");
                      if (s < 0) throw Error(fmt::format("press lagkv: n_sink={} must be >= 0", s));
                      if (lag < 2) throw Error(fmt::format("press lagkv: lag={} must be >= 2", lag));
                      return std::make_unique<LagKVPress>(param_double(p, "lagkv", "ratio"), s, lag,
                                                          param_bool(p, "lagkv", "cross_scoring"));
                    }}, {"LagKVPress"});

}  // namespace
}  // namespace kvslim
