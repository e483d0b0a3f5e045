// Expected Attention: scores an entry by the attention future queries are expected to pay it.
// Queries are modelled as Gaussian: mean mu and (population) covariance S of the pre-RoPE
// queries, then moved by the RoPE rotation averaged over the next `n_future` positions,
// R = mean_t R(p + t): mu' = R mu, S' = R S R^T. For a key k, E[exp(q.k / sqrt(d))] is
// proportional to exp(mu'.k / sqrt(d) + k^T S' k / (2 d)); a softmax of that over the segment's
// entries after the sinks, averaged over the GQA group, then times (score + epsilon) ||v||_2, is
// the score. Devoto, Jeblick, Jegou, "Expected Attention: KV Cache Compression by Estimating
// Attention from Future Queries Distribution", arXiv 2510.00636; reference: kvpress's
// ExpectedAttentionPress (kvpress/presses/expected_attention_press.py). As there, mu and S come
// from every context query after the first n_sink tokens (W_q applied to each layer's attention
// input as the forward pass computes it, summed in float64 over all prefill chunks, so no
// queries are stored), and the first n_sink entries are chosen first but count against the
// budget. kvslim options: `window=N` estimates from the last N queries only (un-rotated from
// their positions); `protect=1` never evicts the sinks. The rotation uses the model's own layout
// (llama pairs or neox halves) and frequencies (Llama 3 rope_freqs included).
// `stats=FILE` uses precomputed statistics instead (kvpress's ExpectedAttentionStatsPress, which
// loads them from the hub; `kvslim ea-stats` computes them on a text, see press/ea_stats.h):
// mean and unbiased covariance per (layer, query head) from the file, the same rotation and score.
#include <cblas.h>

#include <memory>

#include <cmath>

#include <fmt/format.h>

#include "attention/attention.h"
#include "kernels/threads.h"
#include "press/authoring.h"
#include "press/param_file.h"
#include "press/ea_stats.h"
#include "model/rope.h"

namespace kvslim {
namespace {

class ExpectedAttentionPress : public ScorerPress, private LayerHook {
 public:
  ExpectedAttentionPress(double ratio, int window, int n_future, int n_sink, bool cov, bool vnorm, double eps,
                         bool protect, std::string stats_path)
      : ScorerPress(ratio), window_(window), n_future_(n_future), n_sink_(n_sink), cov_(cov), vnorm_(vnorm),
        eps_(eps), protect_(protect), stats_path_(std::move(stats_path)) {
    if (!stats_path_.empty()) file_ = std::make_shared<QueryStatsFile>(QueryStatsFile::load(stats_path_));
  }
  std::string describe_scorer() const override {
    return fmt::format(
        "expected_attention:ratio={},window={},n_future={},n_sink={},covariance={},vnorm={},epsilon={},protect={}{}",
        ratio_, window_, n_future_, n_sink_, cov_ ? 1 : 0, vnorm_ ? 1 : 0, eps_, protect_ ? 1 : 0,
        stats_path_.empty() ? "" : ",stats=" + stats_path_);
  }
  ObservationNeeds scorer_needs() const override {
    ObservationNeeds r;
    if (file_) return r;
    if (window_ > 0) {
      r.window = window_;
      return r;
    }
    // The press itself, as the hook that accumulates the statistics of every query (before RoPE).
    r.hooks.push_back(const_cast<ExpectedAttentionPress*>(this));
    return r;
  }
  void reset() override {
    ScorerPress::reset();
    stats_.clear();
  }
  void apply(KVCache& cache, const Model& model, const Observation& obs, const Target& target) override {
    if (file_) file_->check(model.hparams(), "press expected_attention (" + stats_path_ + ")");
    if (!file_ && window_ == 0 && !stats_.empty() &&
        (static_cast<int>(stats_.size()) != model.hparams().n_layer || hd_ != model.hparams().head_dim))
      throw Error("press expected_attention: query statistics do not match the model");
    ScorerPress::apply(cache, model, obs, target);
  }
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override {
    const HParams& hp = view.hp();
    const int hd = hp.head_dim, half = hd / 2, G = hp.n_group(), nw = view.n_window();
    const auto inv_freq = rope::inv_freq(view.model());
    // Window rows used for the statistics (window=N): the newest N, leaving out sink positions.
    std::vector<int> rows;
    if (window_ > 0)
      for (int i = std::max(0, nw - window_); i < nw; ++i)
        if (view.obs().window_positions[i] >= n_sink_) rows.push_back(i);
    // The future positions follow the tokens seen so far (kvpress: q_len .. q_len + n_future - 1).
    const int32_t next = !file_ && window_ > 0 && nw > 0 ? view.obs().window_positions[nw - 1] + 1 : cache_next_position(view.cache());
    // Averaged rotation, one (cos, sin) pair per rotated pair.
    std::vector<double> cbar(half, 0.0), sbar(half, 0.0);
    for (int i = 0; i < half; ++i) {
      for (int t = 0; t < n_future_; ++t) {
        double th = (double(next) + t) * inv_freq[i];
        cbar[i] += std::cos(th);
        sbar[i] += std::sin(th);
      }
      cbar[i] /= n_future_;
      sbar[i] /= n_future_;
    }
    // The forward pass scales rotated queries by the RoPE magnitude (YaRN's; 1 otherwise): pre-RoPE
    // statistics get it with the rotation, and window queries (rotated already) lose it when undone.
    const double mag = rope::magnitude(hp);
    for (int i = 0; i < half; ++i) cbar[i] *= mag, sbar[i] *= mag;
    // Applies R to vector x (in place).
    auto rot = [&](double* x, int stride) {
      for (int i = 0; i < half; ++i) {
        int a, b;
        rope::pair(hp.rope_neox, hd, i, a, b);
        double x0 = x[a * stride], x1 = x[b * stride];
        x[a * stride] = cbar[i] * x0 - sbar[i] * x1;
        x[b * stride] = sbar[i] * x0 + cbar[i] * x1;
      }
    };
    const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(hd));
    for (int h = 0; h < hp.n_head_kv; ++h) {
      const Segment& s = view.seg(h);
      const size_t n = s.size();
      out[h].assign(n, 0.0f);
      const size_t ns = std::min<size_t>(n, static_cast<size_t>(n_sink_));
      for (size_t j = 0; j < ns; ++j) out[h][j] = keep_first_score(protect_);
      if (n == ns) continue;
      const size_t m = n - ns;
      std::vector<float> keys(m * hd);
      s.keys(ns, n, keys.data());
      std::vector<double> mean_score(m, 0.0);
      std::vector<float> covf(static_cast<size_t>(hd) * hd), muf(hd), t(hd);
      std::vector<double> z(m);
      for (int g = 0; g < G; ++g) {
        const int qh = h * G + g;
        // Statistics of the pre-RoPE queries (float64).
        std::vector<double> mu(hd, 0.0), cov(static_cast<size_t>(hd) * hd, 0.0);
        double N = 0;
        if (file_) {
          N = 1;  // the file holds the mean and the (N - 1) covariance already
          const float* fm = file_->mean_at(view.layer(), qh);
          const float* fc = file_->cov_at(view.layer(), qh);
          for (int d = 0; d < hd; ++d) mu[d] = fm[d];
          if (cov_)
            for (size_t i = 0; i < cov.size(); ++i) cov[i] = fc[i];
        } else if (window_ > 0) {
          std::vector<std::vector<double>> qs;
          const float* wq = view.window_queries(qh);
          for (int i : rows) {
            std::vector<double> q(wq + static_cast<size_t>(i) * hd, wq + static_cast<size_t>(i + 1) * hd);
            rope::rotate(q.data(), hd, hp.rope_neox, inv_freq, -double(view.obs().window_positions[i]));
            if (mag != 1.0)
              for (double& v : q) v /= mag;
            for (int d = 0; d < hd; ++d) mu[d] += q[d];
            qs.push_back(std::move(q));
          }
          N = static_cast<double>(qs.size());
          if (N > 0)
            for (double& v : mu) v /= N;
          if (cov_ && N > 0)
            for (const auto& q : qs)
              for (int a = 0; a < hd; ++a)
                for (int b = 0; b < hd; ++b) cov[a * hd + b] += (q[a] - mu[a]) * (q[b] - mu[b]);
        } else if (view.layer() < static_cast<int>(stats_.size()) && !stats_[view.layer()].empty()) {
          const QueryStats& st = stats_[view.layer()][qh];
          N = st.count;
          if (N > 0) {
            for (int d = 0; d < hd; ++d) mu[d] = st.sum[d] / N;
            if (cov_)  // N S = sum q q^T - N mu mu^T
              for (int a = 0; a < hd; ++a)
                for (int b = 0; b < hd; ++b) cov[a * hd + b] = st.outer[a * hd + b] - N * mu[a] * mu[b];
          }
        }
        if (cov_ && N > 0) {
          for (double& v : cov) v /= N;
          // S' = R S R^T: R on the columns of S, then on its rows.
          for (int c = 0; c < hd; ++c) rot(cov.data() + c, hd);
          for (int r = 0; r < hd; ++r) rot(cov.data() + static_cast<size_t>(r) * hd, 1);
        }
        rot(mu.data(), 1);
        for (int d = 0; d < hd; ++d) muf[d] = static_cast<float>(mu[d]);
        for (size_t i = 0; i < covf.size(); ++i) covf[i] = static_cast<float>(cov[i]);
        double zmax = -INFINITY;
        for (size_t j = 0; j < m; ++j) {
          const float* k = keys.data() + j * hd;
          double v = dot_f32(muf.data(), k, hd) * inv_sqrt_d;
          if (cov_) {
            for (int a = 0; a < hd; ++a) t[a] = dot_f32(covf.data() + static_cast<size_t>(a) * hd, k, hd);
            v += dot_f32(t.data(), k, hd) / hd / 2.0;
          }
          z[j] = v;
          zmax = std::max(zmax, v);
        }
        double sum = 0;
        for (size_t j = 0; j < m; ++j) sum += (z[j] = std::exp(z[j] - zmax));
        for (size_t j = 0; j < m; ++j) mean_score[j] += z[j] / sum / G;
      }
      std::vector<float> v(hd);
      for (size_t j = 0; j < m; ++j) {
        double sc = mean_score[j];
        if (vnorm_) {
          s.value(ns + j, v.data());
          double ss = 0;
          for (float x : v) ss += double(x) * x;
          sc = (sc + eps_) * std::sqrt(ss);
        }
        out[h][ns + j] = static_cast<float>(sc);
      }
    }
  }

 private:
  /// Running sums of one query head's pre-RoPE queries: count, sum q, sum q q^T.
  struct QueryStats {
    double count = 0;
    std::vector<double> sum, outer;
  };
  /// Adds the pre-RoPE queries q [n][n_head][head_dim] of a batch's tokens at positions >=
  /// n_sink to layer l's sums (the forward pass calls layers in order, from one thread).
  void after_qkv(const LayerStep& s) override {
    accumulate(s.layer, s.q, s.n, s.hp->n_head, s.hp->head_dim, s.positions);
  }
  void accumulate(int l, const float* q, int n, int nh, int hd, const int32_t* pos) {
    std::vector<int> rows;
    for (int t = 0; t < n; ++t)
      if (pos[t] >= n_sink_) rows.push_back(t);
    if (rows.empty()) return;
    if (stats_.empty()) nh_ = nh, hd_ = hd;
    if (nh != nh_ || hd != hd_) throw Error("press expected_attention: query shape changed within a request");
    const int dq = nh * hd;
    if (static_cast<int>(stats_.size()) <= l) stats_.resize(l + 1);
    if (stats_[l].empty()) {
      stats_[l].assign(nh, {});
      for (auto& st : stats_[l]) {
        st.sum.assign(hd, 0.0);
        st.outer.assign(static_cast<size_t>(hd) * hd, 0.0);
      }
    }
    const int m = static_cast<int>(rows.size());
    std::vector<float> qh(static_cast<size_t>(m) * hd), gram(static_cast<size_t>(hd) * hd);
    for (int h = 0; h < nh; ++h) {
      QueryStats& st = stats_[l][h];
      for (int r = 0; r < m; ++r)
        for (int d = 0; d < hd; ++d) {
          const float v = q[static_cast<size_t>(rows[r]) * dq + h * hd + d];
          qh[static_cast<size_t>(r) * hd + d] = v;
          st.sum[d] += v;
        }
      st.count += m;
      if (!cov_) continue;
      // One batch's Gram matrix in f32 (BLAS), summed over batches in float64.
      BlasSlot slot;  // see kernels/threads.h
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, hd, hd, m, 1.0f, qh.data(), hd, qh.data(), hd, 0.0f,
                  gram.data(), hd);
      for (size_t i = 0; i < gram.size(); ++i) st.outer[i] += gram[i];
    }
  }
  int window_, n_future_, n_sink_;
  bool cov_, vnorm_;
  double eps_;
  bool protect_;
  int nh_ = 0, hd_ = 0;                         // query heads and head_dim the sums are for
  std::vector<std::vector<QueryStats>> stats_;  // [layer][query head]
  std::string stats_path_;
  std::shared_ptr<const QueryStatsFile> file_;  // stats=FILE
};

PressRegistrar reg({"expected_attention",
                    "expected attention of future queries (Gaussian queries, RoPE averaged over future positions) "
                    "x value norm",
                    "Devoto, Jeblick, Jegou 2025, Expected Attention: KV Cache Compression by Estimating Attention "
                    "from Future Queries Distribution, arXiv 2510.00636; reference: "
                    "kvpress/presses/expected_attention_press.py (ExpectedAttentionPress)",
                    {{"ratio", "0"},
                     {"window", "0", {}, kKvslimOnly},
                     {"n_future", "512", "n_future_positions",
                      {.help = "the future positions whose RoPE rotations the expected query is averaged over"}},
                     {"n_sink", "4", {}, {.help = "the first entries (attention sinks) always kept"}},
                     {"covariance", "1", "use_covariance",
                      {.type = ParamType::Bool, .help = "include the queries' covariance in the expected attention"}},
                     {"vnorm", "1", "use_vnorm",
                      {.type = ParamType::Bool, .help = "multiply the scores by the values' norms"}},
                     {"epsilon", "0", {},
                      {.type = ParamType::Float, .help = "added to the scores before the value norms multiply them"}},
                     {"protect", "0", {}, kKvslimOnly},
                     {"stats", "", "stats_folder",
                      {.type = ParamType::Str,
                       .help = "a file of query statistics (`kvslim ea-stats`) used instead of the context's queries",
                       .default_value = "None",
                       .only_in = "ExpectedAttentionStatsPress"}}},
                    [](const PressParams& p) -> std::unique_ptr<PressImpl> {
                      const char* n = "expected_attention";
                      int w = param_int(p, n, "window"), f = param_int(p, n, "n_future"), s = param_int(p, n, "n_sink");
                      int c = param_int(p, n, "covariance"), v = param_int(p, n, "vnorm");
                      if (w < 0)
                        throw Error(fmt::format("press {}: window={} must be >= 0 (0: every context query)", n, w));
                      if (f < 1) throw Error(fmt::format("press {}: n_future={} must be >= 1", n, f));
                      if (s < 0) throw Error(fmt::format("press {}: n_sink={} must be >= 0", n, s));
                      if ((c != 0 && c != 1) || (v != 0 && v != 1))
                        throw Error(fmt::format("press {}: covariance and vnorm are 0 or 1", n));
                      return std::make_unique<ExpectedAttentionPress>(param_double(p, n, "ratio"), w, f, s, c == 1,
                                                                      v == 1, param_double(p, n, "epsilon"),
                                                                      param_bool(p, n, "protect"),
                                                                      param_file(p, n, "stats"));
                    }}, {"ExpectedAttentionPress", "ExpectedAttentionStatsPress"});

}  // namespace
}  // namespace kvslim
