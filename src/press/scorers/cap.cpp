// CAPKV (kvpress's CapPress): an entry's score is its query relevance times its leverage in the
// value space the relevance weights span. "CAP: capacity-aware KV cache pruning", arXiv 2604.25975;
// reference: kvpress/presses/cap_press.py (CapPress). Per query head g of a KV head, over the
// segment's entries j after the first n_sink:
//   anchor a   = R mean(q) over every context query after the first n_sink tokens (pre-RoPE, W_q
//                applied to each layer's attention input as the forward pass computes it), R the RoPE
//                rotation averaged over the n_future positions after the tokens seen (as Expected
//                Attention: kvpress q_len .. q_len + n_future - 1);
//   weight w_j = exp(tau (c_j - max_j c_j)),  c_j = clamp(a / |a| . k_j / |k_j|, -1, 1)  (keys with RoPE);
//   A          = I + sum_j (w_j + epsilon) v_j v_j^T  (head_dim x head_dim; values are the "capacity
//                vectors", u_j = v_j as kvpress approximates them);
//   score_j    = w_j v_j^T A^-1 v_j,
// then the mean over the GQA group. The first n_sink entries are chosen first (kvpress pads them
// with the layer's largest score + 1: in the budget); `protect=1` never evicts them. Computed in
// float64 (A by Cholesky); kvpress solves in float32. Shapes: keys/values [n][head_dim] per
// segment; the query sums are [layer][query head][head_dim], accumulated over all prefill chunks.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "press/authoring.h"
#include "model/rope.h"

namespace kvslim {
namespace {

class CapPress : public ScorerPress, private LayerHook {
 public:
  CapPress(double ratio, double tau, int n_future, int n_sink, double eps, bool protect)
      : ScorerPress(ratio), tau_(tau), n_future_(n_future), n_sink_(n_sink), eps_(eps), protect_(protect) {}
  std::string describe_scorer() const override {
    return fmt::format("cap:ratio={},tau={},n_future={},n_sink={},epsilon={},protect={}", ratio_, tau_, n_future_,
                       n_sink_, eps_, protect_ ? 1 : 0);
  }
  ObservationNeeds scorer_needs() const override {
    ObservationNeeds r;
    r.hooks.push_back(const_cast<CapPress*>(this));  // sums the pre-RoPE queries of every context token
    return r;
  }
  void reset() override {
    ScorerPress::reset();
    sum_.clear();
    count_ = 0;
  }
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override {
    const HParams& hp = view.hp();
    const int hd = hp.head_dim, half = hd / 2, G = hp.n_group(), l = view.layer();
    const auto inv_freq = rope::inv_freq(view.model());
    const int32_t next = cache_next_position(view.cache());
    std::vector<double> cbar(half, 0.0), sbar(half, 0.0);
    for (int i = 0; i < half; ++i) {
      for (int t = 0; t < n_future_; ++t) {
        const double th = (double(next) + t) * inv_freq[i];
        cbar[i] += std::cos(th);
        sbar[i] += std::sin(th);
      }
      cbar[i] /= n_future_;
      sbar[i] /= n_future_;
    }
    for (int h = 0; h < hp.n_head_kv; ++h) {
      const Segment& s = view.seg(h);
      const size_t n = s.size(), ns = std::min<size_t>(n, static_cast<size_t>(n_sink_));
      out[h].assign(n, 0.0f);
      for (size_t j = 0; j < ns; ++j) out[h][j] = keep_first_score(protect_);
      if (n == ns) continue;
      if (count_ == 0 || l >= static_cast<int>(sum_.size()))
        throw Error("press cap: no context queries after the sinks were recorded (the press needs the prefill)");
      const size_t m = n - ns;
      std::vector<float> kf(m * hd), vf(m * hd);
      s.keys(ns, n, kf.data());
      for (size_t j = 0; j < m; ++j) s.value(ns + j, vf.data() + j * hd);
      std::vector<double> knorm(m);
      for (size_t j = 0; j < m; ++j) {
        double ss = 0;
        for (int d = 0; d < hd; ++d) ss += double(kf[j * hd + d]) * kf[j * hd + d];
        knorm[j] = std::max(std::sqrt(ss), 1e-12);
      }
      std::vector<double> mean(m, 0.0), c(m), w(m), A(static_cast<size_t>(hd) * hd), x(hd);
      for (int g = 0; g < G; ++g) {
        // Anchor: the averaged future rotation applied to the mean pre-RoPE query, normalised.
        std::vector<double> a(sum_[l].begin() + static_cast<size_t>(h * G + g) * hd,
                              sum_[l].begin() + static_cast<size_t>(h * G + g + 1) * hd);
        for (int i = 0; i < half; ++i) {
          int p, q;
          rope::pair(hp.rope_neox, hd, i, p, q);
          const double x0 = a[p] / count_, x1 = a[q] / count_;
          a[p] = cbar[i] * x0 - sbar[i] * x1;
          a[q] = sbar[i] * x0 + cbar[i] * x1;
        }
        double an = 0;
        for (double v : a) an += v * v;
        an = std::max(std::sqrt(an), 1e-12);
        double cmax = -INFINITY;
        for (size_t j = 0; j < m; ++j) {
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += a[d] * kf[j * hd + d];
          c[j] = std::clamp(dot / an / knorm[j], -1.0, 1.0);
          cmax = std::max(cmax, c[j]);
        }
        std::fill(A.begin(), A.end(), 0.0);
        for (int d = 0; d < hd; ++d) A[d * hd + d] = 1.0;
        for (size_t j = 0; j < m; ++j) {
          w[j] = std::exp(tau_ * (c[j] - cmax));
          const double sw = w[j] + eps_;
          const float* v = vf.data() + j * hd;
          for (int r = 0; r < hd; ++r)
            for (int k = 0; k <= r; ++k) A[r * hd + k] += sw * v[r] * v[k];
        }
        // Cholesky A = L L^T in the lower triangle (A is I + a positive semi-definite sum).
        for (int r = 0; r < hd; ++r) {
          for (int k = 0; k < r; ++k) {
            double sacc = A[r * hd + k];
            for (int t = 0; t < k; ++t) sacc -= A[r * hd + t] * A[k * hd + t];
            A[r * hd + k] = sacc / A[k * hd + k];
          }
          double dg = A[r * hd + r];
          for (int t = 0; t < r; ++t) dg -= A[r * hd + t] * A[r * hd + t];
          A[r * hd + r] = std::sqrt(std::max(dg, 1e-300));
        }
        // v^T A^-1 v = |L^-1 v|^2 (forward substitution).
        for (size_t j = 0; j < m; ++j) {
          const float* v = vf.data() + j * hd;
          double lev = 0;
          for (int r = 0; r < hd; ++r) {
            double sacc = v[r];
            for (int t = 0; t < r; ++t) sacc -= A[r * hd + t] * x[t];
            x[r] = sacc / A[r * hd + r];
            lev += x[r] * x[r];
          }
          mean[j] += w[j] * lev / G;
        }
      }
      for (size_t j = 0; j < m; ++j) out[h][ns + j] = static_cast<float>(mean[j]);
    }
  }

 private:
  /// Adds the pre-RoPE queries q [n][n_head][head_dim] of a batch's tokens at positions >= n_sink
  /// to layer s.layer's sums (layers are called in order, from one thread).
  void after_qkv(const LayerStep& s) override {
    const int nh = s.hp->n_head, hd = s.hp->head_dim;
    if (static_cast<int>(sum_.size()) <= s.layer) sum_.resize(s.layer + 1);
    std::vector<double>& acc = sum_[s.layer];
    if (acc.empty()) acc.assign(static_cast<size_t>(nh) * hd, 0.0);
    int rows = 0;
    for (int t = 0; t < s.n; ++t) {
      if (s.positions[t] < n_sink_) continue;
      ++rows;
      const float* q = s.q + static_cast<size_t>(t) * nh * hd;
      for (size_t i = 0; i < acc.size(); ++i) acc[i] += q[i];
    }
    if (s.layer == 0) count_ += rows;  // every layer sees the same tokens
  }
  double tau_;
  int n_future_, n_sink_;
  double eps_;
  bool protect_;
  std::vector<std::vector<double>> sum_;  // [layer][query head * head_dim]
  double count_ = 0;
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "cap";
  i.kvpress = {"CapPress"};
  i.summary = "query relevance exp(tau cos(anchor, key)) x value leverage v^T (I + sum w v v^T)^-1 v (CAPKV)";
  i.source = "CAPKV, arXiv 2604.25975; reference: kvpress/presses/cap_press.py (CapPress)";
  i.params = {{"ratio", "0"},
              {"tau", "5", {}, {.type = ParamType::Float, .help = "the temperature of the query relevance"}},
              {"n_future", "512", "n_future_positions",
               {.help = "the future positions whose RoPE rotations the anchor query is averaged over"}},
              {"n_sink", "4", {}, {.help = "the first entries, chosen first"}},
              {"epsilon", "1e-06", {}, {.help = "added to every relevance weight in the value leverage"}},
              {"protect", "0", {}, kKvslimOnly}};
  i.make = [](const PressParams& p) -> std::unique_ptr<PressImpl> {
    const char* n = "cap";
    const int f = param_int(p, n, "n_future"), s = param_int(p, n, "n_sink");
    const double eps = param_double(p, n, "epsilon"), tau = param_double(p, n, "tau");
    if (f < 1) throw Error(fmt::format("press cap: n_future={} must be >= 1", f));
    if (s < 0) throw Error(fmt::format("press cap: n_sink={} must be >= 0", s));
    if (!(eps >= 0)) throw Error(fmt::format("press cap: epsilon={} must be >= 0", eps));
    if (!std::isfinite(tau)) throw Error(fmt::format("press cap: tau={} must be finite", tau));
    return std::make_unique<CapPress>(param_double(p, n, "ratio"), tau, f, s, eps, param_bool(p, n, "protect"));
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
