// The server's stored-context cache (src/server/context_cache.h) without HTTP: memory tier limits and
// least-recently-used order, prefix lookup at stored boundaries, single flight across threads, and a
// shared tier that fails, is slow, or returns entries that must not be used. The tier here is a
// stand-in (a map behind a mutex) so each fault is exact; the real tiers have their own tests
// (test_context_tier.cpp) and the HTTP tests run them end to end (tests/server/test_contexts.py).
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <thread>

#include "kvslim/context.h"
#include "kvslim/error.h"
#include "kvslim/model.h"
#include "context/file.h"
#include "server/context_cache.h"

using namespace kvslim;
using namespace kvslim::server;

namespace {

const Model& stories() {
  static std::unique_ptr<Model> m = Model::load(std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf");
  return *m;
}

std::vector<Token> tokens(int n, int salt) {
  std::vector<Token> t = {1};
  for (int i = 1; i < n; ++i) t.push_back(static_cast<Token>(3 + (i * 7 + salt * 13) % 500));
  return t;
}

Context build(const std::vector<Token>& t) {
  ContextOptions o;
  o.press = "knorm";
  o.ratio = 0.5;
  return Context::build(stories(), t, o);
}

/// A shared tier in memory whose faults the test switches on.
class FakeTier : public ContextTier {
 public:
  std::mutex mu;
  std::map<std::string, std::string> entries;
  std::map<std::string, bool> locks;
  std::vector<std::string> log;  // "put KEY", "unlock KEY", in call order
  std::atomic<bool> down{false};
  std::atomic<int> gets{0};

  const char* name() const override { return "fake"; }
  std::optional<std::string> get(const std::string& key) override {
    ++gets;
    fail();
    std::lock_guard<std::mutex> lk(mu);
    auto it = entries.find(key);
    if (it == entries.end()) return std::nullopt;
    return it->second;
  }
  void put(const std::string& key, const std::string& image) override {
    fail();
    std::lock_guard<std::mutex> lk(mu);
    entries[key] = image;
    log.push_back("put " + key);
  }
  void erase(const std::string& key) override {
    fail();
    std::lock_guard<std::mutex> lk(mu);
    entries.erase(key);
  }
  std::vector<int> lengths(const std::string& spec) override {
    fail();
    std::lock_guard<std::mutex> lk(mu);
    std::vector<int> out;
    for (const auto& [k, v] : entries)
      if (k.rfind(spec + "-", 0) == 0) out.push_back(std::stoi(k.substr(spec.size() + 1)));
    return out;
  }
  bool try_lock(const std::string& key, double) override {
    fail();
    std::lock_guard<std::mutex> lk(mu);
    if (locks[key]) return false;
    locks[key] = true;
    return true;
  }
  void unlock(const std::string& key) override {
    std::lock_guard<std::mutex> lk(mu);
    locks[key] = false;
    log.push_back("unlock " + key);
  }

 private:
  void fail() const {
    if (down) throw Error("fake tier: connection refused");
  }
};

/// Waits until the writer thread has done `n` puts (bounded).
void wait_puts(FakeTier& t, size_t n) {
  for (int i = 0; i < 500; ++i) {
    {
      std::lock_guard<std::mutex> lk(t.mu);
      size_t puts = 0;
      for (const auto& l : t.log) puts += l.rfind("put ", 0) == 0;
      if (puts >= n) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  FAIL() << "the writer did not store " << n << " entries";
}

ContextTierMetrics tier(const ContextCacheMetrics& m, const std::string& name) {
  for (const auto& t : m.tiers)
    if (t.tier == name) return t;
  ADD_FAILURE() << "no tier " << name;
  return {};
}

}  // namespace

TEST(ContextCache, KeysNameSpecCountAndTokens) {
  ContextCache cc(stories(), {});
  const std::string spec = cc.spec("knorm:ratio=0.5", "k=f16 v=f16", 256);
  EXPECT_EQ(spec.size(), 16u);
  EXPECT_NE(spec, cc.spec("knorm:ratio=0.25", "k=f16 v=f16", 256));
  EXPECT_NE(spec, cc.spec("knorm:ratio=0.5", "k=q8_0 v=f16", 256));
  EXPECT_NE(spec, cc.spec("knorm:ratio=0.5", "k=f16 v=f16", 128));
  const auto t = tokens(40, 1);
  const std::string k = ContextCache::key(spec, t, 30);
  EXPECT_EQ(k.substr(0, 20), spec + "-30-");
  EXPECT_EQ(k, ContextCache::key(spec, tokens(30, 1), 30));  // only the first n count
  EXPECT_NE(k, ContextCache::key(spec, tokens(30, 2), 30));
}

TEST(ContextCache, LongestStoredPrefixAtItsBoundary) {
  ContextCache cc(stories(), {});
  const std::string spec = cc.spec("knorm:ratio=0.5", "k=f16 v=f16", 0);
  const auto doc = tokens(48, 3);
  const std::vector<Token> head(doc.begin(), doc.begin() + 24);
  cc.put(ContextCache::key(spec, head, head.size()), build(head));
  cc.put(ContextCache::key(spec, doc, 40), build(std::vector<Token>(doc.begin(), doc.begin() + 40)));
  auto f = cc.find_prefix(spec, doc, doc.size());
  ASSERT_TRUE(f);
  EXPECT_EQ(f->context.tokens().size(), 40u);
  // Bounded by max_n, and never a context the prompt does not begin with.
  f = cc.find_prefix(spec, doc, 39);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->context.tokens().size(), 24u);
  auto other = doc;
  other[10] += 1;
  EXPECT_FALSE(cc.find_prefix(spec, other, other.size()));
  EXPECT_FALSE(cc.find_prefix(cc.spec("knorm:ratio=0.25", "k=f16 v=f16", 0), doc, doc.size()));
  const ContextCacheMetrics m = cc.metrics();
  EXPECT_EQ(tier(m, "memory").hits, 2u);
  EXPECT_EQ(tier(m, "memory").misses, 2u);
}

TEST(ContextCache, MemoryLimitDropsTheLeastRecentlyUsed) {
  const Context a = build(tokens(30, 1)), b = build(tokens(30, 2)), c = build(tokens(30, 3));
  ContextCache sizer(stories(), {});
  sizer.put("0000000000000000-30-a", a);
  const size_t one = sizer.memory_bytes();
  ASSERT_GT(one, 0u);
  ContextCache::Options lim;
  lim.memory_bytes = 2 * one + one / 2;  // two fit, not three
  ContextCache cc(stories(), std::move(lim));
  cc.put("0000000000000000-30-a", a);
  cc.put("0000000000000000-30-b", b);
  ASSERT_TRUE(cc.find("0000000000000000-30-a"));  // a is now the most recently used
  cc.put("0000000000000000-30-c", c);
  EXPECT_TRUE(cc.find("0000000000000000-30-a"));
  EXPECT_FALSE(cc.find("0000000000000000-30-b"));
  EXPECT_TRUE(cc.find("0000000000000000-30-c"));
  EXPECT_LE(cc.memory_bytes(), 2 * one + one / 2);
  EXPECT_EQ(cc.metrics().evictions, 1u);
  // Giving way to a request: shrink_to frees the oldest first.
  EXPECT_EQ(cc.shrink_to(one), one);
  EXPECT_TRUE(cc.find("0000000000000000-30-c"));
  EXPECT_FALSE(cc.find("0000000000000000-30-a"));
  // An entry larger than the whole limit is not kept in memory.
  ContextCache::Options tiny;
  tiny.memory_bytes = one / 2;
  ContextCache none(stories(), std::move(tiny));
  none.put("0000000000000000-30-a", a);
  EXPECT_EQ(none.memory_bytes(), 0u);
}

TEST(ContextCache, EntriesSharedByTwoContextsCountOnce) {
  // A conversation's next turn is stored from a request that read the first turn's entries in
  // place: the two contexts share those parts, and the memory tier counts them once.
  const Context a = build(tokens(60, 1));
  RequestOptions ro;
  ro.n_predict = 3;
  ro.sampling.temp = 0;
  std::unique_ptr<Request> r = a.request(stories(), {5, 6, 7}, ro);
  r->run();
  const Context t = context::from_request(stories(), *r, "knorm", "", 0, true);
  std::vector<SharedEntries> pa, pt;
  a.cache().shared_parts(pa);
  t.cache().shared_parts(pt);
  size_t common = 0, all_a = 0;
  for (const SharedEntries& p : pa) {
    all_a += p.allocated_bytes;
    for (const SharedEntries& q : pt)
      if (q.id == p.id) common += p.allocated_bytes;
  }
  ASSERT_GT(common, 0u);
  EXPECT_EQ(common, all_a) << "the next turn reads every shared part of the first";
  ContextCache cc(stories(), {});
  cc.put("0000000000000000-60-a", a);
  cc.put("0000000000000000-63-t", t);
  EXPECT_EQ(cc.memory_bytes(), a.info().held_bytes + t.info().held_bytes - common);
  // Parts that running requests read count once, held or not.
  EXPECT_EQ(cc.footprint(pa), cc.memory_bytes());
  EXPECT_TRUE(cc.erase("0000000000000000-60-a"));
  EXPECT_EQ(cc.memory_bytes(), t.info().held_bytes);
  ContextCache empty(stories(), {});
  EXPECT_EQ(empty.footprint(pa), all_a);
  std::vector<SharedEntries> twice = pa;
  twice.insert(twice.end(), pa.begin(), pa.end());
  EXPECT_EQ(empty.footprint(twice), all_a);
  // Evicting a context whose parts requests read frees only what they do not read.
  EXPECT_EQ(cc.shrink_to(all_a, pa), t.info().held_bytes);
  EXPECT_EQ(cc.memory_bytes(), 0u);
}

TEST(ContextCache, SingleFlightBuildsOnceAcrossThreads) {
  ContextCache cc(stories(), {});
  const auto t = tokens(32, 5);
  const std::string id = ContextCache::key(cc.spec("knorm:ratio=0.5", "k=f16 v=f16", 0), t, t.size());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  ContextCache::Flight lead = cc.join(id, deadline);
  ASSERT_TRUE(lead.leader);
  std::atomic<int> got{0}, leaders{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 4; ++i)
    waiters.emplace_back([&] {
      ContextCache::Flight f = cc.join(id, deadline);
      leaders += f.leader;
      if (f.found && f.found->context.tokens() == t) ++got;
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const Context c = build(t);
  cc.put(id, c);
  cc.complete(id, c);
  for (auto& w : waiters) w.join();
  EXPECT_EQ(leaders, 0);
  EXPECT_EQ(got, 4);
  // A failed build lets the waiters go without a context (they compute uncached), and the next
  // caller leads again.
  const std::string id2 = ContextCache::key(cc.spec("knorm:ratio=0.5", "k=f16 v=f16", 0), tokens(32, 6), 32);
  ASSERT_TRUE(cc.join(id2, deadline).leader);
  std::thread w([&] {
    ContextCache::Flight f = cc.join(id2, deadline);
    EXPECT_FALSE(f.leader);
    EXPECT_FALSE(f.found);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  cc.complete(id2, std::nullopt);
  w.join();
  EXPECT_TRUE(cc.join(id2, deadline).leader);
  cc.complete(id2, std::nullopt);
  // A waiter's deadline bounds its wait.
  const std::string id3 = ContextCache::key(cc.spec("knorm:ratio=0.5", "k=f16 v=f16", 0), tokens(32, 7), 32);
  ASSERT_TRUE(cc.join(id3, deadline).leader);
  const auto t0 = std::chrono::steady_clock::now();
  ContextCache::Flight late = cc.join(id3, t0 + std::chrono::milliseconds(100));
  EXPECT_FALSE(late.leader || late.found);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  cc.complete(id3, std::nullopt);
}

TEST(ContextCache, SharedTierStoresInOrderAndAnotherProcessReadsIt) {
  auto fake = std::make_unique<FakeTier>();
  FakeTier& t = *fake;
  ContextCache::Options o;
  o.tiers.push_back(std::move(fake));
  ContextCache a(stories(), std::move(o));
  const auto toks = tokens(36, 8);
  const std::string spec = a.spec("knorm:ratio=0.5", "k=f16 v=f16", 0);
  const std::string id = ContextCache::key(spec, toks, toks.size());
  ASSERT_TRUE(a.join(id, std::chrono::steady_clock::now() + std::chrono::seconds(30)).leader);
  const Context c = build(toks);
  a.put(id, c);
  a.complete(id, c);
  wait_puts(t, 1);
  for (int i = 0; i < 500; ++i) {
    {
      std::lock_guard<std::mutex> lk(t.mu);
      if (t.log.size() >= 2) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  {
    std::lock_guard<std::mutex> lk(t.mu);
    // The lock is released only after the entry is written: a replica polling for it finds it.
    ASSERT_EQ(t.log, (std::vector<std::string>{"put " + id, "unlock " + id}));
  }
  // A second process (here a second cache over a tier holding the same entries) finds it by prefix.
  auto shared = std::make_unique<FakeTier>();
  shared->entries = t.entries;
  ContextCache::Options ob;
  ob.tiers.push_back(std::move(shared));
  ContextCache b(stories(), std::move(ob));
  auto prompt = toks;
  prompt.push_back(42);
  auto f = b.find_prefix(spec, prompt, prompt.size());
  ASSERT_TRUE(f);
  EXPECT_EQ(f->tier, "fake");
  EXPECT_EQ(f->context.tokens(), toks);
  EXPECT_EQ(f->context.info().kv_bytes, c.info().kv_bytes);
  EXPECT_EQ(tier(b.metrics(), "fake").hits, 1u);
  // Now in b's memory: the next lookup does not read the tier.
  EXPECT_EQ(b.find_prefix(spec, prompt, prompt.size())->tier, "memory");
}

TEST(ContextCache, BadOrUnreachableTierEntriesAreMissesNotErrors) {
  auto fake = std::make_unique<FakeTier>();
  FakeTier& t = *fake;
  ContextCache::Options o;
  o.tiers.push_back(std::move(fake));
  o.lock_ttl_s = 0.2;
  ContextCache cc(stories(), std::move(o));
  const auto toks = tokens(28, 9);
  const std::string spec = cc.spec("knorm:ratio=0.5", "k=f16 v=f16", 0);
  const std::string id = ContextCache::key(spec, toks, toks.size());
  const std::string image = build(toks).image();
  {
    std::lock_guard<std::mutex> lk(t.mu);
    // A torn entry (checksum), and an entry under a key that names other tokens.
    t.entries[id] = image.substr(0, image.size() - 3);
    t.entries[ContextCache::key(spec, tokens(28, 10), 28)] = image;
  }
  EXPECT_FALSE(cc.find(id));
  EXPECT_FALSE(cc.find_prefix(spec, tokens(28, 10), 28));
  EXPECT_EQ(tier(cc.metrics(), "fake").errors, 2u);
  // Down: lookups miss, stores are dropped, and join still leads (computes uncached) without waiting.
  t.down = true;
  EXPECT_FALSE(cc.find_prefix(spec, toks, toks.size()));
  const auto t0 = std::chrono::steady_clock::now();
  ContextCache::Flight f = cc.join(ContextCache::key(spec, tokens(28, 11), 28), t0 + std::chrono::seconds(30));
  EXPECT_TRUE(f.leader);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  cc.complete(ContextCache::key(spec, tokens(28, 11), 28), std::nullopt);
  cc.put(id, build(toks));  // kept in memory, the tier's write fails on the writer thread
  EXPECT_TRUE(cc.find(id));
  EXPECT_GE(tier(cc.metrics(), "fake").errors, 4u);
  // Held by another replica that never stores: this one waits for the lock's time, then leads.
  t.down = false;
  const std::string held = ContextCache::key(spec, tokens(28, 12), 28);
  {
    std::lock_guard<std::mutex> lk(t.mu);
    t.locks[held] = true;
  }
  const auto t1 = std::chrono::steady_clock::now();
  ContextCache::Flight w = cc.join(held, t1 + std::chrono::seconds(30));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  EXPECT_TRUE(w.leader);
  EXPECT_GE(waited, 0.15);
  EXPECT_LT(waited, 3.0);
  cc.complete(held, std::nullopt);
}
