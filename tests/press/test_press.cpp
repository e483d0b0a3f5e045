// The rules every press obeys (docs/CLI.md, "Press specs"), on the bundled model, plus the
// spec parser, chunked prefill, decoding presses and key re-rotation.
#include <cstdio>
#include <cstdlib>
#include <map>

#include <unistd.h>

#include "run/prefill.h"
#include "support/press_util.h"

using namespace press_test;

namespace {

// Every registered press, policy and wrapper, at default parameters.
const std::vector<std::string> kAllSpecs = {
    "random", "knorm", "streaming_llm", "snapkv:window=16", "tova", "h2o", "observed_attention",
    "expected_attention:window=16", "criticalkv(snapkv:window=16)", "keydiff",
    "pyramidkv(snapkv:window=16)", "adakv(snapkv:window=16)", "zigzagkv(snapkv:window=16)",
    "global(knorm)", "uniform(keydiff)", "per_layer(knorm,ratios=0.1/0.2/0.3/0.4/0.5)",
    "threshold(knorm):tau=-3,window=16", "snapkv:window=16+knorm", "key_rerotation(streaming_llm)",
    "key_rerotation(adakv(snapkv:window=16))", "decoding(knorm):interval=4,size=32",
    "lagkv:lag=16", "chunkkv(snapkv:window=16)"};

// Presses whose keep-count is the uniform floor(n (1 - r)) with nothing protected at these sizes.
// Since the window, sinks and recent entries count against the budget (kvpress), the window presses
// are uniform too.
const std::vector<std::string> kUniformSpecs = {"random", "knorm", "keydiff", "observed_attention",
                                                "h2o:recent=0", "expected_attention:window=16,n_sink=0",
                                                "snapkv:window=16", "streaming_llm", "tova", "h2o",
                                                "expected_attention"};

TEST(PressRules, RegistryListsEveryMethod) {
  for (const char* n : {"none", "random", "knorm", "streaming_llm", "snapkv", "tova", "h2o", "observed_attention",
                        "expected_attention", "criticalkv", "keydiff", "uniform", "pyramidkv", "adakv", "zigzagkv",
                        "global", "threshold", "per_layer", "key_rerotation", "decoding", "lagkv", "chunkkv"}) {
    const PressInfo* p = PressRegistry::instance().find(n);
    ASSERT_NE(p, nullptr) << n;
    EXPECT_FALSE(p->source.empty()) << n;
  }
}

TEST(PressRules, RatioZeroIsBitIdenticalToNoPress) {
  auto toks = story_tokens(160);
  auto none = make_press_impl("none", 0.0);
  auto ref = prefill(*none, toks);
  // Chunk boundaries change the forward pass's batches (and float rounding), so the chunked
  // reference is the chunked run without a press.
  auto ref48 = prefill(*none, toks, 48);
  for (const std::string& spec : kAllSpecs) {
    if (spec.rfind("per_layer", 0) == 0 || spec.rfind("threshold", 0) == 0) continue;  // not ratio-driven
    auto p = make_press_impl(spec, 0.0);
    EXPECT_EQ(p->ratio(), 0.0) << spec;
    EXPECT_TRUE(same_cache(prefill(*p, toks)->cache(), ref->cache())) << spec;
    EXPECT_TRUE(same_cache(prefill(*p, toks, 48)->cache(), ref48->cache())) << spec << " chunk 48";
  }
  auto p = make_press_impl("per_layer(knorm,ratios=0/0/0/0/0)", 0.5);
  EXPECT_TRUE(same_cache(prefill(*p, toks)->cache(), ref->cache()));
  // f16 cache too (the default codec): nothing is re-encoded.
  auto ref16 = prefill(*none, toks, 0, nullptr, KVCodec::F16);
  auto k = make_press_impl("key_rerotation(snapkv:window=16)", 0.0);
  EXPECT_TRUE(same_cache(prefill(*k, toks, 0, nullptr, KVCodec::F16)->cache(), ref16->cache()));
}

TEST(PressRules, KeptIsFloorOfRatioClampedToOneAndN) {
  auto toks = story_tokens(150);
  for (const std::string& spec : kUniformSpecs)
    for (double r : {0.1, 0.5, 0.75, 0.9, 0.999}) {
      auto p = make_press_impl(spec, r);
      auto s = prefill(*p, toks);
      const size_t want = std::max<size_t>(1, static_cast<size_t>(std::floor(150 * (1 - r) + 1e-9)));
      for (int l = 0; l < s->cache().n_layer(); ++l)
        for (int h = 0; h < s->cache().n_head_kv(); ++h)
          EXPECT_EQ(s->cache().seg(l, h).size(), want) << spec << " r=" << r << " l" << l << " h" << h;
    }
}

TEST(PressRules, ProtectedEntriesSurviveEvenWhenScoresTie) {
  // All scores equal except the protected ones: the protected entries stay, whatever the budget.
  std::vector<float> s(20, 0.5f);
  s[0] = s[1] = s[19] = kProtected;
  auto idx = select_top(s, 2);
  EXPECT_EQ(idx, (std::vector<int32_t>{0, 1, 19}));
  idx = select_top(s, 5);  // the keep-count includes the protected entries
  EXPECT_EQ(idx, (std::vector<int32_t>{0, 1, 17, 18, 19}));  // ties go to the later entries
  // On the model: sinks (streaming_llm), the observation window (snapkv), the newest token (tova),
  // the recent window (h2o) and the sliding window (threshold) at a ratio that would remove them.
  auto toks = story_tokens(120);
  struct Case {
    std::string spec;
    std::vector<int32_t> must;  // positions that must stay
  };
  std::vector<int32_t> last16, first4 = {0, 1, 2, 3};
  for (int i = 104; i < 120; ++i) last16.push_back(i);
  // By default these entries are only chosen first (kvpress); protect=1 is kvslim's guarantee.
  for (const Case& c : {Case{"streaming_llm:n_sink=4,protect=1", first4}, Case{"snapkv:window=16,protect=1", last16},
                        Case{"tova:protect=1", {119}}, Case{"h2o:recent=16,protect=1", last16},
                        Case{"threshold(knorm):tau=1e30,window=16", last16},
                        Case{"expected_attention:n_sink=4,window=16,protect=1", first4},
                        Case{"adakv(snapkv:window=16,protect=1)", last16},
                        Case{"global(snapkv:window=16,protect=1)", last16},
                        Case{"pyramidkv(snapkv:window=16,protect=1)", last16},
                        Case{"zigzagkv(snapkv:window=16,protect=1)", last16}}) {
    for (int chunk : {0, 40}) {
      auto p = make_press_impl(c.spec, 0.95);
      auto s = prefill(*p, toks, chunk);
      for (int l = 0; l < s->cache().n_layer(); ++l)
        for (int h = 0; h < s->cache().n_head_kv(); ++h) {
          const auto& pos = s->cache().seg(l, h).positions();
          for (int32_t m : c.must)
            EXPECT_TRUE(std::binary_search(pos.begin(), pos.end(), m))
                << c.spec << " chunk " << chunk << " lost position " << m << " in l" << l << " h" << h;
        }
    }
  }
}

TEST(PressRules, PromptNoLongerThanTheProtectedWindowIsUntouched) {
  auto toks = story_tokens(40);
  auto none = make_press_impl("none", 0.0);
  auto ref = prefill(*none, toks);
  for (const char* spec : {"snapkv:window=64,protect=1", "h2o:recent=64,protect=1",
                           "threshold(knorm):tau=1e30,window=64", "adakv(snapkv:window=64,protect=1)",
                           "pyramidkv(snapkv:window=64,protect=1)", "zigzagkv(snapkv:window=64,protect=1)",
                           "streaming_llm:n_sink=64,protect=1", "expected_attention:n_sink=64,protect=1"}) {
    auto p = make_press_impl(spec, 0.9);
    EXPECT_TRUE(same_cache(prefill(*p, toks)->cache(), ref->cache())) << spec;
  }
}

TEST(PressRules, PyramidKVFallsBackToUniformBudgetsWhenThePyramidDoesNotFit) {
  // kvpress's get_layer_budget at ratio 0.05 on 200 tokens (window 64): cap 254, min 9.5, max
  // 370.5 -> capped at 136, min 380 - 136 = 244 > max: every layer keeps round(190) = 190.
  auto toks = story_tokens(200);
  auto py = make_press_impl("pyramidkv(knorm)", 0.05);
  auto sp = prefill(*py, toks);
  for (int l = 0; l < sp->cache().n_layer(); ++l)
    EXPECT_EQ(sp->cache().entries(l), size_t(190) * sp->cache().n_head_kv()) << "layer " << l;
}

TEST(PressRules, SelectionIsPerKVHeadAndTheCacheKeepsKVHeadsOnly) {
  auto toks = story_tokens(128);
  auto none = make_press_impl("none", 0.0);
  auto ref = prefill(*none, toks);
  auto p = make_press_impl("adakv(snapkv:window=16)", 0.6);
  auto s = prefill(*p, toks);
  const HParams& hp = bundled_model().hparams();
  ASSERT_EQ(s->cache().n_head_kv(), hp.n_head_kv);
  ASSERT_LT(hp.n_head_kv, hp.n_head);
  bool differ = false;
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h) {
      const Segment &a = s->cache().seg(l, h), &b = ref->cache().seg(l, h);
      differ = differ || a.positions() != s->cache().seg(l, 0).positions();
      // Every kept entry is the original (un-expanded) entry of that KV head.
      std::vector<float> ka(hp.head_dim), kb(hp.head_dim);
      for (size_t i = 0; i < a.size(); ++i) {
        size_t j = std::lower_bound(b.positions().begin(), b.positions().end(), a.positions()[i]) - b.positions().begin();
        a.key(i, ka.data());
        b.key(j, kb.data());
        EXPECT_EQ(ka, kb);
      }
    }
  EXPECT_TRUE(differ) << "AdaKV should select different entries in different KV heads";
}

TEST(PressRules, TwoRequestsAreCompressedAlike) {
  auto a = story_tokens(140), b = tokens_of("The dog ran to the park and found a big stick. He was very happy.");
  for (const std::string& spec : kAllSpecs) {
    auto p = make_press_impl(spec, 0.5);
    auto first = prefill(*p, a, 32);
    prefill(*p, b);
    auto again = prefill(*p, a, 32);
    EXPECT_TRUE(same_cache(first->cache(), again->cache())) << spec;
  }
  // Through generate (prefill, question, decode with decode-time eviction).
  for (const char* spec : {"h2o", "decoding(snapkv:window=8):interval=4,size=24", "threshold(knorm):tau=-2,decode=1"}) {
    auto p = make_press_impl(spec, 0.5);
    GenerateOptions o;
    o.context = "Once upon a time there was a cat. The cat liked milk and naps in the sun.";
    o.question = " The cat";
    o.n_predict = 16;
    o.sampling.temp = 0;
    GenerateResult r1 = generate(bundled_model(), *p, o);
    GenerateOptions o2 = o;
    o2.context = "Tom had a red car. He drove it to the shop to buy bread and apples.";
    generate(bundled_model(), *p, o2);
    GenerateResult r3 = generate(bundled_model(), *p, o);
    EXPECT_EQ(r1.tokens, r3.tokens) << spec;
    EXPECT_EQ(r1.stats.final_kv_bytes, r3.stats.final_kv_bytes) << spec;
  }
}

TEST(PressRules, ReportedRatioAndBytesAreMeasuredFromTheCache) {
  GenerateOptions o;
  o.context = std::string(300, ' ');
  for (int i = 0; i < 12; ++i) o.context += "Lily saw a big red ball in the park and ran to play with it. ";
  o.n_predict = 1;
  o.session.key_codec = o.session.value_codec = KVCodec::F16;
  // A composition: 0.5 then 0.5 of what is left -> 0.75 reported.
  auto p = make_press_impl("snapkv:window=16+knorm", 0.5);
  EXPECT_DOUBLE_EQ(p->ratio(), 0.75);
  GenerateResult r = generate(bundled_model(), *p, o);
  const auto& st = r.stats;
  const HParams& hp = bundled_model().hparams();
  const size_t n = st.context_tokens;
  const size_t per_seg = static_cast<size_t>(uniform_keep(uniform_keep(n, 0.5), 0.5));
  EXPECT_EQ(st.entries_kept, per_seg * hp.n_layer * hp.n_head_kv);
  const size_t row = hp.head_dim * 2 * 2 + 4;  // f16 key + f16 value + int32 position
  EXPECT_EQ(st.kv_bytes, st.entries_kept * row);
  EXPECT_NEAR(st.compression_ratio(), 1.0 - double(per_seg) / n, 1e-12);
}

TEST(PressRules, AdaptiveBudgetsFreeAsManyBytesAsUniform) {
  auto toks = story_tokens(256);
  for (double r : {0.5, 0.75, 0.9}) {
    auto u = make_press_impl("snapkv:window=8", r);
    const size_t want = prefill(*u, toks)->cache().bytes();
    // (PyramidKV is not here: kvpress's schedule rounds each layer's budget, so its total is only
    // close to the uniform one; test_press_reference.cpp checks its exact counts.)
    for (const char* spec : {"adakv(snapkv:window=8)", "zigzagkv(snapkv:window=8)", "global(snapkv:window=8)",
                             "adakv(criticalkv(snapkv:window=8))"}) {
      auto p = make_press_impl(spec, r);
      EXPECT_EQ(prefill(*p, toks)->cache().bytes(), want) << spec << " r=" << r;
    }
  }
}

TEST(PressChunked, RatioAppliesToAllContextSeenAndPeakStaysNearBudgetPlusChunk) {
  auto toks = story_tokens(512);
  const HParams& hp = bundled_model().hparams();
  const size_t row = hp.head_dim * 2 * 4 + 4;  // f32 cache
  for (const char* spec : {"knorm", "snapkv:window=16", "h2o:recent=8", "adakv(snapkv:window=16)",
                           "zigzagkv(snapkv:window=16)", "expected_attention:window=16", "tova", "keydiff",
                           "observed_attention", "key_rerotation(streaming_llm)"}) {
    auto p = make_press_impl(spec, 0.875);  // budget 64 of 512
    size_t peak_chunk = 0, peak_full = 0;
    auto s = prefill(*p, toks, 32, &peak_chunk);
    prefill(*p, toks, 0, &peak_full);
    const size_t budget = 64;
    EXPECT_EQ(s->cache().entries(), budget * hp.n_layer * hp.n_head_kv) << spec;
    EXPECT_EQ(peak_full, size_t(512) * hp.n_layer * hp.n_head_kv * row) << spec;
    // After a chunk of 32 arrives the cache holds at most budget + 32 per segment.
    EXPECT_LE(peak_chunk, (budget + 32) * hp.n_layer * hp.n_head_kv * row) << spec;
  }
}

TEST(PressChunked, H2OStateStaysAlignedAcrossChunks) {
  // One chunk equal to the prompt is the unchunked run; with chunks the accumulated attention of
  // surviving entries keeps growing: the newest and heaviest entries survive, the budget holds.
  auto toks = story_tokens(200);
  auto p = make_press_impl("h2o:recent=4", 0.5);
  auto whole = prefill(*p, toks, 0), one = prefill(*p, toks, 200);
  EXPECT_TRUE(same_cache(whole->cache(), one->cache()));
  auto chunked = prefill(*p, toks, 50);
  EXPECT_EQ(chunked->cache().seg(2, 1).size(), 100u);
  // Position 0 (BOS, the attention sink) accumulates the most attention and is never evicted.
  for (int l = 0; l < 5; ++l)
    for (int h = 0; h < 4; ++h) EXPECT_EQ(chunked->cache().seg(l, h).positions()[0], 0) << l << " " << h;
}

TEST(PressDecode, H2OHoldsTheBudgetDuringDecode) {
  auto p = make_press_impl("h2o:recent=4", 0.5);
  GenerateOptions o;
  o.context = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";
  o.n_predict = 24;
  o.sampling.temp = 0;
  GenerateResult r = generate(bundled_model(), *p, o);
  ASSERT_GT(r.stats.generated_tokens, 1);
  EXPECT_EQ(r.stats.final_kv_bytes, r.stats.kv_bytes);  // no question: the budget is the prefill size
}

TEST(PressDecode, DecodingWrapperCompressesEveryIntervalToTheTarget) {
  auto p = make_press_impl("decoding(snapkv:window=8):interval=8,size=30", 0.0);
  GenerateOptions o;
  o.context = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";
  o.n_predict = 40;
  o.sampling.temp = 0;
  o.session.key_codec = o.session.value_codec = KVCodec::F32;
  GenerateResult r = generate(bundled_model(), *p, o);
  ASSERT_EQ(r.stats.generated_tokens, 40);
  const HParams& hp = bundled_model().hparams();
  const size_t row = hp.head_dim * 2 * 4 + 4;
  EXPECT_EQ(r.stats.kv_bytes, size_t(r.stats.context_tokens) * hp.n_layer * hp.n_head_kv * row);  // prefill untouched
  // 39 tokens were fed back: the last compression (step 32) left 30; 7 more since.
  EXPECT_EQ(r.stats.final_kv_bytes, size_t(30 + 7) * hp.n_layer * hp.n_head_kv * row);
}

TEST(PressRerotation, KeysMoveToContiguousPositionsExactly) {
  auto toks = story_tokens(100);
  auto none = make_press_impl("none", 0.0);
  auto ref = prefill(*none, toks);
  auto p = make_press_impl("key_rerotation(streaming_llm:n_sink=4)", 0.5);
  auto s = prefill(*p, toks);
  const HParams& hp = bundled_model().hparams();
  const int d = hp.head_dim;
  for (int l = 0; l < hp.n_layer; ++l)
    for (int h = 0; h < hp.n_head_kv; ++h) {
      const Segment& a = s->cache().seg(l, h);
      ASSERT_EQ(a.size(), 50u);
      // Kept: sinks 0..3 and positions 54..99, now at 50..99.
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a.positions()[i], int32_t(50 + i));
        const int32_t orig = i < 4 ? int32_t(i) : int32_t(54 + i - 4);
        std::vector<float> k0(d), k1(d);
        ref->cache().seg(l, h).key(orig, k0.data());
        a.key(i, k1.data());
        // Reference: rotate by (new - old) in float64 with explicit pair rotations.
        for (int pr = 0; pr < d / 2; ++pr) {
          double th = double(50 + int(i) - orig) * std::pow(double(hp.rope_freq_base), -2.0 * pr / d);
          double x0 = k0[2 * pr], x1 = k0[2 * pr + 1];
          EXPECT_NEAR(k1[2 * pr], x0 * std::cos(th) - x1 * std::sin(th), 1e-5);
          EXPECT_NEAR(k1[2 * pr + 1], x0 * std::sin(th) + x1 * std::cos(th), 1e-5);
        }
      }
    }
  // The newest entry stays at the session's next position - 1: decoding continues right after it.
  EXPECT_EQ(cache_next_position(s->cache()), 100);
}

// Layer-0 keys depend only on the token, so a token's key at position p' can be computed by the
// model itself: the re-rotated keys must equal them. Checked on random-weight models with the
// neox layout and q/k biases (qwen2.5 shape) and with Llama 3 rope_freqs (llama-3.2 shape).
TEST(PressRerotation, MatchesTheModelsOwnRoPE) {
  const std::string dir = ::testing::TempDir();
  for (const std::string shape : {"qwen2.5-0.5b", "llama-3.2-1b"}) {
    const std::string path = dir + "/press_rerot_" + std::to_string(::getpid()) + "_" + shape + ".gguf";
    std::string cmd = std::string(KVSLIM_CLI) + " synth --shape " + shape + " --type q4_0 --vocab-from " +
                      KVSLIM_SOURCE_DIR + "/models/stories260K.gguf -o " + path + " --layers 1 -q > /dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    auto model = Model::load(path);
    const HParams& hp = model->hparams();
    SessionOptions so;
    so.key_codec = so.value_codec = KVCodec::F32;
    so.n_ctx = 128;
    std::vector<Token> toks;
    for (int i = 0; i < 40; ++i) toks.push_back(1 + (i * 37) % (hp.n_vocab - 1));
    Session a(*model, so);
    auto p = make_press_impl("key_rerotation(streaming_llm:n_sink=4)", 0.5);
    prefill_and_compress(a, *p, toks, 0);
    // Kept: sinks 0..3 (now at 20..23) and positions 24..39 (unchanged).
    std::vector<Token> shifted(20, toks[5]);
    shifted.insert(shifted.end(), toks.begin(), toks.begin() + 4);
    Session b(*model, so);
    b.forward(shifted);
    for (int h = 0; h < hp.n_head_kv; ++h) {
      const Segment &sa = a.cache().seg(0, h), &sb = b.cache().seg(0, h);
      ASSERT_EQ(sa.size(), 20u);
      std::vector<float> ka(hp.head_dim), kb(hp.head_dim);
      for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(sa.positions()[i], 20 + i);
        sa.key(i, ka.data());
        sb.key(20 + i, kb.data());
        float mx = 0;
        for (float x : kb) mx = std::max(mx, std::fabs(x));
        for (int d = 0; d < hp.head_dim; ++d) EXPECT_NEAR(ka[d], kb[d], 2e-5f * mx + 1e-6f) << shape << " h" << h;
      }
    }
    std::remove(path.c_str());
  }
}

TEST(PressSpec, ParsesCompositionsPoliciesAndWrappers) {
  EXPECT_EQ(make_press_impl("snapkv", 0.5)->describe(), "snapkv:ratio=0.5,window=64,kernel=5,pooling=avg,protect=0");
  EXPECT_EQ(make_press_impl("adakv(snapkv:window=32,alpha=0.3)", 0.5)->describe(),
            "adakv(snapkv:ratio=0.5,window=32,kernel=5,pooling=avg,protect=0):alpha=0.3");
  EXPECT_EQ(make_press_impl("adakv(snapkv:window=32):alpha=0.3,ratio=0.25", 0.5)->describe(),
            "adakv(snapkv:ratio=0.25,window=32,kernel=5,pooling=avg,protect=0):alpha=0.3");
  EXPECT_EQ(make_press_impl("adakv", 0.5)->describe(), "adakv(snapkv:ratio=0.5,window=64,kernel=5,pooling=avg,protect=0):alpha=0.2");
  EXPECT_EQ(make_press_impl("threshold(knorm,window=64,tau=0)", 0.0)->describe(),
            "threshold(knorm:ratio=0):tau=0,window=64,decode=0");
  EXPECT_EQ(make_press_impl("snapkv:ratio=0.2+knorm", 0.5)->describe(),
            "snapkv:ratio=0.2,window=64,kernel=5,pooling=avg,protect=0+knorm:ratio=0.5");
  EXPECT_NEAR(make_press_impl("snapkv:ratio=0.2+knorm", 0.5)->ratio(), 0.6, 1e-12);
  EXPECT_EQ(make_press_impl("key_rerotation(adakv(snapkv))", 0.3)->describe(),
            "key_rerotation(adakv(snapkv:ratio=0.3,window=64,kernel=5,pooling=avg,protect=0):alpha=0.2)");
  EXPECT_EQ(make_press_impl("threshold(knorm):tau=1e+5", 0.0)->describe(), "threshold(knorm:ratio=0):tau=100000,window=128,decode=0");
  EXPECT_EQ(make_press_impl("decoding(knorm:ratio=0.5):interval=16", 0.0)->describe(),
            "decoding(knorm:ratio=0.5):interval=16,size=2048");
}

TEST(PressSpec, BadSpecsRaiseErrorsNamingTheProblem) {
  auto msg = [](const std::string& spec, double r = 0.5) -> std::string {
    try {
      make_press_impl(spec, r);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(msg("bogus").find("unknown press 'bogus'"), std::string::npos);
  EXPECT_NE(msg("snapkv:windw=3").find("unknown parameter 'windw'"), std::string::npos);
  EXPECT_NE(msg("snapkv:window=3,window=4").find("given twice"), std::string::npos);
  EXPECT_NE(msg("snapkv:window=x").find("window='x'"), std::string::npos);
  EXPECT_NE(msg("adakv(snapkv").find("unbalanced"), std::string::npos);
  EXPECT_NE(msg("adakv(key_rerotation(snapkv))").find("needs a scorer press"), std::string::npos);
  EXPECT_NE(msg("adakv(pyramidkv(snapkv))").find("already has a budget policy"), std::string::npos);
  EXPECT_NE(msg("knorm(snapkv)").find("takes no inner press"), std::string::npos);
  EXPECT_NE(msg("knorm:ratio=1.5").find("outside [0, 1)"), std::string::npos);
  EXPECT_NE(msg("knorm", 1.0).find("outside [0, 1)"), std::string::npos);
  EXPECT_NE(msg("adakv:alpha=2").find("alpha=2"), std::string::npos);
  EXPECT_NE(msg("snapkv:kernel=4").find("kernel=4"), std::string::npos);
  EXPECT_NE(msg("per_layer(knorm)").find("ratios"), std::string::npos);
  EXPECT_NE(msg("adakv(snapkv)x").find("unexpected"), std::string::npos);
  // Regression: a dangling '+' was reported as "'snapkv+' is not a press name".
  EXPECT_NE(msg("snapkv+").find("no press after the final '+'"), std::string::npos) << msg("snapkv+");
  EXPECT_NE(msg("snapkv + ").find("no press after the final '+'"), std::string::npos);
  EXPECT_NE(msg("+snapkv").find("no press before '+'"), std::string::npos) << msg("+snapkv");
  EXPECT_EQ(msg("snapkv:window=8+knorm"), "");  // a '+' between two presses is composition
}

TEST(PressCli, PressesListsEveryPressAndGenerateRejectsBadSpecs) {
  FILE* f = popen((std::string(KVSLIM_CLI) + " presses 2>&1").c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(f), 0);
  // Presses named test_* are registered by this test binary only (test_press_one_file.cpp).
  for (const PressInfo* p : PressRegistry::instance().all()) {
    if (p->name.rfind("test_", 0) != 0) {
      EXPECT_NE(out.find(p->name), std::string::npos) << p->name;
    }
  }
  EXPECT_NE(out.find("Spec syntax"), std::string::npos);
  std::string cmd = std::string(KVSLIM_CLI) + " generate -m " + KVSLIM_SOURCE_DIR +
                    "/models/stories260K.gguf -p hi --press 'adakv(snapkv' -n 1 > /dev/null 2>&1";
  int rc = std::system(cmd.c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 1);
}

}  // namespace
