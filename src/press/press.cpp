// Shared machinery of presses: the layer view, the compress step, selection, the uniform budget
// and the score-based press.
#include "kvslim/press.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include <fmt/format.h>

#include "kernels/attention.h"
#include "kernels/threads.h"

namespace kvslim {

LayerView::LayerView(const Model& model, const KVCache& cache, const Observation& obs, int layer, Target target)
    : model_(model), cache_(cache), obs_(obs), layer_(layer), target_(target) {}

const float* LayerView::window_queries(int qh) const {
  if (obs_.queries.size() <= static_cast<size_t>(layer_) || obs_.queries[layer_].empty()) return nullptr;
  return obs_.queries[layer_].data() + static_cast<size_t>(qh) * n_window() * hp().head_dim;
}

namespace {
constexpr size_t kKB = 16;  // entries per key block of keys_t
}  // namespace

const std::vector<float>& LayerView::keys_t(int h) const {
  auto it = kt_.find(h);
  if (it != kt_.end()) return it->second;
  const Segment& s = seg(h);
  const size_t n = s.size(), nb = (n + kKB - 1) / kKB;
  const int hd = hp().head_dim;
  std::vector<float> keys(n * hd), kt(nb * kKB * hd, 0.0f);
  s.keys(0, n, keys.data());
  for (size_t j = 0; j < n; ++j)
    for (int d = 0; d < hd; ++d) kt[((j / kKB) * hd + d) * kKB + j % kKB] = keys[j * hd + d];
  return kt_.emplace(h, std::move(kt)).first->second;
}

namespace {

// 16 floats / int32s as one value: GCC keeps them in vector registers (one zmm, two ymm or four
// xmm depending on the clone below), which plain arrays at -O2 are not.
typedef float vf16 __attribute__((vector_size(64)));
typedef int32_t vi16 __attribute__((vector_size(64)));
static_assert(kKB == 16, "key blocks hold one vf16");

// Internal helpers are always inlined into the clones below, so no vector value crosses a call
// and the psABI note about 64-byte vector arguments does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
__attribute__((always_inline)) inline vf16 load16(const float* p) {
  vf16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

/// out[r][j] = sum_d q[r][d] * key_j[d] for r < rb, j < n, with keys in blocks of 16 entries,
/// [block][head_dim][16] (keys_t): a block is contiguous and stays in L1 while four rows at a
/// time use it, with four independent accumulators (SIMD chosen at run time).
__attribute__((target_clones("avx512f", "avx2", "default"))) void logits_block(const float* __restrict q, int rb,
                                                                                const float* __restrict kt, size_t n,
                                                                                int hd, float* __restrict out) {
  for (size_t j = 0; j < n; j += kKB) {
    const float* kb = kt + (j / kKB) * hd * kKB;
    const size_t m = std::min(kKB, n - j);
    int r0 = 0;
    for (; r0 + 4 <= rb; r0 += 4) {
      const float *q0 = q + static_cast<size_t>(r0) * hd, *q1 = q0 + hd, *q2 = q1 + hd, *q3 = q2 + hd;
      vf16 a0 = {}, a1 = {}, a2 = {}, a3 = {};
      for (int d = 0; d < hd; ++d) {
        const vf16 k = load16(kb + static_cast<size_t>(d) * kKB);
        a0 += q0[d] * k;
        a1 += q1[d] * k;
        a2 += q2[d] * k;
        a3 += q3[d] * k;
      }
      float* o = out + static_cast<size_t>(r0) * n + j;
      std::memcpy(o, &a0, m * sizeof(float));
      std::memcpy(o + n, &a1, m * sizeof(float));
      std::memcpy(o + 2 * n, &a2, m * sizeof(float));
      std::memcpy(o + 3 * n, &a3, m * sizeof(float));
    }
    for (; r0 < rb; ++r0) {
      const float* q0 = q + static_cast<size_t>(r0) * hd;
      vf16 a0 = {};
      for (int d = 0; d < hd; ++d) a0 += q0[d] * load16(kb + static_cast<size_t>(d) * kKB);
      std::memcpy(out + static_cast<size_t>(r0) * n + j, &a0, m * sizeof(float));
    }
  }
}

/// 2^y for y <= 0 (clamped at -126), 16 at a time: 2^floor(y) from the exponent bits times a
/// degree-7 polynomial for 2^frac (relative error < 2e-6).
__attribute__((always_inline)) inline vf16 exp2_nonpos(vf16 y) {
  constexpr float c1 = 0.693147180559945f, c2 = 0.240226506959101f, c3 = 0.0555041086648216f,
                  c4 = 0.00961812910762848f, c5 = 0.00133335581464284f, c6 = 0.000154035303933816f,
                  c7 = 1.52527338040598e-05f;  // ln2^k / k!
  const vf16 lo = y - y - 126.0f;
  y = y < lo ? lo : y;
  vi16 ki = __builtin_convertvector(y, vi16);  // truncates toward zero
  vf16 k = __builtin_convertvector(ki, vf16);
  const vi16 above = k > y;  // -1 where truncation rounded up
  ki += above;
  k += __builtin_convertvector(above, vf16);
  const vf16 f = y - k;
  const vf16 p = 1.0f + f * (c1 + f * (c2 + f * (c3 + f * (c4 + f * (c5 + f * (c6 + f * c7))))));
  vf16 two_k;
  const vi16 bits = (ki + 127) << 23;
  std::memcpy(&two_k, &bits, sizeof two_k);
  return p * two_k;
}

/// x[0, n) <- softmax(x[0, n)), 16 values at a time (SIMD chosen at run time).
__attribute__((target_clones("avx512f", "avx2", "default"))) void softmax_inplace(float* __restrict x, size_t n) {
  if (n == 0) return;
  constexpr size_t kL = 16;
  constexpr float kLog2e = 1.44269504088896341f;
  const size_t nb = n / kL * kL;
  // The tail is padded with -inf (exp gives 0) so every step is a full vector.
  float tail[kL];
  for (size_t t = 0; t < kL; ++t) tail[t] = nb + t < n ? x[nb + t] : -INFINITY;
  vf16 vm = load16(tail);
  for (size_t j = 0; j < nb; j += kL) {
    const vf16 v = load16(x + j);
    vm = v > vm ? v : vm;
  }
  float mx = vm[0];
  for (size_t t = 1; t < kL; ++t) mx = std::max(mx, vm[t]);
  vf16 vs = {};
  for (size_t j = 0; j < nb; j += kL) {
    const vf16 e = exp2_nonpos((load16(x + j) - mx) * kLog2e);
    std::memcpy(x + j, &e, sizeof e);
    vs += e;
  }
  const vf16 et = exp2_nonpos((load16(tail) - mx) * kLog2e);
  float sum = 0;
  for (size_t t = 0; t < kL; ++t) sum += vs[t] + (nb + t < n ? et[t] : 0.0f);
  const float inv = 1.0f / sum;
  for (size_t j = 0; j < nb; j += kL) {
    const vf16 v = load16(x + j) * inv;
    std::memcpy(x + j, &v, sizeof v);
  }
  for (size_t j = nb; j < n; ++j) x[j] = et[j - nb] * inv;
}

}  // namespace

void LayerView::attention_rows(int h, int g, int i0, int i1, float* out) const {
  // Only probabilities are needed (no weighted sum of values), and no BLAS: OpenBLAS's own
  // threads inside our parallel layers cost more than they save at these sizes. A window query
  // sees the entries whose position is at most its own; the rest of its row is zero.
  const Segment& s = seg(h);
  const size_t n = s.size();
  const int hd = hp().head_dim;
  const std::vector<float>& kt = keys_t(h);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> q(static_cast<size_t>(i1 - i0) * hd);
  const float* wq = window_queries(h * hp().n_group() + g);
  for (size_t k = 0; k < q.size(); ++k) q[k] = wq[static_cast<size_t>(i0) * hd + k] * scale;
  logits_block(q.data(), i1 - i0, kt.data(), n, hd, out);
  for (int i = i0; i < i1; ++i) {
    float* row = out + static_cast<size_t>(i - i0) * n;
    const size_t vis = std::upper_bound(s.positions().begin(), s.positions().end(), obs_.window_positions[i]) -
                       s.positions().begin();
    softmax_inplace(row, vis);
    std::fill(row + vis, row + n, 0.0f);
  }
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

int32_t cache_next_position(const KVCache& cache) {
  int32_t p = 0;
  for (int l = 0; l < cache.n_layer(); ++l)
    for (int h = 0; h < cache.n_head_kv(); ++h) {
      const auto& pos = cache.seg(l, h).positions();
      if (!pos.empty()) p = std::max(p, pos.back() + 1);  // positions increase within a segment
    }
  return p;
}

void Press::compress(KVCache& cache, const Model& model, const Observation& obs) {
  Target t{ratio(), static_cast<size_t>(cache_next_position(cache))};
  observe(cache, model, obs);
  apply(cache, model, obs, t);
}

void Press::set_ratio(double) { throw Error(fmt::format("press {} has no compression ratio to set", describe())); }

size_t Press::kept_after(const Target& t) const {
  return ratio() > 0 ? static_cast<size_t>(uniform_keep(t.n_context, ratio())) : t.n_context;
}

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
      keep[l][h] = std::min<int>(uniform_keep(in.target.n_for(s), in.target.ratio), static_cast<int>(s.size()));
    }
  return keep;
}

int count_protected(const std::vector<float>& scores) {
  int n = 0;
  for (float s : scores) n += s >= kProtected;
  return n;
}

std::vector<int32_t> select_top(const std::vector<float>& scores, int keep) {
  const int n = static_cast<int>(scores.size());
  keep = std::clamp(std::max(keep, count_protected(scores)), 0, n);
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  if (keep < n) {
    // Highest score first; among equal scores the later entry wins (recency), so the result is
    // deterministic.
    std::nth_element(idx.begin(), idx.begin() + keep, idx.end(), [&](int32_t a, int32_t b) {
      float sa = std::isnan(scores[a]) ? -INFINITY : scores[a], sb = std::isnan(scores[b]) ? -INFINITY : scores[b];
      return sa != sb ? sa > sb : a > b;
    });
    idx.resize(keep);
    std::sort(idx.begin(), idx.end());
  }
  return idx;
}

ScorerPress::ScorerPress(double ratio, std::unique_ptr<BudgetPolicy> policy)
    : ratio_(ratio), policy_(policy ? std::move(policy) : std::make_unique<UniformBudget>()) {}

void ScorerPress::set_policy(std::unique_ptr<BudgetPolicy> p) {
  policy_ = p ? std::move(p) : std::make_unique<UniformBudget>();
  policy_->set_scorer_needs(scorer_needs());
}

void ScorerPress::set_ratio(double r) {
  check_ratio(r, describe_scorer());
  ratio_ = r;
}

std::string ScorerPress::describe() const {
  std::string pol = policy_->describe();
  if (pol == "uniform") return describe_scorer();
  // "adakv:alpha=0.2" -> "adakv(<scorer>):alpha=0.2"
  auto c = pol.find(':');
  std::string name = pol.substr(0, c), rest = c == std::string::npos ? "" : pol.substr(c);
  return name + "(" + describe_scorer() + ")" + rest;
}

ObservationNeeds ScorerPress::needs() const { return merge_needs(scorer_needs(), policy_->needs()); }

ObservationNeeds ScorerPress::decode_needs() const {
  return policy_->decode_interval() > 0 ? needs() : ObservationNeeds{};
}

size_t ScorerPress::kept_after(const Target& t) const {
  return policy_->uses_ratio() ? static_cast<size_t>(uniform_keep(t.n_context, t.ratio)) : t.n_context;
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

void ScorerPress::apply(KVCache& cache, const Model& model, const Observation& obs, const Target& target) {
  if (policy_->uses_ratio() && target.ratio <= 0.0) return;  // ratio 0 leaves the cache bit-identical
  const int L = cache.n_layer(), H = cache.n_head_kv();
  std::vector<double> stat;
  Scores scores = score_all(cache, model, obs, target, &stat);
  policy_->prepare(scores, cache, target);
  KeepCounts keep = policy_->keep_counts(BudgetInput{scores, cache, target, std::move(stat)});
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
