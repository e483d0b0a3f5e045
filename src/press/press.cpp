// Shared machinery of presses: the layer view, the compress step, selection, the uniform budget
// and the score-based press.
#include "press/authoring.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include <fmt/format.h>

#include "attention/window_attention.h"
#include "press/ranking.h"
#include "kernels/threads.h"

namespace kvslim {

LayerView::LayerView(const Model& model, const KVCache& cache, const Observation& obs, int layer, Target target)
    : model_(model), cache_(cache), obs_(obs), layer_(layer), target_(target) {}

const float* LayerView::window_queries(int qh) const {
  if (obs_.queries.size() <= static_cast<size_t>(layer_) || obs_.queries[layer_].empty()) return nullptr;
  return obs_.queries[layer_].data() + static_cast<size_t>(qh) * n_window() * hp().head_dim;
}

const std::vector<float>& LayerView::keys_t(int h) const {
  auto it = kt_.find(h);
  if (it != kt_.end()) return it->second;
  return kt_.emplace(h, keys_blocked(seg(h))).first->second;
}

void LayerView::attention_rows(int h, int g, int i0, int i1, float* out) const {
  // Only probabilities are needed (no weighted sum of values): the kernel materialises them. A
  // window query sees the entries whose position is at most its own; the rest of its row is zero.
  const Segment& s = seg(h);
  const int hd = hp().head_dim;
  std::vector<size_t> vis(i1 - i0);
  for (int i = i0; i < i1; ++i)
    vis[i - i0] = std::upper_bound(s.positions().begin(), s.positions().end(), obs_.window_positions[i]) -
                  s.positions().begin();
  const float* wq = window_queries(h * hp().n_group() + g) + static_cast<size_t>(i0) * hd;
  window_probabilities(wq, i1 - i0, 1.0f / std::sqrt(static_cast<float>(hd)), keys_t(h).data(), s.size(), hd,
                       vis.data(), out);
}

const std::vector<float>& LayerView::window_attention(int h) const {
  auto it = attn_.find(h);
  if (it != attn_.end()) return it->second;
  const int G = hp().n_group(), w = n_window();
  const size_t n = seg(h).size();
  std::vector<float> probs(static_cast<size_t>(G) * w * n);
  if (n > 0 && w > 0 && window_queries(0))
    for (int g = 0; g < G; ++g) attention_rows(h, g, 0, w, probs.data() + static_cast<size_t>(g) * w * n);
  return attn_.emplace(h, std::move(probs)).first->second;
}

const std::vector<float>& LayerView::window_mass(int h, int rows) const {
  const int G = hp().n_group(), w = n_window();
  rows = std::clamp(rows, 0, w);
  auto key = std::make_pair(h, rows);
  auto it = mass_.find(key);
  if (it != mass_.end()) return it->second;
  const size_t n = seg(h).size();
  std::vector<float> mass(static_cast<size_t>(G) * n, 0.0f);
  constexpr int kRB = 16;  // rows per block: bounds the buffer for long segments
  std::vector<float> buf(static_cast<size_t>(std::min(rows, kRB)) * n);
  if (n > 0 && window_queries(0))
    for (int g = 0; g < G; ++g) {
      float* m = mass.data() + static_cast<size_t>(g) * n;
      for (int i0 = w - rows; i0 < w; i0 += kRB) {
        const int i1 = std::min(w, i0 + kRB);
        attention_rows(h, g, i0, i1, buf.data());
        for (int r = 0; r < i1 - i0; ++r) {
          const float* row = buf.data() + static_cast<size_t>(r) * n;
          for (size_t j = 0; j < n; ++j) m[j] += row[j];
        }
      }
    }
  return mass_.emplace(key, std::move(mass)).first->second;
}

int uniform_keep(size_t n, double ratio) {
  if (n == 0) return 0;
  double k = std::floor(static_cast<double>(n) * (1.0 - ratio) + 1e-9);
  return static_cast<int>(std::clamp<double>(k, 1.0, static_cast<double>(n)));
}

int Target::keep(size_t n) const {
  if (budget == 0) return uniform_keep(n, ratio);
  return n == 0 ? 0 : static_cast<int>(std::min(n, budget));
}

int32_t cache_next_position(const KVCache& cache) { return cache.next_position(); }

void PressImpl::compress(KVCache& cache, const Model& model, const Observation& obs) {
  Target t{ratio(), static_cast<size_t>(cache_next_position(cache))};
  observe(cache, model, obs);
  apply(cache, model, obs, t);
}

ObservationNeeds PressImpl::needs() const { return {}; }
ObservationNeeds PressImpl::decode_needs() const { return {}; }

std::string PressImpl::storage_refusal() const {
  if (evicts_in_decode())
    return "it evicts entries during decode with state kept from the prefill (accumulated scores or a decode "
           "window), which a stored context does not carry";
  if (selects_in_decode())
    return "it chooses the entries attention reads at every decode step from state built during the prefill, which "
           "a stored context does not carry";
  if (decode_needs().any())
    return "it observes every decode step (its scores or hooks run during decode), with state a stored context does "
           "not carry";
  return {};
}

void PressImpl::set_ratio(double) { throw Error(fmt::format("press {} has no compression ratio to set", describe())); }

size_t PressImpl::kept_after(const Target& t) const {
  return ratio() > 0 ? static_cast<size_t>(uniform_keep(t.n_context, ratio())) : t.n_context;
}

size_t PressImpl::kept_of(size_t n) const { return kept_after(Target{ratio(), n}); }

ObservationNeeds merge_needs(const ObservationNeeds& a, const ObservationNeeds& b) {
  ObservationNeeds r = a;
  r.window = std::max(a.window, b.window);
  r.hidden_states = a.hidden_states || b.hidden_states;
  r.attention_mass = a.attention_mass || b.attention_mass;
  r.tokens = a.tokens || b.tokens;
  // Every hook of both survives (a composition of two presses with query hooks calls both).
  for (LayerHook* h : b.hooks)
    if (std::find(r.hooks.begin(), r.hooks.end(), h) == r.hooks.end()) r.hooks.push_back(h);
  return r;
}

KeepCounts UniformBudget::keep_counts(const BudgetInput& in) const {
  const KVCache& cache = in.cache;
  KeepCounts keep(cache.n_layer(), std::vector<int>(cache.n_head_kv()));
  for (int l = 0; l < cache.n_layer(); ++l)
    for (int h = 0; h < cache.n_head_kv(); ++h) {
      const Segment& s = cache.seg(l, h);
      keep[l][h] = std::min<int>(in.target.keep(in.target.n_for(s)), static_cast<int>(s.size()));
    }
  return keep;
}

int count_protected(const std::vector<float>& scores) {
  int n = 0;
  for (float s : scores) n += s >= kProtected;
  return n;
}

namespace {
/// The one ranking rule: higher score first; among equal scores the later entry first (recency),
/// so the order is total and deterministic; NaN ranks lowest.
struct RanksBefore {
  const std::vector<float>& s;
  bool operator()(int32_t a, int32_t b) const {
    const float sa = std::isnan(s[a]) ? -INFINITY : s[a], sb = std::isnan(s[b]) ? -INFINITY : s[b];
    return sa != sb ? sa > sb : a > b;
  }
};
}  // namespace

std::vector<int32_t> rank_entries(const std::vector<float>& scores) {
  std::vector<int32_t> idx(scores.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), RanksBefore{scores});
  return idx;
}

std::vector<int32_t> select_top(const std::vector<float>& scores, int keep) {
  const int n = static_cast<int>(scores.size());
  keep = std::clamp(std::max(keep, count_protected(scores)), 0, n);
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  if (keep < n) {
    std::nth_element(idx.begin(), idx.begin() + keep, idx.end(), RanksBefore{scores});
    idx.resize(keep);
    std::sort(idx.begin(), idx.end());
  }
  return idx;
}

ScorerPress::ScorerPress(double ratio, std::unique_ptr<BudgetPolicy> policy)
    : ratio_(ratio), policy_(policy ? std::move(policy) : std::make_unique<UniformBudget>()) {}

void ScorerPress::set_policy(std::unique_ptr<BudgetPolicy> p) {
  const size_t budget = policy_ ? policy_->budget() : 0;
  policy_ = p ? std::move(p) : std::make_unique<UniformBudget>();
  if (budget > 0 && policy_->budget() == 0) policy_->set_budget(budget);
  policy_->set_scorer_needs(scorer_needs());
}

void ScorerPress::set_ratio(double r) {
  check_ratio(r, describe_scorer());
  ratio_ = r;
}

std::string ScorerPress::describe() const {
  std::string pol = policy_->describe();
  if (pol == "uniform") return describe_with_budget();
  // "adakv:alpha=0.2" -> "adakv(<scorer>):alpha=0.2"
  auto c = pol.find(':');
  std::string name = pol.substr(0, c), rest = c == std::string::npos ? "" : pol.substr(c);
  if (policy_->budget()) rest += fmt::format("{}budget={}", rest.empty() ? ":" : ",", policy_->budget());
  return name + "(" + describe_scorer() + ")" + rest;
}

std::string ScorerPress::describe_with_budget() const {
  const std::string s = describe_scorer();
  if (!policy_->budget()) return s;
  return fmt::format("{}{}budget={}", s, s.find(':') == std::string::npos ? ":" : ",", policy_->budget());
}

ObservationNeeds ScorerPress::needs() const { return merge_needs(scorer_needs(), policy_->needs()); }

ObservationNeeds ScorerPress::decode_needs() const {
  return policy_->decode_interval() > 0 ? needs() : ObservationNeeds{};
}

size_t ScorerPress::kept_after(const Target& t) const {
  const size_t n = policy_->uses_ratio() ? static_cast<size_t>(budgeted(t).keep(t.n_context)) : t.n_context;
  return policy_->budget() ? std::min(n, policy_->budget()) : n;
}

Target ScorerPress::budgeted(Target t) const {
  t.budget = policy_->budget();
  // Code that sizes by the ratio (PyramidKV's schedule, chunk selection, global top-k) sees the
  // ratio that keeps N of the context: the same count, as a share.
  if (t.budget > 0 && t.n_context > 0)
    t.ratio = 1.0 - static_cast<double>(std::min(t.n_context, t.budget)) / static_cast<double>(t.n_context);
  return t;
}

Scores ScorerPress::score_all(const KVCache& cache, const Model& model, const Observation& obs, const Target& target,
                              std::vector<double>* layer_stat) const {
  const int L = cache.n_layer(), H = cache.n_head_kv();
  Scores scores(L);
  const bool inspect = layer_stat && policy_->wants_inspect();
  if (layer_stat) layer_stat->assign(L, 0.0);
  parallel_for(L, [&](int64_t b, int64_t e) {
    for (int64_t l = b; l < e; ++l) {
      LayerView view(model, cache, obs, static_cast<int>(l), target);
      scores[l].assign(H, {});
      score(view, scores[l]);
      for (int h = 0; h < H; ++h)
        if (scores[l][h].size() != cache.seg(l, h).size())
          throw Error(fmt::format("press {} produced {} scores for {} entries (layer {}, KV head {})", describe(),
                                  scores[l][h].size(), cache.seg(l, h).size(), l, h));
      // The policy reuses the window attention the scorer already computed.
      if (inspect) (*layer_stat)[l] = policy_->inspect(view);
    }
  });
  return scores;
}

void ScorerPress::apply(KVCache& cache, const Model& model, const Observation& obs, const Target& asked) {
  const Target target = budgeted(asked);
  // Ratio 0 leaves the cache bit-identical; so does a budget no segment exceeds (a policy that
  // keeps by its own parameters still runs: the budget only caps it).
  if (policy_->uses_ratio() && target.budget == 0 && target.ratio <= 0.0) return;
  const int L = cache.n_layer(), H = cache.n_head_kv();
  if (target.budget > 0 && policy_->uses_ratio()) {
    bool over = false;
    for (int l = 0; l < L && !over; ++l)
      for (int h = 0; h < H && !over; ++h) over = cache.seg(l, h).size() > target.budget;
    if (!over) return;
  }
  std::vector<double> stat;
  Scores scores = score_all(cache, model, obs, target, &stat);
  policy_->prepare(scores, cache, target);
  KeepCounts keep = policy_->keep_counts(BudgetInput{scores, cache, target, std::move(stat)});
  // A policy that keeps by its own parameters is capped by the budget (protected entries stay).
  if (target.budget > 0 && !policy_->uses_ratio())
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h)
        keep[l][h] = std::min(keep[l][h], std::max(static_cast<int>(target.budget), count_protected(scores[l][h])));
  parallel_for(static_cast<int64_t>(L) * H, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      int l = static_cast<int>(i / H), h = static_cast<int>(i % H);
      Segment& s = cache.seg(l, h);
      if (keep[l][h] >= static_cast<int>(s.size())) continue;
      s.retain(select_top(scores[l][h], keep[l][h]));
    }
  });
}

void ScorerPress::after_decode(KVCache& cache, const Model& model, const Observation& obs) {
  const int every = policy_->decode_interval();
  if (every <= 0) return;
  observe(cache, model, obs);
  if (++decode_steps_ % every != 0) return;
  apply(cache, model, obs, Target{ratio(), static_cast<size_t>(cache_next_position(cache))});
}

}  // namespace kvslim
