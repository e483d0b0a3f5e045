// LU-KV (arXiv 2602.08585; kvpress lukv_press.py): kvpress's per-head budget rule by hand, the
// curve row kvpress reads, the concave-envelope greedy allocation by hand, the press's kept
// entries against the rule recomputed here (knorm scorer, sinks and window chosen first), the
// offline profile's invariants, the curve file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kvslim/error.h"
#include "press/policies/lukv.h"
#include "train/lukv_profile.h"
#include "support/files.h"
#include "support/press_util.h"

using namespace kvslim;
using press_test::bundled_model;
using press_test::story_tokens;

// kvpress's rule by hand. n = 10, prune (0.25, 0.5, 0.9, 0): ideal 7.5, 5, 1, 10 -> total
// round(23.5) = 24 (half to even), floors 7 + 5 + 1 + 10 = 23, one more to the largest fractional
// part (head 0). n = 7, prune 0.5 x 3: ideal 3.5 each, round(10.5) = 10, floors 9, one more to the
// first head (ties to the lower head; torch.topk leaves the order unspecified). Everything pruned:
// total clamped up to H, one entry each.
TEST(LUKV, LayerKeepByHand) {
  EXPECT_EQ(lukv_layer_keep({0.25f, 0.5f, 0.9f, 0.0f}, 10), (std::vector<int>{8, 5, 1, 10}));
  EXPECT_EQ(lukv_layer_keep({0.5f, 0.5f, 0.5f}, 7), (std::vector<int>{4, 3, 3}));
  EXPECT_EQ(lukv_layer_keep({1.0f, 1.0f, 1.0f}, 7), (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(lukv_layer_keep({-0.5f, 2.0f}, 4), (std::vector<int>{4, 1}));  // rates clamped to [0, 1]
}

// round(100 r) - 1 with Python's half-to-even rounding, clamped to [0, 98].
TEST(LUKV, CurveRowByHand) {
  EXPECT_EQ(lukv_row(0.5), 49);
  EXPECT_EQ(lukv_row(0.125), 11);  // round(12.5) = 12
  EXPECT_EQ(lukv_row(0.135), 13);  // 0.135 x 100 = 13.500000000000002 -> 14
  EXPECT_EQ(lukv_row(0.0), 0);
  EXPECT_EQ(lukv_row(0.999), 98);
}

// Two heads, 4 parts each. A: utilities 0, .6, .8, .9, 1 (concave: slopes .6, .2, .1, .1). B: 0,
// .1, .5, .6, .7, whose envelope joins 0 to 2 (slope .25), then .1, .1. Budget 3: A's first part
// (.6), B's first two (.25) -> 1/4 and 2/4. Budget 4: then A's second (.2) -> 2/4, 2/4. Budget 2:
// A's first part and half of B's envelope segment -> 1/4, 1/4.
TEST(LUKV, AllocationFollowsTheConcaveEnvelopeByHand) {
  const std::vector<std::vector<double>> u = {{0, 0.6, 0.8, 0.9, 1.0}, {0, 0.1, 0.5, 0.6, 0.7}};
  EXPECT_EQ(lukv_allocate(u, 4, 3), (std::vector<double>{0.25, 0.5}));
  EXPECT_EQ(lukv_allocate(u, 4, 4), (std::vector<double>{0.5, 0.5}));
  EXPECT_EQ(lukv_allocate(u, 4, 2), (std::vector<double>{0.25, 0.25}));
  EXPECT_EQ(lukv_allocate(u, 4, 8), (std::vector<double>{1.0, 1.0}));
  EXPECT_THROW(lukv_allocate({{0, 1}}, 4, 1), Error);
}

namespace {

LUKVCurve test_curve(int L, int H) {
  LUKVCurve c;
  c.n_layer = L;
  c.n_head_kv = H;
  c.prune.assign(static_cast<size_t>(99) * L * H, 0.9f);  // every row but 49: keep 10%
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) c.prune[(static_cast<size_t>(49) * L + l) * H + h] = 0.16f * h + 0.1f * (l % 3) + 0.01f;
  return c;
}

}  // namespace

// The press over knorm (score -|k|): per layer the counts of kvpress's rule (recomputed here in
// float64 from the curve's row 49 at ratio 0.5; at 120 tokens the ideal counts are 118.8 - 18 h -
// 12 (l mod 3): fractional parts .8, .6, .4, .2, two more entries to heads 0 and 1), the first 4
// entries and the last one chosen first, the rest by the smallest key norm.
TEST(LUKV, PressKeepsWhatTheReferenceRuleKeeps) {
  const HParams& hp = bundled_model().hparams();
  const int L = hp.n_layer, H = hp.n_head_kv;
  const LUKVCurve c = test_curve(L, H);
  const std::string path = temp_path("lukv_curve.gguf");
  c.save(path, "test");
  const std::vector<Token> toks = story_tokens(120);
  const int n = static_cast<int>(toks.size());
  auto none = make_press_impl("none", 0.0);
  auto full = press_test::prefill(*none, toks);
  auto press = make_press_impl(fmt::format("LUKVPress(KnormPress):curve={}", path), 0.5);
  auto s = press_test::prefill(*press, toks);
  for (int l = 0; l < L; ++l) {
    // Counts: ideal (1 - p) n, total round-half-even of the sum, floors + largest remainders.
    std::vector<double> ideal(H);
    double sum = 0;
    for (int h = 0; h < H; ++h) sum += ideal[h] = (1.0 - (0.16 * h + 0.1 * (l % 3) + 0.01)) * n;
    long total = std::lround(sum);
    if (std::fabs(sum - std::floor(sum) - 0.5) < 1e-9 && total % 2) total -= 1;
    std::vector<int> want(H);
    long base = 0;
    for (int h = 0; h < H; ++h) base += want[h] = static_cast<int>(std::floor(ideal[h] + 1e-9));
    std::vector<int> order(H);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return ideal[a] - std::floor(ideal[a] + 1e-9) > ideal[b] - std::floor(ideal[b] + 1e-9) + 1e-9;
    });
    for (long i = 0; i < total - base; ++i) want[order[i]] += 1;
    for (int h = 0; h < H; ++h) {
      SCOPED_TRACE(fmt::format("layer {} head {}", l, h));
      const Segment& seg = s->cache().seg(l, h);
      ASSERT_EQ(static_cast<int>(seg.size()), want[h]);
      // Expected entries: 0..3 and n - 1 first, then the smallest key norms.
      const auto keys = press_test::keys_of(full->cache().seg(l, h));
      std::vector<int> idx(n);
      std::iota(idx.begin(), idx.end(), 0);
      auto norm = [&](int i) {
        double q = 0;
        for (double v : keys[i]) q += v * v;
        return std::sqrt(q);
      };
      std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) {
        const bool fa = a < 4 || a == n - 1, fb = b < 4 || b == n - 1;
        if (fa != fb) return fa;
        return norm(a) < norm(b);
      });
      std::vector<int32_t> kept(idx.begin(), idx.begin() + want[h]);
      std::sort(kept.begin(), kept.end());
      EXPECT_EQ(seg.positions(), kept);
    }
  }
  // Another ratio reads another row (0.9 everywhere: 10% kept).
  auto p9 = make_press_impl(fmt::format("lukv(knorm):curve={}", path), 0.3);
  auto s9 = press_test::prefill(*p9, toks);
  EXPECT_EQ(s9->cache().seg(0, 0).size(), static_cast<size_t>(std::lround(0.1 * n)));
  // A curve for another shape is refused, naming the file.
  LUKVCurve bad = c;
  bad.n_head_kv = H + 1;
  bad.prune.assign(static_cast<size_t>(99) * L * (H + 1), 0.5f);
  const std::string badp = temp_path("lukv_bad.gguf");
  bad.save(badp, "bad");
  auto pb = make_press_impl(fmt::format("lukv(knorm):curve={}", badp), 0.5);
  EXPECT_THROW(press_test::prefill(*pb, toks), Error);
  EXPECT_THROW(make_press_impl("lukv(knorm)", 0.5), Error);
  EXPECT_THROW(LUKVCurve::load(std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf"), Error);
  const LUKVCurve back = LUKVCurve::load(path);
  EXPECT_EQ(back.prune, c.prune);
  std::remove(path.c_str());
  std::remove(badp.c_str());
}

// The profile on the story model: every row keeps (1 - r) of the entries on average (the budget is
// met exactly), prune ratios in [0, 1] and non-decreasing in r for every head.
TEST(LUKV, ProfileMeetsEveryRowsBudget) {
  const HParams& hp = bundled_model().hparams();
  const std::vector<Token> d1 = story_tokens(96), d2 = story_tokens(80);
  const LUKVCurve c = lukv_profile(bundled_model(), {d1, d2}, "knorm", 0.75);
  ASSERT_EQ(c.n_layer, hp.n_layer);
  ASSERT_EQ(c.n_head_kv, hp.n_head_kv);
  const int LH = hp.n_layer * hp.n_head_kv;
  for (int i = 0; i < 99; ++i) {
    double mean = 0;
    for (int j = 0; j < LH; ++j) {
      const float p = c.prune[static_cast<size_t>(i) * LH + j];
      EXPECT_GE(p, -1e-6f);
      EXPECT_LE(p, 1.0f + 1e-6f);
      if (i) {
        EXPECT_GE(p, c.prune[static_cast<size_t>(i - 1) * LH + j] - 1e-6f) << i << " " << j;
      }
      mean += p;
    }
    EXPECT_NEAR(mean / LH, (i + 1) / 100.0, 1e-5) << "row " << i;
  }
  EXPECT_THROW(lukv_profile(bundled_model(), {d1}, "clusterkv", 0.75), Error);
  EXPECT_THROW(lukv_profile(bundled_model(), {d1}, "knorm", 1.5), Error);
}

// A NumPy .npy curve written here byte by byte (format 1.0: magic, version, header length, a
// Python dict header padded with spaces to a multiple of 64 bytes and ending in a newline, then
// float64 little-endian data in C order) loads with the same values; a wrong shape is refused.
TEST(LUKV, NpyCurveLoadsAsKvpressReadsIt) {
  auto write = [](const std::string& path, const std::string& shape, int n_values) {
    std::string header = "{'descr': '<f8', 'fortran_order': False, 'shape': " + shape + ", }";
    while ((10 + header.size() + 1) % 64) header += ' ';
    header += '\n';
    std::ofstream f(path, std::ios::binary);
    f.write("\x93NUMPY\x01\x00", 8);
    const uint16_t len = static_cast<uint16_t>(header.size());
    f.put(static_cast<char>(len & 0xFF));
    f.put(static_cast<char>(len >> 8));
    f << header;
    for (int i = 0; i < n_values; ++i) {
      const double v = (i % 97) / 100.0;
      char b[8];
      std::memcpy(b, &v, 8);
      f.write(b, 8);
    }
  };
  const std::string path = temp_path("lukv_curve.npy"), bad = temp_path("lukv_bad.npy");
  write(path, "(99, 3, 2)", 99 * 6);
  const LUKVCurve c = LUKVCurve::load(path);
  EXPECT_EQ(c.n_layer, 3);
  EXPECT_EQ(c.n_head_kv, 2);
  ASSERT_EQ(c.prune.size(), 99u * 6);
  for (int i = 0; i < 99 * 6; ++i) EXPECT_EQ(c.prune[i], static_cast<float>((i % 97) / 100.0)) << i;
  EXPECT_EQ(c.at(2, 1, 1), static_cast<float>((2 * 6 + 1 * 2 + 1) / 100.0));
  write(bad, "(98, 3, 2)", 98 * 6);
  EXPECT_THROW(LUKVCurve::load(bad), Error);
  write(bad, "(99, 3, 2)", 10);  // data shorter than the shape
  EXPECT_THROW(LUKVCurve::load(bad), Error);
  std::remove(path.c_str());
  std::remove(bad.c_str());
}
