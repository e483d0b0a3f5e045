// Attention over raw latent codes (attention/latent_code_dot.h, attention/attention_latent.cpp) at
// every SIMD level this CPU has: the kernels' scores and value sums against float64 sums over the
// dequantized codes (LatentCodes::coords), and attend_segment on a latent segment against float64
// softmax attention over the segment's decoded entries.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "attention/attention.h"
#include "attention/latent_code_dot.h"
#include "kernels/quant_dot.h"
#include "kvslim/error.h"
#include "kv/cache.h"
#include "kv/latent.h"

using namespace kvslim;

namespace {

// Every level this CPU runs; restores the level on destruction.
struct Levels {
  qdot::Level saved = qdot::level();
  std::vector<qdot::Level> all() const { return qdot::supported_levels(); }
  ~Levels() { qdot::set_level(saved); }
};

// n rows of hd values with per-axis spreads 3, 2.7, ... and a mean of 1.5 (so centres matter).
std::vector<float> rows_of(int n, int hd, uint32_t seed, float gain = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(n) * hd);
  for (int j = 0; j < n; ++j)
    for (int d = 0; d < hd; ++d) x[static_cast<size_t>(j) * hd + d] = 1.5f + gain * 3.0f * std::pow(0.9f, d) * nd(rng);
  return x;
}

struct Side {
  int bits;
  LatentScales scales;
  int rank;
  bool identity;  ///< a channel-selection basis without scales (f_i = 1 per token)
};

// Codes of one side: 120 rows fitted at once, then 9 single appends 4x larger (widened entries).
LatentCodes make_codes(const Side& s, int hd, uint32_t seed) {
  const std::vector<float> fit = rows_of(120, hd, seed);
  auto basis = s.identity ? identity_basis(hd) : pca_basis(fit.data(), 120, hd, s.rank);
  LatentCodes C(basis, s.bits, s.scales);
  C.append_rows(fit.data(), 120);
  const std::vector<float> late = rows_of(9, hd, seed + 1, 4.0f);
  for (int j = 0; j < 9; ++j) C.append(late.data() + static_cast<size_t>(j) * hd);
  return C;
}

// (o_i, f_i) of a side: centre and step per channel; 0 and the basis scale (or 1) per token.
void offsets(const LatentCodes& C, std::vector<double>& o, std::vector<double>& f) {
  o.assign(C.rank(), 0.0);
  f.assign(C.rank(), 1.0);
  for (int i = 0; i < C.rank(); ++i) {
    if (C.per_channel()) {
      o[i] = C.centers()[i];
      f[i] = C.steps()[i];
    } else if (!C.basis().scale.empty()) {
      f[i] = C.basis().scale[i];
    }
  }
}

const Side kSides[] = {{8, LatentScales::Channel, 64, false}, {8, LatentScales::Channel, 12, false},
                       {4, LatentScales::Channel, 24, false}, {2, LatentScales::Channel, 16, false},
                       {8, LatentScales::Token, 20, false},   {4, LatentScales::Token, 8, false},
                       {2, LatentScales::Token, 5, false},    {8, LatentScales::Token, 12, true}};

TEST(LatentCodeDot, ScoresAndValueSumsMatchFloat64OverDequantizedCodesAtEveryLevel) {
  const int hd = 64;
  Levels lv;
  for (const Side& s : kSides) {
    const int hdim = s.identity ? s.rank : hd;
    const LatentCodes C = make_codes(s, hdim, 7);
    const int rank = C.rank(), n = static_cast<int>(C.size());
    std::vector<double> o, f;
    offsets(C, o, f);
    std::vector<float> coords(static_cast<size_t>(n) * rank);
    C.coords(0, n, coords.data());
    // Entries in a scrambled order with a repeat (the kernels take any index list).
    std::vector<int32_t> idx;
    for (int j = 0; j < n; ++j) idx.push_back((j * 37) % n);
    idx.push_back(5);
    const size_t m = idx.size();
    std::mt19937 rng(11);
    std::normal_distribution<float> nd;
    std::uniform_real_distribution<float> ud(0.0f, 1.0f);
    for (int rows : {1, 2, 5, 7, 13}) {
      // Latent queries x, a = x * f, A = sum(a) / 2; weights P with some zeros.
      std::vector<float> x(static_cast<size_t>(rows) * rank), a(x.size()), A(rows), P(static_cast<size_t>(rows) * m);
      for (int r = 0; r < rows; ++r) {
        double sum = 0;
        for (int i = 0; i < rank; ++i) {
          x[r * rank + i] = nd(rng);
          a[r * rank + i] = static_cast<float>(x[r * rank + i] * f[i]);
          sum += a[r * rank + i];
        }
        A[r] = static_cast<float>(0.5 * sum);
      }
      for (auto& p : P) p = ud(rng) < 0.2f ? 0.0f : ud(rng);
      for (qdot::Level l : lv.all()) {
        qdot::set_level(l);
        SCOPED_TRACE(::testing::Message() << "bits " << s.bits << " rank " << rank << " rows " << rows << " level "
                                          << qdot::level_name(l) << (s.scales == LatentScales::Token ? " token" : " channel"));
        const latent_dot::CodeRows cr = latent_dot::code_rows(C);
        std::vector<float> S(static_cast<size_t>(rows) * (m + 3), -7.0f);
        latent_dot::code_scores(cr, idx.data(), m, a.data(), A.data(), rows, S.data(), m + 3);
        std::vector<float> u(static_cast<size_t>(rows) * rank, 0.0f), t(rows, 0.0f);
        latent_dot::code_accumulate(cr, idx.data(), m, P.data(), m, rows, u.data(), t.data());
        for (int r = 0; r < rows; ++r) {
          // Scores: x . (c_j - o) in float64.
          for (size_t k = 0; k < m; ++k) {
            const float* c = coords.data() + static_cast<size_t>(idx[k]) * rank;
            double ref = 0, mag = 0;  // mag: the float rounding of c_ji scales with |c_ji| + |o_i|
            for (int i = 0; i < rank; ++i) {
              ref += static_cast<double>(x[r * rank + i]) * (c[i] - o[i]);
              mag += std::fabs(static_cast<double>(x[r * rank + i])) * (std::fabs(c[i]) + std::fabs(o[i]));
            }
            ASSERT_NEAR(S[r * (m + 3) + k], ref, 1e-5 * mag + 1e-6) << "entry " << k;
          }
          for (int k = 0; k < 3; ++k) EXPECT_EQ(S[r * (m + 3) + m + k], -7.0f);  // nothing past n written
          // Value sums: sum_k P_k c_k = o sum P + f (u + t / 2).
          double psum = 0;
          for (size_t k = 0; k < m; ++k) psum += P[r * m + k];
          for (int i = 0; i < rank; ++i) {
            double ref = 0, mag = 0;
            for (size_t k = 0; k < m; ++k) {
              const double c = coords[static_cast<size_t>(idx[k]) * rank + i];
              ref += P[r * m + k] * c;
              mag += std::fabs(P[r * m + k] * c);
            }
            const double got = o[i] * psum + f[i] * (u[r * rank + i] + 0.5 * t[r]);
            ASSERT_NEAR(got, ref, 1e-5 * mag + 1e-6) << "channel " << i;
          }
        }
      }
    }
  }
}

// Softmax attention in float64 over explicit keys / values (rows of hd doubles).
std::vector<double> attend64(const std::vector<std::vector<double>>& K, const std::vector<std::vector<double>>& V,
                             const float* q, int visible, double scale, const std::vector<int32_t>* sel,
                             std::vector<double>* probs = nullptr) {
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
  for (double& v : s) sum += (v = std::exp(v - mx));
  std::vector<double> out(hd, 0.0);
  for (size_t t = 0; t < idx.size(); ++t)
    for (size_t i = 0; i < hd; ++i) out[i] += s[t] / sum * V[idx[t]][i];
  if (probs) {
    probs->assign(K.size(), 0.0);  // by entry; 0 for entries not attended
    for (size_t t = 0; t < idx.size(); ++t) (*probs)[idx[t]] = s[t] / sum;
  }
  return out;
}

TEST(LatentCodeDot, AttentionOverRawCodesMatchesFloat64AtEveryLevel) {
  // A GQA group of 5 query rows on one KV head (the retrieval model's shape at head_dim 64),
  // keys and values in their own bases at ranks with and without a tail of channels.
  const int hd = 64, n0 = 200, n1 = 6;
  struct Case {
    int kbits, vbits;
    LatentScales scales;
    int krank, vrank;
  };
  const Case cases[] = {{8, 8, LatentScales::Channel, 32, 20}, {8, 4, LatentScales::Channel, 24, 64},
                        {4, 2, LatentScales::Channel, 17, 16}, {8, 8, LatentScales::Token, 32, 13},
                        {4, 4, LatentScales::Token, 8, 40},    {2, 8, LatentScales::Token, 16, 16},
                        {8, 0, LatentScales::Channel, 16, 16}, {32, 8, LatentScales::Channel, 16, 16}};
  Levels lv;
  for (const Case& cs : cases) {
    Segment seg(hd, KVCodec::F32, KVCodec::F32);
    const std::vector<float> k0 = rows_of(n0, hd, 21), v0 = rows_of(n0, hd, 22);
    for (int j = 0; j < n0; ++j) seg.append(k0.data() + j * hd, v0.data() + j * hd, j);
    seg.to_latent(pca_basis(k0.data(), n0, hd, cs.krank), cs.kbits, pca_basis(v0.data(), n0, hd, cs.vrank), cs.vbits,
                  cs.scales);
    // Decode-time entries, larger than the fitted ones (widened per-channel codes).
    const std::vector<float> k1 = rows_of(n1, hd, 23, 3.0f), v1 = rows_of(n1, hd, 24, 3.0f);
    for (int j = 0; j < n1; ++j) seg.append(k1.data() + j * hd, v1.data() + j * hd, n0 + j);
    const int n = n0 + n1;
    std::vector<std::vector<double>> K, V;
    std::vector<float> e(hd);
    for (int j = 0; j < n; ++j) {
      seg.key(j, e.data());
      K.emplace_back(e.begin(), e.end());
      seg.value(j, e.data());
      V.emplace_back(e.begin(), e.end());
    }
    const int rows = 5;
    std::mt19937 rng(3);
    std::normal_distribution<float> nd;
    std::vector<float> q(rows * hd);
    for (auto& v : q) v = 0.6f * nd(rng);
    const int32_t vis[rows] = {1, 77, 150, n, n};
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const std::vector<int32_t> sel = {0, 3, 4, 5, 60, 61, 149, 200, 205};
    for (qdot::Level l : lv.all()) {
      qdot::set_level(l);
      SCOPED_TRACE(::testing::Message() << "bits " << cs.kbits << "/" << cs.vbits << " level " << qdot::level_name(l));
      std::vector<float> out(rows * hd), mass(n, 0.0f), probs(rows * n);
      attend_segment(seg, q.data(), rows, vis, scale, out.data(), hd, mass.data(), probs.data());
      double msum = 0;
      for (float x : mass) msum += x;
      EXPECT_NEAR(msum, rows, 1e-4);
      std::vector<double> mass64(n, 0.0), p64;
      for (int r = 0; r < rows; ++r) {
        const auto ref = attend64(K, V, q.data() + r * hd, vis[r], scale, nullptr, &p64);
        for (int i = 0; i < hd; ++i) ASSERT_NEAR(out[r * hd + i], ref[i], 2e-4 * (1 + std::fabs(ref[i]))) << "row " << r;
        for (int j = 0; j < n; ++j) {
          ASSERT_NEAR(probs[r * n + j], p64[j], 1e-6 + 1e-4 * p64[j]) << "row " << r << " entry " << j;
          mass64[j] += p64[j];
        }
        for (int j = vis[r]; j < n; ++j) ASSERT_EQ(probs[r * n + j], 0.0f);
      }
      for (int j = 0; j < n; ++j) ASSERT_NEAR(mass[j], mass64[j], 1e-6 + 1e-4 * mass64[j]) << "entry " << j;
      attend_segment_subset(seg, sel.data(), static_cast<int>(sel.size()), q.data(), rows, vis, scale, out.data(), hd);
      for (int r = 0; r < rows; ++r) {
        const auto ref = attend64(K, V, q.data() + r * hd, vis[r], scale, &sel);
        for (int i = 0; i < hd; ++i)
          ASSERT_NEAR(out[r * hd + i], ref[i], 2e-4 * (1 + std::fabs(ref[i]))) << "subset row " << r;
      }
    }
  }
}

TEST(LatentCodeDot, BasisExpansionMatchesFloat64AtEveryLevel) {
  // out_r = mean + sum_i u_ri proj_i for ranks and head dims with and without a tail of 8, with
  // and without a mean, 1-13 rows, rows written out_stride apart (the gap left untouched).
  struct Case {
    int rank, hd;
    bool mean;
  };
  const Case cases[] = {{64, 192, true}, {8, 8, true}, {17, 64, false}, {5, 13, true}, {1, 7, false}, {40, 24, true}};
  Levels lv;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (const Case& cs : cases)
    for (int rows : {1, 2, 5, 6, 7, 13}) {
      std::vector<float> proj(static_cast<size_t>(cs.rank) * cs.hd), mean(cs.hd), u(static_cast<size_t>(rows) * cs.rank);
      for (auto& x : proj) x = nd(rng);
      for (auto& x : mean) x = 2.0f + nd(rng);
      for (auto& x : u) x = 3.0f * nd(rng);
      const int64_t stride = cs.hd + 3;
      for (qdot::Level l : lv.all()) {
        qdot::set_level(l);
        SCOPED_TRACE(::testing::Message() << "rank " << cs.rank << " hd " << cs.hd << " rows " << rows << " level "
                                          << qdot::level_name(l));
        std::vector<float> out(static_cast<size_t>(rows) * stride, -5.0f);
        latent_dot::basis_expand(proj.data(), cs.mean ? mean.data() : nullptr, cs.rank, cs.hd, u.data(), rows,
                                 out.data(), stride);
        for (int r = 0; r < rows; ++r) {
          for (int d = 0; d < cs.hd; ++d) {
            double ref = cs.mean ? mean[d] : 0.0, mag = std::fabs(ref);
            for (int i = 0; i < cs.rank; ++i) {
              const double t = double(u[static_cast<size_t>(r) * cs.rank + i]) * proj[static_cast<size_t>(i) * cs.hd + d];
              ref += t;
              mag += std::fabs(t);
            }
            ASSERT_NEAR(out[r * stride + d], ref, 1e-6 * mag + 1e-6) << "row " << r << " dim " << d;
          }
          for (int d = cs.hd; d < stride && r + 1 < rows; ++d) ASSERT_EQ(out[r * stride + d], -5.0f);
        }
      }
    }
}

TEST(LatentCodeDot, ShiftedExpMatchesFloat64AtEveryLevel) {
  // exp(x - max) and its sum for lengths around the vector width, values from 0 down to far below
  // exp's float range (those give 0 or a denormal-free tiny value, within 1e-37 of the truth).
  Levels lv;
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> ud(-120.0f, 15.0f);
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(9), size_t(16), size_t(100), size_t(1001)}) {
    std::vector<float> x(n);
    for (auto& v : x) v = ud(rng);
    if (n > 3) x[2] = -1e30f;  // a masked-out logit
    for (qdot::Level l : lv.all()) {
      qdot::set_level(l);
      SCOPED_TRACE(::testing::Message() << "n " << n << " level " << qdot::level_name(l));
      std::vector<float> y = x;
      const float sum = latent_dot::exp_shifted(y.data(), n);
      if (n == 0) {
        EXPECT_EQ(sum, 0.0f);
        continue;
      }
      double mx = -1e300, sum64 = 0;
      for (float v : x) mx = std::max(mx, double(v));
      for (size_t j = 0; j < n; ++j) {
        const double ref = std::exp(double(x[j]) - mx);
        sum64 += ref;
        // The float argument x - max carries a relative rounding error, which exp turns into a
        // relative error proportional to |x - max| (as for std::exp on the float difference).
        const double tol = (2e-6 + 2e-7 * std::fabs(double(x[j]) - mx)) * ref + 1e-37;
        ASSERT_NEAR(y[j], ref, tol) << "entry " << j << " x " << x[j];
        ASSERT_GE(y[j], 0.0f);
      }
      EXPECT_NEAR(sum, sum64, 2e-6 * sum64);
    }
  }
}

TEST(LatentCodeDot, RefusesCodesThatAreNotQuantized) {
  const std::vector<float> x = rows_of(10, 8, 1);
  LatentCodes C(pca_basis(x.data(), 10, 8, 4), 0);
  EXPECT_THROW(latent_dot::code_rows(C), Error);
}

}  // namespace
