// Fast KVzip (arXiv 2601.17668; kvpress fastkvzip_press.py, github.com/Janghyun1230/FastKVzip):
// the gate by hand and against a float64 recomputation written here from the formula, the training
// objective (binary cross-entropy) and its gradient against float64 finite differences, the
// learning-rate schedule by hand, training on the story model, the GGUF file, and the press's
// selection against the reference's rule recomputed from the recorded attention inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <tuple>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvslim/error.h"
#include "kvslim/generate.h"
#include "model/session.h"
#include "model/layer_hook.h"
#include "press/scorers/fastkvzip.h"
#include "train/fastkvzip_train.h"
#include "support/files.h"
#include "support/press_util.h"

using namespace kvslim;
using press_test::bundled_model;
using press_test::story_tokens;

namespace {

/// The gate's parameters of one layer in float64 (test-side copy), and its forward pass written
/// from the paper's / kvpress's formula: per group, softmax share of the token's own logit among it
/// and the learned sink logits; mean over groups.
struct Ref {
  int in, H, G, D, S;
  double eps;
  std::vector<double> wq, bq, wk, qn, kn, kb, b;
};

Ref ref_of(const FastKVzipGates& g, int layer) {
  const auto& L = g.layers[layer];
  auto d = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  return {g.input_dim, g.n_head_kv, g.n_group, g.dim, g.n_sink, g.eps, d(L.wq), d(L.bq), d(L.wk), d(L.q_norm),
          d(L.k_norm), d(L.k_base), d(L.b)};
}

std::vector<double> rms(const std::vector<double>& u, const double* w, double eps) {
  double ms = 0;
  for (double x : u) ms += x * x;
  ms /= u.size();
  std::vector<double> y(u.size());
  for (size_t e = 0; e < u.size(); ++e) y[e] = w[e] * u[e] / std::sqrt(ms + eps);
  return y;
}

double ref_score(const Ref& r, const float* x, int h) {
  std::vector<double> kr(r.D);
  for (int e = 0; e < r.D; ++e)
    for (int i = 0; i < r.in; ++i) kr[e] += r.wk[(h * r.D + e) * r.in + i] * x[i];
  const auto k = rms(kr, r.kn.data(), r.eps);
  double mean = 0;
  for (int g = 0; g < r.G; ++g) {
    std::vector<double> qr(r.D);
    for (int e = 0; e < r.D; ++e) {
      const int row = (h * r.G + g) * r.D + e;
      qr[e] = r.bq[row];
      for (int i = 0; i < r.in; ++i) qr[e] += r.wq[row * r.in + i] * x[i];
    }
    const auto q = rms(qr, r.qn.data(), r.eps);
    double l = r.b[h * r.G + g];
    for (int e = 0; e < r.D; ++e) l += k[e] * q[e] / std::sqrt(double(r.D));
    if (r.S == 0) {
      mean += 1 / (1 + std::exp(-l));
      continue;
    }
    double z = 0;
    for (int j = 0; j < r.S; ++j) {
      double s = 0;
      for (int e = 0; e < r.D; ++e) s += r.kb[(h * r.S + j) * r.D + e] * q[e] / std::sqrt(double(r.D));
      z += std::exp(s - l);
    }
    mean += 1 / (1 + z);  // kvpress: 1 / (1 + sum exp(logit_base - logit))
  }
  return mean / r.G;
}

/// The reference's loss (utils.py loss_fn "cnt"): per head, mean over tokens of torch's binary
/// cross-entropy (logs clamped at -100); summed over heads.
double ref_loss(const Ref& r, const float* x, const float* y, int n) {
  double total = 0;
  for (int h = 0; h < r.H; ++h) {
    double s = 0;
    for (int t = 0; t < n; ++t) {
      const double p = ref_score(r, x + t * r.in, h), yt = y[t * r.H + h];
      s -= yt * std::max(std::log(p), -100.0) + (1 - yt) * std::max(std::log(1 - p), -100.0);
    }
    total += s / n;
  }
  return total;
}

FastKVzipGates random_gates(int L, int in, int H, int G, int D, int S, uint32_t seed, double scale = 0.5) {
  FastKVzipGates g = FastKVzipGates::shaped(L, in, H, G, D, S);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (auto& Ly : g.layers) {
    for (auto* v : {&Ly.wq, &Ly.bq, &Ly.wk, &Ly.k_base, &Ly.b})
      for (float& x : *v) x = static_cast<float>(scale) * nd(rng);
    for (float& x : Ly.q_norm) x = 1.0f + 0.2f * nd(rng);
    for (float& x : Ly.k_norm) x = 1.0f + 0.2f * nd(rng);
  }
  return g;
}

std::vector<float> normal(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

}  // namespace

// By hand, eps = 0: x = (1, 0), Wk = I -> k = (1, 0) / sqrt(1/2) = (sqrt 2, 0); Wq = I, bq = (0, 1)
// -> q = (1, 1) / 1 = (1, 1); l = k.q / sqrt(2) + b = 1. Sinks k_base = (sqrt 2, 0) and (0, 0) give
// logits 1 and 0: p = e / (e + e + 1). Without sinks: sigmoid(1). A second group with bq = (1, 0)
// and b = -1: q = (2, 0) / sqrt(2) = (sqrt 2, 0), l = 2 / sqrt 2 * sqrt 2 / sqrt 2 ... = sqrt(2) *
// sqrt(2) / sqrt(2) - 1 = sqrt(2) - 1; sink logits 2 / sqrt 2 = sqrt 2 and 0.
TEST(FastKVzip, GateByHand) {
  const double e = std::exp(1.0), r2 = std::sqrt(2.0);
  for (int S : {2, 0}) {
    FastKVzipGates g = FastKVzipGates::shaped(1, 2, 1, 2, 2, S);
    g.eps = 0;
    auto& L = g.layers[0];
    L.wk = {1, 0, 0, 1};
    L.wq = {1, 0, 0, 1, 1, 0, 0, 1};
    L.bq = {0, 1, 1, 0};
    L.b = {0, -1};
    if (S) L.k_base = {static_cast<float>(r2), 0, 0, 0};
    const float x[2] = {1, 0};
    float p;
    g.predict(0, x, 1, &p);
    double p0, p1;
    if (S) {
      p0 = e / (2 * e + 1);
      const double l1 = r2 - 1;  // k . q1 / sqrt 2 = (sqrt 2 * sqrt 2) / sqrt 2 - 1
      p1 = std::exp(l1) / (std::exp(l1) + std::exp(r2) + 1);
    } else {
      p0 = 1 / (1 + std::exp(-1.0));
      p1 = 1 / (1 + std::exp(-(r2 - 1)));
    }
    EXPECT_NEAR(p, (p0 + p1) / 2, 1e-7) << "sinks " << S;
  }
}

TEST(FastKVzip, GateMatchesFloat64Recomputation) {
  const int in = 12, H = 3, G = 2, D = 4, S = 5, n = 9;
  const FastKVzipGates g = random_gates(2, in, H, G, D, S, 7);
  const auto x = normal(static_cast<size_t>(n) * in, 8);
  for (int l = 0; l < 2; ++l) {
    std::vector<float> out(n * H);
    g.predict(l, x.data(), n, out.data());
    const Ref r = ref_of(g, l);
    for (int t = 0; t < n; ++t)
      for (int h = 0; h < H; ++h) {
        const double want = ref_score(r, &x[t * in], h);
        EXPECT_NEAR(out[t * H + h], want, 1e-7 + 1e-6 * want) << l << " " << t << " " << h;
        EXPECT_GT(out[t * H + h], 0.0f);
        EXPECT_LT(out[t * H + h], 1.0f);
      }
  }
}

// Loss against the float64 recomputation; gradient against central differences of it (h = 1e-4
// in float64 on the test's copy of the parameters), for every tensor.
TEST(FastKVzip, LossAndGradientMatchFloat64) {
  const int in = 6, H = 2, G = 2, D = 4, S = 3, n = 7;
  for (int sinks : {S, 0}) {
    const FastKVzipGates g = random_gates(1, in, H, G, D, sinks, 11);
    const auto x = normal(static_cast<size_t>(n) * in, 12);
    std::vector<float> y(n * H);
    std::mt19937 rng(13);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (float& v : y) v = u(rng) < 0.3f ? 0.0f : u(rng);
    FastKVzipGates::Layer grad = FastKVzipGates::shaped(1, in, H, G, D, sinks).layers[0];
    for (auto* v : {&grad.wq, &grad.bq, &grad.wk, &grad.q_norm, &grad.k_norm, &grad.k_base, &grad.b})
      std::fill(v->begin(), v->end(), 0.0f);
    const double loss = fastkvzip_layer_loss(g, 0, x.data(), y.data(), n, &grad);
    const Ref r0 = ref_of(g, 0);
    EXPECT_NEAR(loss, ref_loss(r0, x.data(), y.data(), n), 1e-5 * std::fabs(loss));
    // Also without the gradient: the same value.
    EXPECT_DOUBLE_EQ(fastkvzip_layer_loss(g, 0, x.data(), y.data(), n), loss);
    struct T {
      const char* name;
      std::vector<double> Ref::*ref;
      std::vector<float> FastKVzipGates::Layer::*grad;
    };
    const T tensors[] = {{"wq", &Ref::wq, &FastKVzipGates::Layer::wq},       {"bq", &Ref::bq, &FastKVzipGates::Layer::bq},
                         {"wk", &Ref::wk, &FastKVzipGates::Layer::wk},       {"q_norm", &Ref::qn, &FastKVzipGates::Layer::q_norm},
                         {"k_norm", &Ref::kn, &FastKVzipGates::Layer::k_norm}, {"k_base", &Ref::kb, &FastKVzipGates::Layer::k_base},
                         {"b", &Ref::b, &FastKVzipGates::Layer::b}};
    for (const T& t : tensors) {
      const size_t size = (r0.*t.ref).size();
      for (size_t i = 0; i < size; i += std::max<size_t>(1, size / 7)) {
        Ref a = r0, b = r0;
        const double h = 1e-4;
        (a.*t.ref)[i] += h;
        (b.*t.ref)[i] -= h;
        const double fd = (ref_loss(a, x.data(), y.data(), n) - ref_loss(b, x.data(), y.data(), n)) / (2 * h);
        EXPECT_NEAR((grad.*t.grad)[i], fd, 2e-4 + 2e-3 * std::fabs(fd)) << t.name << "[" << i << "] sinks " << sinks;
      }
    }
  }
}

// utils.py lr_schedule at 5,000 steps, by hand: 0.01 x step below step 50, 1 until 2,500, 0.5
// until 3,750, then 0.25.
TEST(FastKVzip, LearningRateScheduleByHand) {
  EXPECT_DOUBLE_EQ(fastkvzip_lr_scale(0, 5000), 0.0);
  EXPECT_DOUBLE_EQ(fastkvzip_lr_scale(10, 5000), 0.1);
  EXPECT_DOUBLE_EQ(fastkvzip_lr_scale(49, 5000), 0.49);
  EXPECT_DOUBLE_EQ(fastkvzip_lr_scale(50, 5000), 1.0);
  EXPECT_DOUBLE_EQ(fastkvzip_lr_scale(2499, 5000), 1.0);
  EXPECT_DOUBLE_EQ(fastkvzip_lr_scale(2500, 5000), 0.5);
  EXPECT_DOUBLE_EQ(fastkvzip_lr_scale(3749, 5000), 0.5);
  EXPECT_DOUBLE_EQ(fastkvzip_lr_scale(3750, 5000), 0.25);
  EXPECT_DOUBLE_EQ(fastkvzip_lr_scale(4999, 5000), 0.25);
}

// A student gate learns the scores of a teacher gate of the same shape (targets in (0, 1) that a
// gate can fit exactly): the held-out loss falls most of the way to the teacher's own (the
// entropy floor), starting from torch's initialisation.
TEST(FastKVzip, TrainingFitsATeacherGate) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  const int n = 3000;
  const FastKVzipGates teacher = random_gates(hp.n_layer, hp.n_embd, hp.n_head_kv, 2, 16, 16, 21, 0.3);
  FastKVzipData data;
  data.rows = n;
  data.X.assign(hp.n_layer, {});
  data.Y.assign(hp.n_layer, {});
  std::vector<double> floor(hp.n_layer);
  for (int l = 0; l < hp.n_layer; ++l) {
    data.X[l] = normal(static_cast<size_t>(n) * hp.n_embd, 100 + l);
    data.Y[l].resize(static_cast<size_t>(n) * hp.n_head_kv);
    teacher.predict(l, data.X[l].data(), n, data.Y[l].data());
  }
  FastKVzipTrainOptions o;
  o.n_group = 2;
  o.steps = 300;
  o.batch = 100;
  const FastKVzipTrainResult r = train_fastkvzip(m, data, o);
  EXPECT_EQ(r.train_rows + r.test_rows, static_cast<size_t>(n));
  EXPECT_EQ(r.test_rows, static_cast<size_t>(n / 100));  // every 100th row (1-based)
  r.gates.check(hp, "trained");
  for (int l = 0; l < hp.n_layer; ++l) {
    // The teacher's loss on the held-out rows: the floor.
    std::vector<float> X, Y;
    for (int i = 99; i < n; i += 100) {
      X.insert(X.end(), data.X[l].begin() + static_cast<size_t>(i) * hp.n_embd,
               data.X[l].begin() + static_cast<size_t>(i + 1) * hp.n_embd);
      Y.insert(Y.end(), data.Y[l].begin() + static_cast<size_t>(i) * hp.n_head_kv,
               data.Y[l].begin() + static_cast<size_t>(i + 1) * hp.n_head_kv);
    }
    floor[l] = fastkvzip_layer_loss(teacher, l, X.data(), Y.data(), static_cast<int>(X.size() / hp.n_embd));
    EXPECT_LT(r.test_loss[l] - floor[l], 0.5 * (r.test_loss_init[l] - floor[l]))
        << "layer " << l << ": init " << r.test_loss_init[l] << " trained " << r.test_loss[l] << " floor " << floor[l];
  }
}

TEST(FastKVzip, GatesFileRoundTripsAndIsChecked) {
  const HParams& hp = bundled_model().hparams();
  const FastKVzipGates g = random_gates(hp.n_layer, hp.n_embd, hp.n_head_kv, 2, 4, 3, 5);
  const std::string path = temp_path("fastkvzip_gates.gguf");
  g.save(path, "stories260K");
  const FastKVzipGates back = FastKVzipGates::load(path);
  EXPECT_EQ(back.n_group, 2);
  EXPECT_EQ(back.dim, 4);
  EXPECT_EQ(back.n_sink, 3);
  EXPECT_EQ(back.eps, g.eps);
  for (int l = 0; l < hp.n_layer; ++l) {
    EXPECT_EQ(back.layers[l].wq, g.layers[l].wq);
    EXPECT_EQ(back.layers[l].bq, g.layers[l].bq);
    EXPECT_EQ(back.layers[l].wk, g.layers[l].wk);
    EXPECT_EQ(back.layers[l].q_norm, g.layers[l].q_norm);
    EXPECT_EQ(back.layers[l].k_norm, g.layers[l].k_norm);
    EXPECT_EQ(back.layers[l].k_base, g.layers[l].k_base);
    EXPECT_EQ(back.layers[l].b, g.layers[l].b);
  }
  back.check(hp, path);
  FastKVzipGates other = back;
  other.n_head_kv += 1;
  EXPECT_THROW(other.check(hp, path), Error);
  std::remove(path.c_str());
  EXPECT_THROW(FastKVzipGates::load(std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf"), Error);
  EXPECT_THROW(make_press_impl("fastkvzip", 0.5), Error);
  EXPECT_THROW(make_press_impl("fastkvzip:gates=/nonexistent/gates.gguf", 0.5), Error);
}

// The press against kvpress's rule recomputed here: gate scores (float64, from the attention inputs
// a plain forward pass records), the first n_sink entries and the last int(n x window_ratio) set
// above every score, floor(L x H x n x ratio) entries evicted by one bottom-k over all layers and
// heads (layerwise: floor(H x n x ratio) per layer, bottom-k over its heads). kvpress's class name
// and parameter names are accepted.
TEST(FastKVzip, PressKeepsWhatTheReferenceRuleKeeps) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  const int L = hp.n_layer, H = hp.n_head_kv, d = hp.n_embd;
  const FastKVzipGates g = random_gates(L, d, H, hp.n_head / H, 16, 16, 9, 0.4);
  const std::string path = temp_path("fastkvzip_press.gguf");
  g.save(path, "stories260K");
  const std::vector<Token> toks = story_tokens(150);
  const int n = static_cast<int>(toks.size());
  std::vector<std::vector<float>> xs(L, std::vector<float>(static_cast<size_t>(n) * d));
  {
    SessionOptions so;
    so.key_codec = so.value_codec = KVCodec::F32;
    so.n_ctx = 4096;
    Session s(m, so);
    AfterQKV rec([&](const LayerStep& st) {
      for (int t = 0; t < st.n; ++t)
        std::copy(st.attn_input + static_cast<size_t>(t) * d, st.attn_input + static_cast<size_t>(t + 1) * d,
                  xs[st.layer].begin() + static_cast<size_t>(st.positions[t]) * d);
    });
    s.forward(toks, false, &rec);
  }
  std::vector<std::vector<std::vector<double>>> sc(L, std::vector<std::vector<double>>(H, std::vector<double>(n)));
  const int window = static_cast<int>(n * 0.02);  // 3 at 150 tokens
  for (int l = 0; l < L; ++l) {
    const Ref r = ref_of(g, l);
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < n; ++t)
        sc[l][h][t] = (t < 4 || t >= n - window) ? 1.0 : ref_score(r, &xs[l][static_cast<size_t>(t) * d], h);
  }
  for (int layerwise : {0, 1})
    for (double ratio : {0.5, 0.8}) {
      SCOPED_TRACE(fmt::format("layerwise {} ratio {}", layerwise, ratio));
      // Expected: the evicted (layer, head, position) set.
      std::set<std::tuple<int, int, int>> evicted;
      auto bottom = [&](int l0, int l1, int64_t count) {
        std::vector<std::tuple<double, int, int, int>> all;
        for (int l = l0; l < l1; ++l)
          for (int h = 0; h < H; ++h)
            for (int t = 0; t < n; ++t) all.emplace_back(sc[l][h][t], l, h, t);
        std::sort(all.begin(), all.end());
        for (int64_t i = 0; i < count; ++i) evicted.emplace(std::get<1>(all[i]), std::get<2>(all[i]), std::get<3>(all[i]));
      };
      if (layerwise)
        for (int l = 0; l < L; ++l) bottom(l, l + 1, static_cast<int64_t>(double(H) * n * ratio));
      else
        bottom(0, L, static_cast<int64_t>(double(L) * H * n * ratio));
      auto press = make_press_impl(fmt::format("FastKVzipPress:compression_ratio={},gates={},layerwise={}", ratio, path,
                                          layerwise ? "True" : "False"),
                              0.0);
      EXPECT_EQ(press->describe().rfind("fastkvzip:", 0), 0u) << press->describe();
      auto s = press_test::prefill(*press, toks);
      size_t kept = 0;
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h) {
          std::vector<int32_t> want;
          for (int t = 0; t < n; ++t)
            if (!evicted.count({l, h, t})) want.push_back(t);
          EXPECT_EQ(s->cache().seg(l, h).positions(), want) << "layer " << l << " head " << h;
          kept += s->cache().seg(l, h).size();
        }
      EXPECT_EQ(kept, static_cast<size_t>(L) * H * n - evicted.size());
      // describe() parses back to the same press.
      EXPECT_EQ(make_press_impl(press->describe(), 0.0)->describe(), press->describe());
    }
  // Ratio 0 leaves the cache as no press does.
  auto none = make_press_impl("none", 0.0);
  auto zero = make_press_impl(fmt::format("fastkvzip:gates={}", path), 0.0);
  EXPECT_TRUE(press_test::same_cache(press_test::prefill(*none, toks)->cache(), press_test::prefill(*zero, toks)->cache()));
  std::remove(path.c_str());
}

namespace {

/// Runs `inner` and records every token's attention input [layer][position][n_embd] as the
/// forward pass hands it to the gates (with chunks, later chunks read the compressed cache, so
/// their inputs from layer 1 on differ from an unchunked pass).
class RecordingPress : public PressImpl {
 public:
  RecordingPress(std::unique_ptr<PressImpl> inner, int n_layer, int n_embd, int n)
      : inner_(std::move(inner)),
        xs(n_layer, std::vector<float>(static_cast<size_t>(n) * n_embd)),
        rec_([this, n_embd](const LayerStep& st) {
          for (int t = 0; t < st.n; ++t)
            std::copy(st.attn_input + static_cast<size_t>(t) * n_embd, st.attn_input + static_cast<size_t>(t + 1) * n_embd,
                      xs[st.layer].begin() + static_cast<size_t>(st.positions[t]) * n_embd);
        }) {}
  std::string describe() const override { return inner_->describe(); }
  ObservationNeeds needs() const override {
    ObservationNeeds r = inner_->needs();
    r.hooks.push_back(const_cast<AfterQKV*>(&rec_));
    return r;
  }
  void observe(const KVCache& c, const Model& m, const Observation& o) override { inner_->observe(c, m, o); }
  void apply(KVCache& c, const Model& m, const Observation& o, const Target& t) override { inner_->apply(c, m, o, t); }
  void reset() override { inner_->reset(); }
  double ratio() const override { return inner_->ratio(); }

 private:
  std::unique_ptr<PressImpl> inner_;

 public:
  std::vector<std::vector<float>> xs;

 private:
  AfterQKV rec_;
};

}  // namespace

// Chunked prefill: kvpress compresses once (no chunks); the authors' chunked prefill
// (github.com/Janghyun1230/FastKVzip prefill/model/wrapper.py `prefill`, kvcache.py `prune_chunk`)
// prunes after each chunk only the entries scored since the previous chunk, except the trailing
// local window, which waits for the next chunk, and never revisits a decision. Recomputed here:
// after a step that has seen n tokens, the entries older than the previous step's window are
// kept, the rest ranked by their float64 gate score (sinks and the last int(0.02 n) at 1.0), and
// the lowest go until floor(L x H x n x ratio) have left in all. One chunk = kvpress's rule.
TEST(FastKVzip, ChunkedPrefillDecidesEachChunkOnce) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  const int L = hp.n_layer, H = hp.n_head_kv, d = hp.n_embd;
  const FastKVzipGates g = random_gates(L, d, H, hp.n_head / H, 16, 16, 21, 0.4);
  const std::string path = temp_path("fastkvzip_chunks.gguf");
  g.save(path, "stories260K");
  const std::vector<Token> toks = story_tokens(300);
  const int n = static_cast<int>(toks.size()), chunk = 100;
  for (double ratio : {0.5, 0.75}) {
    SCOPED_TRACE(fmt::format("ratio {}", ratio));
    RecordingPress press(make_press_impl(fmt::format("fastkvzip:gates={}", path), ratio), L, d, n);
    auto s = press_test::prefill(press, toks, chunk);
    std::vector<std::vector<std::vector<double>>> gate(L, std::vector<std::vector<double>>(H, std::vector<double>(n)));
    for (int l = 0; l < L; ++l) {
      const Ref r = ref_of(g, l);
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < n; ++t) gate[l][h][t] = ref_score(r, &press.xs[l][static_cast<size_t>(t) * d], h);
    }
    // The rule, step by step: present[l][h] = positions still in the cache.
    std::vector<std::vector<std::vector<int>>> present(L, std::vector<std::vector<int>>(H));
    int64_t evicted = 0, decided = 0;
    std::vector<int> kept_after_first;  // layer 0 head 0, decided at the first step
    for (int seen = chunk; seen <= n; seen += chunk) {
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h)
          for (int t = seen - chunk; t < seen; ++t) present[l][h].push_back(t);
      const int window = static_cast<int>(seen * 0.02);
      std::vector<std::tuple<double, int, int, int>> undecided;  // (score, l, h, position)
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h)
          for (size_t i = 0; i < present[l][h].size(); ++i) {
            const int t = present[l][h][i];
            if (t < decided) continue;
            const double sc = (i < 4 || t >= seen - window) ? 1.0 : gate[l][h][t];
            undecided.emplace_back(sc, l, h, t);
          }
      std::sort(undecided.begin(), undecided.end());
      const int64_t go = static_cast<int64_t>(double(L) * H * seen * ratio) - evicted;
      ASSERT_GE(go, 0);
      ASSERT_LE(go, static_cast<int64_t>(undecided.size()));
      for (int64_t k = 0; k < go; ++k) {
        auto [sc, l, h, t] = undecided[k];
        ASSERT_LT(sc, 1.0) << "the rule would evict a window entry: pick another ratio";
        auto& v = present[l][h];
        v.erase(std::find(v.begin(), v.end(), t));
      }
      evicted += go;
      decided = seen - window;
      if (seen == chunk)
        for (int t : present[0][0])
          if (t < decided) kept_after_first.push_back(t);
    }
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h)
      {
        const auto& got = s->cache().seg(l, h).positions();
        std::vector<int32_t> want(present[l][h].begin(), present[l][h].end()), extra, missing;
        std::set_difference(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(extra));
        std::set_difference(want.begin(), want.end(), got.begin(), got.end(), std::back_inserter(missing));
        EXPECT_EQ(got, want) << "layer " << l << " head " << h << ": kept but not by the rule "
                             << fmt::format("{}", fmt::join(extra, ",")) << "; missing "
                             << fmt::format("{}", fmt::join(missing, ","));
      }
    // What the first chunk decided to keep is still there.
    const auto& p00 = s->cache().seg(0, 0).positions();
    for (int t : kept_after_first) EXPECT_TRUE(std::count(p00.begin(), p00.end(), t)) << t;
    // revisit=1 (kvslim's generic chunked rule) keeps as many entries, but re-ranks old ones: others.
    auto again = make_press_impl(fmt::format("fastkvzip:gates={},revisit=1", path), ratio);
    auto s2 = press_test::prefill(*again, toks, chunk);
    EXPECT_EQ(s2->cache().entries(), s->cache().entries());
    EXPECT_FALSE(press_test::same_cache(s2->cache(), s->cache()));
    // One chunk of the whole context is the unchunked (kvpress) press.
    auto once = make_press_impl(fmt::format("fastkvzip:gates={}", path), ratio);
    EXPECT_TRUE(press_test::same_cache(press_test::prefill(*once, toks, n)->cache(),
                                       press_test::prefill(*once, toks)->cache()));
  }
  std::remove(path.c_str());
}
