// Expected Attention: scores an entry by the attention future queries are expected to pay it.
// Queries are modelled as Gaussian: mean mu and covariance S of the pre-RoPE queries, estimated
// from the observation window (the last `window` queries, un-rotated from their positions), then
// moved by the RoPE rotation averaged over the next `n_future` positions, R = mean_t R(p + t):
// mu' = R mu, S' = R S R^T. For a key k, E[exp(q.k / sqrt(d))] is proportional to
// exp(mu'.k / sqrt(d) + k^T S' k / (2 d)); a softmax of that over the segment's entries, averaged
// over the GQA group, then times (score + epsilon) ||v||_2, is the score. The first n_sink entries
// are kept. Devoto, Jeblick, Jegou, "Expected Attention: KV Cache Compression by Estimating
// Attention from Future Queries Distribution", arXiv 2510.00636; formula as kvpress's
// ExpectedAttentionPress. Deviation: kvpress estimates mu and S from every context token after the
// sinks; here from the observation window (no hidden states are stored), which also makes the
// estimate follow the most recent text. The rotation uses the model's own layout (llama pairs or
// neox halves) and frequencies (Llama 3 rope_freqs included).
#include <cmath>

#include <fmt/format.h>

#include "kernels/attention.h"
#include "kvslim/press.h"
#include "press/rope.h"

namespace kvslim {
namespace {

class ExpectedAttentionPress : public ScorerPress {
 public:
  ExpectedAttentionPress(double ratio, int window, int n_future, int n_sink, bool cov, bool vnorm, double eps)
      : ScorerPress(ratio), window_(window), n_future_(n_future), n_sink_(n_sink), cov_(cov), vnorm_(vnorm),
        eps_(eps) {}
  std::string describe_scorer() const override {
    return fmt::format("expected_attention:ratio={},window={},n_future={},n_sink={},covariance={},vnorm={},epsilon={}",
                       ratio_, window_, n_future_, n_sink_, cov_ ? 1 : 0, vnorm_ ? 1 : 0, eps_);
  }
  ObservationRequest scorer_request() const override {
    ObservationRequest r;
    r.window = window_;
    return r;
  }
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override {
    const HParams& hp = view.hp();
    const int hd = hp.head_dim, half = hd / 2, G = hp.n_group(), nw = view.n_window();
    const auto inv_freq = rope::inv_freq(view.model());
    // Window rows used for the statistics: the newest `window`, leaving out sink positions.
    std::vector<int> rows;
    for (int i = std::max(0, nw - window_); i < nw; ++i)
      if (view.obs().window_positions[i] >= n_sink_) rows.push_back(i);
    const int32_t next = nw > 0 ? view.obs().window_positions[nw - 1] + 1 : cache_next_position(view.cache());
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
      for (size_t j = 0; j < ns; ++j) out[h][j] = kProtected;
      if (n == ns) continue;
      const size_t m = n - ns;
      std::vector<float> keys(m * hd);
      s.keys(ns, n, keys.data());
      std::vector<double> mean_score(m, 0.0);
      std::vector<float> covf(static_cast<size_t>(hd) * hd), muf(hd), t(hd);
      std::vector<double> z(m);
      for (int g = 0; g < G; ++g) {
        const int qh = h * G + g;
        // Statistics of the pre-RoPE window queries (float64).
        std::vector<double> mu(hd, 0.0), cov(static_cast<size_t>(hd) * hd, 0.0);
        std::vector<std::vector<double>> qs;
        const float* wq = view.window_queries(qh);
        for (int i : rows) {
          std::vector<double> q(wq + static_cast<size_t>(i) * hd, wq + static_cast<size_t>(i + 1) * hd);
          rope::rotate(q.data(), hd, hp.rope_neox, inv_freq, -double(view.obs().window_positions[i]));
          for (int d = 0; d < hd; ++d) mu[d] += q[d];
          qs.push_back(std::move(q));
        }
        const double N = static_cast<double>(qs.size());
        if (N > 0)
          for (double& v : mu) v /= N;
        if (cov_ && N > 0) {
          for (const auto& q : qs)
            for (int a = 0; a < hd; ++a)
              for (int b = 0; b < hd; ++b) cov[a * hd + b] += (q[a] - mu[a]) * (q[b] - mu[b]);
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
  int window_, n_future_, n_sink_;
  bool cov_, vnorm_;
  double eps_;
};

PressRegistrar reg({"expected_attention",
                    "expected attention of future queries (Gaussian queries, RoPE averaged over future positions) "
                    "x value norm",
                    "Devoto, Jeblick, Jegou 2025, Expected Attention: KV Cache Compression by Estimating Attention "
                    "from Future Queries Distribution, arXiv 2510.00636",
                    {{"ratio", "0"}, {"window", "64"}, {"n_future", "512"}, {"n_sink", "4"}, {"covariance", "1"},
                     {"vnorm", "1"}, {"epsilon", "0"}},
                    [](const PressParams& p) -> std::unique_ptr<Press> {
                      const char* n = "expected_attention";
                      int w = param_int(p, n, "window"), f = param_int(p, n, "n_future"), s = param_int(p, n, "n_sink");
                      int c = param_int(p, n, "covariance"), v = param_int(p, n, "vnorm");
                      if (w < 1) throw Error(fmt::format("press {}: window={} must be >= 1", n, w));
                      if (f < 1) throw Error(fmt::format("press {}: n_future={} must be >= 1", n, f));
                      if (s < 0) throw Error(fmt::format("press {}: n_sink={} must be >= 0", n, s));
                      if ((c != 0 && c != 1) || (v != 0 && v != 1))
                        throw Error(fmt::format("press {}: covariance and vnorm are 0 or 1", n));
                      return std::make_unique<ExpectedAttentionPress>(param_double(p, n, "ratio"), w, f, s, c == 1,
                                                                      v == 1, param_double(p, n, "epsilon"));
                    }});

}  // namespace
}  // namespace kvslim
