// The LeanKV-style tier press end to end on the bundled model: of the entries SnapKV keeps, the
// lowest-scored fraction goes to the low tier in the requested codecs; the observation window
// (protected) stays high; new decode entries are high; the cache bytes fall accordingly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "kv/store.h"
#include "kvslim/generate.h"
#include "press/authoring.h"
#include "run/prefill.h"

using namespace kvslim;

TEST(KVTiers, LeanKVPressSplitsKeptEntries) {
  const auto model = Model::load(std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf");
  std::ifstream f(std::string(KVSLIM_SOURCE_DIR) + "/models/story.txt");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::vector<Token> toks = model->tokenizer().encode(ss.str(), true, false);
  const int n = static_cast<int>(toks.size());
  ASSERT_GT(n, 200);

  auto run = [&](const std::string& spec, Session& s) {
    auto press = make_press_impl(spec, 0.5);
    press->reset();
    prefill_and_compress(s, *press, toks, 0);
  };
  SessionOptions o;
  o.n_ctx = 1024;
  Session plain(*model, o), tiered(*model, o);
  run("snapkv:window=32", plain);
  run("leankv(snapkv:window=32):low=0.5,k_low=q8_0,v_low=q4_0", tiered);

  const int keep = static_cast<int>(std::floor(n * 0.5));
  const HParams& hp = model->hparams();
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h) {
      const Segment& a = plain.cache().seg(l, h);
      const Segment& b = tiered.cache().seg(l, h);
      ASSERT_EQ(b.size(), static_cast<size_t>(keep));
      EXPECT_EQ(b.positions(), a.positions()) << "the tiers must keep what the scorer keeps";
      EXPECT_EQ(b.low_tier_size(), static_cast<size_t>(keep / 2));
      for (int i = keep - 32; i < keep; ++i) EXPECT_FALSE(b.is_low(i)) << "window entry " << i << " went low";
      EXPECT_EQ(b.store(1).key_codec(), KVCodec::Q8_0);
      EXPECT_EQ(b.store(1).value_codec(), KVCodec::Q4_0);
    }
  // f16 entries take 2 x 8 x 2 + 4 bytes, low ones 10 + 6 + 4, plus the tier map.
  EXPECT_LT(tiered.cache().bytes(), plain.cache().bytes() * 0.8);
  // Decoding appends high-tier entries after the low ones.
  tiered.forward({toks[1]});
  const Segment& s = tiered.cache().seg(0, 0);
  EXPECT_FALSE(s.is_low(s.size() - 1));
  EXPECT_EQ(s.low_tier_size(), static_cast<size_t>(keep / 2));
  // KIVI caches cannot be tiered.
  SessionOptions k = o;
  k.kv_quant.kivi_bits = 4;
  Session kivi(*model, k);
  EXPECT_THROW(run("leankv(snapkv:window=32):low=0.5", kivi), Error);
  EXPECT_THROW(make_press_impl("leankv(snapkv):low=1.5", 0.5), Error);
  EXPECT_THROW(make_press_impl("leankv(snapkv):k_low=q4_1", 0.5), Error);
}

// LeanKV's K4V2 low tier (keys q4_0, values 2-bit q2_1) beside K8V4 (q8_0 / q4_0): the same
// entries and tiers, low-tier rows within each codec's bound, and per low entry the bytes of the
// rows as written by hand for head_dim 8 (q8_0 10, q4_0 6, q2_1 4 + 2): K8V4 16, K4V2 12.
TEST(KVTiers, K4V2LowTierBesideK8V4) {
  const auto model = Model::load(std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf");
  std::ifstream f(std::string(KVSLIM_SOURCE_DIR) + "/models/story.txt");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::vector<Token> toks = model->tokenizer().encode(ss.str(), true, false);
  ASSERT_EQ(model->hparams().head_dim, 8);
  SessionOptions o;
  o.n_ctx = 1024;
  o.key_codec = o.value_codec = KVCodec::F32;
  Session plain(*model, o), k8v4(*model, o), k4v2(*model, o);
  auto run = [&](const std::string& spec, Session& s) {
    auto press = make_press_impl(spec, 0.5);
    press->reset();
    prefill_and_compress(s, *press, toks, 0);
  };
  run("snapkv:window=32", plain);
  run("leankv(snapkv:window=32):low=0.5,k_low=q8_0,v_low=q4_0", k8v4);
  run("leankv(snapkv:window=32):low=0.5,k_low=q4_0,v_low=q2_1", k4v2);
  size_t n_low = 0;
  const HParams& hp = model->hparams();
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h) {
      const Segment& a = plain.cache().seg(l, h);
      const Segment& b = k8v4.cache().seg(l, h);
      const Segment& c = k4v2.cache().seg(l, h);
      ASSERT_EQ(c.positions(), b.positions());
      ASSERT_EQ(c.low_tier_size(), b.low_tier_size());
      EXPECT_EQ(c.store(1).key_codec(), KVCodec::Q4_0);
      EXPECT_EQ(c.store(1).value_codec(), KVCodec::Q2_1);
      n_low += c.low_tier_size();
      std::vector<float> v(8), w(8);
      for (size_t i = 0; i < c.size(); ++i) {
        c.value(i, v.data());
        a.value(i, w.data());
        if (!c.is_low(i)) {
          EXPECT_EQ(v, w) << "high-tier entries keep the cache's codec";
          continue;
        }
        // q2_1 over one block of 8: |err| <= (max - min) / 6 plus the f16 rounding of min and step.
        const float mn = *std::min_element(w.begin(), w.end()), mx = *std::max_element(w.begin(), w.end());
        for (int d = 0; d < 8; ++d)
          EXPECT_LE(std::fabs(v[d] - w[d]), (mx - mn) / 6 * (1 + 3e-3) + 1e-3 * std::fabs(mn) + 1e-6) << "entry " << i;
      }
    }
  ASSERT_GT(n_low, 0u);
  EXPECT_EQ(k8v4.cache().kv_bytes() - k4v2.cache().kv_bytes(), n_low * (16 - 12));
}
