// Fitting KVzap's surrogates (train/kvzap_train.h): ridge regression and a GELU MLP trained with
// AdamW, on (attention input, log KVzip+ score) pairs collected by KVzip's replay. Jegou et al.,
// arXiv 2601.07891.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include <cblas.h>
#include <fmt/format.h>

#include "kernels/threads.h"
#include "kvslim/error.h"
#include "model/session.h"
#include "train/kvzap_train.h"

namespace kvslim {

namespace {

inline float gelu_grad(float x) {
  return 0.5f * (1.0f + std::erf(x * 0.70710678118654752f)) + x * 0.39894228040143268f * std::exp(-0.5f * x * x);
}

}  // namespace

void ridge_fit(const float* X, const float* Y, size_t n, int d, int k, double alpha, std::vector<float>& W,
               std::vector<float>& b) {
  if (n == 0 || d < 1 || k < 1) throw Error("ridge regression: no training rows");
  std::vector<double> mx(d, 0.0), my(k, 0.0);
  for (size_t t = 0; t < n; ++t) {
    for (int i = 0; i < d; ++i) mx[i] += X[t * d + i];
    for (int j = 0; j < k; ++j) my[j] += Y[t * k + j];
  }
  for (double& v : mx) v /= n;
  for (double& v : my) v /= n;
  // A = Xc^T Xc + alpha I and B = Xc^T Yc, accumulated block by block in float64.
  std::vector<double> A(static_cast<size_t>(d) * d, 0.0), B(static_cast<size_t>(d) * k, 0.0);
  const size_t blk = 1024;
  std::vector<double> xb(blk * d), yb(blk * k);
  for (size_t t0 = 0; t0 < n; t0 += blk) {
    const size_t m = std::min(blk, n - t0);
    for (size_t t = 0; t < m; ++t) {
      for (int i = 0; i < d; ++i) xb[t * d + i] = X[(t0 + t) * d + i] - mx[i];
      for (int j = 0; j < k; ++j) yb[t * k + j] = Y[(t0 + t) * k + j] - my[j];
    }
    BlasSlot slot2;  // see kernels/threads.h
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, static_cast<int>(m), 1.0, xb.data(), d, xb.data(), d,
                1.0, A.data(), d);
    BlasSlot slot3;  // see kernels/threads.h
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, k, static_cast<int>(m), 1.0, xb.data(), d, yb.data(), k,
                1.0, B.data(), k);
  }
  for (int i = 0; i < d; ++i) A[static_cast<size_t>(i) * d + i] += alpha;
  // Cholesky A = L L^T (lower triangle in place).
  for (int j = 0; j < d; ++j) {
    double s = A[static_cast<size_t>(j) * d + j];
    for (int p = 0; p < j; ++p) s -= A[static_cast<size_t>(j) * d + p] * A[static_cast<size_t>(j) * d + p];
    if (!(s > 0)) throw Error(fmt::format("ridge regression: normal equations not positive definite (alpha {})", alpha));
    const double ljj = std::sqrt(s);
    A[static_cast<size_t>(j) * d + j] = ljj;
    for (int i = j + 1; i < d; ++i) {
      double v = A[static_cast<size_t>(i) * d + j];
      for (int p = 0; p < j; ++p) v -= A[static_cast<size_t>(i) * d + p] * A[static_cast<size_t>(j) * d + p];
      A[static_cast<size_t>(i) * d + j] = v / ljj;
    }
  }
  // Solve L Z = B, then L^T Wt = Z, for every target column.
  W.assign(static_cast<size_t>(k) * d, 0.0f);
  b.assign(k, 0.0f);
  std::vector<double> z(d);
  for (int c = 0; c < k; ++c) {
    for (int i = 0; i < d; ++i) {
      double v = B[static_cast<size_t>(i) * k + c];
      for (int p = 0; p < i; ++p) v -= A[static_cast<size_t>(i) * d + p] * z[p];
      z[i] = v / A[static_cast<size_t>(i) * d + i];
    }
    for (int i = d - 1; i >= 0; --i) {
      double v = z[i];
      for (int p = i + 1; p < d; ++p) v -= A[static_cast<size_t>(p) * d + i] * z[p];
      z[i] = v / A[static_cast<size_t>(i) * d + i];
    }
    double bc = my[c];
    for (int i = 0; i < d; ++i) {
      W[static_cast<size_t>(c) * d + i] = static_cast<float>(z[i]);
      bc -= z[i] * mx[i];
    }
    b[c] = static_cast<float>(bc);
  }
}

void mlp_fit(const float* X, const float* Y, size_t n, int d, int k, const MLPTrainOptions& opt,
             std::vector<float>& W1, std::vector<float>& b1, std::vector<float>& W2, std::vector<float>& b2) {
  if (n == 0) throw Error("MLP training: no training rows");
  if (opt.hidden < 1 || opt.epochs < 1 || opt.batch < 1 || !(opt.lr > 0))
    throw Error(fmt::format("MLP training: hidden {}, epochs {}, batch {} must be >= 1 and lr {} > 0", opt.hidden,
                            opt.epochs, opt.batch, opt.lr));
  const int h = opt.hidden;
  std::mt19937_64 rng(opt.seed);
  // torch.nn.Linear's initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases.
  auto init = [&](std::vector<float>& v, size_t count, int fan_in) {
    std::uniform_real_distribution<float> u(-1.0f / std::sqrt(float(fan_in)), 1.0f / std::sqrt(float(fan_in)));
    v.resize(count);
    for (float& x : v) x = u(rng);
  };
  init(W1, static_cast<size_t>(h) * d, d);
  init(b1, h, d);
  init(W2, static_cast<size_t>(k) * h, h);
  init(b2, k, h);
  std::vector<float>* params[4] = {&W1, &b1, &W2, &b2};
  std::vector<float> g[4], m[4], v[4];
  for (int p = 0; p < 4; ++p) {
    g[p].assign(params[p]->size(), 0.0f);
    m[p].assign(params[p]->size(), 0.0f);
    v[p].assign(params[p]->size(), 0.0f);
  }
  const double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  const int B = opt.batch;
  std::vector<float> xb(static_cast<size_t>(B) * d), yb(static_cast<size_t>(B) * k), hp(static_cast<size_t>(B) * h),
      a(hp.size()), out(yb.size()), dy(yb.size()), da(hp.size());
  int64_t step = 0;
  for (int ep = 0; ep < opt.epochs; ++ep) {
    // Cosine annealing to 0 over the epochs, stepped once per epoch (skorch's LRScheduler).
    const double lr = 0.5 * opt.lr * (1.0 + std::cos(M_PI * ep / opt.epochs));
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t t0 = 0; t0 < n; t0 += B) {
      const int nb = static_cast<int>(std::min<size_t>(B, n - t0));
      for (int t = 0; t < nb; ++t) {
        std::copy(X + order[t0 + t] * d, X + order[t0 + t] * d + d, xb.begin() + static_cast<size_t>(t) * d);
        std::copy(Y + order[t0 + t] * k, Y + order[t0 + t] * k + k, yb.begin() + static_cast<size_t>(t) * k);
      }
      kvzap_linear(xb.data(), nb, d, W1.data(), b1.data(), h, hp.data());
      for (size_t i = 0; i < static_cast<size_t>(nb) * h; ++i) a[i] = kvzap_gelu(hp[i]);
      kvzap_linear(a.data(), nb, h, W2.data(), b2.data(), k, out.data());
      // MSE averaged over rows and outputs (torch's MSELoss).
      const float sc = 2.0f / (float(nb) * k);
      for (size_t i = 0; i < static_cast<size_t>(nb) * k; ++i) dy[i] = sc * (out[i] - yb[i]);
      BlasSlot slot4;  // see kernels/threads.h
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k, h, nb, 1.0f, dy.data(), k, a.data(), h, 0.0f,
                  g[2].data(), h);
      std::fill(g[3].begin(), g[3].end(), 0.0f);
      for (int t = 0; t < nb; ++t)
        for (int j = 0; j < k; ++j) g[3][j] += dy[static_cast<size_t>(t) * k + j];
      BlasSlot slot5;  // see kernels/threads.h
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb, h, k, 1.0f, dy.data(), k, W2.data(), h, 0.0f,
                  da.data(), h);
      for (size_t i = 0; i < static_cast<size_t>(nb) * h; ++i) da[i] *= gelu_grad(hp[i]);
      BlasSlot slot6;  // see kernels/threads.h
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, h, d, nb, 1.0f, da.data(), h, xb.data(), d, 0.0f,
                  g[0].data(), d);
      std::fill(g[1].begin(), g[1].end(), 0.0f);
      for (int t = 0; t < nb; ++t)
        for (int j = 0; j < h; ++j) g[1][j] += da[static_cast<size_t>(t) * h + j];
      // Gradient-norm clipping over all parameters, then AdamW (decoupled weight decay).
      double norm2 = 0;
      for (int p = 0; p < 4; ++p)
        for (float x : g[p]) norm2 += double(x) * x;
      const double norm = std::sqrt(norm2);
      const float clip = norm > opt.clip ? static_cast<float>(opt.clip / (norm + 1e-6)) : 1.0f;
      ++step;
      const double bc1 = 1.0 - std::pow(beta1, double(step)), bc2 = 1.0 - std::pow(beta2, double(step));
      for (int p = 0; p < 4; ++p) {
        std::vector<float>& w = *params[p];
        for (size_t i = 0; i < w.size(); ++i) {
          const double gi = double(g[p][i]) * clip;
          w[i] = static_cast<float>(w[i] * (1.0 - lr * opt.weight_decay));
          m[p][i] = static_cast<float>(beta1 * m[p][i] + (1 - beta1) * gi);
          v[p][i] = static_cast<float>(beta2 * v[p][i] + (1 - beta2) * gi * gi);
          w[i] = static_cast<float>(w[i] - lr * (m[p][i] / bc1) / (std::sqrt(v[p][i] / bc2) + eps));
        }
      }
    }
  }
}

double pearson(const float* a, const float* b, size_t n) {
  if (n < 2) return 0.0;
  double ma = 0, mb = 0;
  for (size_t i = 0; i < n; ++i) ma += a[i], mb += b[i];
  ma /= n;
  mb /= n;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < n; ++i) {
    sab += (a[i] - ma) * (b[i] - mb);
    saa += (a[i] - ma) * (a[i] - ma);
    sbb += (b[i] - mb) * (b[i] - mb);
  }
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0.0;
}

KVzapData collect_kvzap_data(const Model& model, const std::vector<std::vector<Token>>& docs, int per_doc,
                             uint64_t seed, const KVzipOptions& kvzip,
                             const std::function<void(size_t, size_t)>& progress) {
  const HParams& hp = model.hparams();
  const int L = hp.n_layer, H = hp.n_head_kv, d = hp.n_embd;
  if (per_doc < 1) throw Error(fmt::format("kvzap data: tokens per document {} must be >= 1", per_doc));
  KVzapData data;
  data.X.assign(L, {});
  data.Y.assign(L, {});
  std::mt19937_64 rng(seed);
  for (size_t di = 0; di < docs.size(); ++di) {
    const std::vector<Token>& doc = docs[di];
    if (doc.empty()) continue;
    const int n = static_cast<int>(doc.size());
    SessionOptions so;
    // Room for the context and its replay (instruction + the whole context in one chunk).
    so.n_ctx = 2 * n + 64;
    Session s(model, so);
    std::vector<std::vector<float>> xs(L, std::vector<float>(static_cast<size_t>(n) * d));
    AfterQKV collect([&](const LayerStep& st) {
      const float* xn = st.attn_input;
      for (int t = 0; t < st.n; ++t)
        if (st.positions[t] < n)
          std::copy(xn + static_cast<size_t>(t) * d, xn + static_cast<size_t>(t + 1) * d,
                    xs[st.layer].begin() + static_cast<size_t>(st.positions[t]) * d);
    });
    s.forward(doc, false, &collect);
    KVzipOptions ko = kvzip;
    ko.chunk = std::max(ko.chunk, 16);
    Scores sc = kvzip_replay_scores(s, doc, 0, ko);
    std::vector<int> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    std::shuffle(idx.begin(), idx.end(), rng);
    idx.resize(std::min(n, per_doc));
    std::sort(idx.begin(), idx.end());
    for (int i : idx) {
      data.doc.push_back(static_cast<int>(di));
      for (int l = 0; l < L; ++l) {
        data.X[l].insert(data.X[l].end(), xs[l].begin() + static_cast<size_t>(i) * d, xs[l].begin() + static_cast<size_t>(i + 1) * d);
        for (int h = 0; h < H; ++h) {
          // No eviction happened, so entry i of every segment is token i.
          float v = sc[l][h][i];
          data.Y[l].push_back(static_cast<float>(std::log(std::max(std::isnan(v) ? 0.0f : v, 1e-12f))));
        }
      }
    }
    if (progress) progress(di + 1, docs.size());
  }
  return data;
}

}  // namespace kvslim
