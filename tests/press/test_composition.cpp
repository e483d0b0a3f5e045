// Composition semantics: each stage is sized from the entries
// actually present, no segment is emptied, pairings that cannot work are refused at parse time
// naming both presses, and every job's decode step honours decode-time selection.
#include <gtest/gtest.h>

#include <cmath>

#include "kvslim/eval.h"
#include "kvslim/request.h"
#include "support/press_util.h"

using namespace kvslim;
using press_test::bundled_model;

namespace {

const char* kLine = "Lily saw a big red ball in the park and ran to play with it. ";

std::string story(int lines) {
  std::string s;
  for (int i = 0; i < lines; ++i) s += kLine;
  return s;
}

RequestOptions opts(int n_predict = 1) {
  RequestOptions o;
  o.n_predict = n_predict;
  o.sampling.temp = 0;
  o.session.key_codec = o.session.value_codec = KVCodec::F32;
  return o;
}

/// Entries per (layer, KV head) after prefilling `text` with `spec` at `ratio`.
std::vector<std::vector<size_t>> kept(const std::string& spec, double ratio, const std::string& text,
                                      size_t* n_context = nullptr) {
  Request r(bundled_model(), make_press_impl(spec, ratio), opts());
  r.set_prompt(text);
  r.prefill();
  if (n_context) *n_context = r.context_tokens().size();
  const KVCache& c = r.cache();
  std::vector<std::vector<size_t>> out(c.n_layer(), std::vector<size_t>(c.n_head_kv()));
  for (int l = 0; l < c.n_layer(); ++l)
    for (int h = 0; h < c.n_head_kv(); ++h) out[l][h] = c.seg(l, h).size();
  return out;
}

size_t floor_keep(size_t n, double r) {  // floor(n (1 - r)), at least 1: the design's rule, by hand
  return std::max<size_t>(1, static_cast<size_t>(std::floor(static_cast<double>(n) * (1.0 - r) + 1e-9)));
}

}  // namespace

TEST(Composition, AStageThatProtectsEverythingHandsOnWhatItKept) {
  // 25-ish tokens: SnapKV's window (64) with protect=1 protects every entry, so snapkv is a no-op
  // and both orders keep floor(n / 2) (was 24% for snapkv+knorm against 48% for knorm+snapkv).
  const std::string text = "Once upon a time there was a little cat. The cat liked milk and naps.";
  size_t n = 0;
  auto a = kept("snapkv:protect=1+knorm", 0.5, text, &n);
  auto b = kept("knorm+snapkv:protect=1", 0.5, text);
  ASSERT_LT(n, 64u);
  for (const auto& layer : a)
    for (size_t k : layer) EXPECT_EQ(k, floor_keep(n, 0.5));
  EXPECT_EQ(a, b);
}

TEST(Composition, LaterStagesAreSizedSegmentBySegment) {
  // A press that leaves segments uneven, then knorm: every segment keeps half of what it held,
  // so the pyramid keeps its shape (it was flattened to knorm's nominal budget).
  const std::string text = story(10);
  for (const char* first : {"pyramidkv(knorm)", "adakv(snapkv:window=8)"}) {
    auto alone = kept(first, 0.5, text);
    auto both = kept(std::string(first) + "+knorm", 0.5, text);
    size_t sum_alone = 0, sum_both = 0;
    for (size_t l = 0; l < alone.size(); ++l)
      for (size_t h = 0; h < alone[l].size(); ++h) {
        EXPECT_EQ(both[l][h], floor_keep(alone[l][h], 0.5)) << first << " l" << l << " h" << h;
        sum_alone += alone[l][h];
        sum_both += both[l][h];
      }
    // Measured: close to 1 - (1 - 0.5)(1 - 0.5) = 0.75 (floors only).
    EXPECT_NEAR(double(sum_both) / sum_alone, 0.5, 0.02) << first;
  }
}

TEST(Composition, NoSegmentIsEverEmptied) {
  // 3 text tokens (+BOS): pyramidkv left "8 4 4 4 0" per layer, global left heads at 0.
  for (const char* spec : {"pyramidkv(knorm)", "global(knorm)", "zigzagkv(snapkv)", "adakv(knorm):alpha=0"})
    for (double r : {0.5, 0.9}) {
      for (const std::string& text : {std::string("Once upon a"), story(3)}) {
        auto k = kept(spec, r, text);
        for (size_t l = 0; l < k.size(); ++l)
          for (size_t h = 0; h < k[l].size(); ++h) EXPECT_GE(k[l][h], 1u) << spec << " r=" << r << " l" << l << " h" << h;
      }
    }
}

TEST(Composition, ClusterKVBeforeAnEvictingPressDecodes) {
  // Was: "attend_segment_subset: indices must be increasing and inside the segment" at the first
  // decode step, after the whole prefill.
  for (const char* spec : {"clusterkv:full_layers=0,sink=4,budget=16+knorm", "knorm+clusterkv:full_layers=0,sink=4,budget=16"}) {
    Request r(bundled_model(), make_press_impl(spec, 0.5), opts(6));
    r.set_prompt(story(6));
    EXPECT_NO_THROW(r.run()) << spec;
    EXPECT_EQ(r.generated().size(), 6u) << spec;
  }
}

TEST(Composition, ImpossiblePairingsAreRefusedNamingBothPresses) {
  auto expect_refused = [](const std::string& spec, const std::vector<std::string>& names) {
    try {
      make_press_impl(spec, 0.5);
      ADD_FAILURE() << spec << " was accepted";
    } catch (const Error& e) {
      for (const auto& n : names) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
  };
  // A decode-time selector with a press that evicts during decode.
  expect_refused("clusterkv+threshold(knorm):tau=-4,decode=1", {"clusterkv", "threshold(knorm)"});
  expect_refused("decoding(knorm)+clusterkv", {"clusterkv", "decoding(knorm)"});
  // Regression: H2O evicts at every decode step (its fixed budget) but was accepted next to clusterkv.
  expect_refused("clusterkv+h2o", {"clusterkv", "h2o", "evicts entries during decode"});
  expect_refused("h2o+clusterkv", {"clusterkv", "h2o", "evicts entries during decode"});
  // KVzip replays the context: nothing to replay at decode time (it never compressed).
  expect_refused("decoding(kvzip):size=48", {"decoding", "kvzip"});
  // CriticalKV over a threshold-driven scorer removed nothing.
  expect_refused("criticalkv(threshold(knorm):tau=-4)", {"criticalkv", "threshold"});
}

TEST(Composition, EvalFidelityHonoursTheDecodeTimeSelector) {
  // Was: KL 0 and top-1 1.0000 for ClusterKV in `kvslim eval fidelity` (the eval decode step
  // ignored the selector) while generate reported attention work saved.
  const Model& m = bundled_model();
  const Tokenizer& tok = m.tokenizer();
  std::vector<Token> all = tok.encode(story(12), true, false);
  ASSERT_GT(all.size(), 60u);
  std::vector<Token> prefix(all.begin(), all.end() - 24), cont(all.end() - 24, all.end());
  RunOptions ro;
  ro.session.key_codec = ro.session.value_codec = KVCodec::F32;
  FidelityReference ref = fidelity_reference(m, prefix, cont, ro);
  auto press = make_press_impl("clusterkv:full_layers=0,sink=4", 0.9);
  FidelityOutcome out = run_fidelity(m, *press, ref, ro);
  EXPECT_GT(out.metrics.mean_kl(), 0.0);
  // And the none press through the same path is exact.
  auto none = make_press_impl("none", 0.0);
  EXPECT_EQ(run_fidelity(m, *none, ref, ro).metrics.mean_kl(), 0.0);
}
