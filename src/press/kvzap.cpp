// KVzap: surrogate of KVzip+ scores (linear by ridge regression, or a GELU MLP trained with AdamW),
// applied as a threshold press with a sliding window in prefill and decode.
// Jegou et al., "KVzap: Fast, Adaptive, and Faithful KV Cache Pruning", arXiv 2601.07891.
#include "press/kvzap.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <random>

#include <cblas.h>
#include <fmt/format.h>

#include "kernels/threads.h"
#include "kvslim/gguf.h"
#include "press/authoring.h"
#include "press/param_file.h"
#include "kvslim/session.h"

namespace kvslim {

namespace {

inline float gelu(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }
inline float gelu_grad(float x) {
  return 0.5f * (1.0f + std::erf(x * 0.70710678118654752f)) + x * 0.39894228040143268f * std::exp(-0.5f * x * x);
}

/// Y[n][o] = X[n][i] W^T + b, W [o][i].
void linear(const float* X, int n, int in, const float* W, const float* b, int o, float* Y) {
  for (int t = 0; t < n; ++t) std::copy(b, b + o, Y + static_cast<size_t>(t) * o);
  BlasSlot slot1;  // see kernels/threads.h
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, o, in, 1.0f, X, in, W, in, 1.0f, Y, o);
}

}  // namespace

void KVzapSurrogate::predict(int layer, const float* x, int n, float* out) const {
  if (n <= 0) return;
  if (kind == Kind::Linear) {
    linear(x, n, input_dim, w1[layer].data(), b1[layer].data(), output_dim, out);
    return;
  }
  std::vector<float> h(static_cast<size_t>(n) * hidden_dim);
  linear(x, n, input_dim, w1[layer].data(), b1[layer].data(), hidden_dim, h.data());
  for (float& v : h) v = gelu(v);
  linear(h.data(), n, hidden_dim, w2[layer].data(), b2[layer].data(), output_dim, out);
}

void KVzapSurrogate::save(const std::string& path, const std::string& model_desc) const {
  GGUFWriter w;
  w.set("general.architecture", GGUFValue::str("kvzap"));
  w.set("kvzap.kind", GGUFValue::str(kind_name()));
  w.set("kvzap.base_model", GGUFValue::str(model_desc));
  w.set("kvzap.n_layer", GGUFValue::u32(n_layer));
  w.set("kvzap.input_dim", GGUFValue::u32(input_dim));
  w.set("kvzap.output_dim", GGUFValue::u32(output_dim));
  w.set("kvzap.hidden_dim", GGUFValue::u32(kind == Kind::MLP ? hidden_dim : 0));
  const int mid = kind == Kind::MLP ? hidden_dim : output_dim;
  for (int l = 0; l < n_layer; ++l) {
    w.add_tensor_f32(fmt::format("kvzap.{}.w1", l), GGMLType::F32, {input_dim, mid}, w1[l]);
    w.add_tensor_f32(fmt::format("kvzap.{}.b1", l), GGMLType::F32, {mid}, b1[l]);
    if (kind == Kind::MLP) {
      w.add_tensor_f32(fmt::format("kvzap.{}.w2", l), GGMLType::F32, {hidden_dim, output_dim}, w2[l]);
      w.add_tensor_f32(fmt::format("kvzap.{}.b2", l), GGMLType::F32, {output_dim}, b2[l]);
    }
  }
  w.write(path);
}

KVzapSurrogate KVzapSurrogate::load(const std::string& path) {
  auto f = GGUFFile::open(path);
  KVzapSurrogate s;
  std::string kind = f->get_string("kvzap.kind");
  if (kind == "linear") s.kind = Kind::Linear;
  else if (kind == "mlp") s.kind = Kind::MLP;
  else throw Error(fmt::format("{}: kvzap.kind '{}' is neither linear nor mlp", path, kind));
  s.n_layer = static_cast<int>(f->get_int("kvzap.n_layer"));
  s.input_dim = static_cast<int>(f->get_int("kvzap.input_dim"));
  s.output_dim = static_cast<int>(f->get_int("kvzap.output_dim"));
  s.hidden_dim = static_cast<int>(f->get_int("kvzap.hidden_dim", 0));
  if (s.n_layer < 1 || s.input_dim < 1 || s.output_dim < 1 || (s.kind == Kind::MLP && s.hidden_dim < 1))
    throw Error(fmt::format("{}: bad kvzap shape (n_layer {}, input_dim {}, output_dim {}, hidden_dim {})", path,
                            s.n_layer, s.input_dim, s.output_dim, s.hidden_dim));
  const int mid = s.kind == Kind::MLP ? s.hidden_dim : s.output_dim;
  auto get = [&](const std::string& name, int64_t count) {
    const TensorInfo& t = f->tensor(name);
    if (t.nelements() != count)
      throw Error(fmt::format("{}: tensor {} has {} values, expected {}", path, name, t.nelements(), count));
    return f->tensor_f32(t);
  };
  for (int l = 0; l < s.n_layer; ++l) {
    s.w1.push_back(get(fmt::format("kvzap.{}.w1", l), int64_t(mid) * s.input_dim));
    s.b1.push_back(get(fmt::format("kvzap.{}.b1", l), mid));
    if (s.kind == Kind::MLP) {
      s.w2.push_back(get(fmt::format("kvzap.{}.w2", l), int64_t(s.output_dim) * s.hidden_dim));
      s.b2.push_back(get(fmt::format("kvzap.{}.b2", l), s.output_dim));
    }
  }
  return s;
}

void KVzapSurrogate::check(const HParams& hp, const std::string& what) const {
  if (n_layer != hp.n_layer || input_dim != hp.n_embd || output_dim != hp.n_head_kv)
    throw Error(fmt::format("{}: surrogate for {} layers, n_embd {}, {} KV heads does not fit the model ({} layers, "
                            "n_embd {}, {} KV heads)",
                            what, n_layer, input_dim, output_dim, hp.n_layer, hp.n_embd, hp.n_head_kv));
}

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
      linear(xb.data(), nb, d, W1.data(), b1.data(), h, hp.data());
      for (size_t i = 0; i < static_cast<size_t>(nb) * h; ++i) a[i] = gelu(hp[i]);
      linear(a.data(), nb, h, W2.data(), b2.data(), k, out.data());
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

namespace {

/// Makes the `threshold` policy (DMS: sliding window, then score < tau leaves).
std::unique_ptr<BudgetPolicy> threshold_policy(double tau, int window, bool decoding) {
  const PressInfo* t = PressRegistry::instance().find("threshold");
  if (!t || !t->make_policy) throw Error("press kvzap: the threshold policy is not registered");
  return t->make_policy({{"tau", fmt::format("{}", tau)}, {"window", fmt::format("{}", window)},
                         {"decode", decoding ? "1" : "0"}});
}

/// KVzap's scorer: each entry gets the surrogate's prediction from its token's attention input
/// when it is created (prefill and decode), kept by position. By default under the threshold
/// policy (DMS), which evicts what leaves the sliding window under tau.
class KVzapPress : public ScorerPress, private LayerHook {
 public:
  KVzapPress(std::shared_ptr<const KVzapSurrogate> s, std::string path, double tau, int window, bool decoding)
      : ScorerPress(0.0, threshold_policy(tau, window, decoding)),
        sur_(std::move(s)),
        path_(std::move(path)),
        default_policy_(policy().describe()),
        tau_(tau),
        window_(window),
        decoding_(decoding) {}

  std::string describe_scorer() const override { return fmt::format("kvzap:surrogate={}", path_); }
  // The threshold policy is KVzap's own: the spec stays "kvzap:..." so that it parses back.
  std::string describe() const override {
    if (policy().describe() != default_policy_) return ScorerPress::describe();
    return fmt::format("kvzap:surrogate={},threshold={},window={},decoding={}", path_, tau_, window_, decoding_ ? 1 : 0);
  }
  ObservationNeeds scorer_needs() const override {
    ObservationNeeds r;
    // The press itself, as the hook that scores every entry from its attention input.
    r.hooks.push_back(const_cast<KVzapPress*>(this));
    return r;
  }
  // Scoring happens in the forward pass; decode steps need it whether or not the policy acts then.
  ObservationNeeds decode_needs() const override { return scorer_needs(); }
  void reset() override {
    ScorerPress::reset();
    scores_.clear();
    scored_ = 0;
  }
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override {
    const int l = view.layer();
    for (int h = 0; h < view.hp().n_head_kv; ++h) {
      const Segment& s = view.seg(h);
      out[h].resize(s.size());
      for (size_t i = 0; i < s.size(); ++i) {
        // Entries created without the surrogate watching (e.g. a question) are never evicted.
        float v = kProtected;
        if (l < static_cast<int>(scores_.size())) {
          auto it = scores_[l][h].find(s.positions()[i]);
          if (it != scores_[l][h].end()) v = it->second;
        }
        out[h][i] = v;
      }
    }
  }
  void apply(KVCache& cache, const Model& model, const Observation& obs, const Target& target) override {
    if (checked_ != &model) {
      sur_->check(model.hparams(), path_);
      checked_ = &model;
    }
    ScorerPress::apply(cache, model, obs, target);
    for (size_t l = 0; l < scores_.size(); ++l)
      for (size_t h = 0; h < scores_[l].size(); ++h) {
        const auto& pos = cache.seg(static_cast<int>(l), static_cast<int>(h)).positions();
        std::map<int32_t, float> kept;
        for (int32_t p : pos) {
          auto it = scores_[l][h].find(p);
          if (it != scores_[l][h].end()) kept.emplace_hint(kept.end(), *it);
        }
        scores_[l][h].swap(kept);
      }
  }
  /// Entries the surrogate scored in this request.
  size_t scored() const { return scored_; }
  std::string report() const override {
    size_t kept = 0;
    for (const auto& layer : scores_)
      for (const auto& m : layer) kept += m.size();
    if (!scored_) return {};
    return fmt::format("kvzap: {} entries scored by the {} surrogate, {} still cached: {:.1f}% of them evicted",
                       scored_, sur_->kind_name(), kept, 100.0 * (1.0 - double(kept) / scored_));
  }

 private:
  void after_qkv(const LayerStep& s) override { predict(s.layer, s.attn_input, s.n, s.hp->n_embd, s.positions); }
  void predict(int layer, const float* x, int n, int dim, const int32_t* pos) {
    if (dim != sur_->input_dim)
      throw Error(fmt::format("{}: surrogate input_dim {} does not fit the model's n_embd {}", path_, sur_->input_dim,
                              dim));
    if (layer >= sur_->n_layer || n <= 0) return;
    const int H = sur_->output_dim;
    if (scores_.size() != static_cast<size_t>(sur_->n_layer)) scores_.assign(sur_->n_layer, std::vector<std::map<int32_t, float>>(H));
    std::vector<float> out(static_cast<size_t>(n) * H);
    sur_->predict(layer, x, n, out.data());
    for (int t = 0; t < n; ++t)
      for (int h = 0; h < H; ++h) scores_[layer][h][pos[t]] = out[static_cast<size_t>(t) * H + h];
    scored_ += static_cast<size_t>(n) * H;
  }

  std::shared_ptr<const KVzapSurrogate> sur_;
  std::string path_, default_policy_;
  double tau_;
  int window_;
  bool decoding_;
  const Model* checked_ = nullptr;
  std::vector<std::vector<std::map<int32_t, float>>> scores_;  // [layer][kv head]: position -> score
  size_t scored_ = 0;
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "kvzap";
  i.summary = "surrogate-predicted KVzip+ scores at entry creation; default policy threshold (evict below tau once "
              "outside a sliding window, in prefill and decode)";
  i.source = "Jegou et al. 2026, KVzap: Fast, Adaptive, and Faithful KV Cache Pruning, arXiv 2601.07891";
  i.params = {{"surrogate", ""}, {"threshold", "-4"}, {"window", "128"}, {"decoding", "1"}};
  i.make = [](const PressParams& p) -> std::unique_ptr<Press> {
    std::string path = param_file(p, "kvzap", "surrogate");
    double tau = param_double(p, "kvzap", "threshold");
    int window = param_int(p, "kvzap", "window"), dec = param_int(p, "kvzap", "decoding");
    if (window < 0) throw Error(fmt::format("press kvzap: window={} must be >= 0", window));
    if (dec != 0 && dec != 1) throw Error(fmt::format("press kvzap: decoding={} must be 0 or 1", dec));
    if (path.empty()) throw Error("press kvzap: give surrogate=FILE (train one with `kvslim kvzap-train`)");
    auto s = std::make_shared<const KVzapSurrogate>(KVzapSurrogate::load(path));
    return std::make_unique<KVzapPress>(s, path, tau, window, dec == 1);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
