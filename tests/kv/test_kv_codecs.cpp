// KV cache codecs against float64: round-trip error bounds derived by hand from each format's
// definition, bit-exactness with ggml's q8_0/q4_0/f16/bf16 (kvslim::quantize_row, itself checked
// against ggml's output), KIVI's group layout, the residual window under appends and retains,
// precision tiers, re-rotation of quantized keys, and byte accounting.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kv/cache.h"
#include "press/wrappers/precision_tiers.h"
#include "kv/store.h"
#include "kvslim/quant.h"
#include "kernels/quant_dot.h"
#include "kv/simd.h"
#include "kv/codec.h"
#include "support/sanitizer.h"

using namespace kvslim;

namespace {

const double kHalfUlp16 = std::ldexp(1.0, -11);  // half an f16 ulp, relative
const double kUlp16 = std::ldexp(1.0, -10);

// Normal values with occasional large outliers, as real keys have.
std::vector<float> sample(size_t n, uint32_t seed, double outlier_p = 0.03, double outlier = 25.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<float> x(n);
  for (float& v : x) v = nd(rng) * (u(rng) < outlier_p ? static_cast<float>(outlier) : 1.0f);
  return x;
}

int gcd32(int hd) { return std::gcd(32, hd); }

// Largest absolute error allowed for element i of row x (head_dim hd) in codec c.
double row_bound(KVCodec c, const float* x, int hd, int i) {
  const double v = std::fabs(double(x[i]));
  switch (c) {
    case KVCodec::F32: return 0.0;
    case KVCodec::F16: return v * kHalfUlp16 + std::ldexp(1.0, -25);
    case KVCodec::BF16: return v * std::ldexp(1.0, -8);
    case KVCodec::Q8_0:
    case KVCodec::Q4_0: {
      const int qb = gcd32(hd), b0 = i / qb * qb;
      double amax = 0;
      for (int j = b0; j < b0 + qb; ++j) amax = std::max(amax, std::fabs(double(x[j])));
      // q8_0: d = amax/127, codes round(x/d) in [-127, 127]: |err| <= d/2, plus 127 codes times
      // the f16 rounding of d. q4_0: d = amax/8, codes trunc(x/d + 8.5) clamped to 15: |err| <= d
      // (the clamp of the extreme value), plus 8 codes times the rounding of d.
      if (c == KVCodec::Q8_0) return amax / 127 * (0.5 + 127 * kHalfUlp16) + 1e-7 * amax;
      return amax / 8 * (1.0 + 8 * kHalfUlp16) + 1e-7 * amax;
    }
    case KVCodec::Q2_1: {
      // d = (max - min) / 3, codes trunc((x - min) / d + 0.5) <= 3: |err| <= d / 2 with exact d and
      // min; the f16 min and step add half an f16 ulp of |min| and 3 halves of d's.
      const int qb = gcd32(hd), b0 = i / qb * qb;
      double mn = x[b0], mx = x[b0];
      for (int j = b0; j < b0 + qb; ++j) mn = std::min(mn, double(x[j])), mx = std::max(mx, double(x[j]));
      const double d = (mx - mn) / 3;
      return d / 2 + kHalfUlp16 * std::fabs(mn) + 3 * kHalfUlp16 * d + std::ldexp(1.0, -24) + 1e-6 * (mx - mn);
    }
  }
  return 0.0;
}

GGMLType ggml_type(KVCodec c) {
  switch (c) {
    case KVCodec::F32: return GGMLType::F32;
    case KVCodec::F16: return GGMLType::F16;
    case KVCodec::BF16: return GGMLType::BF16;
    case KVCodec::Q8_0: return GGMLType::Q8_0;
    case KVCodec::Q4_0: return GGMLType::Q4_0;
    case KVCodec::Q2_1: break;  // no ggml type
  }
  return GGMLType::F32;
}

// KIVI's bound for a group with values in [mn, mx] at `bits`: the f16 zero point is rounded down
// (at most one f16 ulp below mn), the step (mx - zero) / (2^b - 1) rounded up (one ulp), and a
// value lands within step / 2 of its level.
double kivi_bound(double mn, double mx, int bits) {
  const double qmax = (1 << bits) - 1;
  const double mag = std::max(std::fabs(mn), std::fabs(mx));
  const double zero_slack = kUlp16 * std::fabs(mn) + std::ldexp(1.0, -24);
  return 0.5 * (mx - mn + zero_slack) / qmax * (1.0 + 4 * kUlp16) + zero_slack + 1e-6 * mag;
}

const KVCodec kAll[] = {KVCodec::F32, KVCodec::F16, KVCodec::BF16, KVCodec::Q8_0, KVCodec::Q4_0};

}  // namespace

TEST(KVCodec, NamesFollowLlamaCpp) {
  for (KVCodec c : kAll) EXPECT_EQ(parse_codec(codec_name(c)), c);
  EXPECT_THROW(parse_codec("q4_1"), Error);
  EXPECT_THROW(parse_codec("int8"), Error);
  EXPECT_EQ(codec_row_bytes(KVCodec::Q8_0, 128), 4u * 34);  // ggml block_q8_0: 34 bytes per 32
  EXPECT_EQ(codec_row_bytes(KVCodec::Q4_0, 128), 4u * 18);  // block_q4_0: 18 bytes per 32
  EXPECT_EQ(codec_row_bytes(KVCodec::Q8_0, 8), 10u);        // head_dim 8: one block of 8
  EXPECT_EQ(codec_row_bytes(KVCodec::BF16, 64), 128u);
}

TEST(KVCodec, RoundTripWithinBoundAgainstFloat64) {
  for (int hd : {8, 64, 96, 6}) {
    for (KVCodec c : {KVCodec::F32, KVCodec::F16, KVCodec::BF16, KVCodec::Q8_0, KVCodec::Q4_0, KVCodec::Q2_1}) {
      Segment s(hd, c, c);
      const int n = 41;  // crosses key tiles, leaves a partial one
      auto k = sample(static_cast<size_t>(n) * hd, 1 + hd), v = sample(static_cast<size_t>(n) * hd, 2 + hd);
      for (int i = 0; i < n; ++i) s.append(&k[i * hd], &v[i * hd], i);
      std::vector<float> got(hd), all_k(static_cast<size_t>(n) * hd), all_v(all_k.size());
      s.keys(0, n, all_k.data());
      s.values(0, n, all_v.data());
      for (int i = 0; i < n; ++i) {
        s.key(i, got.data());
        for (int d = 0; d < hd; ++d) {
          ASSERT_LE(std::fabs(double(got[d]) - k[i * hd + d]), row_bound(c, &k[i * hd], hd, d))
              << codec_name(c) << " hd " << hd << " key " << i << " dim " << d;
          ASSERT_EQ(got[d], all_k[i * hd + d]);
        }
        s.value(i, got.data());
        for (int d = 0; d < hd; ++d) {
          ASSERT_LE(std::fabs(double(got[d]) - v[i * hd + d]), row_bound(c, &v[i * hd], hd, d))
              << codec_name(c) << " hd " << hd << " value " << i << " dim " << d;
          ASSERT_EQ(got[d], all_v[i * hd + d]);
        }
      }
    }
  }
}

// q2_1 (LeanKV's 2-bit rows): the layout written by hand for one row of head_dim 8 (one block):
// values 0..7 -> min 0, step 7/3; codes trunc(x * 3/7 + 0.5) = 0 0 1 1 2 2 3 3, four per byte,
// value j at bits 2 (j % 4); then the bytes of a whole entry and the row sizes.
TEST(KVCodec, Q2_1LayoutAndBytesByHand) {
  EXPECT_EQ(parse_codec("q2_1"), KVCodec::Q2_1);
  EXPECT_STREQ(codec_name(KVCodec::Q2_1), "q2_1");
  EXPECT_TRUE(codec_is_quantized(KVCodec::Q2_1));
  EXPECT_EQ(codec_row_bytes(KVCodec::Q2_1, 128), 4u * 4 + 32);  // 4 blocks x (f16 step, f16 min) + 2 bits x 128
  EXPECT_EQ(codec_row_bytes(KVCodec::Q2_1, 8), 4u + 2);
  EXPECT_EQ(codec_row_bytes(KVCodec::Q2_1, 6), 3u * 4 + 2);       // 3 blocks of gcd(32, 6) = 2
  const float x[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  Segment s(8, KVCodec::Q2_1, KVCodec::Q2_1);
  s.append(x, x, 0);
  float got[8];
  s.value(0, got);
  const double d = fp16_to_fp32(fp32_to_fp16(7.0f / 3.0f));
  const int codes[8] = {0, 0, 1, 1, 2, 2, 3, 3};
  for (int j = 0; j < 8; ++j) EXPECT_FLOAT_EQ(got[j], static_cast<float>(codes[j] * d)) << j;
  s.key(0, got);
  for (int j = 0; j < 8; ++j) EXPECT_FLOAT_EQ(got[j], static_cast<float>(codes[j] * d)) << j;
  EXPECT_EQ(s.kv_bytes(), 2u * 6);
}

TEST(KVCodec, BitExactWithGgmlWhereHeadDimHoldsWholeBlocks) {
  const int hd = 128, n = 20;
  for (KVCodec c : kAll) {
    Segment s(hd, c, c);
    auto k = sample(static_cast<size_t>(n) * hd, 7), v = sample(static_cast<size_t>(n) * hd, 8);
    for (int i = 0; i < n; ++i) s.append(&k[i * hd], &v[i * hd], i);
    const GGMLType t = ggml_type(c);
    std::vector<uint8_t> q(row_bytes(t, hd));
    std::vector<float> want(hd), got(hd);
    for (int i = 0; i < n; ++i) {
      quantize_row(t, &k[i * hd], q.data(), hd);
      dequantize_row(t, q.data(), want.data(), hd);
      s.key(i, got.data());
      for (int d = 0; d < hd; ++d) ASSERT_EQ(got[d], want[d]) << codec_name(c) << " key " << i << " dim " << d;
      quantize_row(t, &v[i * hd], q.data(), hd);
      dequantize_row(t, q.data(), want.data(), hd);
      s.value(i, got.data());
      for (int d = 0; d < hd; ++d) ASSERT_EQ(got[d], want[d]) << codec_name(c) << " value " << i << " dim " << d;
    }
  }
}

TEST(KVCodec, KiviGroupLayout) {
  // Keys per channel over groups of G tokens, values per token over groups of G channels, the
  // newest R entries in full precision. An outlier channel in the keys and outlier tokens in the
  // values make the bound fail for any other layout.
  const int hd = 64, G = 32, R = 128, n = 300;
  for (int bits : {2, 4}) {
    KVQuantOptions q;
    q.kivi_bits = bits;
    q.kivi_group = G;
    q.kivi_residual = R;
    Segment s(hd, KVCodec::F32, KVCodec::F32, q);
    auto k = sample(static_cast<size_t>(n) * hd, 11, 0.0), v = sample(static_cast<size_t>(n) * hd, 12, 0.0);
    for (int i = 0; i < n; ++i) k[i * hd + 5] = 40.0f + 10.0f * k[i * hd + 5];  // outlier channel
    for (int i = 0; i < n; i += 7)
      for (int d = 0; d < hd; ++d) v[i * hd + d] *= 30.0f;  // outlier tokens
    for (int i = 0; i < n; ++i) s.append(&k[i * hd], &v[i * hd], i);

    const int grouped = (n - R) / G * G;  // expired entries leave the window G at a time
    const KVStore& st = s.store(0);
    EXPECT_EQ(st.group_entries(), static_cast<size_t>(grouped));
    EXPECT_EQ(st.group_sizes(), std::vector<int>(grouped / G, G));
    EXPECT_EQ(st.row_entries(), static_cast<size_t>(n - grouped));

    std::vector<float> got(hd);
    for (int i = 0; i < n; ++i) {
      s.key(i, got.data());
      for (int c = 0; c < hd; ++c) {
        double bound = 0.0;
        if (i < grouped) {
          const int g0 = i / G * G;
          double mn = 1e30, mx = -1e30;
          for (int t = g0; t < g0 + G; ++t) mn = std::min(mn, double(k[t * hd + c])), mx = std::max(mx, double(k[t * hd + c]));
          bound = kivi_bound(mn, mx, bits);
        }
        ASSERT_LE(std::fabs(double(got[c]) - k[i * hd + c]), bound) << "bits " << bits << " key " << i << " ch " << c;
      }
      s.value(i, got.data());
      for (int c = 0; c < hd; ++c) {
        double bound = 0.0;
        if (i < grouped) {
          const int c0 = c / G * G;
          double mn = 1e30, mx = -1e30;
          for (int d = c0; d < c0 + G; ++d) mn = std::min(mn, double(v[i * hd + d])), mx = std::max(mx, double(v[i * hd + d]));
          bound = kivi_bound(mn, mx, bits);
        }
        ASSERT_LE(std::fabs(double(got[c]) - v[i * hd + c]), bound) << "bits " << bits << " value " << i << " ch " << c;
      }
    }
  }
}

TEST(KVCodec, KiviRetainOfScatteredEntriesMergesSparseGroups) {
  // A budget press keeps scattered entries of every group. Without merging, 64 groups of 4 tokens
  // would each keep 64 channels of key zero points and steps; merged, they are 8 full groups.
  const int hd = 64, G = 32, n = 64 * G;
  for (int bits : {2, 4}) {
    KVQuantOptions q;
    q.kivi_bits = bits;
    q.kivi_group = G;
    q.kivi_residual = 0;
    Segment s(hd, KVCodec::F32, KVCodec::F32, q);
    auto k = sample(static_cast<size_t>(n) * hd, 31), v = sample(static_cast<size_t>(n) * hd, 32);
    for (int i = 0; i < n; ++i) s.append(&k[i * hd], &v[i * hd], i);
    ASSERT_EQ(s.store(0).group_entries(), static_cast<size_t>(n));
    std::vector<int32_t> keep;
    for (int i = 0; i < n; i += 8) keep.push_back(i);
    const size_t m = keep.size();
    std::vector<float> kb(m * hd), vb(m * hd);
    for (size_t j = 0; j < m; ++j) {
      s.key(keep[j], &kb[j * hd]);
      s.value(keep[j], &vb[j * hd]);
    }
    s.retain(keep);
    const KVStore& st = s.store(0);
    ASSERT_EQ(st.group_sizes(), std::vector<int>(m / G, G)) << "bits " << bits;
    // Layout (kv/kivi.cpp): key zero points and steps (f16 per channel), key codes, and per token a
    // value record of hd / G (f16 zero, f16 step) pairs and hd codes.
    const size_t group = hd * 4 + hd * (G * bits / 8) + G * ((hd / G) * 4 + hd * bits / 8);
    EXPECT_EQ(st.kv_bytes(), m / G * group) << "bits " << bits;
    // Values move byte for byte; keys are requantized once over the merged group's range of the
    // keys as stored before, so each moves by at most half of the new step.
    std::vector<float> got(hd);
    for (size_t j = 0; j < m; ++j) {
      s.value(j, got.data());
      for (int c = 0; c < hd; ++c) ASSERT_EQ(got[c], vb[j * hd + c]) << "bits " << bits << " value " << j;
      s.key(j, got.data());
      const size_t g0 = j / G * G;
      for (int c = 0; c < hd; ++c) {
        double mn = 1e30, mx = -1e30;
        for (size_t t = g0; t < g0 + G; ++t) mn = std::min(mn, double(kb[t * hd + c])), mx = std::max(mx, double(kb[t * hd + c]));
        ASSERT_LE(std::fabs(double(got[c]) - kb[j * hd + c]), kivi_bound(mn, mx, bits)) << "bits " << bits << " key " << j << " ch " << c;
      }
    }
  }
}

TEST(KVCodec, KiviGroupsStayBoundedUnderRepeatedBudgetRetains) {
  // The pattern of a per-head budget during chunked prefill: append a chunk, keep a scattered
  // subset of at most B entries. The groups must not outnumber what the kept entries need: no two
  // adjacent groups at most half full, so at most 2 * entries / (G / 2) + 1 groups.
  const int hd = 32, G = 16, R = 32, B = 300;
  KVQuantOptions q;
  q.kivi_bits = 4;
  q.kivi_group = G;
  q.kivi_residual = R;
  Segment s(hd, KVCodec::F16, KVCodec::F16, q);
  std::mt19937 rng(77);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  int pos = 0;
  size_t max_bytes = 0;
  for (int chunk = 0; chunk < 40; ++chunk) {
    for (int j = 0; j < 128; ++j, ++pos) {
      auto kv = sample(2 * hd, rng());
      s.append(kv.data(), kv.data() + hd, pos);
    }
    std::vector<int32_t> keep;
    const double p = std::min(1.0, double(B) / s.size());
    for (size_t i = 0; i < s.size(); ++i)
      if (u(rng) < p && keep.size() < static_cast<size_t>(B)) keep.push_back(static_cast<int32_t>(i));
    s.retain(keep);
    const KVStore& st = s.store(0);
    const std::vector<int> sizes = st.group_sizes();
    for (size_t g = 0; g + 1 < sizes.size(); ++g)
      ASSERT_FALSE(sizes[g] <= G / 2 && sizes[g + 1] <= G / 2) << "chunk " << chunk << " groups " << g << ", " << g + 1;
    ASSERT_LE(sizes.size(), 4 * st.group_entries() / G + 1) << "chunk " << chunk;
    max_bytes = std::max(max_bytes, st.kv_bytes());
  }
  // B entries of f16 keys and values are the ceiling a 4-bit cache must stay well under.
  EXPECT_LT(max_bytes, static_cast<size_t>(B) * hd * 2 * 2 / 2);
}

TEST(KVCodec, KiviResidualWindowStaysFullPrecisionThroughAppendsAndRetains) {
  const int hd = 16, G = 8, R = 16;
  struct Entry {
    std::vector<float> k, v;
    uint64_t serial;
    int32_t pos;
  };
  for (int bits : {2, 4}) {
    KVQuantOptions q;
    q.kivi_bits = bits;
    q.kivi_group = G;
    q.kivi_residual = R;
    Segment s(hd, KVCodec::F32, KVCodec::F32, q);
    std::vector<Entry> model;
    std::mt19937 rng(100 + bits);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    uint64_t appended = 0;
    for (int step = 0; step < 300; ++step) {
      if (u(rng) < 0.75) {
        const int m = 1 + static_cast<int>(u(rng) * 6);
        for (int j = 0; j < m; ++j) {
          Entry e{sample(hd, rng()), sample(hd, rng()), appended, static_cast<int32_t>(appended)};
          s.append(e.k.data(), e.v.data(), e.pos);
          model.push_back(std::move(e));
          ++appended;
        }
      } else {
        std::vector<int32_t> keep;
        std::vector<Entry> kept;
        for (size_t i = 0; i < model.size(); ++i)
          if (u(rng) < 0.7) {
            keep.push_back(static_cast<int32_t>(i));
            kept.push_back(model[i]);
          }
        s.retain(keep);
        model.swap(kept);
      }
      ASSERT_EQ(s.size(), model.size());
      const KVStore& st = s.store(0);
      const size_t grouped = st.group_entries();
      const std::vector<int> sizes = st.group_sizes();
      ASSERT_EQ(std::accumulate(sizes.begin(), sizes.end(), size_t{0}), grouped);
      for (int gs : sizes) ASSERT_LE(gs, G);
      std::vector<float> got(hd);
      for (size_t i = 0; i < model.size(); ++i) {
        ASSERT_EQ(s.positions()[i], model[i].pos);
        const bool in_window = model[i].serial + R >= appended;
        if (in_window) {
          ASSERT_GE(i, grouped) << "an entry of the newest R appends was quantized (step " << step << ")";
        }
        if (i >= grouped) {  // the full-precision part: exactly what was appended
          s.key(i, got.data());
          ASSERT_EQ(got, model[i].k) << "step " << step << " entry " << i;
          s.value(i, got.data());
          ASSERT_EQ(got, model[i].v) << "step " << step << " entry " << i;
        }
      }
      // Entries wait in full precision only until G of them have left the window.
      size_t expired_rows = 0;
      for (size_t i = grouped; i < model.size(); ++i) expired_rows += model[i].serial + R < appended;
      ASSERT_LT(expired_rows, static_cast<size_t>(G));
    }
  }
}

TEST(KVCodec, ReRotationOfQuantizedKeysMatchesReRotationOfFloatKeys) {
  // Key re-rotation (KeyRerotation, SinkCache): RoPE by a position delta applied to stored keys.
  // Quantized keys are decoded, rotated and re-encoded; the result must stay within the first
  // quantization error (rotated) plus the second one of the float64 rotation of the original.
  const int hd = 64, n = 64;
  struct Cfg {
    KVCodec c;
    int bits;
  };
  const Cfg cfgs[] = {{KVCodec::F16, 0}, {KVCodec::BF16, 0}, {KVCodec::Q8_0, 0}, {KVCodec::Q4_0, 0},
                      {KVCodec::F32, 2}, {KVCodec::F32, 4}};
  for (const Cfg& cfg : cfgs) {
    KVQuantOptions q;
    q.kivi_bits = cfg.bits;
    q.kivi_group = 32;
    q.kivi_residual = 0;  // every entry quantized
    Segment s(hd, cfg.c, cfg.c, q);
    auto k = sample(static_cast<size_t>(n) * hd, 21);
    std::vector<float> v(k.size(), 0.5f);
    for (int i = 0; i < n; ++i) s.append(&k[i * hd], &v[i * hd], 1000 + i);
    std::mt19937 rng(5);
    std::vector<double> delta(n);
    for (double& d : delta) d = std::uniform_int_distribution<int>(-900, 0)(rng);
    auto rope64 = [&](const double* x, double dp, double* y) {
      for (int i = 0; i < hd / 2; ++i) {
        const double th = dp * std::pow(10000.0, -2.0 * i / hd);
        y[2 * i] = x[2 * i] * std::cos(th) - x[2 * i + 1] * std::sin(th);
        y[2 * i + 1] = x[2 * i] * std::sin(th) + x[2 * i + 1] * std::cos(th);
      }
    };
    // What a re-rotation press does: decode, rotate, set_keys.
    std::vector<float> dec(static_cast<size_t>(n) * hd), rot(dec.size());
    s.keys(0, n, dec.data());
    std::vector<double> a(hd), b(hd);
    for (int i = 0; i < n; ++i) {
      for (int d = 0; d < hd; ++d) a[d] = dec[i * hd + d];
      rope64(a.data(), delta[i], b.data());
      for (int d = 0; d < hd; ++d) rot[i * hd + d] = static_cast<float>(b[d]);
    }
    s.set_keys(0, n, rot.data());

    // Per-element bounds of the first (original keys) and second (rotated decoded keys) encoding.
    auto bounds = [&](const std::vector<float>& x) {
      std::vector<double> bd(x.size());
      for (int i = 0; i < n; ++i)
        for (int c = 0; c < hd; ++c) {
          if (!cfg.bits) {
            bd[i * hd + c] = row_bound(cfg.c, &x[i * hd], hd, c);
          } else {
            const int g0 = i / 32 * 32;
            double mn = 1e30, mx = -1e30;
            for (int t = g0; t < g0 + 32; ++t) mn = std::min(mn, double(x[t * hd + c])), mx = std::max(mx, double(x[t * hd + c]));
            bd[i * hd + c] = kivi_bound(mn, mx, cfg.bits);
          }
        }
      return bd;
    };
    const auto b1 = bounds(k), b2 = bounds(rot);
    std::vector<float> got(hd);
    double worst = 0, worst_bound = 0;
    for (int i = 0; i < n; ++i) {
      for (int d = 0; d < hd; ++d) a[d] = k[i * hd + d];
      rope64(a.data(), delta[i], b.data());  // the float re-rotation
      s.key(i, got.data());
      for (int c = 0; c < hd; ++c) {
        const int p = c ^ 1;  // RoPE mixes channel pairs
        const double bound = std::hypot(b1[i * hd + c], b1[i * hd + p]) + b2[i * hd + c] + 1e-5 * std::fabs(b[c]);
        const double err = std::fabs(double(got[c]) - b[c]);
        ASSERT_LE(err, bound) << codec_name(cfg.c) << " kivi" << cfg.bits << " key " << i << " ch " << c;
        worst = std::max(worst, err);
        worst_bound = std::max(worst_bound, bound);
      }
    }
    EXPECT_GT(worst_bound, 0.0);
  }
}

TEST(KVCodec, HadamardRotationIsUndoneOnRead) {
  // Keys are stored rotated; key() returns the key as appended (exact up to float rounding with
  // f32 storage), and q4_0 after rotation stays within the bound of the rotated row in L2.
  for (int hd : {64, 96, 8}) {
    KVQuantOptions q;
    q.hadamard = true;
    Segment f(hd, KVCodec::F32, KVCodec::F32, q), q4(hd, KVCodec::Q4_0, KVCodec::F32, q);
    auto k = sample(static_cast<size_t>(10) * hd, 31);
    for (int i = 0; i < 10; ++i) {
      f.append(&k[i * hd], &k[i * hd], i);
      q4.append(&k[i * hd], &k[i * hd], i);
    }
    const int hb = hd & -hd;  // block of the block-diagonal rotation
    std::vector<float> got(hd);
    for (int i = 0; i < 10; ++i) {
      f.key(i, got.data());
      for (int d = 0; d < hd; ++d) ASSERT_NEAR(got[d], k[i * hd + d], 1e-5 * (1 + std::fabs(k[i * hd + d])));
      // Float64 Hadamard of the key (Sylvester matrix, entries (-1)^popcount(i&j) / sqrt(hb)).
      std::vector<float> hk(hd);
      for (int b0 = 0; b0 < hd; b0 += hb)
        for (int r = 0; r < hb; ++r) {
          double acc = 0;
          for (int c = 0; c < hb; ++c) acc += (__builtin_popcount(r & c) & 1 ? -1.0 : 1.0) * k[i * hd + b0 + c];
          hk[b0 + r] = static_cast<float>(acc / std::sqrt(double(hb)));
        }
      double b2 = 0, e2 = 0;
      for (int d = 0; d < hd; ++d) b2 += std::pow(row_bound(KVCodec::Q4_0, hk.data(), hd, d) + 1e-6, 2);
      q4.key(i, got.data());
      for (int d = 0; d < hd; ++d) e2 += std::pow(double(got[d]) - k[i * hd + d], 2);
      ASSERT_LE(std::sqrt(e2), std::sqrt(b2)) << "hd " << hd << " key " << i;
    }
  }
}

TEST(KVCodec, PrecisionTiersSplitByScore) {
  const int hd = 64, n = 100;
  Segment s(hd, KVCodec::F16, KVCodec::F16);
  auto k = sample(static_cast<size_t>(n) * hd, 41), v = sample(static_cast<size_t>(n) * hd, 42);
  for (int i = 0; i < n; ++i) s.append(&k[i * hd], &v[i * hd], i);
  std::vector<float> score(n);
  for (int i = 0; i < n; ++i) score[i] = static_cast<float>((i * 37) % n);  // a permutation of 0..99
  for (int i : {3, 4}) score[i] = 3.0e38f;                                 // protected, low raw rank
  apply_precision_tiers(s, score, 30, 40, KVCodec::Q8_0, KVCodec::Q4_0);
  // Expected by hand: protected entries and the 28 best others are high; the next 40 are low.
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return score[a] > score[b]; });
  std::vector<int> tier(n, 2);
  for (int r = 0; r < 70; ++r) tier[order[r]] = r < 30 ? 0 : 1;
  std::vector<int> kept_ids;
  for (int i = 0; i < n; ++i)
    if (tier[i] < 2) kept_ids.push_back(i);
  ASSERT_EQ(s.size(), 70u);
  EXPECT_EQ(s.low_tier_size(), 40u);
  std::vector<float> got(hd);
  for (size_t j = 0; j < kept_ids.size(); ++j) {
    const int i = kept_ids[j];
    EXPECT_EQ(s.positions()[j], i);
    EXPECT_EQ(s.is_low(j), tier[i] == 1) << "entry " << i;
    // Low-tier entries were f16 first, then re-encoded from the decoded f16 values.
    const KVCodec kc = tier[i] ? KVCodec::Q8_0 : KVCodec::F32, vc = tier[i] ? KVCodec::Q4_0 : KVCodec::F32;
    std::vector<float> k16(hd), v16(hd);
    for (int d = 0; d < hd; ++d) {
      k16[d] = fp16_to_fp32(fp32_to_fp16(k[i * hd + d]));
      v16[d] = fp16_to_fp32(fp32_to_fp16(v[i * hd + d]));
    }
    s.key(j, got.data());
    for (int d = 0; d < hd; ++d)
      ASSERT_LE(std::fabs(double(got[d]) - k[i * hd + d]),
                row_bound(kc, k16.data(), hd, d) + row_bound(KVCodec::F16, &k[i * hd], hd, d))
          << "entry " << i;
    s.value(j, got.data());
    for (int d = 0; d < hd; ++d)
      ASSERT_LE(std::fabs(double(got[d]) - v[i * hd + d]),
                row_bound(vc, v16.data(), hd, d) + row_bound(KVCodec::F16, &v[i * hd], hd, d))
          << "entry " << i;
  }
  // Bytes: 30 f16 entries, 40 entries of q8_0 keys (68 B) and q4_0 values (36 B), positions, and
  // the tier map: a bit per entry in 64-bit words plus a 32-bit count per word (2 words here).
  EXPECT_EQ(s.bytes(), 30u * 256 + 40u * (68 + 36) + 70u * 4 + 2u * (8 + 4));
  EXPECT_EQ(s.kv_bytes(), 30u * 256 + 40u * (68 + 36));
  // New entries go to the high tier; retain keeps every entry's tier.
  s.append(&k[0], &v[0], 500);
  EXPECT_FALSE(s.is_low(70));
  std::vector<int32_t> keep;
  for (int j = 0; j < 71; j += 2) keep.push_back(j);
  std::vector<bool> was_low;
  for (int32_t j : keep) was_low.push_back(s.is_low(j));
  s.retain(keep);
  for (size_t j = 0; j < keep.size(); ++j) EXPECT_EQ(s.is_low(j), was_low[j]);
  // KIVI caches cannot be split by tier.
  KVQuantOptions kq;
  kq.kivi_bits = 4;
  Segment kv(hd, KVCodec::F16, KVCodec::F16, kq);
  kv.append(&k[0], &v[0], 0);
  EXPECT_THROW(kv.retain_tiered({0}, {1}, KVCodec::Q8_0, KVCodec::Q4_0), Error);
}

TEST(KVCodec, BytesIncludeScalesAndZeroPoints) {
  const int hd = 64, n = 200;
  auto k = sample(static_cast<size_t>(n) * hd, 51);
  // Row codecs: key + value row bytes and a 4-byte position per entry.
  const std::pair<KVCodec, size_t> rows[] = {
      {KVCodec::F32, 256}, {KVCodec::F16, 128}, {KVCodec::BF16, 128}, {KVCodec::Q8_0, 2 * 34}, {KVCodec::Q4_0, 2 * 18}};
  for (auto [c, rb] : rows) {
    Segment s(hd, c, c);
    for (int i = 0; i < n; ++i) s.append(&k[i * hd], &k[i * hd], i);
    EXPECT_EQ(s.bytes(), n * (2 * rb + 4)) << codec_name(c);
  }
  // KIVI 2-bit, G = 32, R = 128, f16 residual: 64 expired entries form 2 groups; a group of 32
  // tokens holds per channel an f16 zero point and step (64 x 4 B) and 32 x 2 bits of codes
  // (64 x 8 B), and per token 2 value groups x 4 B plus 64 x 2 bits (16 B).
  KVQuantOptions q;
  q.kivi_bits = 2;
  Segment s(hd, KVCodec::F16, KVCodec::F16, q);
  for (int i = 0; i < n; ++i) s.append(&k[i * hd], &k[i * hd], i);
  const size_t group = 64 * 4 + 64 * 8 + 32 * (2 * 4 + 16);
  EXPECT_EQ(s.store(0).group_entries(), 64u);
  EXPECT_EQ(s.kv_bytes(), 2 * group + 136u * 256);
  EXPECT_EQ(s.bytes(), 2 * group + 136u * (256 + 4) + 200u * 4);  // + serials of the window, positions
  EXPECT_EQ(group * 8 / (32 * 2 * 64), 3u);                        // 2-bit codes + 1 bit of scales
  // The memory ratio's reference: a full f16 cache with positions.
  KVCache cache(2, 3, hd);
  EXPECT_EQ(cache.full_f16_bytes(10), 10u * 2 * 3 * (256 + 4));
}

TEST(KVCodec, IncompatibleConfigurationsAreRejected) {
  KVQuantOptions q;
  q.kivi_bits = 3;
  EXPECT_THROW(validate_cache_config(KVCodec::F16, KVCodec::F16, q), Error);
  q.kivi_bits = 2;
  EXPECT_THROW(validate_cache_config(KVCodec::Q8_0, KVCodec::F16, q), Error);
  EXPECT_THROW(validate_cache_config(KVCodec::F16, KVCodec::Q4_0, q), Error);
  EXPECT_NO_THROW(validate_cache_config(KVCodec::BF16, KVCodec::F32, q));
  q.kivi_group = 0;
  EXPECT_THROW(validate_cache_config(KVCodec::F16, KVCodec::F16, q), Error);
  q.kivi_group = 48;  // values: groups of 48 channels do not divide head_dim 64
  EXPECT_THROW(validate_cache_config(KVCodec::F16, KVCodec::F16, q, 64), Error);
  EXPECT_THROW(KVCache(1, 1, 64, KVCodec::F16, KVCodec::F16, q), Error);
  q.kivi_group = 32;
  q.kivi_residual = -1;
  EXPECT_THROW(validate_cache_config(KVCodec::F16, KVCodec::F16, q), Error);
}

namespace {
#if defined(__clang__) && __clang_major__ < 15  // no "arch=x86-64-v4" target there (sanitizer builds)
#define KVSLIM_TARGET_V4 __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512dq,avx512cd")))
#else
#define KVSLIM_TARGET_V4 __attribute__((target("arch=x86-64-v4")))
#endif
KVSLIM_TARGET_V4 float half_v4(uint16_t h) { return kv::simd::half(h); }
KVSLIM_TARGET_V4 void from_f16_v4(const uint16_t* p, float* out) {
#if defined(__clang__) && __clang_major__ < 15  // from_f16 is scalar there (kv/simd.h)
  for (int i = 0; i < 16; ++i) out[i] = kv::simd::half(p[i]);
#else
  kv::simd::store(out, kv::simd::from_f16(p));
#endif
}
}  // namespace

// The inlined f16 conversions of the decoders equal the reference conversion (ggml's) for every
// one of the 65,536 f16 values, in the baseline build and with F16C / AVX-512 instructions.
TEST(KVCodecs, InlineHalfConversionIsExactForEveryValue) {
  const bool v4 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  for (uint32_t h = 0; h < 65536; h += 16) {
    float a[16], b[16];
    kv::simd::store(a, kv::simd::from_f16(&all[h]));
    if (v4) from_f16_v4(&all[h], b);
    for (int j = 0; j < 16; ++j) {
      const uint16_t x = static_cast<uint16_t>(h + j);
      const float ref = fp16_to_fp32(x);
      std::vector<float> got{kv::simd::half(x), a[j]};
      if (v4) got.insert(got.end(), {half_v4(x), b[j]});
      for (float g : got) {
        if (std::isnan(ref)) {
          ASSERT_TRUE(std::isnan(g)) << std::hex << x;
        } else {
          uint32_t gb, rb;
          std::memcpy(&gb, &g, 4);
          std::memcpy(&rb, &ref, 4);
          ASSERT_EQ(gb, rb) << std::hex << x;
        }
      }
    }
  }
}

// The block decoders the attention kernel reads (transposed key tiles, value rows, KIVI groups)
// at every SIMD level against the entry-by-entry scalar decode (Segment::keys / values): q8_0,
// q4_0, f16 and bf16 products are exact on every level, so equal bit for bit; KIVI's
// code * step + zero may be one fused multiply-add (AVX2, AVX-512) or a product and a sum
// (baseline), so within one rounding of the product (|product| <= |value| + |zero| <= |value| +
// the largest magnitude of the data). Head dims with whole 32-blocks (64),
// 16-blocks (80) and 8-blocks (8).
TEST(KVCodec, BlockDecodersAgreeAtEveryLevel) {
  const qdot::Level saved = qdot::level();
  const std::vector<qdot::Level> levels = qdot::supported_levels();
  struct Cfg {
    KVCodec k, v;
    int bits;
  };
  const Cfg cfgs[] = {{KVCodec::Q8_0, KVCodec::Q8_0, 0}, {KVCodec::Q4_0, KVCodec::Q4_0, 0}, {KVCodec::Q2_1, KVCodec::Q2_1, 0},
                      {KVCodec::F16, KVCodec::BF16, 0},  {KVCodec::F16, KVCodec::F16, 4},
                      {KVCodec::F16, KVCodec::F16, 2}};
  for (qdot::Level lv : levels)
    for (int hd : {64, 80, 8})
      for (const Cfg& c : cfgs) {
        qdot::set_level(lv);
        SCOPED_TRACE(std::string("level ") + qdot::level_name(lv) + " hd " + std::to_string(hd) + " bits " +
                     std::to_string(c.bits));
        KVQuantOptions q;
        q.kivi_bits = c.bits;
        q.kivi_group = std::gcd(16, hd);  // tokens per key group and channels per value group
        q.kivi_residual = 16;
        Segment s(hd, c.k, c.v, q);
        const int n = 100;
        auto k = sample(static_cast<size_t>(n) * hd, 5), v = sample(static_cast<size_t>(n) * hd, 6);
        for (int i = 0; i < n; ++i) s.append(&k[i * hd], &v[i * hd], i);
        float amax = 0;
        for (size_t i = 0; i < k.size(); ++i) amax = std::max({amax, std::fabs(k[i]), std::fabs(v[i])});
        std::vector<float> rk(static_cast<size_t>(n) * hd), rv(rk.size());
        s.keys(0, n, rk.data());
        s.values(0, n, rv.data());
        std::vector<float> kt(static_cast<size_t>(hd) * kKVTile), vb(static_cast<size_t>(hd) * kKVTile);
        size_t base = 0;
        for (int si = 0; si < s.n_stores(); ++si) {
          const KVStore& st = s.store(si);
          for (size_t b = 0; b < st.size(); b = st.block_end(b)) {
            const size_t e = st.block_end(b);
            st.block_keys_t(b, e, kt.data());
            const float* vals = st.block_values(b, e, vb.data());
            for (size_t j = 0; j < e - b; ++j)
              for (int d = 0; d < hd; ++d) {
                const float ek = rk[(base + b + j) * hd + d], ev = rv[(base + b + j) * hd + d];
                const float gk = kt[d * kKVTile + j], gv = vals[j * hd + d];
                if (c.bits == 0) {
                  ASSERT_EQ(gk, ek) << "key " << b + j << " channel " << d;
                  ASSERT_EQ(gv, ev) << "value " << b + j << " channel " << d;
                } else {
                  ASSERT_NEAR(gk, ek, std::ldexp(std::fabs(ek) + 2 * amax, -23)) << "key " << b + j << " channel " << d;
                  ASSERT_NEAR(gv, ev, std::ldexp(std::fabs(ev) + 2 * amax, -23)) << "value " << b + j << " channel " << d;
                }
              }
          }
          base += st.size();
        }
        EXPECT_EQ(base, static_cast<size_t>(n));
      }
  qdot::set_level(saved);
}

namespace {
// q2_1 value j of a row (layout of kv/codec_q2_1.cpp read from the bytes): min + code * step,
// in float64 then rounded once (both terms are exact in float64 and so is their sum: f16 values
// times a code in [0, 3] span at most 13 + 40 bits), i.e. the float that one fused multiply-add or
// an exact product then a sum yields.
float q2_1_row_ref(const uint8_t* row, int hd, int j) {
  const int qb = std::gcd(32, hd), nb = hd / qb, b = j / qb;
  uint16_t d, m;
  std::memcpy(&d, row + 4 * b, 2);
  std::memcpy(&m, row + 4 * b + 2, 2);
  const int code = (row[4 * nb + j / 4] >> (2 * (j % 4))) & 3;
  return static_cast<float>(static_cast<double>(fp16_to_fp32(m)) + code * static_cast<double>(fp16_to_fp32(d)));
}
// The same for lane l, channel c of a key tile: f16 steps [nb][16], f16 minimums [nb][16], codes
// [hd][4 bytes], lane l at bits 2 (l % 4) of byte l / 4.
float q2_1_tile_ref(const uint8_t* tile, int hd, int l, int c) {
  const int qb = std::gcd(32, hd), nb = hd / qb, b = c / qb;
  uint16_t d, m;
  std::memcpy(&d, tile + 2 * (b * kKVTile + l), 2);
  std::memcpy(&m, tile + 2 * ((nb + b) * kKVTile + l), 2);
  const int code = (tile[nb * kKVTile * 4 + c * (kKVTile / 4) + l / 4] >> (2 * (l % 4))) & 3;
  return static_cast<float>(static_cast<double>(fp16_to_fp32(m)) + code * static_cast<double>(fp16_to_fp32(d)));
}
}  // namespace

// q2_1's block decoders (key tiles and value rows: generic code per level, hand-written AVX2) at
// every SIMD level against the value read from the bytes by the layout's definition and computed
// in float64 (q2_1_row_ref): equal bit for bit. Head dims with 32-blocks (128, 64), 16-blocks (80,
// the AVX2 rows path) and 8-blocks (8, 24: scalar rows tail).
TEST(KVCodec, Q2_1DecodersAreBitExactAtEveryLevel) {
  const qdot::Level saved = qdot::level();
  const std::vector<qdot::Level> levels = qdot::supported_levels();
  for (int hd : {128, 64, 80, 8, 24}) {
    const int n = 37;
    const auto x = sample(static_cast<size_t>(n) * hd, 11);
    const size_t rb = codec_row_bytes(KVCodec::Q2_1, hd);
    std::vector<uint8_t> rows(rb * n + 32);
    for (int i = 0; i < n; ++i) kv::q2_1_row_encode(hd, &x[static_cast<size_t>(i) * hd], &rows[rb * i]);
    std::vector<uint8_t> tile(static_cast<size_t>(hd) / std::gcd(32, hd) * kKVTile * 4 + hd * kKVTile / 4 + 32);
    for (int l = 0; l < kKVTile; ++l) kv::q2_1_tile_put(hd, tile.data(), l, &x[static_cast<size_t>(l) * hd]);
    for (qdot::Level lv : levels) {
      qdot::set_level(lv);
      SCOPED_TRACE(std::string("level ") + qdot::level_name(lv) + " hd " + std::to_string(hd));
      std::vector<float> out(static_cast<size_t>(n) * hd), kt(static_cast<size_t>(hd) * kKVTile);
      kv::q2_1_rows_decode(hd, rows.data(), out.data(), n);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < hd; ++j) ASSERT_EQ(out[static_cast<size_t>(i) * hd + j], q2_1_row_ref(&rows[rb * i], hd, j)) << i << " " << j;
      kv::q2_1_tile_decode(hd, tile.data(), kt.data());
      for (int l = 0; l < kKVTile; ++l)
        for (int c = 0; c < hd; ++c) ASSERT_EQ(kt[c * kKVTile + l], q2_1_tile_ref(tile.data(), hd, l, c)) << l << " " << c;
    }
  }
  qdot::set_level(saved);
}

// Regression: the stores' key tiles and value rows were std::vectors, so the decode step
// that outgrew a long segment copied it into freshly faulted pages (every segment at once: 1.5 s for
// the first token after a 16K fill on a Zen 5 VM). They grow by realloc now, which moves a mapped
// block's pages (mremap) or extends it in place. From 33,000 to 70,000 f16 entries (head_dim 64; a
// std::vector doubles its capacity, and copies 8 MiB, at 65,537 entries; realloc grows in steps of
// 1.5) no single append faults in more than a few new pages, and every entry reads back as written.
TEST(KVStore, GrowingALongSegmentMovesPagesInsteadOfCopying) {
  if (kSanitized) GTEST_SKIP() << "a sanitizer's allocator copies on realloc (the property is glibc's)";
  KVCache threshold_setter(1, 1, 64);  // sets the allocator's mmap threshold, as every model run does
  const int hd = 64;
  KVStore st(hd, KVCodec::F16, KVCodec::F16, KVQuantOptions{});
  std::vector<float> k(hd), v(hd), out(hd);
  auto entry = [&](size_t i) {
    for (int d = 0; d < hd; ++d) k[d] = static_cast<float>((i * 7 + d) % 1000) * 0.25f, v[d] = -k[d];
  };
  size_t worst_faults = 0, worst_at = 0;
  for (size_t i = 0; i < 70000; ++i) {
    entry(i);
    rusage r0{}, r1{};
    getrusage(RUSAGE_SELF, &r0);
    st.append(k.data(), v.data());
    getrusage(RUSAGE_SELF, &r1);
    const size_t faults = static_cast<size_t>(r1.ru_minflt - r0.ru_minflt);
    if (i >= 33000 && faults > worst_faults) worst_faults = faults, worst_at = i;
  }
  // A copy of 65,536 entries' keys (8 MiB) touches 2,048 new pages.
  EXPECT_LT(worst_faults, 64u) << "append of entry " << worst_at;
  for (size_t i : {size_t{0}, size_t{12345}, size_t{65536}, size_t{69999}}) {
    entry(i);
    st.key(i, out.data());
    for (int d = 0; d < hd; ++d) ASSERT_EQ(out[d], k[d]) << i << " " << d;  // quarters up to 250 are exact in f16
    st.value(i, out.data());
    for (int d = 0; d < hd; ++d) ASSERT_EQ(out[d], v[d]) << i << " " << d;
  }
}

// A block whose largest value is a denormal float has a step whose inverse overflows: the codes
// were computed as 0 x inf = NaN and converted to integers (undefined; UBSan stopped the stored-
// context tests on the retrieval model's near-zero keys). The step is stored as an f16 0, so the
// block decodes to zeros.
TEST(KVCodecs, ABlockOfDenormalValuesEncodesToZeros) {
  for (KVCodec c : {KVCodec::Q8_0, KVCodec::Q4_0, KVCodec::Q2_1}) {
    SCOPED_TRACE(codec_name(c));
    Segment s(32, c, c);
    std::vector<float> k(32, 0.0f), v(32, 0.0f), out(32);
    k[3] = 1e-39f;
    v[5] = -2e-40f;
    s.append(k.data(), v.data(), 0);
    s.key(0, out.data());
    for (float x : out) EXPECT_EQ(x, 0.0f);
    s.value(0, out.data());
    for (float x : out) EXPECT_EQ(x, 0.0f);
  }
}

// A value outside every KIVI level (inf, or NaN from a corrupted stored context's residual window)
// was converted to an integer before clamping (undefined; found by fuzz_context under UBSan).
TEST(KVCodecs, KiviCodeOfAValueOutsideEveryLevelIsClamped) {
  EXPECT_EQ(kv::kivi_code(std::nanf(""), 0.0f, 1.0f, 4), 0);
  EXPECT_EQ(kv::kivi_code(INFINITY, 0.0f, 1.0f, 4), 15);
  EXPECT_EQ(kv::kivi_code(-INFINITY, 0.0f, 1.0f, 2), 0);
  EXPECT_EQ(kv::kivi_code(2.4f, 0.0f, 1.0f, 2), 2);   // round to nearest level
  EXPECT_EQ(kv::kivi_code(7.0f, 0.0f, 1.0f, 2), 3);   // above the top level
}

// The bulk f16 encoder (F16C / AVX-512 where the level has them) gives the scalar conversion's bits
// at every level: on every f16 value, on the exact ties between neighbours (round to even) and one
// float ulp either side of them, across the overflow threshold (65520 rounds to inf), on subnormal
// halves and float denormals, on NaNs with payloads, and on a stride through all 2^32 patterns.
TEST(KVCodecs, BulkHalfEncoderMatchesScalarAtEveryLevel) {
  std::vector<uint32_t> bits;
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    const uint32_t f = std::bit_cast<uint32_t>(fp16_to_fp32(static_cast<uint16_t>(h)));
    const float next = fp16_to_fp32(static_cast<uint16_t>(h + 1));
    const uint32_t tie = std::bit_cast<uint32_t>((fp16_to_fp32(static_cast<uint16_t>(h)) + next) / 2);
    for (uint32_t x : {f, tie - 1, tie, tie + 1}) bits.insert(bits.end(), {x, x | 0x80000000u});
  }
  for (uint32_t x : {0x7F800000u, 0x7FC00000u, 0x7F800001u, 0x7FBFFFFFu, 0x7FD55555u, 0x477FE000u, 0x477FEFFFu,
                     0x477FF000u, 0x477FF001u, 0x7F7FFFFFu, 0x00000001u, 0x007FFFFFu, 0x33000000u, 0x33000001u,
                     0x32FFFFFFu})
    bits.insert(bits.end(), {x, x | 0x80000000u});
  for (uint64_t x = 0; x < (uint64_t{1} << 32); x += 65537) bits.push_back(static_cast<uint32_t>(x));
  std::vector<float> in(bits.size());
  std::vector<uint16_t> want(bits.size()), got(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    in[i] = std::bit_cast<float>(bits[i]);
    want[i] = fp32_to_fp16(in[i]);
  }
  const qdot::Level saved = qdot::level();
  for (qdot::Level lv : qdot::supported_levels()) {
    qdot::set_level(lv);
    std::fill(got.begin(), got.end(), uint16_t{0});
    kv::f32_to_f16_n(in.data(), got.data(), in.size());
    for (size_t i = 0; i < in.size(); ++i)
      ASSERT_EQ(got[i], want[i]) << qdot::level_name(lv) << " input 0x" << std::hex << bits[i];
  }
  qdot::set_level(saved);
  // Hand-derived: 1 + 2^-11 is the tie between 1 and 1 + 2^-10 (rounds to the even 1), 65520 is
  // the tie at the top (rounds to inf), 2^-25 the tie between 0 and the smallest subnormal (to 0).
  const float hand[] = {1.0f + 0x1p-11f, 65520.0f, 65519.0f, 0x1p-25f, 0x1.8p-24f};
  uint16_t h[5];
  kv::f32_to_f16_n(hand, h, 5);
  EXPECT_EQ(h[0], 0x3C00);
  EXPECT_EQ(h[1], 0x7C00);
  EXPECT_EQ(h[2], 0x7BFF);
  EXPECT_EQ(h[3], 0x0000);
  EXPECT_EQ(h[4], 0x0002);
}
