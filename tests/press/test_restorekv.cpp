// RestoreKV (arXiv 2608.01247; kvpress restorekv_press.py): the forward pass over input
// embeddings with a LoRA adapter (model/input_override.h, model/lora.h) against an independent
// float64 re-computation and against the token path, the file of embeddings and adapter, and the
// press: budget arithmetic derived by hand from kvpress's rule, positions n .. n + R - 1 for the
// restore entries and n + R on for the question, the restore pass over the whole cache.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kernels/matmul.h"
#include "kvslim/error.h"
#include "kvslim/gguf.h"
#include "kvslim/request.h"
#include "model/session.h"
#include "model/input_override.h"
#include "model/lora.h"
#include "press/scorers/restorekv.h"
#include "support/files.h"
#include "support/press_util.h"

using namespace kvslim;
using press_test::bundled_model;

namespace {

const std::vector<LoraTarget> kAllTargets = {LoraTarget::Q,    LoraTarget::K,  LoraTarget::V,   LoraTarget::O,
                                             LoraTarget::Gate, LoraTarget::Up, LoraTarget::Down};

/// An adapter of `rank` on all seven projections with random A and B (scale `sd`).
LoraAdapter random_lora(const HParams& hp, int rank, float alpha, uint32_t seed, float sd) {
  LoraAdapter a = LoraAdapter::zeros(hp, rank, alpha, kAllTargets);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  for (auto& layer : a.layers)
    for (auto& f : layer) {
      for (float& x : f.a) x = nd(rng);
      for (float& x : f.b) x = nd(rng);
    }
  return a;
}

std::vector<float> random_rows(int n, int d, uint32_t seed, float sd) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(static_cast<size_t>(n) * d);
  for (float& x : v) x = nd(rng);
  return v;
}

std::vector<Token> story_tokens(const Model& m, size_t n) {
  std::vector<Token> t = m.tokenizer().encode(slurp(std::string(KVSLIM_SOURCE_DIR) + "/models/story.txt"), true, false);
  EXPECT_GE(t.size(), n);
  t.resize(n);
  return t;
}

// ---- an independent float64 forward pass (llama layout, no rope_freqs / scaling / biases) ----

std::vector<double> dense(const WeightView& W) {
  std::vector<float> row(W.cols);
  std::vector<double> out(static_cast<size_t>(W.rows) * W.cols);
  for (int64_t r = 0; r < W.rows; ++r) {
    dequantize_row(W.type, W.row(r), row.data(), W.cols);
    for (int64_t c = 0; c < W.cols; ++c) out[r * W.cols + c] = row[c];
  }
  return out;
}

std::vector<double> matvec(const std::vector<double>& W, int rows, int cols, const std::vector<double>& x) {
  std::vector<double> y(rows, 0.0);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) y[r] += W[static_cast<size_t>(r) * cols + c] * x[c];
  return y;
}

/// y += alpha / rank * B (A x), in double.
void lora64(const LoraAdapter* a, int layer, LoraTarget t, const std::vector<double>& x, std::vector<double>& y) {
  if (!a) return;
  const auto& f = a->layers[layer][static_cast<int>(t)];
  const int r = a->rank, in = static_cast<int>(x.size()), out = static_cast<int>(y.size());
  std::vector<double> ax(r, 0.0);
  for (int k = 0; k < r; ++k)
    for (int c = 0; c < in; ++c) ax[k] += double(f.a[static_cast<size_t>(k) * in + c]) * x[c];
  for (int o = 0; o < out; ++o)
    for (int k = 0; k < r; ++k) y[o] += double(a->alpha) / r * double(f.b[static_cast<size_t>(o) * r + k]) * ax[k];
}

std::vector<double> rmsnorm64(const std::vector<double>& x, const std::vector<float>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double s = 1.0 / std::sqrt(ss / x.size() + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * s * w[i];
  return y;
}

struct Ref64 {
  std::vector<std::vector<double>> logits;  // [row][n_vocab]
  // [layer][row][n_head_kv * head_dim]: keys (RoPE applied) and values of every row
  std::vector<std::vector<std::vector<double>>> k, v;
};

/// Rows `inputs` ([row][n_embd]) at positions 0.. through the model; rows with lora_on[t] use the
/// adapter (RestoreKV: only the restore rows).
Ref64 forward64(const Model& m, const std::vector<std::vector<double>>& inputs, const std::vector<bool>& lora_on,
                const LoraAdapter* lora) {
  const HParams& hp = m.hparams();
  const int d = hp.n_embd, hd = hp.head_dim, nh = hp.n_head, nkv = hp.n_head_kv, G = nh / nkv, ff = hp.n_ff;
  const int n = static_cast<int>(inputs.size());
  Ref64 r;
  r.k.assign(hp.n_layer, {});
  r.v.assign(hp.n_layer, {});
  std::vector<std::vector<double>> x = inputs;
  for (int l = 0; l < hp.n_layer; ++l) {
    const LayerWeights& L = m.layer(l);
    const auto wq = dense(*L.wq), wk = dense(*L.wk), wv = dense(*L.wv), wo = dense(*L.wo), wg = dense(*L.w_gate),
               wu = dense(*L.w_up), wd = dense(*L.w_down);
    std::vector<std::vector<double>> q(n);
    for (int t = 0; t < n; ++t) {
      const LoraAdapter* a = lora_on[t] ? lora : nullptr;
      auto xn = rmsnorm64(x[t], L.attn_norm, hp.rms_eps);
      q[t] = matvec(wq, nh * hd, d, xn);
      auto kt = matvec(wk, nkv * hd, d, xn), vt = matvec(wv, nkv * hd, d, xn);
      lora64(a, l, LoraTarget::Q, xn, q[t]);
      lora64(a, l, LoraTarget::K, xn, kt);
      lora64(a, l, LoraTarget::V, xn, vt);
      // RoPE, llama layout: pairs (2i, 2i+1) turn by t * base^(-2i / head_dim).
      auto rot = [&](std::vector<double>& z, int heads) {
        for (int h = 0; h < heads; ++h)
          for (int i = 0; i < hd / 2; ++i) {
            const double th = t * std::pow(double(hp.rope_freq_base), -2.0 * i / hd);
            double& a0 = z[h * hd + 2 * i];
            double& a1 = z[h * hd + 2 * i + 1];
            const double x0 = a0, x1 = a1;
            a0 = x0 * std::cos(th) - x1 * std::sin(th);
            a1 = x0 * std::sin(th) + x1 * std::cos(th);
          }
      };
      rot(q[t], nh);
      rot(kt, nkv);
      r.k[l].push_back(kt);
      r.v[l].push_back(vt);
    }
    for (int t = 0; t < n; ++t) {
      const LoraAdapter* a = lora_on[t] ? lora : nullptr;
      std::vector<double> att(static_cast<size_t>(nh) * hd, 0.0);
      for (int h = 0; h < nh; ++h) {
        const int kvh = h / G;
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (int j = 0; j <= t; ++j) {
          double dot = 0;
          for (int e = 0; e < hd; ++e) dot += q[t][h * hd + e] * r.k[l][j][kvh * hd + e];
          s[j] = dot / std::sqrt(double(hd));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - mx));
        for (int j = 0; j <= t; ++j)
          for (int e = 0; e < hd; ++e) att[h * hd + e] += s[j] / z * r.v[l][j][kvh * hd + e];
      }
      auto o = matvec(wo, d, nh * hd, att);
      lora64(a, l, LoraTarget::O, att, o);
      for (int i = 0; i < d; ++i) x[t][i] += o[i];
      auto xn = rmsnorm64(x[t], L.ffn_norm, hp.rms_eps);
      auto g = matvec(wg, ff, d, xn), u = matvec(wu, ff, d, xn);
      lora64(a, l, LoraTarget::Gate, xn, g);
      lora64(a, l, LoraTarget::Up, xn, u);
      for (int i = 0; i < ff; ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      auto dn = matvec(wd, d, ff, g);
      lora64(a, l, LoraTarget::Down, g, dn);
      for (int i = 0; i < d; ++i) x[t][i] += dn[i];
    }
  }
  const auto wout = dense(m.output());
  for (int t = 0; t < n; ++t) r.logits.push_back(matvec(wout, hp.n_vocab, d, rmsnorm64(x[t], m.output_norm(), hp.rms_eps)));
  return r;
}

SessionOptions f32_session(bool exact) {
  SessionOptions o;
  o.key_codec = o.value_codec = KVCodec::F32;
  o.exact = exact;
  return o;
}

/// Runs `f`, which must throw kvslim::Error with every one of `parts` in its message.
template <class F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

/// The entry of segment (l, h) at position p: key and value.
void entry_at(const KVCache& c, int l, int h, int32_t p, std::vector<float>& k, std::vector<float>& v) {
  const Segment& s = c.seg(l, h);
  for (size_t i = 0; i < s.size(); ++i)
    if (s.positions()[i] == p) {
      k.resize(s.head_dim());
      v.resize(s.head_dim());
      s.keys(i, i + 1, k.data());
      s.values(i, i + 1, v.data());
      return;
    }
  ADD_FAILURE() << "no entry at position " << p << " in segment " << l << "," << h;
}

}  // namespace

// The token path and the embeddings path are one forward pass: the token rows of the embedding
// matrix given as inputs leave the same logits and cache, bit for bit, with no adapter and with
// an adapter whose B is zero.
TEST(RestoreKVForward, TokenEmbeddingRowsEqualTheTokenPath) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  const std::vector<Token> ctx = story_tokens(m, 40);
  const std::vector<Token> tail = {ctx[5], ctx[9], ctx[17], ctx[30], ctx[2]};
  std::vector<float> rows(tail.size() * hp.n_embd);
  for (size_t t = 0; t < tail.size(); ++t)
    dequantize_row(m.token_embd().type, m.token_embd().row(tail[t]), rows.data() + t * hp.n_embd, hp.n_embd);
  LoraAdapter zero_b = random_lora(hp, 4, 8.0f, 7, 0.5f);
  for (auto& layer : zero_b.layers)
    for (auto& f : layer) std::fill(f.b.begin(), f.b.end(), 0.0f);
  for (bool exact : {false, true})
    for (const LoraAdapter* lora : std::vector<const LoraAdapter*>{nullptr, &zero_b}) {
      Session a(m, f32_session(exact)), b(m, f32_session(exact));
      a.forward(ctx);
      b.forward(ctx);
      const std::vector<float> la = a.forward(tail, true);
      InputOverride over(rows.data(), static_cast<int>(tail.size()), hp.n_embd, lora);
      const std::vector<float> lb = b.forward_inputs(over, true);
      ASSERT_EQ(la.size(), lb.size());
      for (size_t i = 0; i < la.size(); ++i) ASSERT_EQ(la[i], lb[i]) << "logit " << i << " exact " << exact;
      EXPECT_EQ(a.next_position(), b.next_position());
      for (int l = 0; l < hp.n_layer; ++l)
        for (int h = 0; h < hp.n_head_kv; ++h) {
          const Segment &sa = a.cache().seg(l, h), &sb = b.cache().seg(l, h);
          ASSERT_EQ(sa.size(), sb.size());
          std::vector<float> ka(sa.size() * hp.head_dim), kb(ka.size()), va(ka.size()), vb(ka.size());
          sa.keys(0, sa.size(), ka.data());
          sb.keys(0, sb.size(), kb.data());
          sa.values(0, sa.size(), va.data());
          sb.values(0, sb.size(), vb.data());
          EXPECT_EQ(ka, kb);
          EXPECT_EQ(va, vb);
          EXPECT_EQ(sa.positions(), sb.positions());
        }
    }
}

// R learned rows at positions n .. n + R - 1 after a context of n tokens, with a LoRA adapter on
// all seven projections for those rows only, against a float64 re-computation of the whole model:
// every restore row's logits and every layer's restore keys (RoPE applied) and values.
TEST(RestoreKVForward, EmbeddingsWithLoraMatchFloat64) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  ASSERT_FALSE(hp.rope_neox);
  ASSERT_TRUE(m.rope_freqs().empty());
  ASSERT_EQ(hp.rope_freq_scale, 1.0f);
  const int n = 12, R = 3;
  const std::vector<Token> ctx = story_tokens(m, n);
  const std::vector<float> emb = random_rows(R, hp.n_embd, 11, 0.8f);
  const LoraAdapter lora = random_lora(hp, 2, 4.0f, 13, 0.1f);

  Session s(m, f32_session(true));
  s.forward(ctx);
  InputOverride over(emb.data(), R, hp.n_embd, &lora);
  const std::vector<float> logits = s.forward_inputs(over, true);
  EXPECT_EQ(s.next_position(), n + R);

  std::vector<std::vector<double>> in;
  std::vector<bool> on;
  std::vector<float> row(hp.n_embd);
  for (Token t : ctx) {
    dequantize_row(m.token_embd().type, m.token_embd().row(t), row.data(), hp.n_embd);
    in.emplace_back(row.begin(), row.end());
    on.push_back(false);
  }
  for (int r = 0; r < R; ++r) {
    in.emplace_back(emb.begin() + static_cast<size_t>(r) * hp.n_embd, emb.begin() + static_cast<size_t>(r + 1) * hp.n_embd);
    on.push_back(true);
  }
  const Ref64 ref = forward64(m, in, on, &lora);
  // The adapter must matter, or the comparison would not test it.
  const Ref64 plain = forward64(m, in, std::vector<bool>(in.size(), false), nullptr);
  double moved = 0;
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < hp.n_vocab; ++i) moved = std::max(moved, std::abs(ref.logits[n + r][i] - plain.logits[n + r][i]));
  EXPECT_GT(moved, 0.05);

  {
    // Calibration: the token path's own rows against the same float64 re-computation.
    Session t(m, f32_session(true));
    const std::vector<float> lt = t.forward(ctx, true);
    double w = 0;
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < hp.n_vocab; ++i)
        w = std::max(w, std::abs(lt[static_cast<size_t>(r) * hp.n_vocab + i] - ref.logits[r][i]) /
                            std::max(1.0, std::abs(ref.logits[r][i])));
    std::printf("context rows (token path) vs float64: worst relative error %.3g\n", w);
    EXPECT_LT(w, 5e-5);
  }
  // f32 sums over five layers: within 5e-5 relative to max(1, |value|), as the token path's rows
  // (measured: 5.7e-6 for those, 4.7e-6 for the restore rows; a misplaced or missing adapter term
  // moves the logits by more than 0.05, checked above).
  auto tol = [](double ref) { return 5e-5 * std::max(1.0, std::abs(ref)); };
  double worst = 0;
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < hp.n_vocab; ++i) {
      const double got = logits[static_cast<size_t>(r) * hp.n_vocab + i], want = ref.logits[n + r][i];
      worst = std::max(worst, std::abs(got - want) / std::max(1.0, std::abs(want)));
      ASSERT_NEAR(got, want, tol(want)) << "row " << r << " logit " << i;
    }
  std::vector<float> k, v;
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h)
      for (int r = 0; r < R; ++r) {
        entry_at(s.cache(), l, h, n + r, k, v);
        for (int e = 0; e < hp.head_dim; ++e) {
          const double wk = ref.k[l][n + r][h * hp.head_dim + e], wv = ref.v[l][n + r][h * hp.head_dim + e];
          worst = std::max(worst, std::abs(k[e] - wk) / std::max(1.0, std::abs(wk)));
          worst = std::max(worst, std::abs(v[e] - wv) / std::max(1.0, std::abs(wv)));
          ASSERT_NEAR(k[e], wk, tol(wk)) << "layer " << l << " head " << h;
          ASSERT_NEAR(v[e], wv, tol(wv)) << "layer " << l << " head " << h;
        }
      }
  RecordProperty("worst_relative_error", fmt::format("{:.3g}", worst));
  std::printf("restore rows vs float64: worst relative error %.3g\n", worst);
}

TEST(RestoreKVForward, OverrideErrors) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  const std::vector<float> emb = random_rows(2, hp.n_embd, 3, 1.0f);
  Session s(m, f32_session(false));
  s.forward(story_tokens(m, 8));
  InputOverride none(emb.data(), 0, hp.n_embd, nullptr);
  EXPECT_THROW(s.forward_inputs(none), Error);
  InputOverride narrow(emb.data(), 2, hp.n_embd - 1, nullptr);
  EXPECT_THROW(s.forward_inputs(narrow), Error);
  EXPECT_EQ(s.next_position(), 8);  // nothing ran
}

// ---- the file ----

namespace {

RestoreKVWeights random_weights(const HParams& hp, int R, uint32_t seed) {
  RestoreKVWeights w;
  w.n_embd = hp.n_embd;
  w.n_layer = hp.n_layer;
  w.n_tokens = R;
  w.embeddings = random_rows(R, hp.n_embd, seed, 0.8f);
  w.lora = random_lora(hp, 8, 16.0f, seed + 1, 0.1f);  // kvpress's test adapter: rank 8, alpha 16, all seven
  return w;
}

}  // namespace

TEST(RestoreKVFile, RoundTripAndMismatchesNameTheFileAndTensor) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  const RestoreKVWeights w = random_weights(hp, 8, 21);
  const std::string path = temp_path("restorekv_roundtrip.gguf");
  w.save(path, "stories260K");
  const RestoreKVWeights back = RestoreKVWeights::load(path);
  EXPECT_EQ(back.n_tokens, 8);
  EXPECT_EQ(back.embeddings, w.embeddings);
  EXPECT_EQ(back.lora.rank, 8);
  EXPECT_EQ(back.lora.alpha, 16.0f);
  for (int l = 0; l < hp.n_layer; ++l)
    for (int i = 0; i < kLoraTargets; ++i) {
      EXPECT_EQ(back.lora.layers[l][i].a, w.lora.layers[l][i].a);
      EXPECT_EQ(back.lora.layers[l][i].b, w.lora.layers[l][i].b);
    }
  back.check(hp, path);

  // Another model's width: check() names the file and what differs.
  HParams other = hp;
  other.n_embd = hp.n_embd * 2;
  expect_error([&] { back.check(other, path); }, {path, "n_embd"});
  // A factor of the wrong width for this model: the message names the tensor.
  RestoreKVWeights bad = w;
  bad.lora.layers[2][static_cast<int>(LoraTarget::Down)].a.resize(8 * (hp.n_ff - 1));
  expect_error([&] { bad.check(hp, path); }, {"restorekv.2.down.lora_a"});
  // A file whose embeddings tensor is short: load() names the file and the tensor.
  GGUFWriter gw;
  gw.set("general.architecture", GGUFValue::str("restorekv"));
  gw.set("restorekv.n_embd", GGUFValue::u32(hp.n_embd));
  gw.set("restorekv.n_layer", GGUFValue::u32(hp.n_layer));
  gw.set("restorekv.n_tokens", GGUFValue::u32(8));
  gw.set("restorekv.lora_rank", GGUFValue::u32(0));
  gw.add_tensor_f32("restorekv.embeddings", GGMLType::F32, {hp.n_embd, 7}, std::vector<float>(7 * hp.n_embd, 0.0f));
  const std::string short_path = temp_path("restorekv_short.gguf");
  gw.write(short_path);
  expect_error([&] { RestoreKVWeights::load(short_path); }, {short_path, "'restorekv.embeddings'"});
  // Not a RestoreKV file at all.
  EXPECT_THROW(RestoreKVWeights::load(std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf"), Error);
  std::remove(path.c_str());
  std::remove(short_path.c_str());
}

// ---- the press ----

namespace {

RequestOptions press_options() {
  RequestOptions o;
  o.n_predict = 0;
  o.sampling.temp = 0;
  o.session.key_codec = o.session.value_codec = KVCodec::F32;
  return o;
}

/// A RestoreKV file of random weights (R = 8 restore tokens) for the bundled model, under a
/// per-process temporary name; removed when it goes out of scope.
struct WeightsFile {
  RestoreKVWeights w;
  std::string path;
  WeightsFile(uint32_t seed, const std::string& name)
      : w(random_weights(bundled_model().hparams(), 8, seed)), path(temp_path(name)) {
    w.save(path, "stories260K");
  }
  ~WeightsFile() { std::remove(path.c_str()); }
  WeightsFile(const WeightsFile&) = delete;
  WeightsFile& operator=(const WeightsFile&) = delete;
};

/// A request of the bundled model with the press `spec` at `ratio` over the first `n` story
/// tokens (and `question`), prefilled: the context compressed, the question appended.
std::unique_ptr<Request> prefilled(const std::string& spec, double ratio, size_t n,
                                   const std::vector<Token>& question = {}, const RequestOptions& o = press_options()) {
  const Model& m = bundled_model();
  auto req = std::make_unique<Request>(m, make_press_impl(spec, ratio), o);
  req->set_prompt_tokens(story_tokens(m, n), question);
  req->prefill();
  return req;
}

}  // namespace

// kvpress's rule, derived by hand for the bundled model (5 layers x 4 KV heads = 20 segments):
// n = 64 context tokens, R = 8, ratio 0.33: the ratio becomes 0.33 + 8 / 64 = 0.455; KVzip prunes
// int(20 x 64 x 0.455) = int(582.4) = 582 context entries in one bottom-k over all segments, so
// 1280 - 582 = 698 context entries stay, plus 20 x 8 = 160 restore entries (never evicted) and the
// 20 x 3 question entries: 918 in all. (kvslim's kvzip at 0.455 would keep 20 x floor(64 x 0.545)
// = 680 context entries: the reference's single floor over all segments differs.) Every segment
// holds the restore entries at positions 64..71, the question at 72..74, and the next token goes
// to position 75.
TEST(RestoreKVPress, BudgetAndPositionsAsTheReference) {
  const Model& m = bundled_model();
  const HParams& hp = m.hparams();
  ASSERT_EQ(hp.n_layer * hp.n_head_kv, 20);
  const WeightsFile f(31, "restorekv_press.gguf");
  const RestoreKVWeights& w = f.w;
  const std::vector<Token> ctx = story_tokens(m, 64);
  const std::vector<Token> question = {ctx[20], ctx[21], ctx[22]};

  const auto req = prefilled("restorekv:file=" + f.path, 0.33, 64, question);
  const KVCache& c = req->cache();
  EXPECT_EQ(c.entries(), 918u);
  EXPECT_EQ(req->position(), 75);
  size_t context_kept = 0;
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h) {
      const auto& p = c.seg(l, h).positions();
      std::vector<int32_t> tail(p.end() - 11, p.end());
      EXPECT_EQ(tail, (std::vector<int32_t>{64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74})) << l << "," << h;
      for (size_t i = 0; i + 11 < p.size(); ++i) EXPECT_LT(p[i], 64);
      context_kept += p.size() - 11;
      // The sinks stay (kvslim's kvzip rule; kvpress scores them 1.0).
      for (int i = 0; i < 4; ++i) EXPECT_EQ(p[i], i);
    }
  EXPECT_EQ(context_kept, 698u);

  // The restore entries are those of the restore pass over the whole, uncompressed cache: the
  // same embeddings and adapter run after the full context in a plain session.
  Session full(m, press_options().session);
  full.forward(ctx);
  InputOverride over(w.embeddings.data(), 8, hp.n_embd, &w.lora);
  full.forward_inputs(over);
  std::vector<float> k1, v1, k2, v2;
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h)
      for (int32_t p = 64; p < 72; ++p) {
        entry_at(c, l, h, p, k1, v1);
        entry_at(full.cache(), l, h, p, k2, v2);
        for (int e = 0; e < hp.head_dim; ++e) {
          ASSERT_NEAR(k1[e], k2[e], 1e-5);
          ASSERT_NEAR(v1[e], v2[e], 1e-5);
        }
      }
}

// A second case with an exact product: n = 64, R = 8, ratio 0.5 -> 0.625; 1280 x 0.625 = 800
// pruned, 480 context entries + 160 restore entries (no question).
TEST(RestoreKVPress, BudgetExactProduct) {
  const WeightsFile f(41, "restorekv_press2.gguf");
  const auto req = prefilled("RestoreKVPress:compression_ratio=0.5,file=" + f.path, 0.0, 64);
  EXPECT_EQ(req->cache().entries(), 640u);
  EXPECT_EQ(req->position(), 72);
  // Ratio + R / n above 1: every context entry the rules allow leaves (kvpress: all of them; kvslim
  // keeps the 4 sinks of each segment): n = 16, ratio 0.6 -> min(1, 0.6 + 0.5) = 1.
  EXPECT_EQ(prefilled("restorekv:file=" + f.path, 0.6, 16)->cache().entries(), 20u * (4 + 8));
}

// Ratio 0 runs nothing (kvpress skips scoring and the restore pass): the cache and logits are
// those of no press. The spec parses back, and kvpress's names are accepted.
TEST(RestoreKVPress, RatioZeroIsNoPressAndSpecsParseBack) {
  const WeightsFile f(51, "restorekv_press3.gguf");
  const std::string& path = f.path;
  const auto a = prefilled("restorekv:file=" + path, 0.0, 40), b = prefilled("none", 0.0, 40);
  EXPECT_EQ(a->logits(), b->logits());
  EXPECT_TRUE(press_test::same_cache(a->cache(), b->cache()));
  EXPECT_EQ(a->position(), 40);

  auto p = make_press_impl("RestoreKVPress:compression_ratio=0.25,kvzip_plus_normalization=1,file=" + path, 0.0);
  const std::string spec = p->describe();
  EXPECT_EQ(spec, fmt::format("restorekv:ratio=0.25,file={},chunk=2048,n_sink=4,plus=1", path));
  EXPECT_EQ(make_press_impl(spec, 0.0)->describe(), spec);
  // Its budget is its own: a policy over it is refused when the spec is parsed.
  EXPECT_THROW(make_press_impl("adakv(restorekv:file=" + path + ")", 0.5), Error);
  EXPECT_THROW(make_press_impl("restorekv", 0.5), Error);  // no file
}

// The restore pass runs once over the whole context (kvpress has no chunked prefill): a context
// prefilled in chunks is refused with an error saying so; a model of another width is refused
// naming the file.
TEST(RestoreKVPress, ChunkedPrefillAndOtherModelsAreRefused) {
  const Model& m = bundled_model();
  const WeightsFile f(61, "restorekv_press4.gguf");
  RequestOptions o = press_options();
  o.chunk_size = 32;
  expect_error([&] { prefilled("restorekv:file=" + f.path, 0.5, 64, {}, o); }, {"more than one prefill step"});

  HParams hp = m.hparams();
  hp.n_embd *= 2;
  RestoreKVWeights wide = f.w;
  wide.n_embd = hp.n_embd;
  wide.embeddings.assign(static_cast<size_t>(8) * hp.n_embd, 0.0f);
  wide.lora = LoraAdapter{};
  const std::string wide_path = temp_path("restorekv_wide.gguf");
  wide.save(wide_path, "wider");
  expect_error([&] { prefilled("restorekv:file=" + wide_path, 0.5, 64); }, {wide_path});
  std::remove(wide_path.c_str());
}

// Composes like kvzip: a later stage compresses what restorekv left (restore entries included).
TEST(RestoreKVPress, Composes) {
  const WeightsFile f(71, "restorekv_press5.gguf");
  const auto alone = prefilled("restorekv:file=" + f.path, 0.33, 64);
  const auto both = prefilled("restorekv:file=" + f.path + "+knorm", 0.33, 64);
  EXPECT_EQ(alone->cache().entries(), 858u);  // 698 + 160, as above without the question
  EXPECT_LT(both->cache().entries(), alone->cache().entries());
  EXPECT_EQ(both->position(), 72);
}
