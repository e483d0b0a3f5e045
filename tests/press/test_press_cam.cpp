// CaM (kvpress's CAMPress) against its reference rule: merges derived by hand for small layers
// (kept set, merge candidates, windows of following kept entries, probabilities and the 0/0, x/0
// cases, Bernoulli draws), then the wrapper end to end during decode.
#include <gtest/gtest.h>

#include <deque>

#include "kvslim/request.h"
#include "press/wrappers/cam.h"
#include "support/press_util.h"

using namespace press_test;

namespace {

std::function<double()> draws(std::deque<double> d) {
  auto q = std::make_shared<std::deque<double>>(std::move(d));
  return [q] {
    double v = q->front();
    q->pop_front();
    return v;
  };
}

// Scores 5 1 4 2 6 3 (entries 0..5), keep 3: kept {0, 2, 4}; the evicted ranked 5 (3), 3 (2), 1 (1).
TEST(PressCam, MergesByHand) {
  const std::vector<float> score = {5, 1, 4, 2, 6, 3};
  const std::vector<std::vector<double>> attn = {{0.5, 1.0, 0.5, 1.0, 0.5, 0.0}};
  const std::vector<float> v0 = {10, 20, 30, 40, 50, 60};
  {
    // k = 2: candidates 3 and 5. Entry 3's window (merge_budget 2): kept entries after it = {4}, so
    // 1 target; p = 1.0 / 0.5 -> 1: value 4 += 40 / 1. Entry 5 has no kept entry after it.
    std::vector<std::vector<float>> v = {v0};
    auto kept = cam_merge_layer(score, attn, 3, 2, 2, v, 1, draws({0.9, 0.0}));
    EXPECT_EQ(kept, (std::vector<int32_t>{0, 2, 4}));
    EXPECT_EQ(v[0], (std::vector<float>{10, 20, 30, 40, 90, 60}));
  }
  {
    // k = 3: entry 1's window is {2, 4}: mean attention 0.5, p = 1 -> values 2 and 4 += 20 / 2.
    std::vector<std::vector<float>> v = {v0};
    cam_merge_layer(score, attn, 3, 3, 2, v, 1, draws({0.9, 0.9, 0.9}));
    EXPECT_EQ(v[0][2], 40.0f);
    EXPECT_EQ(v[0][4], 100.0f);
    // merge_budget 1: entry 1 merges into 2 only (20 / 1), entry 3 into 4.
    v = {v0};
    cam_merge_layer(score, attn, 3, 3, 1, v, 1, draws({0.9, 0.9, 0.9}));
    EXPECT_EQ(v[0][2], 50.0f);
    EXPECT_EQ(v[0][4], 90.0f);
  }
  {
    // p = 0.25 / 0.5 = 0.5 for entry 1: a draw of 0.3 merges (the whole 20 / 2, the mask is 0 or 1),
    // 0.7 does not.
    auto a = attn;
    a[0][1] = 0.25;
    std::vector<std::vector<float>> v = {v0};
    cam_merge_layer(score, a, 3, 3, 2, v, 1, draws({0.3, 0.9, 0.0}));
    EXPECT_EQ(v[0][2], 40.0f);
    v = {v0};
    cam_merge_layer(score, a, 3, 3, 2, v, 1, draws({0.7, 0.9, 0.0}));
    EXPECT_EQ(v[0][2], 30.0f);
    EXPECT_EQ(v[0][4], 90.0f);
  }
  {
    // 0 / 0 -> p = 0 (never merges); x / 0 -> p = 1. Two heads draw independently.
    const std::vector<std::vector<double>> z = {{0, 0, 0, 0, 0, 0}, {0, 0, 0, 1, 0, 0}};
    std::vector<std::vector<float>> v = {v0, v0};
    cam_merge_layer(score, z, 3, 2, 2, v, 1, draws({0.0, 0.5, 0.0, 0.0}));
    EXPECT_EQ(v[0], v0);
    EXPECT_EQ(v[1][4], 90.0f);
  }
  // Nothing to evict: every entry kept, values untouched.
  std::vector<std::vector<float>> v = {v0};
  EXPECT_EQ(cam_merge_layer(score, attn, 6, 3, 2, v, 1, draws({})).size(), 6u);
  EXPECT_EQ(v[0], v0);
}

// During decode: every `interval` steps a layer above `size` entries is cut to `size`, the same
// entries in all its KV heads; the prefill is left alone; the same request twice gives the same
// cache (the generator is reseeded per request).
TEST(PressCam, DecodeKeepsSizeEntriesPerLayer) {
  auto toks = story_tokens(40);
  auto run = [&](const std::string& spec) {
    auto p = make_press_impl(spec, 0.0);
    RequestOptions o;
    o.session.key_codec = o.session.value_codec = KVCodec::F32;
    o.session.n_ctx = 512;
    o.n_predict = 20;
    o.sampling.temp = 0;
    auto r = std::make_unique<Request>(bundled_model(), std::move(p), o);
    r->set_prompt_tokens(toks);
    r->run();
    return r;
  };
  auto a = run("cam(knorm):interval=8,size=32,merge_budget=4");
  auto b = run("cam(knorm):interval=8,size=32,merge_budget=4");
  const KVCache& c = a->cache();
  // 40 context tokens, 20 sampled (the last is not run): 59 positions; compressions after decode
  // steps 8 and 16 leave 32 + 3 entries.
  for (int l = 0; l < c.n_layer(); ++l)
    for (int h = 0; h < c.n_head_kv(); ++h) {
      EXPECT_EQ(c.seg(l, h).size(), 35u) << "l" << l << " h" << h;
      EXPECT_EQ(c.seg(l, h).positions(), c.seg(l, 0).positions());
    }
  EXPECT_TRUE(same_cache(c, b->cache()));
  EXPECT_THROW(make_press_impl("cam(kvzip)", 0.5), Error);
  EXPECT_THROW(make_press_impl("cam(knorm):merge_budget=0", 0.5), Error);
  EXPECT_EQ(make_press_impl("CAMPress(KnormPress,compression_interval=4,target_size=16)", 0.0)->describe(),
            make_press_impl("cam(knorm):interval=4,size=16", 0.0)->describe());
}

}  // namespace
