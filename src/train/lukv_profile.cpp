// LU-KV's offline profiling: utility curves per head from the attention a document's future
// gives its context, and the allocation over their concave envelopes (train/lukv_profile.h).
#include "train/lukv_profile.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>

#include <fmt/format.h>

#include "model/session.h"
#include "press/authoring.h"
#include "press/recorders.h"

namespace kvslim {

std::vector<double> lukv_allocate(const std::vector<std::vector<double>>& u, int steps, double budget) {
  struct Seg {
    double slope;
    int head, len;
  };
  std::vector<Seg> segs;
  for (int h = 0; h < static_cast<int>(u.size()); ++h) {
    if (static_cast<int>(u[h].size()) != steps + 1)
      throw Error(fmt::format("lukv allocation: head {} has {} utility points, expected {}", h, u[h].size(), steps + 1));
    // Upper concave envelope of (s, u[s]) (monotone chain).
    std::vector<int> hull;
    for (int s = 0; s <= steps; ++s) {
      while (hull.size() >= 2) {
        const int a = hull[hull.size() - 2], b = hull.back();
        // b lies on or under the chord a -> s: drop it.
        if ((u[h][b] - u[h][a]) * (s - a) <= (u[h][s] - u[h][a]) * (b - a)) hull.pop_back();
        else break;
      }
      hull.push_back(s);
    }
    for (size_t i = 1; i < hull.size(); ++i)
      segs.push_back({(u[h][hull[i]] - u[h][hull[i - 1]]) / (hull[i] - hull[i - 1]), h, hull[i] - hull[i - 1]});
  }
  std::stable_sort(segs.begin(), segs.end(), [](const Seg& a, const Seg& b) { return a.slope > b.slope; });
  std::vector<double> parts(u.size(), 0.0);
  double left = std::max(0.0, budget);
  for (const Seg& s : segs) {
    if (left <= 0) break;
    const double take = std::min<double>(s.len, left);
    parts[s.head] += take;
    left -= take;
  }
  for (double& p : parts) p /= steps;
  return parts;
}

LUKVCurve lukv_profile(const Model& model, const std::vector<std::vector<Token>>& docs, const std::string& scorer_spec,
                       double context_fraction, const std::function<void(size_t, size_t)>& progress) {
  const HParams& hp = model.hparams();
  const int L = hp.n_layer, H = hp.n_head_kv, G = std::max(1, hp.n_head / std::max(1, hp.n_head_kv));
  constexpr int kSteps = 100;
  if (!(context_fraction > 0 && context_fraction < 1))
    throw Error(fmt::format("lukv profile: context fraction {} must be in (0, 1)", context_fraction));
  std::unique_ptr<PressImpl> p = make_press_impl(scorer_spec, 0.0);
  auto* scorer = p->scorer();
  if (!scorer) throw Error(fmt::format("lukv profile: '{}' is not a scorer press", scorer_spec));
  std::vector<std::vector<std::vector<double>>> u(L, std::vector<std::vector<double>>(H, std::vector<double>(kSteps + 1)));
  int used = 0;
  for (size_t di = 0; di < docs.size(); ++di) {
    const std::vector<Token>& doc = docs[di];
    const int n = static_cast<int>(doc.size() * context_fraction);
    const int nf = static_cast<int>(doc.size()) - n;
    if (n < 2 || nf < 1) continue;
    SessionOptions so;
    so.n_ctx = static_cast<int>(doc.size()) + 16;
    Session s(model, so);
    scorer->reset();
    Observation obs;
    run_observed(s, std::vector<Token>(doc.begin(), doc.begin() + n), scorer->needs(), obs);
    Target t;
    t.n_context = static_cast<size_t>(n);
    const Scores sc = scorer->score_all(s.cache(), model, obs, t);
    ObservationNeeds fut;
    fut.attention_mass = true;
    Observation fobs;
    run_observed(s, std::vector<Token>(doc.begin() + n, doc.end()), fut, fobs);
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        const std::vector<float>& mass = fobs.attention_mass.at(l).at(h);
        std::vector<int> order(n);
        std::iota(order.begin(), order.end(), 0);
        // The scorer's ranking: best first; NaN last; ties to the later entry (as select_top).
        auto key = [&](int i) { return std::isnan(sc[l][h][i]) ? -INFINITY : sc[l][h][i]; };
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
          return key(a) > key(b) || (key(a) == key(b) && a > b);
        });
        std::vector<double> cum(n + 1, 0.0);
        for (int i = 0; i < n; ++i) cum[i + 1] = cum[i] + mass[order[i]] / (double(nf) * G);
        for (int st = 0; st <= kSteps; ++st) u[l][h][st] += cum[static_cast<size_t>(std::floor(double(st) * n / kSteps))];
      }
    ++used;
    if (progress) progress(di + 1, docs.size());
  }
  if (!used) throw Error("lukv profile: no document long enough (a context of >= 2 tokens and a future)");
  std::vector<std::vector<double>> flat;
  for (auto& layer : u)
    for (auto& head : layer) {
      for (double& v : head) v /= used;
      flat.push_back(head);
    }
  LUKVCurve c;
  c.n_layer = L;
  c.n_head_kv = H;
  c.prune.resize(static_cast<size_t>(99) * L * H);
  for (int i = 0; i < 99; ++i) {
    const double r = (i + 1) / 100.0;
    const std::vector<double> keep = lukv_allocate(flat, kSteps, (1 - r) * kSteps * L * H);
    for (size_t j = 0; j < keep.size(); ++j) c.prune[static_cast<size_t>(i) * L * H + j] = static_cast<float>(1 - keep[j]);
  }
  return c;
}

}  // namespace kvslim
