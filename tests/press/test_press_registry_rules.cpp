// The press rules of the design, checked for every press, policy and wrapper the registry holds
// (not a hand-written list), through the request runner that every job drives. A press that
// cannot run without a file (a trained surrogate, head labels) is listed by name below, so a new
// press is never skipped silently.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "kvslim/press.h"
#include "kvslim/request.h"
#include "press/wrappers.h"
#include "support/press_util.h"

using namespace kvslim;
using press_test::bundled_model;
using press_test::same_cache;

namespace {

// Presses whose default spec needs a file the test data does not hold (covered elsewhere with a
// file made in the test: test_press_replay_gates_clusters.cpp).
const std::set<std::string> kNeedsFile = {"kvzap", "duo_attention", "qfilter", "fastkvzip", "lukv", "restorekv"};
// Presses that do not remove a ratio of the context in prefill, so "measured == requested" does
// not apply: the reason is the press's documented behaviour.
const std::set<std::string> kNotRatioDriven = {
    "none",       // keeps everything
    "clusterkv",  // selects at decode time, evicts nothing
    "threshold",  // keeps by score threshold (tau)
    "per_layer",  // its own per-layer ratios
    "decoding",   // compresses during decode only
    "compression_ratio_decoding",  // the same (decoding with size=0)
    "cam",        // the same: merges and evicts during decode only
    "leankv",     // precision tiers: a share is kept at low precision, not evicted
    "simlayerkv", // keeps everything in non-lazy layers; no ratio (default threshold 1: no-op)
};

std::string story(int lines) {
  std::string s;
  for (int i = 0; i < lines; ++i) s += "Lily saw a big red ball in the park and ran to play with it. ";
  return s;
}

RequestOptions greedy(int n) {
  RequestOptions o;
  o.n_predict = n;
  o.sampling.temp = 0;
  o.session.key_codec = o.session.value_codec = KVCodec::F32;
  return o;
}

// Presses that change the cache at ratio 0 by design: threshold keeps by tau, per_layer by its
// own ratios, leankv re-encodes its `low` share, think and latent reduce key channels / rank by
// parameters of their own (dimensions, not entries).
const std::set<std::string> kRatioIndependent = {"threshold", "per_layer", "leankv", "think", "latent"};
// Presses that keep whole groups of entries, so the measured ratio meets the requested one to
// within a group rather than one entry per segment.
const std::set<std::string> kGroupGranular = {"chunkkv"};

// Presses with a parameter that has no default: the value the test gives (bundled model: 5 layers).
const std::map<std::string, std::string> kRequired = {
    {"threshold", "threshold:tau=-4"},
    {"finch", "finch:window=8"},
    {"per_layer", "per_layer:ratios=0.5/0.25/0.5/0.75/0.5"},
};

/// Every registered name (a policy or wrapper alone wraps its default inner press).
std::vector<std::string> runnable_specs() {
  std::vector<std::string> out;
  for (const PressInfo* info : PressRegistry::instance().all()) {
    if (kNeedsFile.count(info->name)) continue;
    auto it = kRequired.find(info->name);
    out.push_back(it != kRequired.end() ? it->second : info->name);
  }
  return out;
}

/// The registry name a spec starts with.
std::string name_of(const std::string& spec) { return spec.substr(0, spec.find_first_of(":(+")); }

struct RunResult {
  std::vector<Token> tokens;
  std::vector<float> logits;
  RequestStats stats;
};

RunResult generate_with(PressImpl& press, const std::string& context, const std::string& question, int n,
                  const KVCache** cache_out = nullptr, std::unique_ptr<Request>* keep = nullptr) {
  auto r = std::make_unique<Request>(bundled_model(), press, greedy(n));
  r->set_prompt(context, question);
  r->run();
  RunResult out{r->generated(), r->logits(), r->stats()};
  if (keep) *keep = std::move(r);
  return out;
}

/// Wraps a press and logs what it is shown: a digest of every Observation handed to observe() and
/// after_decode(), and every call of the one layer hook at its three points (the spy adds its own
/// hook next to the press's when the press needs anything, so a press that needs nothing keeps the
/// batched decode path).
class SpyPress : public PressImpl, private LayerHook {
 public:
  explicit SpyPress(std::unique_ptr<PressImpl> p) : p_(std::move(p)) {}
  std::string describe() const override { return p_->describe(); }
  ObservationNeeds needs() const override { return with_spy(p_->needs()); }
  ObservationNeeds decode_needs() const override { return with_spy(p_->decode_needs()); }
  void observe(const KVCache& c, const Model& m, const Observation& o) override {
    log_.push_back("observe " + digest(o));
    p_->observe(c, m, o);
  }
  void apply(KVCache& c, const Model& m, const Observation& o, const Target& t) override { p_->apply(c, m, o, t); }
  void after_decode(KVCache& c, const Model& m, const Observation& o) override {
    log_.push_back("decode " + digest(o));
    p_->after_decode(c, m, o);
  }
  void reset() override {
    p_->reset();
    log_.clear();
  }
  double ratio() const override { return p_->ratio(); }
  double key_channel_ratio() const override { return p_->key_channel_ratio(); }
  void set_ratio(double r) override { p_->set_ratio(r); }
  size_t kept_after(const Target& t) const override { return p_->kept_after(t); }
  void remap_positions(int l, int h, const std::vector<int32_t>& o, const std::vector<int32_t>& n) override {
    p_->remap_positions(l, h, o, n);
  }
  bool evicts_in_decode() const override { return p_->evicts_in_decode(); }
  bool selects_in_decode() const override { return p_->selects_in_decode(); }
  const std::vector<std::string>& log() const { return log_; }
  /// Hook calls seen at each point: after Q/K/V, before attention, after attention.
  int calls[3] = {0, 0, 0};

 private:
  ObservationNeeds with_spy(ObservationNeeds n) const {
    if (n.any()) n.hooks.push_back(const_cast<SpyPress*>(this));
    return n;
  }
  void after_qkv(const LayerStep& s) override {
    ++calls[0];
    log_.push_back(fmt::format("qkv l{} n{} p{}", s.layer, s.n, s.positions[0]));
  }
  bool before_attention(const LayerStep& s, std::vector<std::vector<int32_t>>&) override {
    ++calls[1];
    size_t entries = 0;
    for (int h = 0; h < s.hp->n_head_kv; ++h) entries += s.cache->seg(s.layer, h).size();
    log_.push_back(fmt::format("attend l{} entries{}", s.layer, entries));
    return false;
  }
  void after_attention(const LayerStep& s, const std::vector<std::vector<float>>*) override { ++calls[2]; }
  static std::string digest(const Observation& o) {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](const void* p, size_t n) {
      const auto* b = static_cast<const unsigned char*>(p);
      for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    };
    for (const auto& q : o.queries) mix(q.data(), q.size() * sizeof(float));
    mix(o.window_positions.data(), o.window_positions.size() * sizeof(int32_t));
    for (const auto& l : o.attention_mass)
      for (const auto& m : l) mix(m.data(), m.size() * sizeof(float));
    for (const auto& x : o.hidden) mix(x.data(), x.size() * sizeof(float));
    mix(o.tokens.data(), o.tokens.size() * sizeof(Token));
    mix(o.token_positions.data(), o.token_positions.size() * sizeof(int32_t));
    return fmt::format("w{} t{} m{} runner{} #{:016x}", o.n_window(), o.tokens.size(), o.attention_mass.size(),
                       o.runner != nullptr, h);
  }
  std::unique_ptr<PressImpl> p_;
  std::vector<std::string> log_;
};

}  // namespace

TEST(RegistryRules, EveryRegisteredNameIsCoveredOrListed) {
  std::set<std::string> names;
  for (const PressInfo* info : PressRegistry::instance().all()) names.insert(info->name);
  for (const auto& n : kNeedsFile) EXPECT_TRUE(names.count(n)) << n << " is no longer registered: drop it from the list";
  for (const std::string& spec : runnable_specs()) EXPECT_NO_THROW(make_press_impl(spec, 0.5)) << spec;
}

TEST(RegistryRules, RatioZeroIsBitIdenticalToNoPress) {
  const std::string ctx = story(6);
  auto none = make_press_impl("none", 0.0);
  std::unique_ptr<Request> ref;
  RunResult want = generate_with(*none, ctx, " The ball", 6, nullptr, &ref);
  for (const std::string& spec : runnable_specs()) {
    if (kRatioIndependent.count(name_of(spec))) continue;
    auto p = make_press_impl(spec, 0.0);
    if (p->ratio() != 0.0) continue;     // e.g. a policy whose inner press has its own ratio
    std::unique_ptr<Request> r;
    RunResult got = generate_with(*p, ctx, " The ball", 6, nullptr, &r);
    EXPECT_EQ(got.tokens, want.tokens) << spec;
    EXPECT_EQ(got.logits, want.logits) << spec;
    EXPECT_TRUE(same_cache(r->cache(), ref->cache())) << spec;
  }
}

TEST(RegistryRules, NoSegmentBelowOneEntry) {
  for (const std::string& spec : runnable_specs())
    for (const std::string& text : {std::string("Once upon a"), story(4)}) {
      Request r(bundled_model(), make_press_impl(spec, 0.9), greedy(2));
      r.set_prompt(text);
      r.run();
      const KVCache& c = r.cache();
      for (int l = 0; l < c.n_layer(); ++l)
        for (int h = 0; h < c.n_head_kv(); ++h)
          EXPECT_GE(c.seg(l, h).size(), 1u) << spec << " '" << text.substr(0, 12) << "' l" << l << " h" << h;
    }
}

TEST(RegistryRules, NothingCarriesOverBetweenRequests) {
  const std::string a = story(5), b = "Tom had a red car. He drove it to the shop to buy bread and apples. ";
  for (const std::string& spec : runnable_specs()) {
    auto p = make_press_impl(spec, 0.5);
    std::unique_ptr<Request> r1, r3;
    RunResult first = generate_with(*p, a, " Lily", 8, nullptr, &r1);
    generate_with(*p, b, " Tom", 8);
    RunResult again = generate_with(*p, a, " Lily", 8, nullptr, &r3);
    EXPECT_EQ(first.tokens, again.tokens) << spec;
    EXPECT_EQ(first.logits, again.logits) << spec;
    EXPECT_TRUE(same_cache(r1->cache(), r3->cache())) << spec;
  }
}

TEST(RegistryRules, MeasuredRatioFollowsTheRequestedOne) {
  // 300+ tokens: longer than every default protected window, so the ratio is reachable.
  const std::string ctx = story(24);
  for (const std::string& spec : runnable_specs()) {
    if (kNotRatioDriven.count(name_of(spec)) || kRatioIndependent.count(name_of(spec)) ||
        kGroupGranular.count(name_of(spec)))
      continue;
    for (double r : {0.5, 0.75}) {
      auto p = make_press_impl(spec, r);
      Request req(bundled_model(), *p, greedy(1));
      req.set_prompt(ctx);
      req.prefill();
      const RequestStats& st = req.stats();
      // Floors (one per segment) and rounding only: within 1 entry per segment of the request.
      const double segs = double(st.entries_total) / st.context_tokens;
      EXPECT_NEAR(st.compression_ratio(), p->ratio(), segs / st.entries_total + 1e-9) << spec << " r=" << r;
      // And what the request reports is what the cache holds.
      EXPECT_EQ(st.entries_kept, req.cache().entries()) << spec;
    }
  }
}

TEST(RegistryRules, EveryJobPathLeavesTheSameCacheAndLogits) {
  // generate (Request::run: sampling greedily), bench and eval fidelity (prefill, then the same
  // tokens fed with advance()), and chunked prefill of one chunk: one runner, one result.
  const std::string ctx = story(6);
  for (const std::string& spec : runnable_specs()) {
    auto p = make_press_impl(spec, 0.5);
    std::unique_ptr<Request> gen;
    RunResult g = generate_with(*p, ctx, "", 6, nullptr, &gen);
    RequestOptions o = greedy(0);
    o.chunk_size = 4096;  // one chunk: the same as no chunking
    Request fed(bundled_model(), *p, o);
    fed.set_prompt(ctx);
    fed.prefill();
    ASSERT_FALSE(g.tokens.empty()) << spec;
    // generate does not run its last sampled token; feed the same ones.
    for (size_t i = 0; i + 1 < g.tokens.size(); ++i) fed.advance(g.tokens[i]);
    EXPECT_EQ(fed.logits(), g.logits) << spec;
    EXPECT_TRUE(same_cache(fed.cache(), gen->cache())) << spec;
  }
}

TEST(RegistryRules, EveryJobPathShowsThePressTheSameObservations) {
  // The one hook: generate (Request::run), eval/bench (prefill, then advance() with the same
  // tokens) and serve (step_batch, several requests at once) show every press the same
  // observations, and the hook is called at its three points of every layer.
  const std::string ctx = story(6);
  const int L = bundled_model().hparams().n_layer;
  for (const std::string& spec : runnable_specs()) {
    SpyPress gen_spy(make_press_impl(spec, 0.5));
    Request gen(bundled_model(), gen_spy, greedy(6));
    gen.set_prompt(ctx);
    gen.run();
    ASSERT_FALSE(gen.generated().empty()) << spec;

    SpyPress fed_spy(make_press_impl(spec, 0.5));
    Request fed(bundled_model(), fed_spy, greedy(0));
    fed.set_prompt(ctx);
    fed.prefill();
    for (size_t i = 0; i + 1 < gen.generated().size(); ++i) fed.advance(gen.generated()[i]);
    EXPECT_EQ(fed_spy.log(), gen_spy.log()) << spec;

    SpyPress a_spy(make_press_impl(spec, 0.5)), b_spy(make_press_impl(spec, 0.5));
    Request a(bundled_model(), a_spy, greedy(6)), b(bundled_model(), b_spy, greedy(6));
    a.set_prompt(ctx);
    b.set_prompt(ctx);
    while (!a.finished() || !b.finished()) step_batch({&a, &b});
    EXPECT_EQ(a_spy.log(), gen_spy.log()) << spec;
    EXPECT_EQ(b_spy.log(), gen_spy.log()) << spec;
    EXPECT_EQ(a.generated(), gen.generated()) << spec;

    if (gen_spy.needs().any()) {
      EXPECT_GE(gen_spy.calls[0], L) << spec;
      EXPECT_EQ(gen_spy.calls[0], gen_spy.calls[1]) << spec;
      EXPECT_EQ(gen_spy.calls[1], gen_spy.calls[2]) << spec;
    }
  }
}

TEST(RegistryRules, ACompositionCallsTheHooksOfEveryPress) {
  // Each stage's own hook survives composition (before, only one query hook did).
  auto a = std::make_unique<SpyPress>(make_press_impl("expected_attention:window=0", 0.3));
  auto b = std::make_unique<SpyPress>(make_press_impl("expected_attention:window=0", 0.3));
  SpyPress* pa = a.get();
  SpyPress* pb = b.get();
  ObservationNeeds n = merge_needs(a->needs(), b->needs());
  EXPECT_EQ(n.hooks.size(), 4u);  // each press's own hook and each spy
  std::vector<std::unique_ptr<PressImpl>> parts;
  parts.push_back(std::move(a));
  parts.push_back(std::move(b));
  ComposedPress both(std::move(parts));
  Request r(bundled_model(), both, greedy(2));
  r.set_prompt(story(3));
  r.run();
  const int L = bundled_model().hparams().n_layer;
  EXPECT_EQ(pa->calls[0], L);
  EXPECT_EQ(pb->calls[0], L);
  EXPECT_LT(r.stats().entries_kept, r.stats().entries_total);
}

// Regression: `generate --press think --compression-ratio 0.5` (and simlayerkv, duo_attention,
// threshold, per_layer) ran with the ratio silently unused. make_press now says whether the
// caller's ratio is used; the truth here is the behaviour: the ratio is used exactly when two
// ratios leave different caches or logits.
TEST(RegistryRules, RatioUseIsReportedAsTheBehaviourShowsIt) {
  // Decode-time presses act after `compression_interval` decoded tokens (512), beyond this test.
  const std::set<std::string> kActsLater = {"decoding", "compression_ratio_decoding", "cam"};
  const std::string ctx = story(24);
  for (const std::string& spec : runnable_specs()) {
    if (name_of(spec) == "none" || kActsLater.count(name_of(spec))) continue;
    bool used_lo = false, used_hi = false;
    auto lo = make_press_impl(spec, 0.3, used_lo);
    auto hi = make_press_impl(spec, 0.7, used_hi);
    EXPECT_EQ(used_lo, used_hi) << spec;
    std::unique_ptr<Request> rl, rh;
    RunResult a = generate_with(*lo, ctx, " The ball", 4, nullptr, &rl);
    RunResult b = generate_with(*hi, ctx, " The ball", 4, nullptr, &rh);
    const bool differs = a.logits != b.logits || !same_cache(rl->cache(), rh->cache());
    EXPECT_EQ(used_lo, differs) << spec << (differs ? ": the ratio changes the result" : ": the ratio changes nothing");
  }
  // The spec's own ratio replaces the caller's; a composition uses it when one term does.
  bool used = true;
  make_press_impl("snapkv:ratio=0.3", 0.5, used);
  EXPECT_FALSE(used);
  make_press_impl("snapkv:ratio=0.3+knorm", 0.5, used);
  EXPECT_TRUE(used);
  make_press_impl("adakv(snapkv):ratio=0.3", 0.5, used);
  EXPECT_FALSE(used);
  make_press_impl("think+cla", 0.5, used);
  EXPECT_FALSE(used);
  EXPECT_THROW(check_ratio_used("think", 0.5, "--compression-ratio"), Error);
  EXPECT_NO_THROW(check_ratio_used("think", 0.0, "--compression-ratio"));
  EXPECT_NO_THROW(check_ratio_used("kvzip+latent", 0.5, "--compression-ratio"));
}

// Figures a request reports are what its press did. For every registered press alone and a few
// compositions, after prefill and a decode long enough for decode-time presses to act, the
// request's ratios equal a count taken here: the entries in the cache's segments against the
// tokens run (each gave every layer and KV head one entry), and the key channels stored against
// whole keys. Regression: a threshold press acting in decode (DMS) evicted ~half of the entries
// while every figure said 0, and ThinK's pruned channels showed nowhere inside a composition.
TEST(RegistryRules, ReportedRatiosAreWhatTheCacheHolds) {
  std::vector<std::string> specs = runnable_specs();
  const std::string dms = "threshold(knorm):tau=-4,window=8,decode=1";
  for (const std::string& s : std::vector<std::string>{dms, "snapkv+think", "think:key_ratio=0.25+knorm", "knorm+" + dms,
                               "decoding(knorm):interval=4,size=16", "key_rerotation(streaming_llm)+think"})
    specs.push_back(s);
  const HParams& hp = bundled_model().hparams();
  for (const std::string& spec : specs) {
    auto p = make_press_impl(spec, 0.5);
    Request r(bundled_model(), *p, greedy(24));
    r.set_prompt(story(6), " The ball");
    r.run();
    ASSERT_FALSE(r.generated().empty()) << spec;
    const RequestStats& st = r.stats();
    // The last sampled token is never run through the model.
    const size_t tokens = r.context_tokens().size() + r.question_tokens().size() + r.generated().size() - 1;
    size_t entries = 0, key_channels = 0;
    const KVCache& c = r.cache();
    for (int l = 0; l < c.n_layer(); ++l)
      for (int h = 0; h < c.n_head_kv(); ++h) {
        const Segment& seg = c.seg(l, h);
        entries += seg.size();
        const int dims = seg.latent() ? static_cast<int>(seg.latent_keys().basis().rank()) : hp.head_dim;
        key_channels += seg.size() * static_cast<size_t>(dims);
      }
    const size_t seen = tokens * hp.n_layer * hp.n_head_kv;
    EXPECT_EQ(st.entries_seen, seen) << spec;
    EXPECT_EQ(st.entries_now, entries) << spec;
    EXPECT_DOUBLE_EQ(st.request_compression_ratio(), 1.0 - double(entries) / seen) << spec;
    EXPECT_DOUBLE_EQ(st.key_channel_ratio(), 1.0 - double(key_channels) / (double(entries) * hp.head_dim)) << spec;
    // A press asked to prune key channels pruned that share of them (floor(head_dim * r) each).
    if (p->key_channel_ratio() > 0) {
      EXPECT_NEAR(st.key_channel_ratio(), p->key_channel_ratio(), 1.0 / hp.head_dim + 1e-12) << spec;
    } else if (name_of(spec) != "latent") {  // a latent basis's rank is its own parameter (energy)
      EXPECT_EQ(st.key_channel_ratio(), 0.0) << spec;
    }
  }
  // The decode-time threshold evicts while decoding: more is removed over the request than the
  // prefill compression removed, and it is reported.
  auto p = make_press_impl(dms, 0.0);
  Request r(bundled_model(), *p, greedy(24));
  r.set_prompt(story(6));
  r.run();
  EXPECT_GT(r.stats().request_compression_ratio(), 0.2);
  EXPECT_LT(r.cache().entries(), r.stats().entries_seen);
  // And think inside a composition reports its channels while the other stage removes entries.
  auto both = make_press_impl("snapkv+think", 0.5);
  EXPECT_DOUBLE_EQ(both->key_channel_ratio(), 0.5);
  EXPECT_DOUBLE_EQ(both->ratio(), 0.5);
}
