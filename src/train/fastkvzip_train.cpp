// Training Fast KVzip's gates (arXiv 2601.17668) on the user's model: targets are KVzip scores
// (the largest attention an entry receives while the model repeats the context; plain KVzip by
// default, as the authors' data), the loss binary cross-entropy of the gate's score against them,
// the optimiser SGD with momentum 0.9, peak learning rate 0.2 and the authors' step schedule
// (github.com/Janghyun1230/FastKVzip optim.py, utils.py: lr_schedule, loss_fn "cnt", acc_fn, and
// load_data.py's split: every 100th token held out). The authors' training adds the bias b twice to
// the logit while kvpress's press adds it once; kvslim adds it once in both.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

#include <cblas.h>
#include <fmt/format.h>

#include "kernels/threads.h"
#include "model/session.h"
#include "model/layer_hook.h"
#include "train/fastkvzip_train.h"

namespace kvslim {

double fastkvzip_lr_scale(int step, int steps) {
  if (step < 0.01 * steps) return 0.01 * step;
  if (step >= 0.75 * steps) return 0.25;
  if (step >= 0.5 * steps) return 0.5;
  return 1.0;
}

double fastkvzip_layer_loss(const FastKVzipGates& gt, int layer, const float* x, const float* y, int n,
                            FastKVzipGates::Layer* grad) {
  if (n <= 0) return 0.0;
  const FastKVzipGates::Layer& L = gt.layers.at(layer);
  const int in = gt.input_dim, H = gt.n_head_kv, G = gt.n_group, D = gt.dim, S = gt.n_sink;
  const int nq = H * G * D, nk = H * D;
  const double sd = std::sqrt(static_cast<double>(D)), eps = gt.eps;
  // Projections of the batch: QR = X Wq^T + bq [n][nq], KR = X Wk^T [n][nk].
  std::vector<float> QR(static_cast<size_t>(n) * nq), KR(static_cast<size_t>(n) * nk);
  for (int t = 0; t < n; ++t) std::copy(L.bq.begin(), L.bq.end(), QR.begin() + static_cast<size_t>(t) * nq);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, nq, in, 1.0f, x, in, L.wq.data(), in, 1.0f, QR.data(), nq);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, nk, in, 1.0f, x, in, L.wk.data(), in, 0.0f, KR.data(), nk);
  std::vector<float> dQR, dKR;
  std::vector<double> dqn(D, 0.0), dkn(D, 0.0), dkb(static_cast<size_t>(H) * S * D, 0.0), db(static_cast<size_t>(H) * G, 0.0),
      dbq(nq, 0.0);
  if (grad) {
    dQR.assign(QR.size(), 0.0f);
    dKR.assign(KR.size(), 0.0f);
  }
  std::vector<double> kh(D), k(D), qh(static_cast<size_t>(G) * D), q(static_cast<size_t>(G) * D), rq(G), p(G),
      pi(static_cast<size_t>(G) * S), dk(D), dq(D), u(D);
  double loss = 0;
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < H; ++h) {
      // k = k_norm * rmsnorm(kr)
      const float* kr = KR.data() + static_cast<size_t>(t) * nk + static_cast<size_t>(h) * D;
      double ms = 0;
      for (int e = 0; e < D; ++e) ms += double(kr[e]) * kr[e];
      const double rk = 1.0 / std::sqrt(ms / D + eps);
      for (int e = 0; e < D; ++e) {
        kh[e] = kr[e] * rk;
        k[e] = L.k_norm[e] * kh[e];
      }
      double pred = 0;
      for (int g = 0; g < G; ++g) {
        const float* qr = QR.data() + static_cast<size_t>(t) * nq + (static_cast<size_t>(h) * G + g) * D;
        double m2 = 0;
        for (int e = 0; e < D; ++e) m2 += double(qr[e]) * qr[e];
        rq[g] = 1.0 / std::sqrt(m2 / D + eps);
        double* qg = q.data() + static_cast<size_t>(g) * D;
        for (int e = 0; e < D; ++e) {
          qh[static_cast<size_t>(g) * D + e] = qr[e] * rq[g];
          qg[e] = L.q_norm[e] * qh[static_cast<size_t>(g) * D + e];
        }
        double l = 0;
        for (int e = 0; e < D; ++e) l += k[e] * qg[e];
        l = l / sd + L.b[static_cast<size_t>(h) * G + g];
        p[g] = fastkvzip_gate_probability(L, h, S, D, qg, sd, l, pi.data() + static_cast<size_t>(g) * S);
        pred += p[g];
      }
      pred /= G;
      const double yt = y[static_cast<size_t>(t) * H + h];
      loss -= yt * std::max(std::log(pred), -100.0) + (1 - yt) * std::max(std::log(1 - pred), -100.0);
      if (!grad) continue;
      // torch's binary cross-entropy gradient: (p - y) / max(p (1 - p), 1e-12); mean over the n tokens.
      const double dpred = (pred - yt) / std::max(pred * (1 - pred), 1e-12) / n;
      std::fill(dk.begin(), dk.end(), 0.0);
      for (int g = 0; g < G; ++g) {
        const double dp = dpred / G;
        const double dl = dp * p[g] * (1 - p[g]);
        db[static_cast<size_t>(h) * G + g] += dl;
        const double* qg = q.data() + static_cast<size_t>(g) * D;
        for (int e = 0; e < D; ++e) {
          dq[e] = dl * k[e] / sd;
          dk[e] += dl * qg[e] / sd;
        }
        for (int j = 0; j < S; ++j) {
          const double ds = -dp * p[g] * pi[static_cast<size_t>(g) * S + j];
          const float* kb = L.k_base.data() + (static_cast<size_t>(h) * S + j) * D;
          double* gkb = dkb.data() + (static_cast<size_t>(h) * S + j) * D;
          for (int e = 0; e < D; ++e) {
            dq[e] += ds * kb[e] / sd;
            gkb[e] += ds * qg[e] / sd;
          }
        }
        // RMSNorm backward: q = w * u * r, u the raw projection, r = 1 / sqrt(mean(u^2) + eps).
        const double* qhg = qh.data() + static_cast<size_t>(g) * D;
        double dot = 0;
        for (int e = 0; e < D; ++e) {
          dqn[e] += dq[e] * qhg[e];
          u[e] = L.q_norm[e] * dq[e];
          dot += u[e] * qhg[e];  // sum (w dq) u r
        }
        float* dqr = dQR.data() + static_cast<size_t>(t) * nq + (static_cast<size_t>(h) * G + g) * D;
        for (int e = 0; e < D; ++e) {
          const double v = rq[g] * (u[e] - qhg[e] * dot / D);
          dqr[e] = static_cast<float>(v);
          dbq[(static_cast<size_t>(h) * G + g) * D + e] += v;
        }
      }
      double dot = 0;
      for (int e = 0; e < D; ++e) {
        dkn[e] += dk[e] * kh[e];
        u[e] = L.k_norm[e] * dk[e];
        dot += u[e] * kh[e];
      }
      float* dkr = dKR.data() + static_cast<size_t>(t) * nk + static_cast<size_t>(h) * D;
      for (int e = 0; e < D; ++e) dkr[e] = static_cast<float>(rk * (u[e] - kh[e] * dot / D));
    }
  if (grad) {
    // dWq += dQR^T X, dWk += dKR^T X.
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nq, in, n, 1.0f, dQR.data(), nq, x, in, 1.0f, grad->wq.data(), in);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, in, n, 1.0f, dKR.data(), nk, x, in, 1.0f, grad->wk.data(), in);
    auto add = [](std::vector<float>& dst, const std::vector<double>& src) {
      for (size_t i = 0; i < src.size(); ++i) dst[i] += static_cast<float>(src[i]);
    };
    add(grad->bq, dbq);
    add(grad->q_norm, dqn);
    add(grad->k_norm, dkn);
    add(grad->k_base, dkb);
    add(grad->b, db);
  }
  return loss / n;
}

FastKVzipData collect_fastkvzip_data(const Model& model, const std::vector<std::vector<Token>>& docs,
                                     const KVzipOptions& opt, const std::function<void(size_t, size_t)>& progress) {
  const HParams& hp = model.hparams();
  const int L = hp.n_layer, H = hp.n_head_kv, d = hp.n_embd;
  FastKVzipData data;
  data.X.assign(L, {});
  data.Y.assign(L, {});
  for (size_t di = 0; di < docs.size(); ++di) {
    const std::vector<Token>& doc = docs[di];
    if (doc.empty()) continue;
    const int n = static_cast<int>(doc.size());
    SessionOptions so;
    so.n_ctx = 2 * n + 64;  // the context and its replay (instruction + the whole context in one chunk)
    Session s(model, so);
    std::vector<std::vector<float>> xs(L, std::vector<float>(static_cast<size_t>(n) * d));
    AfterQKV collect([&](const LayerStep& st) {
      for (int t = 0; t < st.n; ++t)
        if (st.positions[t] >= 0 && st.positions[t] < n)
          std::copy(st.attn_input + static_cast<size_t>(t) * d, st.attn_input + static_cast<size_t>(t + 1) * d,
                    xs[st.layer].begin() + static_cast<size_t>(st.positions[t]) * d);
    });
    s.forward(doc, false, &collect);
    KVzipOptions ko = opt;
    ko.chunk = std::max(ko.chunk, 16);
    Scores sc = kvzip_replay_scores(s, doc, 0, ko);
    for (int l = 0; l < L; ++l) {
      data.X[l].insert(data.X[l].end(), xs[l].begin(), xs[l].end());
      for (int i = 0; i < n; ++i)
        for (int h = 0; h < H; ++h) {
          // No eviction happened, so entry i of every segment is token i; unscored entries (NaN) are 0.
          const float v = sc[l][h][i];
          data.Y[l].push_back(std::isnan(v) ? 0.0f : std::clamp(v, 0.0f, 1.0f));
        }
    }
    data.rows += static_cast<size_t>(n);
    if (progress) progress(di + 1, docs.size());
  }
  return data;
}

namespace {

void gather(const std::vector<float>& src, int width, const std::vector<size_t>& rows, size_t b, size_t e,
            std::vector<float>& dst) {
  dst.resize((e - b) * width);
  for (size_t i = b; i < e; ++i)
    std::copy(src.begin() + rows[i] * width, src.begin() + (rows[i] + 1) * width, dst.begin() + (i - b) * width);
}

template <class F>
void each_tensor(FastKVzipGates::Layer& a, FastKVzipGates::Layer& b, FastKVzipGates::Layer& c, F f) {
  f(a.wq, b.wq, c.wq);
  f(a.bq, b.bq, c.bq);
  f(a.wk, b.wk, c.wk);
  f(a.q_norm, b.q_norm, c.q_norm);
  f(a.k_norm, b.k_norm, c.k_norm);
  f(a.k_base, b.k_base, c.k_base);
  f(a.b, b.b, c.b);
}

}  // namespace

FastKVzipTrainResult train_fastkvzip(const Model& model, const FastKVzipData& data, const FastKVzipTrainOptions& opt,
                                     const std::function<void(int, int)>& on_step) {
  const auto t0 = std::chrono::steady_clock::now();
  const HParams& hp = model.hparams();
  const int L = hp.n_layer, H = hp.n_head_kv, in = hp.n_embd;
  const int G = opt.n_group > 0 ? opt.n_group : std::max(1, hp.n_head / std::max(1, hp.n_head_kv));
  if (data.rows == 0 || data.X.size() != static_cast<size_t>(L) || data.Y.size() != static_cast<size_t>(L))
    throw Error("fastkvzip-train: no training data (give documents)");
  for (int l = 0; l < L; ++l)
    if (data.X[l].size() != data.rows * in || data.Y[l].size() != data.rows * H)
      throw Error(fmt::format("fastkvzip-train: layer {} data do not fit the model (n_embd {}, {} KV heads)", l, in, H));
  if (opt.steps < 1 || opt.batch < 1 || !(opt.lr > 0) || opt.test_every < 2)
    throw Error(fmt::format("fastkvzip-train: steps {} and batch {} must be >= 1, lr {} > 0, test_every {} >= 2",
                            opt.steps, opt.batch, opt.lr, opt.test_every));
  FastKVzipTrainResult r;
  r.gates = FastKVzipGates::shaped(L, in, H, G, opt.dim, opt.n_sink);
  std::mt19937_64 rng(opt.seed);
  // torch's nn.Linear initialisation: weight and bias U(-1/sqrt(in), 1/sqrt(in)).
  const float bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(in)));
  std::uniform_real_distribution<float> U(-bound, bound);
  for (auto& Ly : r.gates.layers) {
    for (float& v : Ly.wq) v = U(rng);
    for (float& v : Ly.bq) v = U(rng);
    for (float& v : Ly.wk) v = U(rng);
  }
  std::vector<size_t> train, test;
  for (size_t i = 0; i < data.rows; ++i) ((i + 1) % opt.test_every == 0 ? test : train).push_back(i);
  if (train.empty()) throw Error("fastkvzip-train: every row is held out (too few tokens)");
  r.train_rows = train.size();
  r.test_rows = test.size();
  auto evaluate = [&](std::vector<double>& loss, std::vector<double>* acc) {
    loss.assign(L, 0.0);
    if (acc) acc->assign(L, 0.0);
    if (test.empty()) return;
    parallel_for(L, [&](int64_t a, int64_t b) {
      std::vector<float> X, Y, P;
      for (int64_t l = a; l < b; ++l) {
        gather(data.X[l], in, test, 0, test.size(), X);
        gather(data.Y[l], H, test, 0, test.size(), Y);
        loss[l] = fastkvzip_layer_loss(r.gates, static_cast<int>(l), X.data(), Y.data(), static_cast<int>(test.size()));
        if (acc) {
          P.resize(Y.size());
          r.gates.predict(static_cast<int>(l), X.data(), static_cast<int>(test.size()), P.data());
          size_t ok = 0;
          for (size_t i = 0; i < P.size(); ++i) ok += (P[i] >= 0.05f) == (Y[i] >= 0.05f);
          (*acc)[l] = double(ok) / P.size();
        }
      }
    });
  };
  evaluate(r.test_loss_init, nullptr);
  const size_t batch = std::min<size_t>(opt.batch, train.size());
  const size_t n_split = std::max<size_t>(1, train.size() / batch);
  std::vector<FastKVzipGates::Layer> mom(r.gates.layers), grads(r.gates.layers);
  for (auto& m : mom) each_tensor(m, m, m, [](std::vector<float>& a, std::vector<float>&, std::vector<float>&) {
      std::fill(a.begin(), a.end(), 0.0f);
    });
  std::vector<size_t> order = train;
  for (int step = 0; step < opt.steps; ++step) {
    const size_t split = static_cast<size_t>(step) % n_split;
    if (split == 0) std::shuffle(order.begin(), order.end(), rng);
    const size_t b = split * batch, e = b + batch;
    const float lr = static_cast<float>(opt.lr * fastkvzip_lr_scale(step, opt.steps));
    const float mu = static_cast<float>(opt.momentum);
    const bool first = step == 0;
    parallel_for(L, [&](int64_t la, int64_t lb) {
      std::vector<float> X, Y;
      for (int64_t l = la; l < lb; ++l) {
        gather(data.X[l], in, order, b, e, X);
        gather(data.Y[l], H, order, b, e, Y);
        FastKVzipGates::Layer& g = grads[l];
        each_tensor(g, g, g, [](std::vector<float>& a, std::vector<float>&, std::vector<float>&) {
          std::fill(a.begin(), a.end(), 0.0f);
        });
        fastkvzip_layer_loss(r.gates, static_cast<int>(l), X.data(), Y.data(), static_cast<int>(e - b), &g);
        // torch.optim.SGD with momentum: buf = mu buf + grad (buf = grad at the first step); p -= lr buf.
        each_tensor(r.gates.layers[l], mom[l], g, [&](std::vector<float>& p, std::vector<float>& m, std::vector<float>& gr) {
          for (size_t i = 0; i < p.size(); ++i) {
            m[i] = first ? gr[i] : mu * m[i] + gr[i];
            p[i] -= lr * m[i];
          }
        });
      }
    });
    if (on_step && ((step + 1) % 100 == 0 || step + 1 == opt.steps)) on_step(step + 1, opt.steps);
  }
  evaluate(r.test_loss, &r.test_accuracy);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace kvslim
