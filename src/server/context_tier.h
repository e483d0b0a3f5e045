#pragma once
// Where `kvslim serve` keeps stored contexts beyond its own memory, shared with other processes: a
// directory (--context-dir) or Redis (--context-store redis://...). A tier stores opaque images (the
// bytes of context files, which carry their own format version and checksum: the reader refuses a torn
// or corrupted one) under keys the server makes; it never interprets them.
//
// Keys are "<spec>-<n>-<hash>": the 16-hex-digit digest of what the context was compressed with (model
// fingerprint, press as run, cache codecs, chunk size), its token count, and the digest of its tokens.
// A prompt's stored prefixes are found by asking for the token counts stored under its spec and looking
// up the prefix of each count.
//
// Every call is thread-safe (HTTP threads look up, a writer thread stores) and bounded in time: a store
// that is down or slow makes the call throw, and the server then computes as if uncached.
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvslim::server {

class ContextTier {
 public:
  virtual ~ContextTier() = default;
  /// "dir" or "redis": the tier's label in logs and /metrics.
  virtual const char* name() const = 0;
  /// The image stored under `key`, or nullopt when there is none (or it expired). Throws kvslim::Error
  /// when the store cannot be reached, fails, or does not answer within its timeout.
  virtual std::optional<std::string> get(const std::string& key) = 0;
  /// Stores `image` under `key`, replacing what is there, so that a concurrent get() sees the old whole
  /// image, the new whole image, or nothing; never a mix of the two. Throws kvslim::Error on failure.
  virtual void put(const std::string& key, const std::string& image) = 0;
  /// Removes the entry under `key` (nothing when absent). Throws kvslim::Error on failure.
  virtual void erase(const std::string& key) = 0;
  /// Token counts of the contexts stored under `spec` (the key's first part), largest first. May name
  /// counts whose entry has since expired or been erased (the lookup then misses). Throws as get().
  virtual std::vector<int> lengths(const std::string& spec) = 0;
  /// Single flight across processes: takes the build lock of `key` for `ttl_s` seconds unless another
  /// process holds it; returns whether this caller took it. Throws as get().
  virtual bool try_lock(const std::string& key, double ttl_s) = 0;
  /// Releases a lock this process took (nothing when it expired or another holds it).
  virtual void unlock(const std::string& key) = 0;
};

/// Files DIR/<key>.kvc written atomically (temporary file + rename). Creates DIR when missing. Throws
/// kvslim::Error naming the directory when it cannot be created, is not a directory, or is not writable.
std::unique_ptr<ContextTier> make_dir_tier(const std::string& dir);

/// Redis tier settings (`--context-store`, `--context-prefix`, `--context-ttl`).
struct RedisTierOptions {
  std::string url;                 ///< redis://[:PASSWORD@]HOST:PORT[/DB]
  std::string prefix = "kvslim:";  ///< prepended to every Redis key this tier uses
  double ttl_s = 0;                ///< entries expire this long after they are stored; 0 = never
  double timeout_s = 2;            ///< connect and per-command timeout
  size_t chunk_bytes = 64u << 20;  ///< an image is stored in values of at most this size (Redis caps one at 512 MB)
};

/// A Redis tier (hiredis). Parses the URL at once (throws kvslim::Error naming the URL and what is
/// wrong); connects on first use and again after a failure, so a store that is down at start or
/// restarted later is not fatal.
std::unique_ptr<ContextTier> make_redis_tier(const RedisTierOptions& opt);

}  // namespace kvslim::server
