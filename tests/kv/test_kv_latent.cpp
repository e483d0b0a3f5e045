// Latent segments (kv/latent.h): PCA bases against a hand-built covariance, code quantization
// bounds, exact byte accounting, and attention over codes against float64 attention.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "attention/attention.h"
#include "kv/cache.h"
#include "kv/latent.h"
#include "kvslim/quant.h"

using namespace kvslim;

namespace {

float fp16_round(float x) { return fp16_to_fp32(fp32_to_fp16(x)); }

// Three orthonormal directions in R^hd (Gram-Schmidt of random vectors).
std::vector<std::vector<double>> orthonormal(int hd, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd;
  std::vector<std::vector<double>> out;
  while (static_cast<int>(out.size()) < n) {
    std::vector<double> v(hd);
    for (auto& x : v) x = nd(rng);
    for (auto& u : out) {
      double d = 0;
      for (int i = 0; i < hd; ++i) d += u[i] * v[i];
      for (int i = 0; i < hd; ++i) v[i] -= d * u[i];
    }
    double nn = 0;
    for (double x : v) nn += x * x;
    for (auto& x : v) x /= std::sqrt(nn);
    out.push_back(v);
  }
  return out;
}

TEST(KVLatent, PcaFindsTheAxesOfAHandBuiltCovariance) {
  // Points mean +- 3u, +- 2v, +- 1w: covariance (18 uu' + 8 vv' + 2 ww') / 6, so the axes are u, v, w
  // with standard deviations sqrt(3), sqrt(4/3), sqrt(1/3).
  const int hd = 16;
  auto U = orthonormal(hd, 3, 5);
  std::vector<double> mean(hd);
  for (int i = 0; i < hd; ++i) mean[i] = 0.25 * i - 1.0;
  const double amp[3] = {3, 2, 1};
  std::vector<float> rows;
  for (int a = 0; a < 3; ++a)
    for (double sg : {1.0, -1.0})
      for (int i = 0; i < hd; ++i) rows.push_back(static_cast<float>(mean[i] + sg * amp[a] * U[a][i]));
  auto b = pca_basis(rows.data(), 6, hd, 0, 0.999);
  ASSERT_EQ(b->rank(), 3);
  const double sd[3] = {std::sqrt(3.0), std::sqrt(4.0 / 3.0), std::sqrt(1.0 / 3.0)};
  for (int a = 0; a < 3; ++a) {
    EXPECT_NEAR(b->scale[a], sd[a], 1e-5);
    double dot = 0;
    for (int i = 0; i < hd; ++i) dot += b->proj[a * hd + i] * U[a][i];
    EXPECT_NEAR(std::fabs(dot), 1.0, 1e-5) << "axis " << a;
  }
  for (int i = 0; i < hd; ++i) EXPECT_NEAR(b->mean[i], mean[i], 1e-5);
  // Every point lies in the span: encode + decode returns it.
  std::vector<float> c(3), x(hd);
  for (int j = 0; j < 6; ++j) {
    b->encode(rows.data() + j * hd, c.data());
    b->decode(c.data(), x.data());
    for (int i = 0; i < hd; ++i) EXPECT_NEAR(x[i], rows[j * hd + i], 1e-5);
  }
  // A fixed rank of 1 keeps only u.
  EXPECT_EQ(pca_basis(rows.data(), 6, hd, 1)->rank(), 1);
  EXPECT_THROW(pca_basis(rows.data(), 0, hd, 1), Error);
}

TEST(KVLatent, QuantizedCodesStayWithinHalfAStepAndCountTheirBytes) {
  const int hd = 12;
  auto b = std::make_shared<LatentBasis>();
  b->head_dim = hd;
  b->channels = {0, 2, 3, 5, 7, 11};
  b->scale = {1, 2, 0.5, 1, 4, 1};
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (int bits : {2, 4, 8}) {
    LatentCodes codes(b, bits);
    EXPECT_EQ(codes.row_bytes(), static_cast<size_t>((6 * bits + 7) / 8 + 2));
    std::vector<std::vector<float>> xs;
    for (int j = 0; j < 20; ++j) {
      std::vector<float> x(hd);
      for (auto& v : x) v = 3 * nd(rng);
      codes.append(x.data());
      xs.push_back(x);
    }
    EXPECT_EQ(codes.bytes(), 20 * codes.row_bytes());
    std::vector<float> c(6);
    const double qmax = 0.5 * ((1 << bits) - 1);
    for (int j = 0; j < 20; ++j) {
      codes.coords(j, j + 1, c.data());
      double amax = 0;
      for (int i = 0; i < 6; ++i) amax = std::max(amax, static_cast<double>(std::fabs(xs[j][b->channels[i]] / b->scale[i])));
      const double step = amax / qmax * (1 + 1e-3);  // the token scale is rounded to f16
      for (int i = 0; i < 6; ++i)
        EXPECT_LE(std::fabs(c[i] - xs[j][b->channels[i]]), b->scale[i] * step * 0.5 + 1e-6)
            << "bits " << bits << " entry " << j << " coord " << i;
    }
  }
  EXPECT_THROW(LatentCodes(b, 3), Error);
  EXPECT_THROW(LatentCodes(nullptr, 4), Error);
}

TEST(KVLatent, PerChannelCodesFitEachCoordinateAndDropTheEntryScale) {
  // Identity selection of 2 channels; channel 0 takes -3, -1, 1, 3 (exactly the four 2-bit levels
  // of center 0 and step 2), channel 1 is constant 10 (no spread: its step is floored at 1% of
  // the largest, 0.02, and 10 decodes to the level 10 + 0.01).
  auto b = identity_basis(2);
  LatentCodes codes(b, 2, LatentScales::Channel);
  EXPECT_TRUE(codes.per_channel());
  EXPECT_EQ(codes.row_bytes(), 2u);  // 2 codes of 2 bits + the entry's widening exponent
  const std::vector<float> rows = {-3, 10, 1, 10, 3, 10, -1, 10};
  codes.append_rows(rows.data(), 4);
  ASSERT_EQ(codes.steps().size(), 2u);
  EXPECT_FLOAT_EQ(codes.centers()[0], 0.0f);
  EXPECT_FLOAT_EQ(codes.steps()[0], 2.0f);
  EXPECT_FLOAT_EQ(codes.steps()[1], 0.02f);
  EXPECT_EQ(codes.bytes(), 4u * 2 + 2 * 2 * 4);  // rows + (center, step) per coordinate
  std::vector<float> x(2);
  for (int j = 0; j < 4; ++j) {
    codes.decode(j, x.data());
    EXPECT_FLOAT_EQ(x[0], rows[2 * j]);
    EXPECT_NEAR(x[1], 10.0f, 0.01f + 1e-5f);
  }
  // Later entries keep the fit: 0.9 rounds to the level 1; 50 is outside the fitted range and
  // widens the steps by 2^(16/4) = 16 (top level 2 * 16 * 1.5 = 48; 2^(17/4) would give 57.1).
  const float more[] = {0.9f, 10.0f, 50.0f, 10.0f};
  codes.append(more);
  codes.append(more + 2);
  codes.decode(4, x.data());
  EXPECT_FLOAT_EQ(x[0], 1.0f);
  codes.decode(5, x.data());
  EXPECT_FLOAT_EQ(x[0], 48.0f);
  EXPECT_NEAR(x[1], 10.0f, 0.16f + 1e-5f);  // half a widened step of channel 1
  // Without rows to fit, the step is the Gaussian-optimal one for the basis' scale (Max 1960:
  // 0.3352 sigma at 16 levels).
  auto s = std::make_shared<LatentBasis>(*identity_basis(2));
  s->scale = {2.0f, 0.5f};
  LatentCodes fresh(s, 4, LatentScales::Channel);
  fresh.append(more);
  EXPECT_NEAR(fresh.steps()[0], 0.6704f, 1e-5f);
  EXPECT_NEAR(fresh.steps()[1], 0.1676f, 1e-5f);
  // f16 / f32 codes ignore the scaling mode.
  EXPECT_FALSE(LatentCodes(b, 0, LatentScales::Channel).per_channel());
  EXPECT_EQ(LatentCodes(b, 32, LatentScales::Channel).row_bytes(), 8u);
}

TEST(KVLatent, PerChannelScalesBeatTokenScalesOnAnisotropicCodes) {
  // One coordinate 30x larger than the others: a token scale spends its 4 levels on it and
  // rounds the small ones to +-step/2; per-channel steps fit each coordinate. Reference: Max's
  // 2-bit Gaussian quantizer leaves MSE 0.1175 sigma^2, the floor for the small coordinates;
  // the per-entry widening byte (least error over the whole entry) spends some of their
  // precision on the large coordinate's tails, but far less than a token scale does.
  const int hd = 8;
  auto b = identity_basis(hd);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const int n = 4000;
  std::vector<float> rows(static_cast<size_t>(n) * hd);
  for (int j = 0; j < n; ++j)
    for (int d = 0; d < hd; ++d) rows[j * hd + d] = (d == 0 ? 30.0f : 1.0f) * nd(rng);
  double err[2] = {0, 0};
  int m = 0;
  for (LatentScales sc : {LatentScales::Token, LatentScales::Channel}) {
    LatentCodes codes(b, 2, sc);
    codes.append_rows(rows.data(), n);
    std::vector<float> x(hd);
    for (int j = 0; j < n; ++j) {
      codes.decode(j, x.data());
      for (int d = 1; d < hd; ++d) err[m] += std::pow(x[d] - rows[j * hd + d], 2);
    }
    err[m] /= static_cast<double>(n) * (hd - 1);
    ++m;
  }
  EXPECT_GT(err[0], 0.5);        // token: most small coordinates fall to +-step/2, far off
  EXPECT_GT(err[1], 0.1175 - 0.01);  // never below the Gaussian optimum
  EXPECT_LT(err[1], 0.25);           // channel: within about 2x of it (measured 0.200)
}

struct Rows {
  std::vector<std::vector<float>> k, v;
};

Rows fill(Segment& s, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  Rows r;
  const int hd = s.head_dim();
  for (int j = 0; j < n; ++j) {
    std::vector<float> k(hd), v(hd);
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    s.append(k.data(), v.data(), 2 * j);
    r.k.push_back(k);
    r.v.push_back(v);
  }
  return r;
}

// x projected onto the basis in float64: mean + P^T P (x - mean).
std::vector<double> reconstruct64(const LatentBasis& b, const std::vector<float>& x) {
  const int hd = b.head_dim, r = b.rank();
  std::vector<double> out(hd);
  for (int i = 0; i < hd; ++i) out[i] = b.mean.empty() ? 0.0 : b.mean[i];
  for (int a = 0; a < r; ++a) {
    double c = 0;
    for (int i = 0; i < hd; ++i) c += static_cast<double>(b.proj[a * hd + i]) * (x[i] - (b.mean.empty() ? 0.0 : b.mean[i]));
    for (int i = 0; i < hd; ++i) out[i] += c * b.proj[a * hd + i];
  }
  return out;
}

TEST(KVLatent, SegmentStoresCodesRetainsAndCountsBasesOnce) {
  const int hd = 16, n = 40;
  KVCache cache(2, 1, hd, KVCodec::F16, KVCodec::F16);
  Rows r0 = fill(cache.seg(0, 0), n, 1);
  fill(cache.seg(1, 0), n, 2);
  std::vector<float> all;
  for (auto& k : r0.k) all.insert(all.end(), k.begin(), k.end());
  auto kb = pca_basis(all.data(), n, hd, 6);
  auto vb = pca_basis(all.data(), n, hd, 4);
  // Both layers share both bases (cross-layer sharing): counted once.
  cache.seg(0, 0).to_latent(kb, 32, vb, 8);
  cache.seg(1, 0).to_latent(kb, 32, vb, 8);
  const size_t row = 6 * 4 + (4 + 2) + 4;  // f32 key codes, 8-bit value codes + scale, position
  EXPECT_EQ(cache.seg(0, 0).bytes(), n * row);
  EXPECT_EQ(cache.basis_bytes(), kb->bytes() + vb->bytes());
  EXPECT_EQ(kb->bytes(), (6 * hd + hd + 6) * sizeof(float));
  EXPECT_EQ(cache.bytes(), 2 * n * row + kb->bytes() + vb->bytes());
  // Keys decode to their float64 projection (entries stored as f16 first, so compare to the f16 key).
  std::vector<float> k(hd);
  for (int j = 0; j < n; j += 7) {
    cache.seg(0, 0).key(j, k.data());
    std::vector<float> k16(hd);
    for (int i = 0; i < hd; ++i) k16[i] = fp16_round(r0.k[j][i]);
    auto ref = reconstruct64(*kb, k16);
    for (int i = 0; i < hd; ++i) EXPECT_NEAR(k[i], ref[i], 1e-4);
  }
  // Appends after the switch are encoded too; retain frees rows.
  std::vector<float> x(hd, 0.5f);
  cache.seg(0, 0).append(x.data(), x.data(), 100);
  EXPECT_EQ(cache.seg(0, 0).size(), static_cast<size_t>(n + 1));
  cache.seg(0, 0).retain({0, 5, 40});
  EXPECT_EQ(cache.seg(0, 0).bytes(), 3 * row);
  EXPECT_EQ(cache.seg(0, 0).positions(), (std::vector<int32_t>{0, 10, 100}));
  cache.seg(0, 0).key(2, k.data());
  auto ref = reconstruct64(*kb, x);
  for (int i = 0; i < hd; ++i) EXPECT_NEAR(k[i], ref[i], 1e-5);
  EXPECT_THROW(cache.seg(0, 0).retain_tiered({0, 1}, {1, 0}, KVCodec::Q8_0, KVCodec::Q4_0), Error);
  // clear() returns to the codecs.
  cache.clear();
  EXPECT_FALSE(cache.seg(0, 0).latent());
  EXPECT_EQ(cache.basis_bytes(), 0u);
  auto wrong = pca_basis(all.data(), n / 2, hd / 2, 2);
  EXPECT_THROW(cache.seg(0, 0).to_latent(wrong, 0, vb, 0), Error);
}

// Softmax attention in float64 over explicit keys/values.
std::vector<double> attend64(const std::vector<std::vector<double>>& K, const std::vector<std::vector<double>>& V,
                             const float* q, int visible, double scale, const std::vector<int>* sel = nullptr) {
  const size_t hd = V[0].size();
  std::vector<int> idx;
  for (int j = 0; j < visible; ++j)
    if (!sel || std::find(sel->begin(), sel->end(), j) != sel->end()) idx.push_back(j);
  std::vector<double> s;
  double mx = -1e300;
  for (int j : idx) {
    double d = 0;
    for (size_t i = 0; i < hd; ++i) d += q[i] * K[j][i];
    s.push_back(d * scale);
    mx = std::max(mx, s.back());
  }
  double sum = 0;
  for (double& x : s) sum += (x = std::exp(x - mx));
  std::vector<double> out(hd, 0.0);
  for (size_t t = 0; t < idx.size(); ++t)
    for (size_t i = 0; i < hd; ++i) out[i] += s[t] / sum * V[idx[t]][i];
  return out;
}

TEST(KVLatent, AttentionOverCodesMatchesFloat64OverDecodedEntries) {
  const int hd = 32, n = 150, rows = 3;
  // Token and per-channel scales; 8-bit per-channel codes take the vectorized dequantization
  // (ranks 12 and 20: full 8-lane blocks and a tail).
  const std::pair<int, LatentScales> cases[] = {{32, LatentScales::Token}, {0, LatentScales::Token},
                                                {4, LatentScales::Token},  {8, LatentScales::Channel},
                                                {4, LatentScales::Channel}, {2, LatentScales::Channel}};
  for (const auto& [bits, scales] : cases) {
    Segment s(hd, KVCodec::F32, KVCodec::F32);
    Rows r = fill(s, n, 9);
    std::vector<float> ks, vs;
    for (int j = 0; j < n; ++j) {
      ks.insert(ks.end(), r.k[j].begin(), r.k[j].end());
      vs.insert(vs.end(), r.v[j].begin(), r.v[j].end());
    }
    s.to_latent(pca_basis(ks.data(), n, hd, 12), bits, pca_basis(vs.data(), n, hd, 20), bits, scales);
    // The reference reads the segment's own decoded entries (the codes' rounding included), so
    // the kernel's absorption of the query and deferred value expansion are what is checked.
    std::vector<std::vector<double>> K, V;
    std::vector<float> x(hd);
    for (int j = 0; j < n; ++j) {
      s.key(j, x.data());
      K.emplace_back(x.begin(), x.end());
      s.value(j, x.data());
      V.emplace_back(x.begin(), x.end());
    }
    std::mt19937 rng(4);
    std::normal_distribution<float> nd;
    std::vector<float> q(rows * hd), out(rows * hd), mass(n, 0.0f), probs(rows * n);
    for (auto& v : q) v = 2 * nd(rng);
    const int32_t vis[rows] = {1, 77, 150};
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    attend_segment(s, q.data(), rows, vis, scale, out.data(), hd, mass.data(), probs.data());
    double msum = 0;
    for (float m : mass) msum += m;
    EXPECT_NEAR(msum, rows, 1e-4);
    for (int rr = 0; rr < rows; ++rr) {
      auto ref = attend64(K, V, q.data() + rr * hd, vis[rr], scale);
      for (int i = 0; i < hd; ++i) EXPECT_NEAR(out[rr * hd + i], ref[i], 2e-4) << "bits " << bits << " row " << rr;
      for (int j = vis[rr]; j < n; ++j) EXPECT_EQ(probs[rr * n + j], 0.0f);
    }
    // Subset (decode-time selection).
    const std::vector<int> sel = {0, 3, 4, 5, 60, 61, 149};
    const std::vector<int32_t> sel32(sel.begin(), sel.end());
    attend_segment_subset(s, sel32.data(), static_cast<int>(sel32.size()), q.data(), rows, vis, scale, out.data(), hd);
    for (int rr = 0; rr < rows; ++rr) {
      auto ref = attend64(K, V, q.data() + rr * hd, vis[rr], scale, &sel);
      for (int i = 0; i < hd; ++i) EXPECT_NEAR(out[rr * hd + i], ref[i], 2e-4) << "subset row " << rr;
    }
  }
}

}  // namespace
