// Code bits of calibrated latent bases chosen by measured KL (choose_latent_bits_by_kl,
// `latent-calibrate --target-kl`): bytes per entry by hand, the order of the candidates, the
// first-within-target rule, and the KL of a trial recomputed in float64 through the latent press
// loading the saved bases.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include <fmt/format.h>

#include "press/scorers/latent.h"
#include "run/prefill.h"
#include "train/latent_calibrate.h"
#include "support/press_util.h"

using namespace press_test;

namespace {

std::vector<Token> story_text_tokens() {
  std::ifstream in(std::string(KVSLIM_SOURCE_DIR) + "/models/story.txt");
  std::stringstream ss;
  ss << in.rdbuf();
  const Tokenizer& tok = bundled_model().tokenizer();
  std::vector<Token> t = tok.encode(ss.str(), false, false);
  t.insert(t.begin(), tok.bos());
  return t;
}

// KL(p || q) of two logit rows in float64: log-softmax by hand.
double kl64(const float* p, const float* q, size_t n) {
  double mp = p[0], mq = q[0];
  for (size_t i = 1; i < n; ++i) mp = std::max(mp, double(p[i])), mq = std::max(mq, double(q[i]));
  double zp = 0, zq = 0;
  for (size_t i = 0; i < n; ++i) zp += std::exp(p[i] - mp), zq += std::exp(q[i] - mq);
  double kl = 0;
  for (size_t i = 0; i < n; ++i) {
    const double lp = p[i] - mp - std::log(zp), lq = q[i] - mq - std::log(zq);
    kl += std::exp(lp) * (lp - lq);
  }
  return kl;
}

// KL(full || latent) over the last 30 tokens of `probe` (0.25 x 120), in float64, with the
// bases (and their per-segment bits) saved to a file and loaded by the latent press.
double press_kl(const Model& model, const LatentBases& bases, const std::vector<Token>& probe) {
  const std::string path =
      (std::filesystem::temp_directory_path() / fmt::format("kvslim_bits_kl_{}.gguf", ::getpid())).string();
  bases.save(path, "test");
  const std::vector<Token> ctx(probe.begin(), probe.end() - 30), tail(probe.end() - 30, probe.end());
  Session full(model, SessionOptions{}), lat(model, SessionOptions{});
  auto none = make_press_impl("none", 0.0);
  auto latent = make_press_impl("latent:file=" + path, 0.0);
  prefill_and_compress(full, *none, ctx, 0, nullptr, nullptr);
  prefill_and_compress(lat, *latent, ctx, 0, nullptr, nullptr);
  std::remove(path.c_str());
  const std::vector<float> p = full.forward(tail, true), q = lat.forward(tail, true);
  double kl = 0;
  const size_t nv = model.hparams().n_vocab;
  for (size_t i = 0; i < tail.size(); ++i) kl += kl64(p.data() + i * nv, q.data() + i * nv, nv);
  return kl / static_cast<double>(tail.size());
}

TEST(LatentBitsKl, CheapestWithinTargetAndKlRecomputedThroughThePress) {
  const Model& model = bundled_model();
  const HParams& hp = model.hparams();
  const int S = hp.n_layer * hp.n_head_kv;
  const std::vector<Token> all = story_text_tokens();
  ASSERT_GT(all.size(), 360u);
  const std::vector<Token> fit(all.begin(), all.begin() + 240), probe(all.begin() + 240, all.begin() + 360);
  LatentCalibration opt;
  opt.k_rank = opt.v_rank = hp.head_dim;  // full rank: only the bits matter
  opt.k_bits = opt.v_bits = 8;
  LatentBases bases = calibrate_latent(model, {fit}, opt);
  const double target = 0.01;
  const LatentBitsChoice c = choose_latent_bits_by_kl(model, bases, {probe}, target);

  // Bytes per entry by hand, rank 8 with per-channel scales: 2-bit codes 2 bytes + 1 widening
  // byte, 4-bit 4 + 1, 8-bit 8 + 1, f16 16; plus the 4-byte position; times the segments.
  auto row = [](int bits) { return bits == 2 ? 3 : bits == 4 ? 5 : bits == 8 ? 9 : 16; };
  ASSERT_FALSE(c.trials.empty());
  EXPECT_EQ(c.trials[0].k_bits, 2);
  EXPECT_EQ(c.trials[0].v_bits, 2);
  for (size_t i = 0; i < c.trials.size(); ++i) {
    const LatentBitsTrial& t = c.trials[i];
    EXPECT_DOUBLE_EQ(t.bytes_per_entry, S * (row(t.k_bits) + row(t.v_bits) + 4.0)) << i;
    if (i > 0) {
      const LatentBitsTrial& prev = c.trials[i - 1];
      EXPECT_LE(prev.bytes_per_entry, t.bytes_per_entry) << i;
      // Equal bytes: the candidate with more key bits comes first (8/4 before 4/8).
      if (prev.bytes_per_entry == t.bytes_per_entry) {
        EXPECT_GT(row(prev.k_bits), row(t.k_bits)) << i;
      }
    }
  }
  // The first within the target is chosen; every earlier (cheaper) one was above it.
  ASSERT_TRUE(c.target_met);
  ASSERT_EQ(c.chosen, static_cast<int>(c.trials.size()) - 1);
  EXPECT_LE(c.trials[c.chosen].kl, target);
  for (int i = 0; i < c.chosen; ++i) EXPECT_GT(c.trials[i].kl, target) << i;
  EXPECT_GT(c.chosen, 0);  // 2-bit keys and values are far from 0.01 nats on this model
  for (int u = 0; u < S; ++u) {
    EXPECT_EQ(bases.key_bits[u], c.trials[c.chosen].k_bits);
    EXPECT_EQ(bases.value_bits[u], c.trials[c.chosen].v_bits);
  }

  // The chosen trial's KL again, through the saved file and the latent press on a request-like
  // session, with the KL in float64.
  const double kl = press_kl(model, bases, probe);
  EXPECT_NEAR(c.trials[c.chosen].kl, kl, 1e-3 * kl + 1e-7);
  EXPECT_EQ(c.steps, 0);
  EXPECT_DOUBLE_EQ(c.kl, c.trials[c.chosen].kl);

  EXPECT_THROW(choose_latent_bits_by_kl(model, bases, {probe}, -1.0), Error);
  EXPECT_THROW(choose_latent_bits_by_kl(model, bases, {probe}, 0.01, LatentScales::Channel, 0.0), Error);
  EXPECT_THROW(choose_latent_bits_by_kl(model, bases, {std::vector<Token>{1}}, 0.01), Error);
}

// Per segment side after the uniform choice: never more bytes than it, the bytes the hand count
// of the final per-segment bits, and the final KL (recomputed through the press) within the target.
TEST(LatentBitsKl, PerSegmentLoweringStaysWithinTheTargetAndBelowTheUniformBytes) {
  const Model& model = bundled_model();
  const HParams& hp = model.hparams();
  const int S = hp.n_layer * hp.n_head_kv;
  const std::vector<Token> all = story_text_tokens();
  const std::vector<Token> fit(all.begin(), all.begin() + 240), probe(all.begin() + 240, all.begin() + 360);
  LatentCalibration opt;
  opt.k_rank = opt.v_rank = hp.head_dim;
  LatentBases bases = calibrate_latent(model, {fit}, opt);
  const double target = 0.01;
  const LatentBitsChoice c =
      choose_latent_bits_by_kl(model, bases, {probe}, target, LatentScales::Channel, 0.25, /*per_segment=*/true);
  ASSERT_TRUE(c.target_met);
  const LatentBitsTrial& u = c.trials[c.chosen];
  auto row = [](int bits) { return bits == 2 ? 3 : bits == 4 ? 5 : bits == 8 ? 9 : 16; };
  double bytes = 0;
  for (int i = 0; i < S; ++i) {
    EXPECT_LE(row(bases.key_bits[i]), row(u.k_bits)) << i;
    EXPECT_LE(row(bases.value_bits[i]), row(u.v_bits)) << i;
    bytes += row(bases.key_bits[i]) + row(bases.value_bits[i]) + 4;
  }
  EXPECT_DOUBLE_EQ(c.bytes_per_entry, bytes);
  EXPECT_GT(c.steps, 0);  // some side of this model tolerates fewer bits than the uniform choice
  EXPECT_LT(c.bytes_per_entry, u.bytes_per_entry);
  EXPECT_LE(c.kl, target);
  const double kl = press_kl(model, bases, probe);
  EXPECT_NEAR(c.kl, kl, 1e-3 * kl + 1e-7);
}

}  // namespace
