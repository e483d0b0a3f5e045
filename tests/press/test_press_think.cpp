// ThinK key-channel pruning against a float64 re-computation of its channel scores, the attention
// it leaves, and its byte accounting.
#include <algorithm>
#include <numeric>

#include "attention/attention.h"
#include "run/prefill.h"
#include "support/press_util.h"

using namespace press_test;

namespace {

TEST(PressThinK, PrunesTheLowestQueryWeightedChannelsAndFreesTheirBytes) {
  const Model& model = bundled_model();
  const HParams& hp = model.hparams();
  const int hd = hp.head_dim, G = hp.n_group(), n = 48, nw = 6;
  KVCache cache = random_cache(model, n, 21);
  std::vector<int32_t> wpos(nw);
  for (int i = 0; i < nw; ++i) wpos[i] = n - nw + i;
  Observation obs = random_window(model, wpos, 22);
  // Original keys and values, float64.
  std::vector<std::vector<std::vector<std::vector<double>>>> K0(hp.n_layer), V0(hp.n_layer);
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h) {
      K0[l].push_back(keys_of(cache.seg(l, h)));
      V0[l].push_back(values_of(cache.seg(l, h)));
    }
  const size_t before = cache.bytes();
  auto press = make_press_impl("think:key_ratio=0.5", 0.0);
  press->compress(cache, model, obs);
  const int keep = hd - hd / 2;
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h) {
      // Float64 scores: mean over window and group of q_d^2 times mean over entries of k_d^2.
      std::vector<double> score(hd);
      for (int d = 0; d < hd; ++d) {
        double qs = 0, ks = 0;
        for (int g = 0; g < G; ++g)
          for (int i = 0; i < nw; ++i) {
            const double q = obs.queries[l][(static_cast<size_t>(h * G + g) * nw + i) * hd + d];
            qs += q * q / (G * nw);
          }
        for (int j = 0; j < n; ++j) ks += K0[l][h][j][d] * K0[l][h][j][d] / n;
        score[d] = qs * ks;
      }
      std::vector<int> order(hd);
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int a, int b) { return score[a] > score[b]; });
      std::vector<bool> kept(hd, false);
      for (int i = 0; i < keep; ++i) kept[order[i]] = true;
      const Segment& s = cache.seg(l, h);
      ASSERT_TRUE(s.latent());
      ASSERT_EQ(s.latent_keys().rank(), keep);
      auto K = keys_of(s);
      auto V = values_of(s);
      for (int j = 0; j < n; ++j)
        for (int d = 0; d < hd; ++d) {
          EXPECT_EQ(K[j][d], kept[d] ? K0[l][h][j][d] : 0.0) << "layer " << l << " head " << h << " channel " << d;
          EXPECT_EQ(V[j][d], V0[l][h][j][d]);
        }
      // Attention over the pruned keys equals float64 attention with the pruned channels zeroed.
      std::vector<float> q(hd), out(hd);
      for (int d = 0; d < hd; ++d) q[d] = 0.3f * (d + 1) - 1.0f;
      const int32_t vis = n;
      attend_segment(s, q.data(), 1, &vis, 0.5f, out.data(), hd);
      std::vector<double> sc(n);
      double mx = -1e300, sum = 0;
      for (int j = 0; j < n; ++j) {
        double dot = 0;
        for (int d = 0; d < hd; ++d) dot += kept[d] ? q[d] * K0[l][h][j][d] : 0.0;
        sc[j] = 0.5 * dot;
        mx = std::max(mx, sc[j]);
      }
      for (double& x : sc) sum += (x = std::exp(x - mx));
      for (int d = 0; d < hd; ++d) {
        double ref = 0;
        for (int j = 0; j < n; ++j) ref += sc[j] / sum * V0[l][h][j][d];
        EXPECT_NEAR(out[d], ref, 1e-5);
      }
    }
  // f32 cache: keys keep `keep` f32 channels, values stay f32, positions stay; the identity value
  // basis is shared by every segment and counted once; each key selection holds `keep` int32s.
  const size_t segs = static_cast<size_t>(hp.n_layer) * hp.n_head_kv;
  const size_t expect = segs * n * ((keep + hd) * 4 + 4) + hd * 4 + segs * keep * 4;
  EXPECT_EQ(cache.bytes(), expect);
  EXPECT_LT(cache.bytes(), before);
}

TEST(PressThinK, ComposesWithEvictionAndDecodesThroughTheModel) {
  const Model& model = bundled_model();
  const HParams& hp = model.hparams();
  SessionOptions so;
  Session s(model, so);
  std::vector<Token> ctx;
  for (int i = 0; i < 200; ++i) ctx.push_back(static_cast<Token>(10 + (i * 7) % 200));  // beyond snapkv's window
  auto press = make_press_impl("snapkv+think:key_ratio=0.5", 0.5);
  press->reset();
  prefill_and_compress(s, *press, ctx, 0, nullptr, nullptr);
  // Half the entries (snapkv 0.5) with half the key channels (f16): bytes per entry drop from
  // 2*2*hd + 4 to (hd/2 + hd)*2 + 4.
  const KVCache& c = s.cache();
  size_t entries = c.entries();
  EXPECT_EQ(entries, static_cast<size_t>(hp.n_layer) * hp.n_head_kv * 100);
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h) EXPECT_TRUE(c.seg(l, h).latent());
  const size_t per_entry = (hp.head_dim / 2 + hp.head_dim) * 2 + 4;
  EXPECT_EQ(c.bytes(), entries * per_entry + c.basis_bytes());
  // Decode continues on the latent cache (question and new tokens are stored as codes).
  std::vector<float> logits = s.forward({5, 6, 7});
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  EXPECT_EQ(c.entries(), entries + 3 * hp.n_layer * hp.n_head_kv);
  EXPECT_THROW(make_press_impl("think:key_ratio=1", 0.0), Error);
  EXPECT_THROW(make_press_impl("think:window=0", 0.0), Error);
}

}  // namespace
