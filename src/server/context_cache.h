#pragma once
// The server's stored contexts: compress a context once, answer every later request with the same
// context without prefilling it again (kvslim/context.h says what a stored context is).
//
// Tiers, looked up in order: this process's memory (least recently used first out, within a byte
// limit), then a directory and/or Redis (src/server/context_tier.h) shared with other replicas. A hit
// in a lower tier is checked (format, checksum, model fingerprint, tokens) and kept in memory. Stores
// to the lower tiers run on a writer thread, never on the engine's thread; a tier that fails or times
// out is logged and counted, and the request goes on as if uncached.
//
// Reuse: a request takes a stored context equal to its own context (the same tokens, compressed
// the same way), or, for a chat, the stored conversation its messages continue.
//
// Single flight: while one request builds a context, others needing the same one wait for it rather
// than building it again; across replicas the first takes a lock in the shared tier and the others
// poll the tier for the entry until the lock's time runs out.
//
// Keys: "<spec>-<n>-<hash>" (context_tier.h). The spec digest covers the model fingerprint, the press
// as described, the cache codecs and the chunk size, so a context is only reused by a request that
// would have compressed it the same way.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kvslim/context.h"
#include "server/context_tier.h"
#include "tools/tools.h"

namespace kvslim::server {

/// Per-tier counters for /metrics.
struct ContextTierMetrics {
  std::string tier;                 ///< "memory", "dir" or "redis"
  uint64_t hits = 0, misses = 0;    ///< lookups answered / not answered by this tier
  uint64_t errors = 0;              ///< failed or timed-out calls, and entries refused (checksum, model)
  uint64_t stores = 0;              ///< entries written
  size_t bytes = 0;                 ///< memory: bytes held now; others: bytes written
};

struct ContextCacheMetrics {
  std::vector<ContextTierMetrics> tiers;
  uint64_t prefill_tokens_saved = 0;  ///< context tokens requests did not prefill thanks to a hit
  uint64_t builds = 0;                ///< contexts built and stored
  uint64_t flight_waits = 0;          ///< requests that waited for another's build instead of building
  uint64_t evictions = 0;             ///< memory entries dropped for space
  size_t entries = 0;                 ///< entries in memory
};

class ContextCache {
 public:
  struct Options {
    size_t memory_bytes = 512u << 20;                  ///< memory tier's limit (cache bytes of its contexts)
    std::vector<std::unique_ptr<ContextTier>> tiers;   ///< looked up in this order after memory
    double lock_ttl_s = 120;                           ///< a cross-replica build lock's lifetime
  };
  /// Starts the writer thread. `model` must outlive the cache.
  ContextCache(const Model& model, Options opt);
  /// Writes what is queued (bounded by the tiers' timeouts), then stops the writer.
  ~ContextCache();
  ContextCache(const ContextCache&) = delete;
  ContextCache& operator=(const ContextCache&) = delete;

  /// The spec digest (16 hex digits) of contexts compressed by `press` (its describe()) with the
  /// cache `cache_type` (describe_cache_config) after every `chunk_size` tokens.
  std::string spec(const std::string& press, const std::string& cache_type, int chunk_size) const;
  /// "<spec>-<n>-<hash>" for the first n of `tokens`.
  static std::string key(const std::string& spec, const std::vector<Token>& tokens, size_t n);

  struct Found {
    std::string id;
    Context context;
    std::string tier;  ///< where it was found
  };
  /// The longest stored context of `spec` whose tokens are the first n of `tokens`, n <= max_n.
  /// Counts a hit or a miss per tier looked at. Never throws for a tier's failure.
  std::optional<Found> find_prefix(const std::string& spec, const std::vector<Token>& tokens, size_t max_n);
  /// The context stored under `id` (memory, then the tiers), or nullopt.
  std::optional<Found> find(const std::string& id);

  /// Keeps `context` under `id`: in memory now (evicting the least recently used beyond the limit;
  /// a context larger than the whole limit is not kept in memory), in the tiers by the writer.
  void put(const std::string& id, const Context& context);
  /// Drops `id` from memory and every tier. Returns whether memory or any tier had it (tier errors
  /// count as not found and are logged).
  bool erase(const std::string& id);
  /// Evicts least recently used memory entries until footprint(in_use) <= `bytes`; returns the
  /// bytes of memory_bytes() freed. Parts in `in_use` (read by running requests) are not freed by
  /// evicting the contexts that hold them, so they count whether the memory tier holds them or not.
  size_t shrink_to(size_t bytes, const std::vector<SharedEntries>& in_use = {});
  /// Bytes of the contexts held in memory: each context's own allocations, plus every shared part
  /// of their caches (KVCache::share) once however many contexts hold it.
  size_t memory_bytes() const;
  /// memory_bytes() plus the allocated bytes of the parts of `in_use` (distinct ids) that no held
  /// context holds: the memory the stored contexts and the running requests' shared entries take.
  size_t footprint(const std::vector<SharedEntries>& in_use) const;

  /// Ids and figures of the contexts in memory, most recently used first.
  std::vector<std::pair<std::string, ContextInfo>> list() const;

  /// Single flight for `id`. The first caller (leader) gets nullopt and must build the context, then
  /// call complete(id, ...) exactly once; later callers wait (up to `deadline`) for the leader and
  /// get its context, or nullopt when it failed or the wait timed out (they then build on their own,
  /// uncached). Across replicas the leader also takes the shared tiers' lock; when another replica
  /// holds it, the caller polls those tiers for the entry until the lock's time or `deadline` runs
  /// out, and leads when it does not appear.
  struct Flight {
    bool leader = false;
    std::optional<Found> found;
  };
  Flight join(const std::string& id, std::chrono::steady_clock::time_point deadline);
  /// Ends the leader's flight: `context` (stored with put() by the caller) or nullopt on failure.
  void complete(const std::string& id, const std::optional<Context>& context);

  /// Counts context tokens a request did not prefill.
  void count_saved(size_t tokens);
  ContextCacheMetrics metrics() const;

 private:
  struct Entry {
    std::string id, spec;
    Context context;
    size_t bytes = 0;      ///< held bytes of the context, shared parts included
    size_t own_bytes = 0;  ///< bytes minus its shared parts
    std::vector<SharedEntries> parts;
    size_t n = 0;
  };
  struct Pending {
    bool done = false;
    std::optional<Context> context;
    std::condition_variable cv;
  };
  /// A tier operation for the writer thread, in order.
  struct Write {
    enum Kind { Put, Unlock } kind = Put;
    std::string id;
    std::optional<Context> context;  ///< Put
    size_t tier = 0;                 ///< Unlock
  };
  /// One tier's entry `id`, checked (format, checksum, model, tokens: against `tokens`' first n when
  /// given, else against the key) and kept in memory on a hit; failures are counted and logged.
  struct Read {
    enum Status { Absent, Failed, Refused, Hit } status = Absent;
    std::optional<Found> found;
  };
  Read read_entry(size_t t, const std::string& id, const std::vector<Token>* tokens, size_t n);
  /// The entry `id` from the first tier holding a valid one (its tokens checked against `tokens`'
  /// first n when given, else against the key), kept in memory.
  std::optional<Found> from_tiers(const std::string& id, const std::vector<Token>* tokens, size_t n,
                                  bool count_miss);
  /// Whether `tokens` hash to the key `id`.
  static bool key_matches(const std::string& id, const std::vector<Token>& tokens);
  void insert_locked(const std::string& id, const Context& context, const std::string& spec, size_t n);
  void evict_locked(size_t limit, const std::vector<SharedEntries>& in_use = {});
  /// Drops entry `it` from memory and from the byte counts.
  void drop_locked(std::list<Entry>::iterator it);
  size_t footprint_locked(const std::vector<SharedEntries>& in_use) const;
  void writer();
  void tier_error(size_t t, const std::string& what);

  const Model& model_;
  Options opt_;
  uint64_t fingerprint_ = 0;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recently used first
  std::map<std::string, std::list<Entry>::iterator> by_id_;
  size_t bytes_ = 0;      // own bytes of the entries plus the distinct parts of parts_
  std::map<const void*, std::pair<size_t, size_t>> parts_;  // shared part -> (entries holding it, allocated bytes)
  std::map<std::string, std::shared_ptr<Pending>> flights_;
  std::map<std::string, size_t> locked_;  // ids whose shared lock this process holds
  std::deque<Write> writes_;
  std::condition_variable writer_cv_;
  bool stop_ = false;
  ContextCacheMetrics m_;
  std::thread writer_;
};

}  // namespace kvslim::server
