#include "server/context_cache.h"
#include "tools/tools.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>


namespace kvslim::server {

namespace {

using SteadyClock = std::chrono::steady_clock;

/// Bytes a context holds in memory (its allocations, not only its entries: small contexts cost
/// several times their entries in tiles, tables and allocator overhead).
size_t held_bytes(const Context& c) { return c.info().held_bytes; }

bool is_prefix(const std::vector<Token>& stored, const std::vector<Token>& tokens) {
  return stored.size() <= tokens.size() && std::equal(stored.begin(), stored.end(), tokens.begin());
}

}  // namespace

ContextCache::ContextCache(const Model& model, Options opt)
    : model_(model), opt_(std::move(opt)), fingerprint_(Context::fingerprint(model)) {
  m_.tiers.push_back({"memory"});
  for (const auto& t : opt_.tiers) m_.tiers.push_back({t->name()});
  writer_ = std::thread([this] { writer(); });
}

ContextCache::~ContextCache() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  writer_cv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

std::string ContextCache::spec(const std::string& press, const std::string& cache_type, int chunk_size) const {
  Hash64 h(fingerprint_);
  for (const std::string* s : {&press, &cache_type}) {
    const uint64_t n = s->size();
    h.update(&n, sizeof(n));
    h.update(s->data(), s->size());
  }
  const int32_t c = chunk_size;
  h.update(&c, sizeof(c));
  return fmt::format("{:016x}", h.digest());
}

std::string ContextCache::key(const std::string& spec, const std::vector<Token>& tokens, size_t n) {
  return fmt::format("{}-{}-{:016x}", spec, n, hash64(tokens.data(), std::min(n, tokens.size()) * sizeof(Token)));
}

void ContextCache::tier_error(size_t t, const std::string& what) {
  // One line per failure would flood the log while a store is down: at most one per tier per 10 s.
  static std::mutex log_mu;
  static std::map<size_t, SteadyClock::time_point> last;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++m_.tiers[t + 1].errors;
  }
  std::lock_guard<std::mutex> lk(log_mu);
  const auto now = SteadyClock::now();
  auto it = last.find(t);
  if (it != last.end() && now - it->second < std::chrono::seconds(10)) return;
  last[t] = now;
  fmt::print(stderr, "kvslim serve: context store {}: {} (going on as if uncached)\n", opt_.tiers[t]->name(), what);
}

ContextCache::Read ContextCache::read_entry(size_t t, const std::string& id, const std::vector<Token>* tokens,
                                            size_t n) {
  Read r;
  std::optional<std::string> image;
  try {
    image = opt_.tiers[t]->get(id);
  } catch (const std::exception& e) {
    tier_error(t, e.what());
    r.status = Read::Failed;
    return r;
  }
  if (!image) return r;
  std::optional<Context> c;
  try {
    c = Context::from_image(model_, image->data(), image->size(), fmt::format("{} entry {}", opt_.tiers[t]->name(), id));
  } catch (const std::exception& e) {
    tier_error(t, fmt::format("entry refused: {}", e.what()));
    r.status = Read::Refused;
    return r;
  }
  // The key names a digest of the tokens; a colliding or tampered entry must not answer.
  const std::vector<Token>& got = c->tokens();
  if (!(tokens ? (got.size() == n && is_prefix(got, *tokens)) : key_matches(id, got))) {
    tier_error(t, fmt::format("entry {} holds other tokens than its key names", id));
    r.status = Read::Refused;
    return r;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++m_.tiers[t + 1].hits;
    insert_locked(id, *c, id.substr(0, id.find('-')), got.size());
  }
  r.status = Read::Hit;
  r.found = Found{id, *c, opt_.tiers[t]->name()};
  return r;
}

std::optional<ContextCache::Found> ContextCache::from_tiers(const std::string& id, const std::vector<Token>* tokens,
                                                            size_t n, bool count_miss) {
  for (size_t t = 0; t < opt_.tiers.size(); ++t) {
    Read r = read_entry(t, id, tokens, n);
    if (r.status == Read::Hit) return r.found;
    if (r.status == Read::Absent && count_miss) {
      std::lock_guard<std::mutex> lk(mu_);
      ++m_.tiers[t + 1].misses;
    }
  }
  return std::nullopt;
}

bool ContextCache::key_matches(const std::string& id, const std::vector<Token>& tokens) {
  const size_t dash = id.find('-');
  return dash != std::string::npos && key(id.substr(0, dash), tokens, tokens.size()) == id;
}

std::optional<ContextCache::Found> ContextCache::find_prefix(const std::string& spec, const std::vector<Token>& tokens,
                                                             size_t max_n) {
  max_n = std::min(max_n, tokens.size());
  std::optional<Found> best;
  size_t best_n = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    std::list<Entry>::iterator hit = lru_.end();
    for (auto it = lru_.begin(); it != lru_.end(); ++it)
      if (it->spec == spec && it->n <= max_n && it->n > best_n && is_prefix(it->context.tokens(), tokens)) {
        hit = it;
        best_n = it->n;
      }
    if (hit != lru_.end()) {
      lru_.splice(lru_.begin(), lru_, hit);
      best = Found{hit->id, hit->context, "memory"};
    }
  }
  // A longer prefix may be in a shared tier (stored by another replica).
  if (best_n < max_n) {
    for (size_t t = 0; t < opt_.tiers.size(); ++t) {
      std::vector<int> lens;
      try {
        lens = opt_.tiers[t]->lengths(spec);
      } catch (const std::exception& e) {
        tier_error(t, e.what());
        continue;
      }
      std::sort(lens.rbegin(), lens.rend());
      lens.erase(std::unique(lens.begin(), lens.end()), lens.end());  // each candidate read once
      bool found = false;
      for (int n : lens) {
        if (n <= 0 || static_cast<size_t>(n) <= best_n || static_cast<size_t>(n) > max_n) continue;
        Read r = read_entry(t, key(spec, tokens, static_cast<size_t>(n)), &tokens, static_cast<size_t>(n));
        if (r.status == Read::Failed) break;  // the tier is down: its other entries are too
        if (r.status != Read::Hit) continue;
        best = r.found;
        best_n = static_cast<size_t>(n);
        found = true;
        break;
      }
      std::lock_guard<std::mutex> lk(mu_);
      if (found) break;
      ++m_.tiers[t + 1].misses;
    }
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (best && best->tier == "memory") ++m_.tiers[0].hits;
  if (!best || best->tier != "memory") ++m_.tiers[0].misses;
  return best;
}

std::optional<ContextCache::Found> ContextCache::find(const std::string& id) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_id_.find(id);
    if (it != by_id_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++m_.tiers[0].hits;
      return Found{id, it->second->context, "memory"};
    }
    ++m_.tiers[0].misses;
  }
  return from_tiers(id, nullptr, 0, true);
}

void ContextCache::insert_locked(const std::string& id, const Context& context, const std::string& spec, size_t n) {
  auto it = by_id_.find(id);
  if (it != by_id_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return;
  }
  const size_t bytes = held_bytes(context);
  if (bytes > opt_.memory_bytes) return;
  Entry e{id, spec, context, bytes, bytes, {}, n};
  context.cache().shared_parts(e.parts);
  for (const SharedEntries& p : e.parts) e.own_bytes -= std::min(e.own_bytes, p.allocated_bytes);
  bytes_ += e.own_bytes;
  for (const SharedEntries& p : e.parts) {
    auto& [refs, b] = parts_[p.id];
    if (refs++ == 0) {
      b = p.allocated_bytes;
      bytes_ += b;
    }
  }
  lru_.push_front(std::move(e));
  by_id_[id] = lru_.begin();
  evict_locked(opt_.memory_bytes);
  m_.tiers[0].bytes = bytes_;
  m_.entries = lru_.size();
}

void ContextCache::drop_locked(std::list<Entry>::iterator it) {
  bytes_ -= it->own_bytes;
  for (const SharedEntries& p : it->parts) {
    auto at = parts_.find(p.id);
    if (--at->second.first == 0) {
      bytes_ -= at->second.second;
      parts_.erase(at);
    }
  }
  by_id_.erase(it->id);
  lru_.erase(it);
  m_.tiers[0].bytes = bytes_;
  m_.entries = lru_.size();
}

size_t ContextCache::footprint_locked(const std::vector<SharedEntries>& in_use) const {
  size_t n = bytes_;
  std::vector<const void*> seen;
  for (const SharedEntries& p : in_use) {
    if (parts_.count(p.id) || std::find(seen.begin(), seen.end(), p.id) != seen.end()) continue;
    seen.push_back(p.id);
    n += p.allocated_bytes;
  }
  return n;
}

void ContextCache::evict_locked(size_t limit, const std::vector<SharedEntries>& in_use) {
  // Requests answering from a context hold the shared parts of its cache they read (shared
  // pointers), so dropping the entry here never takes anything from under a running request.
  while (!lru_.empty() && footprint_locked(in_use) > limit) {
    drop_locked(std::prev(lru_.end()));
    ++m_.evictions;
  }
  m_.tiers[0].bytes = bytes_;
  m_.entries = lru_.size();
}

void ContextCache::put(const std::string& id, const Context& context) {
  std::lock_guard<std::mutex> lk(mu_);
  ++m_.builds;
  insert_locked(id, context, id.substr(0, id.find('-')), context.tokens().size());
  if (!opt_.tiers.empty()) {
    writes_.push_back(Write{Write::Put, id, context});
    writer_cv_.notify_all();
  }
}

bool ContextCache::erase(const std::string& id) {
  bool had = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_id_.find(id);
    if (it != by_id_.end()) {
      drop_locked(it->second);
      had = true;
    }
  }
  for (size_t t = 0; t < opt_.tiers.size(); ++t) {
    try {
      if (!had && opt_.tiers[t]->get(id)) had = true;
      opt_.tiers[t]->erase(id);
    } catch (const std::exception& e) {
      tier_error(t, e.what());
    }
  }
  return had;
}

size_t ContextCache::shrink_to(size_t bytes, const std::vector<SharedEntries>& in_use) {
  std::lock_guard<std::mutex> lk(mu_);
  const size_t before = bytes_;
  evict_locked(bytes, in_use);
  return before - bytes_;
}

size_t ContextCache::memory_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return bytes_;
}

size_t ContextCache::footprint(const std::vector<SharedEntries>& in_use) const {
  std::lock_guard<std::mutex> lk(mu_);
  return footprint_locked(in_use);
}

std::vector<std::pair<std::string, ContextInfo>> ContextCache::list() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<std::pair<std::string, ContextInfo>> out;
  for (const Entry& e : lru_) out.emplace_back(e.id, e.context.info());
  return out;
}

ContextCache::Flight ContextCache::join(const std::string& id, SteadyClock::time_point deadline) {
  std::shared_ptr<Pending> p;
  {
    std::unique_lock<std::mutex> lk(mu_);
    auto it = flights_.find(id);
    if (it == flights_.end()) {
      // Stored while this caller was looking elsewhere: no build needed.
      auto e = by_id_.find(id);
      if (e != by_id_.end()) return Flight{false, Found{id, e->second->context, "memory"}};
      flights_[id] = std::make_shared<Pending>();
    } else {
      p = it->second;
      ++m_.flight_waits;
      p->cv.wait_until(lk, deadline, [&] { return p->done; });
      if (p->done && p->context) return Flight{false, Found{id, *p->context, "memory"}};
      return Flight{false, std::nullopt};
    }
  }
  // This process leads; across replicas the shared tiers decide.
  for (size_t t = 0; t < opt_.tiers.size(); ++t) {
    bool taken = false;
    try {
      taken = opt_.tiers[t]->try_lock(id, opt_.lock_ttl_s);
    } catch (const std::exception& e) {
      tier_error(t, e.what());
      continue;
    }
    if (taken) {
      std::lock_guard<std::mutex> lk(mu_);
      locked_[id] = t;
      return Flight{true, std::nullopt};
    }
    // Another replica builds it: wait for its entry, then take it.
    const auto until = std::min(deadline, SteadyClock::now() + std::chrono::milliseconds(
                                                                    static_cast<int64_t>(opt_.lock_ttl_s * 1000)));
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++m_.flight_waits;
    }
    while (SteadyClock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::optional<Found> f = from_tiers(id, nullptr, 0, false);
      if (f) {
        complete(id, f->context);
        return Flight{false, f};
      }
      bool still_locked = true;
      try {
        still_locked = !opt_.tiers[t]->try_lock(id, opt_.lock_ttl_s);
      } catch (const std::exception& e) {
        tier_error(t, e.what());
        break;
      }
      if (!still_locked) {
        // Released: the entry may have been written between the look above and the release.
        std::optional<Found> late = from_tiers(id, nullptr, 0, false);
        if (late) {
          try {
            opt_.tiers[t]->unlock(id);
          } catch (const std::exception& e) {
            tier_error(t, e.what());
          }
          complete(id, late->context);
          return Flight{false, late};
        }
        // The other replica gave up (or its lock expired): this one builds.
        std::lock_guard<std::mutex> lk(mu_);
        locked_[id] = t;
        return Flight{true, std::nullopt};
      }
    }
    break;
  }
  return Flight{true, std::nullopt};
}

void ContextCache::complete(const std::string& id, const std::optional<Context>& context) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = flights_.find(id);
  if (it != flights_.end()) {
    it->second->done = true;
    it->second->context = context;
    it->second->cv.notify_all();
    flights_.erase(it);
  }
  auto l = locked_.find(id);
  if (l != locked_.end()) {
    // Released after the entry's write (the writer keeps the order), so a replica polling for the
    // entry finds it before it could take the lock.
    writes_.push_back(Write{Write::Unlock, id, std::nullopt, l->second});
    locked_.erase(l);
    writer_cv_.notify_all();
  }
}

void ContextCache::count_saved(size_t tokens) {
  std::lock_guard<std::mutex> lk(mu_);
  m_.prefill_tokens_saved += tokens;
}

ContextCacheMetrics ContextCache::metrics() const {
  std::lock_guard<std::mutex> lk(mu_);
  return m_;
}

void ContextCache::writer() {
  for (;;) {
    Write w;
    {
      std::unique_lock<std::mutex> lk(mu_);
      writer_cv_.wait(lk, [&] { return stop_ || !writes_.empty(); });
      if (writes_.empty()) return;
      w = std::move(writes_.front());
      writes_.pop_front();
    }
    if (w.kind == Write::Unlock) {
      try {
        opt_.tiers[w.tier]->unlock(w.id);
      } catch (const std::exception& e) {
        tier_error(w.tier, e.what());
      }
      continue;
    }
    // Serialized here, off the engine's thread.
    const std::string image = w.context->image();
    for (size_t t = 0; t < opt_.tiers.size(); ++t) {
      try {
        opt_.tiers[t]->put(w.id, image);
        std::lock_guard<std::mutex> lk(mu_);
        ++m_.tiers[t + 1].stores;
        m_.tiers[t + 1].bytes += image.size();
      } catch (const std::exception& e) {
        tier_error(t, e.what());
      }
    }
  }
}

}  // namespace kvslim::server
