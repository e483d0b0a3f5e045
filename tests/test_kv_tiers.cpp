// The LeanKV-style tier press end to end on the bundled model: of the entries SnapKV keeps, the
// lowest-scored fraction goes to the low tier in the requested codecs; the observation window
// (protected) stays high; new decode entries are high; the cache bytes fall accordingly.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "kv/store.h"
#include "kvslim/generate.h"
#include "press/authoring.h"

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
    auto press = make_press(spec, 0.5);
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
  EXPECT_THROW(make_press("leankv(snapkv):low=1.5", 0.5), Error);
  EXPECT_THROW(make_press("leankv(snapkv):k_low=q4_1", 0.5), Error);
}
