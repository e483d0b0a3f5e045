// The per-head entry budget (budget=N, a field of every budget policy): during chunked prefill every
// KV head ends each chunk with at most N context entries (an adaptive policy N x heads per layer),
// so the cache stops growing with the context; counts below are derived by hand from N, the chunk
// size and the model's shape.
#include <algorithm>

#include "kvslim/press.h"
#include "kvslim/request.h"
#include "support/press_util.h"

using namespace press_test;

namespace {

/// The bundled story twice over, cut to n tokens (the model's context holds 512).
std::vector<Token> long_context(int n) {
  const Model& m = bundled_model();
  std::string text;
  for (int i = 0; i < 4; ++i) text += std::string(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she "
      "saw a big red ball under a tree. She ran to the ball and kicked it as hard as she could. The ball flew over "
      "the fence and into the garden of an old man. Lily was scared, but she went to say sorry. ");
  std::vector<Token> ids = m.tokenizer().encode(text, true, false);
  EXPECT_GE(static_cast<int>(ids.size()), n);
  ids.resize(std::min<size_t>(ids.size(), static_cast<size_t>(n)));
  return ids;
}

size_t largest_segment(const KVCache& c) {
  size_t m = 0;
  for (int l = 0; l < c.n_layer(); ++l)
    for (int h = 0; h < c.n_head_kv(); ++h) m = std::max(m, c.seg(l, h).size());
  return m;
}

/// A request over `ids` with `spec`, prefilled chunk by chunk; `after_chunk` sees the cache after each.
std::unique_ptr<Request> prefill(const std::string& spec, const std::vector<Token>& ids, int chunk,
                                 const std::function<void(const KVCache&)>& after_chunk = nullptr) {
  RequestOptions o;
  o.chunk_size = chunk;
  o.n_predict = 0;
  auto r = std::make_unique<Request>(bundled_model(), make_press_impl(spec, 0.0), o);
  r->set_prompt_tokens(ids, {});
  while (!r->prefill_step())
    if (after_chunk) after_chunk(r->cache());
  if (after_chunk) after_chunk(r->cache());
  return r;
}

}  // namespace

TEST(PressBudget, EveryChunkEndsWithAtMostNEntriesPerHead) {
  const std::vector<Token> ids = long_context(400);
  const size_t N = 100, chunk = 64;
  int chunks = 0;
  auto r = prefill("snapkv:budget=100", ids, static_cast<int>(chunk), [&](const KVCache& c) {
    ++chunks;
    // At most N kept from earlier chunks; the step just compressed leaves N once past N.
    EXPECT_LE(largest_segment(c), N) << "after chunk " << chunks;
  });
  EXPECT_EQ(chunks, static_cast<int>((ids.size() + chunk - 1) / chunk));
  const KVCache& c = r->cache();
  for (int l = 0; l < c.n_layer(); ++l)
    for (int h = 0; h < c.n_head_kv(); ++h) EXPECT_EQ(c.seg(l, h).size(), N) << l << "," << h;
  // A budget larger than the context keeps everything: the cache equals the uncompressed one.
  auto all = prefill("snapkv:budget=1000", ids, static_cast<int>(chunk));
  auto none = prefill("none", ids, static_cast<int>(chunk));
  EXPECT_EQ(all->cache().entries(), none->cache().entries());
  EXPECT_EQ(all->cache().bytes(), none->cache().bytes());
}

// Compressing once, a budget of N out of n is the ratio 1 - N/n: the same entries, the same bytes.
TEST(PressBudget, OnePrefillEqualsTheMatchingRatio) {
  const std::vector<Token> ids = long_context(400);
  for (const char* spec : {"snapkv", "knorm", "adakv(snapkv)", "pyramidkv(snapkv)"}) {
    auto by_budget = prefill(std::string(spec) + ":budget=100", ids, 0);
    RequestOptions o;
    o.n_predict = 0;
    Request by_ratio(bundled_model(), make_press_impl(spec, 0.75), o);  // floor(400 x 0.25) = 100
    by_ratio.set_prompt_tokens(ids, {});
    by_ratio.prefill();
    const KVCache &a = by_budget->cache(), &b = by_ratio.cache();
    for (int l = 0; l < a.n_layer(); ++l)
      for (int h = 0; h < a.n_head_kv(); ++h)
        EXPECT_EQ(a.seg(l, h).positions(), b.seg(l, h).positions()) << spec << " layer " << l << " head " << h;
  }
}

// AdaKV moves the budget between a layer's heads: N x heads per layer, not N per head.
TEST(PressBudget, AdaKVSplitsNTimesHeadsAcrossALayer) {
  const std::vector<Token> ids = long_context(400);
  auto r = prefill("adakv(snapkv):budget=100", ids, 64);
  const KVCache& c = r->cache();
  for (int l = 0; l < c.n_layer(); ++l) {
    size_t total = 0;
    for (int h = 0; h < c.n_head_kv(); ++h) total += c.seg(l, h).size();
    EXPECT_EQ(total, 100u * c.n_head_kv()) << "layer " << l;
  }
}

// A policy that keeps by its own parameters (threshold) is capped by the budget.
TEST(PressBudget, CapsAThresholdPolicy) {
  const std::vector<Token> ids = long_context(300);
  auto capped = prefill("threshold(knorm,tau=-1000,window=16):budget=80", ids, 0);
  auto uncapped = prefill("threshold(knorm,tau=-1000,window=16)", ids, 0);
  EXPECT_EQ(largest_segment(uncapped->cache()), ids.size());  // tau below every score keeps all
  const KVCache& c = capped->cache();
  for (int l = 0; l < c.n_layer(); ++l)
    for (int h = 0; h < c.n_head_kv(); ++h) EXPECT_EQ(c.seg(l, h).size(), 80u) << l << "," << h;
  // Protected entries stay even where they outnumber the budget: the sliding window of 128.
  auto window = prefill("threshold(knorm,tau=-1000,window=128):budget=80", ids, 0);
  EXPECT_EQ(largest_segment(window->cache()), 128u);
}

TEST(PressBudget, SpecsRoundTripAndRefusals) {
  for (const char* spec : {"snapkv:budget=4096", "adakv(snapkv):budget=4096", "adakv(snapkv:budget=4096)",
                           "knorm:budget=7+snapkv:budget=9", "kvzip:budget=4096", "global(snapkv):budget=4096"}) {
    auto p = make_press_impl(spec, 0.0);
    EXPECT_NE(p->describe().find("budget="), std::string::npos) << spec << " -> " << p->describe();
    EXPECT_EQ(make_press_impl(p->describe(), 0.0)->describe(), p->describe()) << spec;
  }
  auto refused = [](const std::string& spec, double ratio, std::initializer_list<const char*> parts) {
    try {
      make_press_impl(spec, ratio);
      ADD_FAILURE() << spec << " was accepted";
    } catch (const Error& e) {
      for (const char* p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  };
  refused("snapkv:budget=100,ratio=0.5", 0.0, {"budget=100", "ratio=0.5", "together"});
  refused("adakv(snapkv):budget=100,ratio=0.5", 0.0, {"budget=100", "ratio=0.5"});
  refused("snapkv:budget=0", 0.0, {"budget=0", "at least 1"});
  refused("chunk(snapkv:budget=10)", 0.0, {"chunk", "budget=10", "ignored"});
  refused("none:budget=10", 0.0, {"budget"});
  // The caller's ratio does not fill a budgeted press: the budget alone decides.
  bool used = true;
  auto p = make_press_impl("snapkv:budget=100", 0.5, used);
  EXPECT_FALSE(used);
  EXPECT_NE(p->describe().find("ratio=0,"), std::string::npos) << p->describe();
}

// budget=N is declared once, on the policy of every scorer press: each one, run with it, must end
// with at most N entries per head, in a chunked prefill or, for the presses that need the whole
// context in one step (as kvpress's), in one. Presses that keep no entries by score refuse it,
// naming it. (KVzip once returned before replaying when its ratio was 0, so kvzip:budget=N kept
// every entry.)
TEST(PressBudget, EveryScorerPressHonoursIt) {
  const std::vector<Token> ids = long_context(400);
  const size_t N = 100;
  int run = 0;
  for (const PressInfo* info : PressRegistry::instance().all()) {
    if (info->kind != PressKind::Scorer) continue;
    // ClusterKV keeps every entry and selects clusters while decoding; its own `budget` parameter is
    // the number of entries each decode step attends to (test_press_cluster*).
    if (info->name == "clusterkv") continue;
    const std::string spec = info->name + ":budget=100";
    SCOPED_TRACE(spec);
    try {
      make_press_impl(spec, 0.0);
    } catch (const Error& e) {
      // Presses that keep no entries by score, or need a file or a parameter of their own.
      const std::string what = e.what();
      const bool refused_budget = what.find("takes no budget") != std::string::npos;
      const bool needs_more = what.find("budget") == std::string::npos;
      EXPECT_TRUE(refused_budget || needs_more) << what;
      continue;
    }
    std::unique_ptr<Request> r;
    try {
      r = prefill(spec, ids, 64);
    } catch (const Error& e) {
      const std::string what = e.what();
      ASSERT_NE(what.find("in one prefill step"), std::string::npos) << what;
      r = prefill(spec, ids, 0);
    }
    const size_t heads = static_cast<size_t>(r->cache().n_layer()) * r->cache().n_head_kv();
    // KVzip's default policy is global (one top-k over every layer and head): N x heads over the
    // whole cache, so one head may keep more than N. Every other default policy keeps N per head.
    if (info->name == "kvzip") {
      EXPECT_LE(r->cache().entries(), N * heads);
      EXPECT_GT(largest_segment(r->cache()), N);  // the entries did move between heads
    } else {
      EXPECT_LE(largest_segment(r->cache()), N);
    }
    EXPECT_LT(r->cache().entries(), ids.size() * heads);
    ++run;
  }
  EXPECT_GE(run, 10);
}
