#pragma once
// Helpers shared by the press tests: the bundled model, hand-built caches and observations, and
// float64 attention for reference values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvslim/generate.h"
#include "kvslim/model.h"
#include "press/authoring.h"
#include "model/session.h"
#include "run/prefill.h"

namespace press_test {

using namespace kvslim;

inline const Model& bundled_model() {
  static std::unique_ptr<Model> m = Model::load(std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf");
  return *m;
}

/// A cache shaped like the bundled model with `n` random f32 entries per segment at the given
/// positions (0..n-1 when empty).
inline KVCache random_cache(const Model& model, int n, uint32_t seed, std::vector<int32_t> positions = {}) {
  const HParams& hp = model.hparams();
  KVCache cache(hp.n_layer, hp.n_head_kv, hp.head_dim, KVCodec::F32, KVCodec::F32);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  if (positions.empty())
    for (int i = 0; i < n; ++i) positions.push_back(i);
  std::vector<float> k(hp.head_dim), v(hp.head_dim);
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h)
      for (int i = 0; i < n; ++i) {
        for (auto& x : k) x = 1.5f * nd(rng);
        for (auto& x : v) x = nd(rng);
        cache.seg(l, h).append(k.data(), v.data(), positions[i]);
      }
  return cache;
}

/// An observation window of `w` random queries at the given positions, for every layer.
inline Observation random_window(const Model& model, const std::vector<int32_t>& positions, uint32_t seed) {
  const HParams& hp = model.hparams();
  Observation obs;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int w = static_cast<int>(positions.size());
  obs.window_positions = positions;
  obs.queries.assign(hp.n_layer, std::vector<float>(static_cast<size_t>(hp.n_head) * w * hp.head_dim));
  for (auto& q : obs.queries)
    for (auto& x : q) x = 1.5f * nd(rng);
  return obs;
}

/// Keys/values of a segment as double rows.
inline std::vector<std::vector<double>> keys_of(const Segment& s) {
  std::vector<std::vector<double>> out;
  std::vector<float> k(s.head_dim());
  for (size_t i = 0; i < s.size(); ++i) {
    s.key(i, k.data());
    out.emplace_back(k.begin(), k.end());
  }
  return out;
}
inline std::vector<std::vector<double>> values_of(const Segment& s) {
  std::vector<std::vector<double>> out;
  std::vector<float> v(s.head_dim());
  for (size_t i = 0; i < s.size(); ++i) {
    s.value(i, v.data());
    out.emplace_back(v.begin(), v.end());
  }
  return out;
}

/// float64 causal softmax of query q (at position qpos) over a segment's keys: zero where the
/// entry's position is after qpos.
inline std::vector<double> softmax_row(const std::vector<double>& q, int32_t qpos, const Segment& s) {
  auto K = keys_of(s);
  const auto& pos = s.positions();
  const double scale = 1.0 / std::sqrt(double(s.head_dim()));
  std::vector<double> z(K.size(), -INFINITY);
  double mx = -INFINITY;
  for (size_t j = 0; j < K.size(); ++j) {
    if (pos[j] > qpos) continue;
    double d = 0;
    for (size_t c = 0; c < q.size(); ++c) d += q[c] * K[j][c];
    z[j] = d * scale;
    mx = std::max(mx, z[j]);
  }
  double sum = 0;
  for (double& x : z) {
    x = std::isinf(x) ? 0.0 : std::exp(x - mx);
    sum += x;
  }
  for (double& x : z) x /= sum;
  return z;
}

/// Window query i of query head qh of layer l, as doubles.
inline std::vector<double> window_query(const Observation& obs, const HParams& hp, int l, int qh, int i) {
  const int w = obs.n_window();
  const float* p = obs.queries[l].data() + (static_cast<size_t>(qh) * w + i) * hp.head_dim;
  return std::vector<double>(p, p + hp.head_dim);
}

/// Expects got ~= want with a relative tolerance (plus a small absolute one).
inline void expect_close(double got, double want, double rel, const std::string& what) {
  EXPECT_NEAR(got, want, rel * std::fabs(want) + 1e-9) << what;
}

/// Builds a scorer press from a spec and returns it as a ScorerPress (fails the test otherwise).
inline std::unique_ptr<ScorerPress> scorer(const std::string& spec, double ratio) {
  std::unique_ptr<PressImpl> p = make_press_impl(spec, ratio);
  ScorerPress* sp = p->scorer();
  EXPECT_EQ(static_cast<PressImpl*>(sp), p.get()) << spec << " is not a scorer press";
  if (static_cast<PressImpl*>(sp) != p.get()) return nullptr;
  p.release();
  return std::unique_ptr<ScorerPress>(sp);
}

/// The bundled model's tokens for a text (with BOS).
inline std::vector<Token> tokens_of(const std::string& text) {
  const Tokenizer& tok = bundled_model().tokenizer();
  return tok.encode(text, true, false);
}

/// A children's-story text of roughly `n` tokens.
inline std::vector<Token> story_tokens(size_t n) {
  std::string base =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, "
      "she saw a big red ball under a tree. She ran to the ball and kicked it high into the sky. Her friend "
      "Tom came to play with her, and they laughed and ran until the sun went down. ";
  std::string text;
  std::vector<Token> t;
  while ((t = tokens_of(text)).size() < n) text += base;
  t.resize(n);
  return t;
}

/// Prefills `tokens` into a fresh f32 session with `press` and returns the session.
inline std::unique_ptr<Session> prefill(PressImpl& press, const std::vector<Token>& tokens, int chunk = 0,
                                        size_t* peak = nullptr, KVCodec codec = KVCodec::F32) {
  SessionOptions so;
  so.key_codec = codec;
  so.value_codec = codec;
  so.n_ctx = 4096;
  auto s = std::make_unique<Session>(bundled_model(), so);
  prefill_and_compress(*s, press, tokens, chunk, peak);
  return s;
}

/// True when two caches hold the same entries bit for bit (keys, values, positions).
inline bool same_cache(const KVCache& a, const KVCache& b) {
  if (a.n_layer() != b.n_layer() || a.n_head_kv() != b.n_head_kv()) return false;
  for (int l = 0; l < a.n_layer(); ++l)
    for (int h = 0; h < a.n_head_kv(); ++h) {
      const Segment &x = a.seg(l, h), &y = b.seg(l, h);
      if (x.size() != y.size() || x.positions() != y.positions()) return false;
      std::vector<float> kx(x.size() * x.head_dim()), ky(kx.size()), vx(kx.size()), vy(kx.size());
      if (x.size() == 0) continue;
      x.keys(0, x.size(), kx.data());
      y.keys(0, y.size(), ky.data());
      x.values(0, x.size(), vx.data());
      y.values(0, y.size(), vy.data());
      if (std::memcmp(kx.data(), ky.data(), kx.size() * 4) || std::memcmp(vx.data(), vy.data(), vx.size() * 4))
        return false;
    }
  return true;
}

}  // namespace press_test
