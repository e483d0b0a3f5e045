// Compactor's leverage and non-causal attention scores (see compactor_scores.h).
#include "press/compactor_scores.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "press/token_states.h"

namespace kvslim {

namespace {

/// Lower Cholesky factor of a [n][n] in place; false when not positive definite.
bool cholesky(std::vector<double>& a, int n) {
  for (int j = 0; j < n; ++j) {
    double s = a[static_cast<size_t>(j) * n + j];
    for (int k = 0; k < j; ++k) s -= a[static_cast<size_t>(j) * n + k] * a[static_cast<size_t>(j) * n + k];
    if (!(s > 0)) return false;
    const double ljj = std::sqrt(s);
    a[static_cast<size_t>(j) * n + j] = ljj;
    for (int i = j + 1; i < n; ++i) {
      double t = a[static_cast<size_t>(i) * n + j];
      for (int k = 0; k < j; ++k) t -= a[static_cast<size_t>(i) * n + k] * a[static_cast<size_t>(j) * n + k];
      a[static_cast<size_t>(i) * n + j] = t / ljj;
    }
  }
  return true;
}

}  // namespace

std::vector<double> leverage_scores(const std::vector<float>& K, int S, int d, int sketch, std::mt19937& rng) {
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> phi(static_cast<size_t>(d) * sketch);
  for (double& x : phi) x = nd(rng) / std::sqrt(double(sketch));
  std::vector<double> mean(d, 0.0);
  for (int i = 0; i < S; ++i)
    for (int c = 0; c < d; ++c) mean[c] += K[static_cast<size_t>(i) * d + c] / double(S);
  std::vector<double> X(static_cast<size_t>(S) * sketch, 0.0);
  for (int i = 0; i < S; ++i)
    for (int c = 0; c < d; ++c) {
      const double x = K[static_cast<size_t>(i) * d + c] - mean[c];
      for (int j = 0; j < sketch; ++j) X[static_cast<size_t>(i) * sketch + j] += x * phi[static_cast<size_t>(c) * sketch + j];
    }
  std::vector<double> G(static_cast<size_t>(sketch) * sketch, 0.0);
  for (int i = 0; i < S; ++i)
    for (int a = 0; a < sketch; ++a)
      for (int b = 0; b < sketch; ++b)
        G[static_cast<size_t>(a) * sketch + b] += X[static_cast<size_t>(i) * sketch + a] * X[static_cast<size_t>(i) * sketch + b];
  std::vector<double> L;
  double jitter = 1e-2;
  bool ok = false;
  for (int t = 0; t < 5 && !ok; ++t) {
    L = G;
    for (int a = 0; a < sketch; ++a) L[static_cast<size_t>(a) * sketch + a] += jitter;
    ok = cholesky(L, sketch);
    if (!ok) jitter *= 10;
  }
  if (!ok) throw Error("leverage scores: Cholesky failed after 5 jitters");
  // score_i = |L^{-1} x_i|^2 (forward substitution).
  std::vector<double> out(S), y(sketch);
  for (int i = 0; i < S; ++i) {
    double s = 0;
    for (int a = 0; a < sketch; ++a) {
      double t = X[static_cast<size_t>(i) * sketch + a];
      for (int k = 0; k < a; ++k) t -= L[static_cast<size_t>(a) * sketch + k] * y[k];
      y[a] = t / L[static_cast<size_t>(a) * sketch + a];
      s += y[a] * y[a];
    }
    out[i] = std::max(0.0, s);
  }
  return out;
}

std::vector<double> noncausal_column_sums(const float* q, const float* k, int S, int hd, int chunk) {
  std::vector<double> out(S, 0.0);
  std::vector<double> logit(chunk);
  for (int b = 0; b < S; b += chunk) {
    const int e = std::min(S, b + chunk), real = e - b, pad = chunk - real;
    // Real queries: logits over the real keys, padded keys at -1e-9.
    for (int i = b; i < e; ++i) {
      double mx = pad > 0 ? -1e-9 : -INFINITY;
      for (int j = b; j < e; ++j) {
        double d = 0;
        for (int c = 0; c < hd; ++c) d += double(q[static_cast<size_t>(i) * hd + c]) * k[static_cast<size_t>(j) * hd + c];
        logit[j - b] = d;
        mx = std::max(mx, d);
      }
      double sum = pad * std::exp(-1e-9 - mx);
      for (int j = 0; j < real; ++j) sum += (logit[j] = std::exp(logit[j] - mx));
      for (int j = 0; j < real; ++j) out[b + j] += logit[j] / sum;
    }
    // Padded (zero) queries: logit 0 on real keys, -1e-9 on padded ones.
    if (pad > 0) {
      const double share = 1.0 / (real + pad * std::exp(-1e-9));
      for (int j = b; j < e; ++j) out[j] += pad * share;
    }
  }
  return out;
}

void noncausal_scores(const LayerView& view, const std::vector<int>& b, const std::vector<int>& e, int chunk,
                      const char* press, std::vector<std::vector<double>>& out) {
  const HParams& hp = view.hp();
  const int H = hp.n_head_kv, G = hp.n_group(), hd = hp.head_dim, dq = hp.n_head * hd;
  out.assign(H, {});
  std::vector<int> prev_rows;
  std::vector<float> Q;
  for (int h = 0; h < H; ++h) {
    std::vector<int> rows = hidden_rows(view, h, press);
    rows = std::vector<int>(rows.begin() + b[h], rows.begin() + e[h]);
    if (rows != prev_rows || Q.empty()) Q = queries_from_hidden(view, rows);
    prev_rows = rows;
    const int S = e[h] - b[h];
    std::vector<float> K(static_cast<size_t>(S) * hd), V(K.size()), q(K.size());
    if (S > 0) {
      view.seg(h).keys(b[h], e[h], K.data());
      view.seg(h).values(b[h], e[h], V.data());
    }
    std::vector<double> A(S, 0.0);
    for (int g = 0; g < G; ++g) {
      for (int i = 0; i < S; ++i)
        std::copy_n(Q.data() + static_cast<size_t>(i) * dq + static_cast<size_t>(h * G + g) * hd, hd,
                    q.data() + static_cast<size_t>(i) * hd);
      std::vector<double> col = noncausal_column_sums(q.data(), K.data(), S, hd, chunk);
      for (int i = 0; i < S; ++i) A[i] += col[i] / G;
    }
    std::vector<double> s(S);
    for (int i = 0; i < S; ++i) {
      double vn = 0;
      for (int c = 0; c < hd; ++c) vn += double(V[static_cast<size_t>(i) * hd + c]) * V[static_cast<size_t>(i) * hd + c];
      s[i] = A[i] * std::sqrt(vn);
    }
    out[h].resize(S);
    for (int i = 0; i < S; ++i)
      out[h][i] = ((i > 0 ? s[i - 1] : 0.0) + s[i] + (i + 1 < S ? s[i + 1] : 0.0)) / 3.0;
  }
}

void leverage_layer_scores(const LayerView& view, const std::vector<int>& b, const std::vector<int>& e, int sketch,
                           uint32_t seed, const char* press, std::vector<std::vector<double>>& out) {
  const int H = view.hp().n_head_kv, hd = view.hp().head_dim;
  out.assign(H, {});
  for (int h = 0; h < H; ++h) {
    std::vector<int> rows = hidden_rows(view, h, press);
    rows = std::vector<int>(rows.begin() + b[h], rows.begin() + e[h]);
    std::vector<float> K = prerope_keys_from_hidden(view, h, rows);
    std::mt19937 rng(seed + 104729u * static_cast<uint32_t>(view.layer() * H + h));
    out[h] = rows.empty() ? std::vector<double>{} : leverage_scores(K, static_cast<int>(rows.size()), hd, sketch, rng);
  }
}

void zscore_layer(std::vector<std::vector<double>>& x) {
  double mean = 0, sd = 0;
  mean_std(x, mean, sd);
  sd = std::max(sd, 1e-6);  // torch's clamp_min keeps NaN (a single value)
  for (auto& v : x)
    for (double& a : v) a = (a - mean) / sd;
}

}  // namespace kvslim
