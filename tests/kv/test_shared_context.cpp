// Requests answering from one stored context share its read-only entries (Segment::share,
// KVCache::share): each fork appends to a private tail, reads the same attention blocks in the same
// order as a full copy of the cache (bit-identical outputs), copies a segment before changing shared
// entries (retain, set_keys), and holds only its tail and what it copied.
//
// References are independent of the sharing code: a copy of the segment made before share() (the
// plain copy path) for the storage tests, the uncached request (context + question through the press)
// for the model tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "attention/attention.h"
#include "kv/store.h"
#include "kvslim/context.h"
#include "server/engine.h"
#include "support/press_util.h"

using namespace kvslim;
using press_test::bundled_model;
using press_test::same_cache;

namespace {

struct Layout {
  Layout(std::string n, KVCodec key = KVCodec::F16, KVCodec value = KVCodec::F16)
      : name(std::move(n)), k(key), v(value) {}
  std::string name;
  KVCodec k, v;
  KVQuantOptions q;
  bool tiers = false;  ///< LeanKV split: every third entry to a q8_0 / q4_0 low tier
};

std::vector<Layout> layouts() {
  std::vector<Layout> out = {{"f32", KVCodec::F32, KVCodec::F32}, {"f16"}, {"bf16", KVCodec::BF16, KVCodec::BF16},
                             {"q8_0", KVCodec::Q8_0, KVCodec::Q8_0}, {"q4_0", KVCodec::Q4_0, KVCodec::Q4_0},
                             {"q8_0/q4_0", KVCodec::Q8_0, KVCodec::Q4_0}};
  for (int bits : {2, 4})
    for (auto [g, r] : {std::pair{8, 8}, std::pair{32, 20}}) {
      Layout l{"kivi" + std::to_string(bits) + " G=" + std::to_string(g) + " R=" + std::to_string(r)};
      l.q.kivi_bits = bits;
      l.q.kivi_group = g;
      l.q.kivi_residual = r;
      out.push_back(l);
    }
  Layout had{"q8_0 + hadamard", KVCodec::Q8_0, KVCodec::Q8_0};
  had.q.hadamard = true;
  out.push_back(had);
  Layout lean{"f16 + low tier", KVCodec::F16, KVCodec::F16};
  lean.tiers = true;
  out.push_back(lean);
  return out;
}

std::vector<float> random_rows(std::mt19937& rng, size_t n, int hd) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n * hd);
  for (float& v : x) v = nd(rng);
  return x;
}

void append_rows(Segment& s, const std::vector<float>& k, const std::vector<float>& v, int hd, int32_t pos0) {
  for (size_t i = 0; i < k.size() / hd; ++i) s.append(k.data() + i * hd, v.data() + i * hd, pos0 + static_cast<int32_t>(i));
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Attention outputs, probabilities and masses of a decode row and a 5-row prefill tile (every
/// entry visible to the last row), then keys, values and positions: everything a reader sees.
std::vector<float> reads(const Segment& s, uint32_t seed) {
  const int hd = s.head_dim();
  std::mt19937 rng(seed);
  std::vector<float> out;
  for (int rows : {1, 5}) {
    const std::vector<float> q = random_rows(rng, rows, hd);
    std::vector<int32_t> vis(rows);
    for (int r = 0; r < rows; ++r) vis[r] = static_cast<int32_t>(s.size()) - (rows - 1 - r);
    std::vector<float> o(static_cast<size_t>(rows) * hd), mass(s.size()), probs(rows * s.size());
    attend_segment(s, q.data(), rows, vis.data(), 0.125f, o.data(), hd, mass.data(), probs.data());
    out.insert(out.end(), o.begin(), o.end());
    out.insert(out.end(), mass.begin(), mass.end());
    out.insert(out.end(), probs.begin(), probs.end());
  }
  std::vector<float> kv(s.size() * hd);
  s.keys(0, s.size(), kv.data());
  out.insert(out.end(), kv.begin(), kv.end());
  s.values(0, s.size(), kv.data());
  out.insert(out.end(), kv.begin(), kv.end());
  for (int32_t p : s.positions()) out.push_back(static_cast<float>(p));
  out.push_back(static_cast<float>(s.bytes()));
  out.push_back(static_cast<float>(s.kv_bytes()));
  return out;
}

/// A segment of `n` random entries in layout `l` (with the LeanKV split when asked).
Segment filled(const Layout& l, int hd, size_t n, std::mt19937& rng) {
  Segment s(hd, l.k, l.v, l.q);
  append_rows(s, random_rows(rng, n, hd), random_rows(rng, n, hd), hd, 0);
  if (l.tiers && n > 0) {
    std::vector<int32_t> keep;
    std::vector<uint8_t> low;
    for (size_t i = 0; i < n; ++i)
      if (i % 7 != 3) {
        keep.push_back(static_cast<int32_t>(i));
        low.push_back(i % 3 == 1);
      }
    s.retain_tiered(keep, low, KVCodec::Q8_0, KVCodec::Q4_0);
  }
  return s;
}

}  // namespace

TEST(SharedEntries, ForksReadWhatAFullCopyReadsBitForBit) {
  const int hd = 64;
  for (const Layout& l : layouts())
    for (size_t n : {0, 1, 15, 16, 17, 47, 100, 131}) {
      SCOPED_TRACE(l.name + ", " + std::to_string(n) + " entries");
      std::mt19937 rng(static_cast<uint32_t>(n * 31 + l.name.size()));
      const Segment base = filled(l, hd, n, rng);
      Segment full_a = base, full_b = base;  // the plain copy path: copies made before sharing
      Segment context = base;
      context.share();
      Segment a = context, b = context;
      // Shared: whole key tiles, or KIVI groups, or a low tier.
      const bool fixed = l.q.kivi_bits ? base.store(0).group_entries() > 0 : base.store(0).size() >= 16;
      EXPECT_EQ(a.shares(), fixed || base.n_stores() > 1);
      ASSERT_TRUE(same_floats(reads(a, 1), reads(full_a, 1)));
      // Two forks take different entries, in steps across tile and KIVI group boundaries.
      int32_t pos = static_cast<int32_t>(n);
      for (int step : {1, 3, 16, 7, 40}) {
        const std::vector<float> ka = random_rows(rng, step, hd), va = random_rows(rng, step, hd);
        const std::vector<float> kb = random_rows(rng, step, hd), vb = random_rows(rng, step, hd);
        append_rows(a, ka, va, hd, pos);
        append_rows(full_a, ka, va, hd, pos);
        append_rows(b, kb, vb, hd, pos);
        append_rows(full_b, kb, vb, hd, pos);
        pos += step;
        ASSERT_TRUE(same_floats(reads(a, pos), reads(full_a, pos))) << "after " << pos << " entries";
        ASSERT_TRUE(same_floats(reads(b, pos), reads(full_b, pos))) << "after " << pos << " entries";
      }
      EXPECT_TRUE(same_floats(reads(context, 9), reads(base, 9))) << "the shared context changed";
      // A fork stored as a context in turn (a conversation's next turn) shares again.
      Segment turn = a;
      turn.share();
      Segment c = turn;
      const std::vector<float> kc = random_rows(rng, 21, hd), vc = random_rows(rng, 21, hd);
      append_rows(c, kc, vc, hd, pos);
      append_rows(full_a, kc, vc, hd, pos);
      EXPECT_TRUE(same_floats(reads(c, 3), reads(full_a, 3)));
    }
}

TEST(SharedEntries, ChangingSharedEntriesCopiesTheSegmentFirst) {
  const int hd = 64;
  for (const Layout& l : layouts()) {
    SCOPED_TRACE(l.name);
    std::mt19937 rng(7);
    const Segment base = filled(l, hd, 100, rng);
    Segment context = base;
    context.share();
    ASSERT_TRUE(context.shares());
    const std::vector<float> before = reads(context, 5);
    Segment a = context, b = context, full = base;
    const std::vector<float> k = random_rows(rng, 10, hd), v = random_rows(rng, 10, hd);
    append_rows(a, k, v, hd, 100);
    append_rows(b, k, v, hd, 100);
    append_rows(full, k, v, hd, 100);
    const std::vector<float> b_reads = reads(b, 6);

    // Eviction (a decode-time press): a's own copy, the same entries as a full copy's.
    std::vector<int32_t> keep;
    for (int32_t i = 0; i < static_cast<int32_t>(a.size()); ++i)
      if (i % 4 != 1) keep.push_back(i);
    a.retain(keep);
    full.retain(keep);
    EXPECT_FALSE(a.shares());
    EXPECT_TRUE(same_floats(reads(a, 8), reads(full, 8)));
    // Key re-rotation of old entries: the same.
    Segment a2 = context, full2 = base;
    const std::vector<float> nk = random_rows(rng, 3, hd);
    a2.set_keys(2, 5, nk.data());
    full2.set_keys(2, 5, nk.data());
    EXPECT_FALSE(a2.shares());
    EXPECT_TRUE(same_floats(reads(a2, 8), reads(full2, 8)));
    // Keys of the private tail only: nothing to copy.
    if (!l.q.kivi_bits) {
      Segment a3 = b, full3 = base;
      append_rows(full3, k, v, hd, 100);
      a3.set_keys(a3.size() - 2, a3.size(), nk.data());
      full3.set_keys(full3.size() - 2, full3.size(), nk.data());
      EXPECT_TRUE(a3.shares());
      EXPECT_TRUE(same_floats(reads(a3, 8), reads(full3, 8)));
    }
    Segment a4 = b;
    a4.clear();
    EXPECT_FALSE(a4.shares());
    EXPECT_EQ(a4.size(), 0u);

    EXPECT_TRUE(same_floats(reads(context, 5), before)) << "the context changed";
    EXPECT_TRUE(same_floats(reads(b, 6), b_reads)) << "another fork changed";
    EXPECT_TRUE(b.shares());
  }
}

TEST(SharedEntries, FourForksHoldOneContextPlusTheirTails) {
  // 4 layers x 2 KV heads x head_dim 64, 1,000 entries a segment (4,000 with KIVI, whose tail, the
  // residual window of up to 159 f16 entries, is a larger share of a short context); each fork
  // appends 10.
  const int L = 4, H = 2, hd = 64, q = 10, forks = 4;
  for (bool kivi : {false, true}) {
    SCOPED_TRACE(kivi ? "kivi4 G=32 R=128" : "f16");
    const int n = kivi ? 4000 : 1000;
    KVQuantOptions qo;
    if (kivi) {
      qo.kivi_bits = 4;
      qo.kivi_group = 32;
      qo.kivi_residual = 128;
    }
    KVCache context(L, H, hd, KVCodec::F16, KVCodec::F16, qo);
    std::mt19937 rng(3);
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h)
        append_rows(context.seg(l, h), random_rows(rng, n, hd), random_rows(rng, n, hd), hd, 0);
    context.shrink_to_fit();
    const size_t unshared = context.allocated_bytes();
    context.share();
    const size_t ctx_bytes = context.allocated_bytes();
    // Sharing moves bytes, it does not add any beyond the part objects.
    EXPECT_LE(ctx_bytes, unshared + L * H * 2 * (sizeof(KVStore) + 64));
    std::vector<KVCache> f(forks, context);
    size_t own = 0;
    for (KVCache& c : f) {
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h)
          append_rows(c.seg(l, h), random_rows(rng, q, hd), random_rows(rng, q, hd), hd, n);
      own += c.allocated_bytes() - c.shared_allocated_bytes();
    }
    // What a fork holds alone, per segment, bounded by hand: the Segment and KVStore objects and
    // the part pointers (2 KiB), the positions (copied: n + q int32 with at most doubled capacity),
    // and the tail: f16 rows are 128 + 128 bytes; the tail holds at most 15 context entries plus q
    // (f16) or the residual window, at most R + G - 1 = 159 entries, plus q (KIVI), in buffers
    // grown by at most 1.5x, plus 32 + 32 bytes of slack and for KIVI its serials (4 bytes each)
    // and the groups the q appends may have formed (at most one group of 32, under 2 KiB).
    const size_t tail_entries = (kivi ? 159 : 15) + q;
    const size_t per_seg = 2048 + 2 * (n + q) * 4 + (tail_entries * 256 * 3 / 2 + 64 + 256) +
                           (kivi ? 2 * tail_entries * 4 + 2048 : 0);
    const size_t bound = static_cast<size_t>(L) * H * per_seg;
    for (const KVCache& c : f) EXPECT_LE(c.allocated_bytes() - c.shared_allocated_bytes(), bound);
    const size_t total = ctx_bytes + own;
    EXPECT_LE(total, ctx_bytes + forks * bound);
    // Full copies would hold at least the context's key and value bytes each.
    EXPECT_LT(total, ctx_bytes + (forks / 2) * context.kv_bytes()) << "forks hold copies of the context";
    EXPECT_EQ(f[0].shared_kv_bytes() + (f[0].kv_bytes() - f[0].shared_kv_bytes()), f[0].kv_bytes());
    EXPECT_GT(f[0].shared_kv_bytes(), context.kv_bytes() * 8 / 10);
    std::vector<SharedEntries> parts;
    for (const KVCache& c : f) c.shared_parts(parts);
    std::vector<SharedEntries> ctx_parts;
    context.shared_parts(ctx_parts);
    ASSERT_EQ(parts.size(), forks * ctx_parts.size());
    for (size_t i = 0; i < parts.size(); ++i) EXPECT_EQ(parts[i].id, ctx_parts[i % ctx_parts.size()].id);
  }
}

// ---- Stored contexts on the bundled model ----

namespace {

const char* kDoc =
    "Once upon a time there was a little cat named Tom. Tom liked milk and naps in the sun. One day Tom found a "
    "red ball in the garden. He played with the ball all day long. His friend the dog came to play too. They ran "
    "and jumped until the sun went down. Then Tom went home and slept.";
const char* kQuestions[] = {" What did Tom find? Tom found", " Who came to play?", " When did Tom go home"};

RequestOptions options(const Layout& c, int n_predict) {
  RequestOptions o;
  o.n_predict = n_predict;
  o.sampling.temp = 0;
  o.session.key_codec = c.k;
  o.session.value_codec = c.v;
  o.session.kv_quant = c.q;
  return o;
}

/// Logits after the question and after every decode step.
using Trace = std::vector<std::vector<float>>;

/// N requests answering from one stored context, stepped together (step_batch), against each
/// question's uncached run with the same press.
void expect_forks_match(const std::string& spec, double ratio, const Layout& c, bool expect_sharing = true) {
  SCOPED_TRACE(spec + " / " + c.name);
  const Model& m = bundled_model();
  const Tokenizer& tok = m.tokenizer();
  const int n = 6;
  std::vector<Trace> ref;
  for (const char* q : kQuestions) {
    Request r(m, make_press_impl(spec, ratio), options(c, n));
    r.set_prompt(kDoc, q);
    r.prefill();
    Trace t{r.logits()};
    while (!r.finished()) {
      r.step();
      t.push_back(r.logits());
    }
    ref.push_back(t);
  }
  ContextOptions co;
  co.press = spec;
  co.ratio = ratio;
  co.session = options(c, 0).session;
  const Context ctx = Context::build(m, std::string(kDoc), co);
  std::vector<std::unique_ptr<Request>> forks;
  std::vector<Trace> got;
  for (const char* q : kQuestions) {
    forks.push_back(ctx.request(m, tok.encode(q, false, false), options(c, n)));
    forks.back()->prefill();
    got.push_back({forks.back()->logits()});
    EXPECT_EQ(forks.back()->cache().shared_kv_bytes() > 0, expect_sharing);
  }
  for (int s = 0; s <= n; ++s) {
    std::vector<Request*> live;
    for (auto& f : forks)
      if (!f->finished()) live.push_back(f.get());
    if (live.empty()) break;
    for (const std::exception_ptr& e : step_batch(live)) EXPECT_FALSE(e);
    for (size_t i = 0; i < forks.size(); ++i)
      if (std::find(live.begin(), live.end(), forks[i].get()) != live.end()) got[i].push_back(forks[i]->logits());
  }
  for (size_t i = 0; i < forks.size(); ++i) {
    ASSERT_EQ(got[i].size(), ref[i].size()) << kQuestions[i];
    for (size_t t = 0; t < ref[i].size(); ++t) EXPECT_TRUE(same_floats(got[i][t], ref[i][t])) << kQuestions[i] << " step " << t;
  }
}

}  // namespace

TEST(SharedContext, ForksOfEveryCodecMatchTheUncachedRunBitForBit) {
  std::vector<Layout> cs = {{"f32", KVCodec::F32, KVCodec::F32}, {"f16"}, {"q8_0", KVCodec::Q8_0, KVCodec::Q8_0},
                            {"q4_0", KVCodec::Q4_0, KVCodec::Q4_0}};
  for (int bits : {2, 4}) {
    Layout k{"kivi" + std::to_string(bits)};
    k.q.kivi_bits = bits;
    k.q.kivi_group = 8;
    k.q.kivi_residual = 8;
    cs.push_back(k);
  }
  Layout had{"q8_0 + hadamard", KVCodec::Q8_0, KVCodec::Q8_0};
  had.q.hadamard = true;
  cs.push_back(had);
  for (const Layout& c : cs) expect_forks_match("snapkv:window=4", 0.5, c);
}

TEST(SharedContext, ForksOfEachPressFamilyMatchTheUncachedRunBitForBit) {
  const Layout f16{"f16"};
  Layout q8{"q8_0", KVCodec::Q8_0, KVCodec::Q8_0};
  Layout kivi{"kivi4"};
  kivi.q.kivi_bits = 4;
  kivi.q.kivi_group = 8;
  kivi.q.kivi_residual = 8;
  expect_forks_match("none", 0.0, f16);
  expect_forks_match("adakv(snapkv:window=4)", 0.5, kivi);        // budget policy over KIVI groups
  expect_forks_match("kvzip", 0.5, f16);                          // context reconstruction (replay)
  expect_forks_match("snapkv:window=4+knorm", 0.4, q8);           // a composition over a quantized cache
  expect_forks_match("leankv(snapkv:window=4)", 0.3, f16);        // precision tiers (two stores)
  expect_forks_match("cla:layers=1/3", 0.0, f16);                 // cross-layer sharing
  expect_forks_match("key_rerotation(streaming_llm)", 0.5, f16);  // positions moved
  // Latent codes are copied, not shared (Segment::share leaves latent segments as they are).
  expect_forks_match("latent:k_rank=4,v_rank=4,k_bits=4,v_bits=8", 0.0, f16, false);
}

TEST(SharedContext, DecodeEvictionInOneRequestLeavesTheOthersAndTheContextAlone) {
  const Model& m = bundled_model();
  const Tokenizer& tok = m.tokenizer();
  for (const Layout& c : {Layout{"f16"}, [] {
         Layout k{"kivi2"};
         k.q.kivi_bits = 2;
         k.q.kivi_group = 8;
         k.q.kivi_residual = 8;
         return k;
       }()}) {
    SCOPED_TRACE(c.name);
    ContextOptions co;
    co.press = "snapkv:window=4";
    co.ratio = 0.3;
    co.session = options(c, 0).session;
    const Context ctx = Context::build(m, std::string(kDoc), co);
    const std::string image = ctx.image();
    const std::vector<Token> qa = tok.encode(kQuestions[0], false, false), qb = tok.encode(kQuestions[1], false, false);
    const int n = 10;
    auto b_trace = [&](Request* a) {
      std::unique_ptr<Request> b = ctx.request(m, qb, options(c, n));
      b->prefill();
      if (a) a->prefill();
      Trace t{b->logits()};
      for (int s = 0; s < n && !b->finished(); ++s) {
        if (a && !a->finished()) a->step();  // A evicts from its cache every 2 steps
        if (!b->step()) break;
        t.push_back(b->logits());
      }
      return t;
    };
    const Trace alone = b_trace(nullptr);
    // A: the same stored context with a press that evicts during decode (set_prompt_cached is what
    // Context::request calls, with a press of its own here).
    std::unique_ptr<Request> probe = ctx.request(m, {}, options(c, 0));
    auto a_request = [&](KVCache cache) {
      auto a = std::make_unique<Request>(m, make_press_impl("decoding(knorm):interval=2,size=24", 0.0), options(c, n));
      a->set_prompt_cached(ctx.tokens(), std::move(cache), probe->position(), probe->logits(), probe->stats(), qa);
      return a;
    };
    std::unique_ptr<Request> a = a_request(ctx.cache());
    const Trace beside = b_trace(a.get());
    ASSERT_EQ(alone.size(), beside.size());
    for (size_t t = 0; t < alone.size(); ++t) EXPECT_TRUE(same_floats(alone[t], beside[t])) << "step " << t;
    EXPECT_LT(a->cache().entries(), ctx.cache().entries()) << "the press did not evict";
    EXPECT_EQ(a->cache().shared_kv_bytes(), 0u) << "evicted segments must own their entries";
    EXPECT_EQ(ctx.image(), image) << "the stored context changed";
    // A's own answers are those of the same press over a private copy of the context.
    KVCache own = ctx.cache();
    for (int l = 0; l < own.n_layer(); ++l)
      for (int h = 0; h < own.n_head_kv(); ++h) own.seg(l, h).unshare();
    EXPECT_EQ(own.shared_kv_bytes(), 0u);
    std::unique_ptr<Request> a_ref = a_request(own), a2 = a_request(ctx.cache());
    a_ref->run();
    a2->run();
    EXPECT_EQ(a2->generated(), a_ref->generated());
    EXPECT_TRUE(same_floats(a2->logits(), a_ref->logits()));
    EXPECT_TRUE(same_cache(a2->cache(), a_ref->cache()));
  }
}

TEST(SharedContext, FourRequestsHoldTheContextOnce) {
  const Model& m = bundled_model();
  const Tokenizer& tok = m.tokenizer();
  ContextOptions co;
  const size_t n = 400;
  const Context ctx = Context::build(m, press_test::story_tokens(n), co);
  const KVCache& cc = ctx.cache();
  ASSERT_EQ(cc.seg(0, 0).size(), ctx.tokens().size());
  const size_t n_ctx = ctx.tokens().size();
  std::vector<std::unique_ptr<Request>> forks;
  size_t own = 0;
  for (int i = 0; i < 4; ++i) {
    forks.push_back(ctx.request(m, tok.encode(kQuestions[i % 3], false, false), options(Layout{"f16"}, 4)));
    forks.back()->run();
    const KVCache& c = forks.back()->cache();
    own += c.allocated_bytes() - c.shared_allocated_bytes();
  }
  // Per segment a fork holds, bounded by hand: its positions (n_ctx context entries and at most 14
  // more, the capacity grown by an eighth plus 16 at most once: 4 * ((n_ctx + 14) * 9 / 8 + 16)
  // bytes), its tail (at most 15 context entries plus 14, f16 keys in 16-entry tiles of 8 channels:
  // 2 tiles of 256 bytes, values 16 bytes a row, buffers grown by at most 1.5x, 64 bytes of slack:
  // under 2 KiB) and its objects (Segment, KVStore, part pointers: under 2 KiB).
  const size_t segs = static_cast<size_t>(cc.n_layer()) * cc.n_head_kv();
  const size_t per_seg = 4 * ((n_ctx + 14) * 9 / 8 + 16) + 2048 + 2048;
  EXPECT_LE(own, 4 * segs * per_seg);
  // Four copies would hold at least four times the context's entries; the forks hold under half of it.
  EXPECT_LT(own, 2 * cc.kv_bytes()) << "forks hold copies of the context";
  EXPECT_GT(cc.shared_allocated_bytes(), cc.allocated_bytes() / 2);
}

// ---- The server's engine: a stored context's shared parts count once against the KV budget ----

namespace {

/// The most requests the engine ran at once while answering `n` requests from `ctx` (60 tokens
/// each) within `budget` bytes.
int most_at_once(const Context& ctx, size_t budget, int n, size_t* reservation) {
  server::EngineOptions eo;
  eo.parallel = n;
  eo.kv_budget = budget;
  eo.session.n_ctx = 512;
  server::Engine engine(bundled_model(), eo);
  std::vector<std::shared_ptr<server::Job>> jobs;
  for (int i = 0; i < n; ++i) {
    auto j = std::make_shared<server::Job>();
    j->context = ctx.tokens();
    j->question = bundled_model().tokenizer().encode(kQuestions[i % 3], false, false);
    j->max_tokens = 60;
    j->sampling.temp = 0;
    j->session = eo.session;
    j->cached = ctx;
    j->reservation = engine.estimate(*j);
    *reservation = j->reservation;
    jobs.push_back(j);
  }
  for (auto& j : jobs) engine.submit(j);
  int most = 0;
  for (;;) {
    most = std::max(most, engine.metrics().active);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    bool all = true;
    for (auto& j : jobs) {
      std::lock_guard<std::mutex> lk(j->mu);
      all = all && j->done;
    }
    if (all) break;
  }
  for (auto& j : jobs) EXPECT_FALSE(j->error) << (j->error ? j->error->what() : "");
  return most;
}

}  // namespace

TEST(SharedContext, TheKvBudgetCountsSharedEntriesOnce) {
  const Context ctx = Context::build(bundled_model(), press_test::story_tokens(250), ContextOptions{});
  const size_t shared = ctx.cache().shared_allocated_bytes();
  size_t res = 0;
  // Without a budget, to learn a request's reservation (its tail and room for 60 tokens).
  most_at_once(ctx, 0, 1, &res);
  ASSERT_GT(res, 0u);
  ASSERT_LT(res, shared) << "a request reserves its own part, not the context";
  // Room for the context once and four reservations (20% spare): all four run together. Counted
  // once per request, the context would leave room for two.
  EXPECT_EQ(most_at_once(ctx, shared + 4 * res * 6 / 5, 4, &res), 4);
  // Room for the context once and two and a half reservations: at most two at once. Not counted
  // at all, the context would let all four run.
  EXPECT_LE(most_at_once(ctx, shared + res * 5 / 2, 4, &res), 2);
}
