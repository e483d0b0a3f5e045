#include "press/budget_util.h"
#include "press/ranking.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kvslim::budget {

std::vector<int64_t> apportion(const std::vector<double>& desired_in, const std::vector<int64_t>& lo,
                               const std::vector<int64_t>& hi, int64_t total) {
  const size_t n = desired_in.size();
  std::vector<int64_t> x(n, 0);
  if (n == 0) return x;
  int64_t sum_lo = 0, sum_hi = 0;
  for (size_t i = 0; i < n; ++i) sum_lo += lo[i], sum_hi += std::max(lo[i], hi[i]);
  total = std::clamp(total, sum_lo, sum_hi);
  std::vector<double> d = desired_in;
  bool any = false;
  for (double& v : d) {
    if (!(v > 0)) v = 0;  // NaN and negatives count as nothing
    any = any || v > 0;
  }
  if (!any) std::fill(d.begin(), d.end(), 1.0);
  auto filled = [&](double lambda, std::vector<double>* out) {
    double s = 0;
    for (size_t i = 0; i < n; ++i) {
      double v = std::clamp(lambda * d[i], static_cast<double>(lo[i]), static_cast<double>(std::max(lo[i], hi[i])));
      if (out) (*out)[i] = v;
      s += v;
    }
    return s;
  };
  // Bisection on lambda: filled() is non-decreasing in it.
  double a = 0, b = 1;
  while (filled(b, nullptr) < total && b < 1e300) b *= 2;
  for (int it = 0; it < 200; ++it) {
    double m = 0.5 * (a + b);
    (filled(m, nullptr) < total ? a : b) = m;
  }
  std::vector<double> real(n);
  filled(b, &real);
  int64_t s = 0;
  for (size_t i = 0; i < n; ++i) {
    x[i] = std::clamp<int64_t>(static_cast<int64_t>(std::floor(real[i] + 1e-9)), lo[i], std::max(lo[i], hi[i]));
    s += x[i];
  }
  // Largest remainders take the missing units (or the smallest give back any excess).
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t i, size_t j) {
    return real[i] - std::floor(real[i] + 1e-9) > real[j] - std::floor(real[j] + 1e-9);
  });
  while (s < total) {
    bool moved = false;
    for (size_t i : order)
      if (s < total && x[i] < hi[i]) ++x[i], ++s, moved = true;
    if (!moved) break;
  }
  while (s > total) {
    bool moved = false;
    for (auto it = order.rbegin(); it != order.rend(); ++it)
      if (s > total && x[*it] > lo[*it]) --x[*it], --s, moved = true;
    if (!moved) break;
  }
  return x;
}

int64_t uniform_total(const KVCache& cache, const Target& t, const std::vector<std::pair<int, int>>& segs) {
  // Pooled over the group: a segment that an earlier chunk left short (an adaptive policy gave it
  // less) does not shrink the group's total; only the entries that exist cap it.
  int64_t entries = 0, k = 0;
  for (auto [l, h] : segs) {
    const Segment& s = cache.seg(l, h);
    entries += static_cast<int64_t>(s.size());
    k += t.keep(t.n_for(s));
  }
  return std::min<int64_t>(entries, k);
}

std::vector<int64_t> protected_counts(const Scores& scores, const std::vector<std::pair<int, int>>& segs) {
  std::vector<int64_t> p;
  p.reserve(segs.size());
  for (auto [l, h] : segs) p.push_back(count_protected(scores[l][h]));
  return p;
}

std::vector<int64_t> floor_counts(const Scores& scores, const std::vector<std::pair<int, int>>& segs) {
  std::vector<int64_t> p = protected_counts(scores, segs);
  for (size_t i = 0; i < segs.size(); ++i)
    p[i] = std::min<int64_t>(std::max<int64_t>(p[i], 1), static_cast<int64_t>(scores[segs[i].first][segs[i].second].size()));
  return p;
}

namespace {
inline float rank_value(float s) { return std::isnan(s) ? -INFINITY : s; }
}  // namespace

std::vector<int64_t> shared_top(const Scores& scores, const std::vector<std::pair<int, int>>& segs,
                                const std::vector<int64_t>& must_in, int64_t total) {
  const size_t S = segs.size();
  std::vector<int64_t> keep(S, 0);
  // Each segment's entries in select_top's order: score descending, later entry first.
  struct Cand {
    float s;
    int32_t idx;
    int32_t seg;
  };
  std::vector<Cand> rest;
  int64_t sum_must = 0;
  for (size_t i = 0; i < S; ++i) {
    const auto& sc = scores[segs[i].first][segs[i].second];
    const int64_t n = static_cast<int64_t>(sc.size());
    const std::vector<int32_t> order = rank_entries(sc);
    // Every non-empty segment keeps at least one entry (the rule "never below 1").
    int64_t must = std::clamp<int64_t>(std::max<int64_t>({must_in[i], count_protected(sc), 1}), 0, n);
    keep[i] = must;
    sum_must += must;
    for (int64_t r = must; r < n; ++r) rest.push_back({rank_value(sc[order[r]]), order[r], static_cast<int32_t>(i)});
  }
  int64_t extra = std::clamp<int64_t>(total - sum_must, 0, static_cast<int64_t>(rest.size()));
  if (extra > 0) {
    auto better = [](const Cand& a, const Cand& b) {
      if (a.s != b.s) return a.s > b.s;
      if (a.seg != b.seg) return a.seg < b.seg;
      return a.idx > b.idx;
    };
    if (extra < static_cast<int64_t>(rest.size())) std::nth_element(rest.begin(), rest.begin() + extra, rest.end(), better);
    for (int64_t r = 0; r < extra; ++r) ++keep[rest[r].seg];
  }
  return keep;
}

std::vector<std::pair<int, int>> all_segments(const KVCache& cache) {
  std::vector<std::pair<int, int>> s;
  for (int l = 0; l < cache.n_layer(); ++l)
    for (int h = 0; h < cache.n_head_kv(); ++h) s.emplace_back(l, h);
  return s;
}

std::vector<std::pair<int, int>> layer_segments(const KVCache& cache, int layer) {
  std::vector<std::pair<int, int>> s;
  for (int h = 0; h < cache.n_head_kv(); ++h) s.emplace_back(layer, h);
  return s;
}

KeepCounts layer_shaped_keep(const BudgetInput& in, const std::function<double(int layer)>& desired_for) {
  const KVCache& cache = in.cache;
  auto segs = all_segments(cache);
  std::vector<double> desired;
  std::vector<int64_t> hi;
  for (auto [l, h] : segs) {
    desired.push_back(desired_for(l));
    hi.push_back(static_cast<int64_t>(cache.seg(l, h).size()));
  }
  auto x = apportion(desired, floor_counts(in.scores, segs), hi, uniform_total(cache, in.target, segs));
  KeepCounts keep(cache.n_layer(), std::vector<int>(cache.n_head_kv()));
  for (size_t i = 0; i < segs.size(); ++i) keep[segs[i].first][segs[i].second] = static_cast<int>(x[i]);
  return keep;
}

}  // namespace kvslim::budget
