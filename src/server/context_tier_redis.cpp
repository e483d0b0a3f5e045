// The Redis tier of stored contexts (--context-store redis://...), shared by every replica that names
// the same store and prefix.
//
// Layout, under the prefix P:
//   P ctx:KEY            the head: "GEN N SIZE", the generation, the number of chunks and the image size
//   P ctx:KEY:GEN:I      chunk I (0..N-1) of the image, at most chunk_bytes each
//   P len:SPEC           a set of the token counts stored under SPEC
//   P lock:KEY           a build lock: a random token of its holder, with an expiry
// A put writes new chunks under a fresh generation and then the head in one MULTI/EXEC, so a reader
// that read the old head finds the old generation's chunks (whole, or deleted: a miss), never a mix.
// Chunks of a generation are never rewritten; the writer that replaced a head deletes its chunks.
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

#include "kvslim/error.h"
#include "server/context_tier.h"
#include "server/context_tier_key.h"

namespace kvslim::server {

namespace {

constexpr const char* kTier = "redis";
// Idle connections kept for the next calls; more callers at once open more, closed when returned.
constexpr size_t kMaxIdle = 8;
// Chunk names sent in one pipeline by a get, or in one DEL.
constexpr size_t kBatch = 256;
// Redis refuses a value over 512 MB (proto-max-bulk-len).
constexpr size_t kMaxChunk = size_t(512) << 20;

struct RedisUrl {
  std::string host;
  int port = 6379;
  std::string user, password;  // AUTH [user] password when password is not empty
  int db = 0;
};

/// `url` with its password replaced by "***", fit to quote in an error message.
std::string redacted(const std::string& url) {
  const size_t scheme = url.find("://");
  const size_t at = url.rfind('@');
  if (scheme == std::string::npos || at == std::string::npos || at < scheme + 3) return printable(url);
  const std::string userinfo = url.substr(scheme + 3, at - scheme - 3);
  const size_t colon = userinfo.find(':');
  const std::string shown = colon == std::string::npos ? "***" : userinfo.substr(0, colon) + ":***";
  return printable(url.substr(0, scheme + 3) + shown + url.substr(at));
}

[[noreturn]] void bad_url(const std::string& url, const std::string& why) {
  throw Error(fmt::format("context store URL \"{}\": {} (expected redis://[:PASSWORD@]HOST[:PORT][/DB])",
                          redacted(url), why));
}

std::string percent_decoded(const std::string& url, const std::string& s, const char* what) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    int v = 0;
    if (i + 2 >= s.size() || std::from_chars(s.data() + i + 1, s.data() + i + 3, v, 16).ptr != s.data() + i + 3)
      bad_url(url, fmt::format("the {} has a '%' not followed by two hex digits", what));
    out += char(v);
    i += 2;
  }
  return out;
}

/// A decimal number of at most `max_digits` digits in [lo, hi], or -1.
long long decimal(std::string_view s, size_t max_digits, long long lo, long long hi) {
  if (s.empty() || s.size() > max_digits) return -1;
  long long v = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size() || v < lo || v > hi) return -1;
  return v;
}

RedisUrl parse_url(const std::string& url) {
  RedisUrl u;
  if (url.rfind("rediss://", 0) == 0) bad_url(url, "TLS (rediss://) is not supported");
  if (url.rfind("redis://", 0) != 0) bad_url(url, "the scheme is not redis://");
  std::string rest = url.substr(8);
  if (rest.find_first_of("?#") != std::string::npos) bad_url(url, "query and fragment parts are not supported");
  if (const size_t at = rest.rfind('@'); at != std::string::npos) {
    const std::string userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const size_t colon = userinfo.find(':');
    if (colon == std::string::npos) bad_url(url, "the part before '@' has no ':' before the password");
    u.user = percent_decoded(url, userinfo.substr(0, colon), "user name");
    u.password = percent_decoded(url, userinfo.substr(colon + 1), "password");
    if (u.password.empty()) bad_url(url, "the password is empty");
  }
  std::string hostport = rest, db;
  if (const size_t slash = rest.find('/'); slash != std::string::npos) {
    hostport = rest.substr(0, slash);
    db = rest.substr(slash + 1);
  }
  std::string port;
  bool has_port = false;
  if (!hostport.empty() && hostport[0] == '[') {  // [IPv6]:port
    const size_t close = hostport.find(']');
    if (close == std::string::npos) bad_url(url, "the '[' of an IPv6 address has no ']'");
    u.host = hostport.substr(1, close - 1);
    const std::string after = hostport.substr(close + 1);
    if (!after.empty() && after[0] != ':') bad_url(url, "text after the IPv6 address is not ':PORT'");
    has_port = !after.empty();
    if (has_port) port = after.substr(1);
  } else {
    const size_t colon = hostport.find(':');
    u.host = hostport.substr(0, colon);
    has_port = colon != std::string::npos;
    if (has_port) port = hostport.substr(colon + 1);
  }
  if (u.host.empty()) bad_url(url, "no host");
  for (char c : u.host)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' || c == ':'))
      bad_url(url, fmt::format("the host \"{}\" has a character that is not a letter, digit, '.', '-' or '_'",
                               printable(u.host)));
  if (has_port) {
    const long long p = decimal(port, 5, 1, 65535);
    if (p < 0) bad_url(url, fmt::format("the port \"{}\" is not a number from 1 to 65535", printable(port)));
    u.port = int(p);
  }
  if (!db.empty()) {
    const long long d = decimal(db, 9, 0, 999'999'999);
    if (d < 0) bad_url(url, fmt::format("the database \"{}\" is not a number", printable(db)));
    u.db = int(d);
  }
  return u;
}

std::string random_hex16() {
  static std::mutex mu;
  static std::mt19937_64 gen{[] {
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ rd();
  }()};
  std::lock_guard<std::mutex> lock(mu);
  return fmt::format("{:016x}", gen());
}

timeval to_timeval(double s) {
  timeval tv{};
  tv.tv_sec = time_t(std::floor(s));
  tv.tv_usec = suseconds_t(std::lround((s - std::floor(s)) * 1e6));
  if (tv.tv_usec >= 1'000'000) {
    tv.tv_sec += 1;
    tv.tv_usec -= 1'000'000;
  }
  return tv;
}

struct ContextFree {
  void operator()(redisContext* c) const { redisFree(c); }
};
using Conn = std::unique_ptr<redisContext, ContextFree>;
struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

/// The connection failed (the store went away, or did not answer in time); it cannot be used again.
struct IoFailure {
  std::string text;
  bool timeout;
};

/// hiredis writes with write(2): a store that closed the connection would raise SIGPIPE, whose default
/// action ends the process. Blocked in this thread for the exchange, and one it raised is consumed.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeBlock() {
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE)) {
        const timespec zero{0, 0};
        sigtimedwait(&pipe_, nullptr, &zero);
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

/// One command's arguments (views: the image's chunks are sent without a copy).
using Command = std::vector<std::string_view>;

class RedisTier : public ContextTier {
 public:
  RedisTier(const RedisTierOptions& opt, RedisUrl url)
      : opt_(opt),
        url_(std::move(url)),
        where_(fmt::format("{} {}", kTier,
                           url_.host.find(':') != std::string::npos ? fmt::format("[{}]:{}", url_.host, url_.port)
                                                                     : fmt::format("{}:{}", url_.host, url_.port))),
        ttl_ms_(opt.ttl_s > 0 ? std::to_string(std::max<long long>(1, std::llround(opt.ttl_s * 1000))) : "") {}

  ~RedisTier() override = default;

  const char* name() const override { return kTier; }

  std::optional<std::string> get(const std::string& key) override {
    tier_key::check(key, kTier, "key");
    const std::string head_key = opt_.prefix + "ctx:" + key;
    return call([&](redisContext* c) -> std::optional<std::string> {
      const auto head_reply = exchange(c, {{"GET", head_key}});
      const redisReply* h = head_reply[0].get();
      check(h, "GET");
      if (h->type != REDIS_REPLY_STRING) return std::nullopt;
      const auto head = parse_head({h->str, h->len});
      if (!head) return std::nullopt;  // not a head this tier wrote
      if (head->chunks == 0) return head->size == 0 ? std::optional<std::string>("") : std::nullopt;
      // The replies are taken one by one, so at most the image and one chunk are held at once; the
      // chunks are asked for in batches, so a missing generation costs one batch, whatever its head says.
      std::string image;
      if (head->size <= (size_t(1) << 30)) image.reserve(head->size);
      bool whole = true;
      std::vector<std::string> names;
      std::vector<Command> gets;
      for (size_t from = 0; from < head->chunks && whole; from += kBatch) {
        names.clear();
        gets.clear();
        for (size_t i = from; i < std::min(head->chunks, from + kBatch); ++i)
          names.push_back(chunk_key(head_key, head->gen, i));
        for (const auto& n : names) gets.push_back({"GET", n});
        exchange_each(c, gets, [&](const redisReply* r) {
          check(r, "GET");
          if (r->type != REDIS_REPLY_STRING || image.size() + r->len > head->size) whole = false;
          if (whole) image.append(r->str, r->len);
        });
      }
      // A chunk expired, or the entry was replaced and this generation deleted while it was read.
      if (!whole || image.size() != head->size) return std::nullopt;
      return image;
    });
  }

  void put(const std::string& key, const std::string& image) override {
    tier_key::check(key, kTier, "key");
    const std::string head_key = opt_.prefix + "ctx:" + key;
    const std::string gen = random_hex16();
    const size_t chunks = (image.size() + opt_.chunk_bytes - 1) / opt_.chunk_bytes;
    std::vector<std::string> names;
    names.reserve(chunks);
    for (size_t i = 0; i < chunks; ++i) names.push_back(chunk_key(head_key, gen, i));
    const std::string head = fmt::format("{} {} {}", gen, chunks, image.size());
    const auto parts = tier_key::parse(key);
    const std::string len_key = parts ? opt_.prefix + "len:" + std::string(parts->spec) : "";
    const std::string tokens = parts ? std::to_string(parts->tokens) : "";

    std::vector<Command> cmds;
    cmds.push_back({"MULTI"});
    for (size_t i = 0; i < chunks; ++i) {
      const size_t at = i * opt_.chunk_bytes;
      const std::string_view chunk = std::string_view(image).substr(at, std::min(opt_.chunk_bytes, image.size() - at));
      cmds.push_back(with_ttl({"SET", names[i], chunk}));
    }
    // The old head, read in the transaction, names the generation this put replaces.
    const size_t get_at = cmds.size() - 1;  // index in EXEC's answer
    cmds.push_back({"GET", head_key});
    cmds.push_back(with_ttl({"SET", head_key, head}));
    if (parts) {
      cmds.push_back({"SADD", len_key, tokens});
      if (!ttl_ms_.empty()) cmds.push_back({"PEXPIRE", len_key, ttl_ms_});
    }
    cmds.push_back({"EXEC"});
    const std::string old = call([&](redisContext* c) { return transaction(c, cmds, "storing " + key, get_at); });
    delete_generation(head_key, old);
  }

  void erase(const std::string& key) override {
    tier_key::check(key, kTier, "key");
    const std::string head_key = opt_.prefix + "ctx:" + key;
    const std::vector<Command> cmds = {{"MULTI"}, {"GET", head_key}, {"DEL", head_key}, {"EXEC"}};
    const std::string old = call([&](redisContext* c) { return transaction(c, cmds, "erasing " + key, 0); });
    delete_generation(head_key, old);
  }

  std::vector<int> lengths(const std::string& spec) override {
    tier_key::check(spec, kTier, "spec");
    const std::string len_key = opt_.prefix + "len:" + spec;
    return call([&](redisContext* c) {
      const auto r = exchange(c, {{"SMEMBERS", len_key}});
      check(r[0].get(), "SMEMBERS");
      std::set<int, std::greater<int>> found;
      if (r[0]->type == REDIS_REPLY_ARRAY)
        for (size_t i = 0; i < r[0]->elements; ++i) {
          const redisReply* e = r[0]->element[i];
          if (e->type != REDIS_REPLY_STRING) continue;
          const long long n = decimal({e->str, e->len}, 9, 0, 999'999'999);
          if (n >= 0) found.insert(int(n));
        }
      return std::vector<int>(found.begin(), found.end());
    });
  }

  bool try_lock(const std::string& key, double ttl_s) override {
    tier_key::check(key, kTier, "key");
    if (!std::isfinite(ttl_s) || ttl_s <= 0 || ttl_s > 1e9)
      throw Error(fmt::format("context store {}: lock time {} s for {} is not a positive number of seconds", where_,
                              ttl_s, key));
    const std::string lock_key = opt_.prefix + "lock:" + key;
    const std::string token = random_hex16() + random_hex16();
    const std::string ms = std::to_string(std::max<long long>(1, std::llround(ttl_s * 1000)));
    const bool took = call([&](redisContext* c) {
      const auto r = exchange(c, {{"SET", lock_key, token, "NX", "PX", ms}});
      check(r[0].get(), "SET NX");
      return r[0]->type == REDIS_REPLY_STATUS;  // "OK"; nil when another holds it
    });
    if (took) tokens_.put(key, token);
    return took;
  }

  void unlock(const std::string& key) override {
    const std::optional<std::string> held_token = tokens_.take(key);
    if (!held_token) return;
    const std::string& token = *held_token;
    // Deleted only while it still holds this caller's token: a lock that expired and was taken by
    // another process stays. A failure is not raised: the lock expires by itself, and callers release
    // on their way out.
    static constexpr std::string_view kScript =
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";
    const std::string lock_key = opt_.prefix + "lock:" + key;
    try {
      call([&](redisContext* c) {
        const auto r = exchange(c, {{"EVAL", kScript, "1", lock_key, token}});
        check(r[0].get(), "EVAL (unlock)");
        return 0;
      });
    } catch (const Error&) {
    }
  }

 private:
  struct Head {
    std::string gen;
    size_t chunks = 0, size = 0;
  };

  static std::optional<Head> parse_head(std::string_view v) {
    const size_t a = v.find(' '), b = a == std::string_view::npos ? a : v.find(' ', a + 1);
    if (b == std::string_view::npos || a == 0 || a > 32) return std::nullopt;
    Head h;
    h.gen = std::string(v.substr(0, a));
    const long long n = decimal(v.substr(a + 1, b - a - 1), 12, 0, 1LL << 40);
    const long long s = decimal(v.substr(b + 1), 15, 0, 1LL << 50);
    // Each chunk holds at least one byte, so a count past the size is not a head this tier wrote (and
    // would make a get send that many commands).
    if (n < 0 || s < 0 || n > s || (s > 0 && n == 0)) return std::nullopt;
    h.chunks = size_t(n);
    h.size = size_t(s);
    return h;
  }

  static std::string chunk_key(const std::string& head_key, const std::string& gen, size_t i) {
    return fmt::format("{}:{}:{}", head_key, gen, i);
  }

  Command with_ttl(Command c) const {
    if (!ttl_ms_.empty()) {
      c.push_back("PX");
      c.push_back(ttl_ms_);
    }
    return c;
  }

  /// Runs MULTI ... EXEC; returns the string at `get_at` of EXEC's answer (the old head), "" when nil.
  std::string transaction(redisContext* c, const std::vector<Command>& cmds, const std::string& what,
                          size_t get_at) {
    std::string first_error;
    Reply exec;
    size_t i = 0;
    exchange_each(c, cmds, [&](redisReply* r) {
      if (r->type == REDIS_REPLY_ERROR && first_error.empty()) first_error = std::string(r->str, r->len);
      if (++i == cmds.size()) {
        exec.reset(r);
        return true;  // keep it
      }
      return false;
    });
    if (!first_error.empty())
      throw Error(fmt::format("context store {}: {} refused: {}", where_, what, printable(first_error)));
    if (!exec || exec->type != REDIS_REPLY_ARRAY || exec->elements <= get_at)
      throw Error(fmt::format("context store {}: {}: the transaction was not run", where_, what));
    for (size_t k = 0; k < exec->elements; ++k)
      if (exec->element[k]->type == REDIS_REPLY_ERROR)
        throw Error(fmt::format("context store {}: {} refused: {}", where_, what,
                                printable({exec->element[k]->str, exec->element[k]->len})));
    const redisReply* old = exec->element[get_at];
    return old->type == REDIS_REPLY_STRING ? std::string(old->str, old->len) : std::string();
  }

  /// Deletes the chunks of the generation a replaced head named. Its entry is already replaced, so a
  /// failure only leaves chunks that expire with the TTL (or stay, without one): not the caller's error.
  void delete_generation(const std::string& head_key, const std::string& old_head) {
    const auto head = parse_head(old_head);
    if (!head) return;
    try {
      // In batches, stopping at one that deleted nothing (the rest expired, or the head was not ours).
      for (size_t from = 0; from < head->chunks; from += kBatch) {
        std::vector<std::string> names;
        for (size_t i = from; i < std::min(head->chunks, from + kBatch); ++i)
          names.push_back(chunk_key(head_key, head->gen, i));
        Command del{"DEL"};
        for (const auto& n : names) del.push_back(n);
        const long long deleted = call([&](redisContext* c) {
          const auto r = exchange(c, {del});
          return r[0]->type == REDIS_REPLY_INTEGER ? r[0]->integer : 0;
        });
        if (deleted == 0) break;
      }
    } catch (const Error&) {
    }
  }

  /// Throws kvslim::Error for an error reply.
  void check(const redisReply* r, const char* command) const {
    if (r->type == REDIS_REPLY_ERROR)
      throw Error(fmt::format("context store {}: {} refused: {}", where_, command, printable({r->str, r->len})));
  }

  [[noreturn]] void io_failure(redisContext* c, int err) const {
    const bool timeout = c->err == REDIS_ERR_IO &&
                         (err == EAGAIN || err == EWOULDBLOCK || std::strcmp(c->errstr, std::strerror(EAGAIN)) == 0);
    throw IoFailure{timeout ? fmt::format("no answer within {} s", opt_.timeout_s) : std::string(c->errstr), timeout};
  }

  /// Sends the commands in one pipeline and passes each reply to `each` in order; a reply `each`
  /// returns true for is kept by it (it took ownership), others are freed.
  template <class F>
  void exchange_each(redisContext* c, const std::vector<Command>& cmds, F&& each) {
    SigpipeBlock no_sigpipe;
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& cmd : cmds) {
      argv.clear();
      lens.clear();
      for (const auto& a : cmd) {
        argv.push_back(a.data());
        lens.push_back(a.size());
      }
      if (redisAppendCommandArgv(c, int(argv.size()), argv.data(), lens.data()) != REDIS_OK) io_failure(c, errno);
    }
    for (size_t i = 0; i < cmds.size(); ++i) {
      void* r = nullptr;
      if (redisGetReply(c, &r) != REDIS_OK || !r) io_failure(c, errno);
      Reply reply(static_cast<redisReply*>(r));
      if constexpr (std::is_same_v<std::invoke_result_t<F, redisReply*>, bool>) {
        if (each(reply.get())) reply.release();
      } else {
        each(reply.get());
      }
    }
  }

  std::vector<Reply> exchange(redisContext* c, const std::vector<Command>& cmds) {
    std::vector<Reply> out;
    exchange_each(c, cmds, [&](redisReply* r) {
      out.emplace_back(r);
      return true;
    });
    return out;
  }

  Conn connect() {
    const timeval tv = to_timeval(opt_.timeout_s);
    Conn c(redisConnectWithTimeout(url_.host.c_str(), url_.port, tv));
    if (!c) throw Error(fmt::format("context store {}: cannot connect: out of memory", where_));
    if (c->err) throw Error(fmt::format("context store {}: cannot connect: {}", where_, c->errstr));
    if (redisSetTimeout(c.get(), tv) != REDIS_OK)
      throw Error(fmt::format("context store {}: cannot set the timeout: {}", where_, c->errstr));
    std::vector<Command> hello;
    if (!url_.password.empty()) {
      if (url_.user.empty())
        hello.push_back({"AUTH", url_.password});
      else
        hello.push_back({"AUTH", url_.user, url_.password});
    }
    const std::string db = std::to_string(url_.db);
    if (url_.db != 0) hello.push_back({"SELECT", db});
    if (hello.empty()) return c;
    try {
      const auto r = exchange(c.get(), hello);
      for (size_t i = 0; i < r.size(); ++i)
        if (r[i]->type == REDIS_REPLY_ERROR)
          throw Error(fmt::format("context store {}: {} refused: {}", where_,
                                  hello[i][0] == "AUTH" ? "AUTH" : "SELECT " + db, printable({r[i]->str, r[i]->len})));
    } catch (const IoFailure& f) {
      throw Error(fmt::format("context store {}: {}", where_, f.text));
    }
    return c;
  }

  /// Runs `f` on a connection: an idle one, or a new one. A connection that failed is closed; when it
  /// was an idle one whose store went away meanwhile (restarted: the connection is dead, the store
  /// is not), `f` runs once more on a new connection. A timeout is not retried, to keep calls bounded.
  template <class F>
  auto call(F&& f) -> std::invoke_result_t<F, redisContext*> {
    for (int attempt = 0;; ++attempt) {
      Conn c;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!idle_.empty()) {
          c = std::move(idle_.back());
          idle_.pop_back();
        }
      }
      const bool reused = c != nullptr;
      if (!c) c = connect();
      try {
        auto result = f(c.get());
        std::lock_guard<std::mutex> lock(mu_);
        if (idle_.size() < kMaxIdle) idle_.push_back(std::move(c));
        return result;
      } catch (const IoFailure& e) {
        if (reused && !e.timeout && attempt == 0) {
          std::lock_guard<std::mutex> lock(mu_);
          idle_.clear();  // they were opened to the same store and are likely dead too
          continue;
        }
        throw Error(fmt::format("context store {}: {}", where_, e.text));
      }
    }
  }

  const RedisTierOptions opt_;
  const RedisUrl url_;
  const std::string where_;   // "redis HOST:PORT", the tier in error messages (never the password)
  const std::string ttl_ms_;  // PX argument; empty when entries do not expire
  std::mutex mu_;
  std::vector<Conn> idle_;
  tier_key::LockTokens tokens_;
};

}  // namespace

std::unique_ptr<ContextTier> make_redis_tier(const RedisTierOptions& opt) {
  RedisUrl url = parse_url(opt.url);
  if (!std::isfinite(opt.timeout_s) || opt.timeout_s <= 0 || opt.timeout_s > 1e6)
    throw Error(fmt::format("context store {}: the timeout {} s is not a positive number of seconds",
                            redacted(opt.url), opt.timeout_s));
  if (!std::isfinite(opt.ttl_s) || opt.ttl_s < 0 || opt.ttl_s > 1e9)
    throw Error(fmt::format("context store {}: the TTL {} s is not 0 (no expiry) or a positive number of seconds",
                            redacted(opt.url), opt.ttl_s));
  if (opt.chunk_bytes == 0 || opt.chunk_bytes > kMaxChunk)
    throw Error(fmt::format("context store {}: the chunk size {} bytes is not from 1 to {}", redacted(opt.url),
                            opt.chunk_bytes, kMaxChunk));
  return std::make_unique<RedisTier>(opt, std::move(url));
}

}  // namespace kvslim::server
