// The stored-context tiers beyond memory (src/server/context_tier.h): a directory, and Redis through a
// redis-server this test starts on a free loopback port (skipped where the binary is absent). The
// layout in Redis is checked with a client of the test's own (hiredis), not through the tier.
#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "kvslim/error.h"
#include "server/context_tier.h"

using namespace kvslim::server;
using kvslim::Error;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

extern char** environ;

namespace {

const std::string kSpec = "0123456789abcdef";

std::string key_of(const std::string& spec, int n, const std::string& hash) {
  return spec + "-" + std::to_string(n) + "-" + hash;
}

std::string random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = char(g() & 0xff);
  return s;
}

class TempDir {
 public:
  TempDir() {
    std::string t = (fs::temp_directory_path() / "kvslim-tier.XXXXXX").string();
    if (!mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed");
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    for (auto& e : fs::recursive_directory_iterator(path, ec))
      if (e.is_directory(ec)) fs::permissions(e.path(), fs::perms::owner_all, fs::perm_options::add, ec);
    fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path, ec);
  }
  std::string path;
};

std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> out;
  for (auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

/// The message of the kvslim::Error `f` throws ("" and a test failure when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no kvslim::Error thrown";
  return "";
}

/// Runs `f` on a thread of its own and waits at most `limit`: a call that hangs fails the test
/// instead of hanging it. Returns the error message `f` threw, or "" when it threw none.
template <class F>
std::string error_within(F f, std::chrono::milliseconds limit) {
  auto done = std::make_shared<std::promise<std::string>>();
  auto result = done->get_future();
  std::thread([f, done] {
    try {
      f();
      done->set_value("");
    } catch (const Error& e) {
      done->set_value(e.what());
    } catch (...) {
      done->set_value("(an exception other than kvslim::Error)");
    }
  }).detach();
  if (result.wait_for(limit) != std::future_status::ready) {
    ADD_FAILURE() << "the call did not return within " << limit.count() << " ms";
    return "(hang)";
  }
  return result.get();
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---------------------------------------------------------------------------------------------------
// Directory tier

TEST(ContextTierDir, RoundTripReplaceErase) {
  TempDir d;
  auto tier = make_dir_tier(d.path);
  EXPECT_STREQ(tier->name(), "dir");
  const std::string key = key_of(kSpec, 40, "00112233aabbccdd");
  EXPECT_EQ(tier->get(key), std::nullopt);

  const std::string a = random_bytes(10000, 1), b = random_bytes(3000, 2);
  tier->put(key, a);
  EXPECT_EQ(tier->get(key), a);
  // The file itself, read without the tier, and no temporary file left beside it.
  EXPECT_EQ(read_file(d.path + "/" + key + ".kvc"), a);
  EXPECT_EQ(names_in(d.path), std::set<std::string>{key + ".kvc"});

  tier->put(key, b);
  EXPECT_EQ(tier->get(key), b);
  EXPECT_EQ(names_in(d.path), std::set<std::string>{key + ".kvc"});

  tier->put(key, "");
  EXPECT_EQ(tier->get(key), std::string());

  // Another tier object on the same directory (another process) sees the same entries.
  auto other = make_dir_tier(d.path + "/");
  EXPECT_EQ(other->get(key), std::string());

  tier->erase(key);
  EXPECT_EQ(tier->get(key), std::nullopt);
  EXPECT_NO_THROW(tier->erase(key));
  EXPECT_TRUE(names_in(d.path).empty());
}

TEST(ContextTierDir, CreatesTheDirectoryAndItsParents) {
  TempDir d;
  const std::string dir = d.path + "/a/b/c";
  auto tier = make_dir_tier(dir);
  EXPECT_TRUE(fs::is_directory(dir));
  tier->put(key_of(kSpec, 1, "ab"), "x");
  EXPECT_EQ(read_file(dir + "/" + key_of(kSpec, 1, "ab") + ".kvc"), "x");
}

TEST(ContextTierDir, LengthsFromTheListing) {
  TempDir d;
  auto tier = make_dir_tier(d.path);
  EXPECT_TRUE(tier->lengths(kSpec).empty());
  tier->put(key_of(kSpec, 5, "aaaa"), "1");
  tier->put(key_of(kSpec, 12, "bbbb"), "2");
  tier->put(key_of(kSpec, 12, "cccc"), "3");
  tier->put(key_of(kSpec, 100, "dddd"), "4");
  tier->put(key_of("fedcba9876543210", 7, "eeee"), "5");
  // Names that are not entries of this spec are not counted.
  for (const char* junk : {"README", "0123456789abcdef-x-aa.kvc", "0123456789abcdef-9-aa.kvc.bak",
                           "0123456789abcdef-8-.kvc", ".tmp-0123456789abcdef-3-aa-XYZ", "0123456789abcdef-6-aa.lock",
                           "0123456789abcdef0-4-aa.kvc"})
    std::ofstream(d.path + "/" + junk) << "junk";
  EXPECT_EQ(tier->lengths(kSpec), (std::vector<int>{100, 12, 5}));
  EXPECT_EQ(tier->lengths("fedcba9876543210"), std::vector<int>{7});
  EXPECT_TRUE(tier->lengths("ffffffffffffffff").empty());
  tier->erase(key_of(kSpec, 100, "dddd"));
  EXPECT_EQ(tier->lengths(kSpec), (std::vector<int>{12, 5}));
}

TEST(ContextTierDir, LocksAcrossProcesses) {
  TempDir d;
  auto a = make_dir_tier(d.path), b = make_dir_tier(d.path);  // two replicas
  const std::string key = key_of(kSpec, 9, "99");
  EXPECT_TRUE(a->try_lock(key, 30));
  EXPECT_TRUE(fs::exists(d.path + "/" + key + ".lock"));
  EXPECT_FALSE(b->try_lock(key, 30));
  b->unlock(key);  // b holds nothing: the lock stays a's
  EXPECT_FALSE(b->try_lock(key, 30));
  a->unlock(key);
  EXPECT_FALSE(fs::exists(d.path + "/" + key + ".lock"));
  EXPECT_TRUE(b->try_lock(key, 30));
  b->unlock(key);

  // An expired lock is taken over; its old holder's unlock then leaves the new holder's lock alone.
  const std::string k2 = key_of(kSpec, 10, "aa");
  EXPECT_TRUE(a->try_lock(k2, 0.5));
  EXPECT_FALSE(b->try_lock(k2, 30));
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_TRUE(b->try_lock(k2, 30));
  a->unlock(k2);
  auto c = make_dir_tier(d.path);
  EXPECT_FALSE(c->try_lock(k2, 30));
  b->unlock(k2);
  EXPECT_TRUE(c->try_lock(k2, 30));
  c->unlock(k2);
  // Only the entries' own files remain: no lock or moved-aside file is left.
  EXPECT_TRUE(names_in(d.path).empty());

  // A lock file without a readable expiry: held while it is new (its writer may be about to write
  // it), taken over once it is old.
  const std::string k3 = key_of(kSpec, 11, "bb"), lock3 = d.path + "/" + k3 + ".lock";
  std::ofstream(lock3) << "not a lock";
  EXPECT_FALSE(a->try_lock(k3, 30));
  const timespec old[2] = {{time(nullptr) - 60, 0}, {time(nullptr) - 60, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, lock3.c_str(), old, 0), 0);
  EXPECT_TRUE(a->try_lock(k3, 30));
  a->unlock(k3);

  EXPECT_NE(error_of([&] { a->try_lock(k3, 0); }).find("lock time"), std::string::npos);
  EXPECT_NE(error_of([&] { a->try_lock(k3, -1); }).find("lock time"), std::string::npos);
}

TEST(ContextTierDir, LocksSingleFlightUnderContention) {
  TempDir d;
  const std::string key = key_of(kSpec, 3, "cc");
  std::vector<std::unique_ptr<ContextTier>> tiers;
  for (int i = 0; i < 8; ++i) tiers.push_back(make_dir_tier(d.path));
  std::atomic<int> took{0};
  std::vector<std::thread> threads;
  for (auto& t : tiers)
    threads.emplace_back([&, tier = t.get()] { took += tier->try_lock(key, 30) ? 1 : 0; });
  for (auto& t : threads) t.join();
  EXPECT_EQ(took.load(), 1);
}

TEST(ContextTierDir, BadKeysAreRefused) {
  TempDir d;
  const std::string dir = d.path + "/tier";
  auto tier = make_dir_tier(dir);
  const std::string too_long(201, 'a');
  for (const std::string& bad : {std::string("../escape"), std::string("a/b"), std::string(""), std::string("ABCDEF"),
                                 std::string("a.kvc"), std::string("a b"), std::string("a\0b", 3), too_long}) {
    SCOPED_TRACE(bad);
    EXPECT_NE(error_of([&] { tier->put(bad, "x"); }).find("is not valid"), std::string::npos);
    EXPECT_NE(error_of([&] { tier->get(bad); }).find("is not valid"), std::string::npos);
    EXPECT_NE(error_of([&] { tier->erase(bad); }).find("is not valid"), std::string::npos);
    EXPECT_NE(error_of([&] { tier->try_lock(bad, 1); }).find("is not valid"), std::string::npos);
    EXPECT_NE(error_of([&] { tier->lengths(bad); }).find("is not valid"), std::string::npos);
  }
  EXPECT_EQ(names_in(d.path), std::set<std::string>{"tier"});
  EXPECT_TRUE(names_in(dir).empty());
  EXPECT_NO_THROW(tier->put(std::string(200, 'a'), "x"));  // the longest accepted
}

TEST(ContextTierDir, SpecialFilesAtAnEntryAreErrorsNotHangs) {
  TempDir d;
  auto tier = make_dir_tier(d.path);
  const std::string key = key_of(kSpec, 4, "dd"), path = d.path + "/" + key + ".kvc";
  // A FIFO without a writer: a blocking open would wait for one forever.
  ASSERT_EQ(mkfifo(path.c_str(), 0644), 0);
  std::string msg = error_within([&tier, key] { tier->get(key); }, std::chrono::milliseconds(3000));
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a regular file"), std::string::npos) << msg;
  const std::string lock = d.path + "/" + key + ".lock";
  ASSERT_EQ(mkfifo(lock.c_str(), 0644), 0);
  msg = error_within([&tier, key] { tier->try_lock(key, 1); }, std::chrono::milliseconds(3000));
  EXPECT_NE(msg.find(lock), std::string::npos) << msg;
  // A put replaces whatever non-directory is there by its rename.
  tier->put(key, "image");
  EXPECT_EQ(tier->get(key), "image");

  // A directory at the entry's path: get and put fail naming it.
  const std::string k2 = key_of(kSpec, 5, "ee"), p2 = d.path + "/" + k2 + ".kvc";
  fs::create_directory(p2);
  msg = error_of([&] { tier->get(k2); });
  EXPECT_NE(msg.find(p2), std::string::npos) << msg;
  msg = error_of([&] { tier->put(k2, "x"); });
  EXPECT_NE(msg.find(p2), std::string::npos) << msg;
  msg = error_of([&] { tier->erase(k2); });
  EXPECT_NE(msg.find(p2), std::string::npos) << msg;
  // The failed put left no temporary file.
  for (const auto& n : names_in(d.path)) EXPECT_NE(n.rfind(".tmp-", 0), 0u) << n;

  // A symbolic link is not followed.
  const std::string k3 = key_of(kSpec, 6, "ff"), p3 = d.path + "/" + k3 + ".kvc";
  ASSERT_EQ(symlink("/etc/hostname", p3.c_str()), 0);
  msg = error_of([&] { tier->get(k3); });
  EXPECT_NE(msg.find(p3), std::string::npos) << msg;
}

TEST(ContextTierDir, UnusableDirectoriesAreErrors) {
  TempDir d;
  const std::string file = d.path + "/file";
  std::ofstream(file) << "x";
  std::string msg = error_of([&] { make_dir_tier(file); });
  EXPECT_NE(msg.find(file), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a directory"), std::string::npos) << msg;
  msg = error_of([&] { make_dir_tier(file + "/sub"); });
  EXPECT_NE(msg.find(file + "/sub"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { make_dir_tier(""); }).find("empty"), std::string::npos);

  if (geteuid() != 0) {
    // Permissions bind everyone but root.
    const std::string ro = d.path + "/ro";
    fs::create_directory(ro);
    auto tier = make_dir_tier(ro);
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    msg = error_of([&] { make_dir_tier(ro); });
    EXPECT_NE(msg.find(ro), std::string::npos) << msg;
    EXPECT_NE(msg.find("not writable"), std::string::npos) << msg;
    msg = error_of([&] { tier->put(key_of(kSpec, 1, "aa"), "x"); });
    EXPECT_NE(msg.find(ro), std::string::npos) << msg;
    EXPECT_NE(msg.find("Permission denied"), std::string::npos) << msg;
    msg = error_of([&] { make_dir_tier(ro + "/sub"); });
    EXPECT_NE(msg.find(ro + "/sub"), std::string::npos) << msg;
  } else if (fs::is_directory("/sys/kernel")) {
    // sysfs refuses new files even to root.
    msg = error_of([&] { make_dir_tier("/sys/kernel"); });
    EXPECT_NE(msg.find("/sys/kernel"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not writable"), std::string::npos) << msg;
  }
}

TEST(ContextTierDir, LeftoversOfDeadWritersAreRemoved) {
  TempDir d;
  const std::string old_tmp = d.path + "/.tmp-" + key_of(kSpec, 1, "aa") + "-Ab12Cd";
  const std::string new_tmp = d.path + "/.tmp-" + key_of(kSpec, 2, "aa") + "-Ef34Gh";
  const std::string old_stale = d.path + "/.stale-0123";
  for (const auto& p : {old_tmp, new_tmp, old_stale}) std::ofstream(p) << "partial";
  const timespec two_hours_ago[2] = {{time(nullptr) - 7200, 0}, {time(nullptr) - 7200, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, old_tmp.c_str(), two_hours_ago, 0), 0);
  ASSERT_EQ(utimensat(AT_FDCWD, old_stale.c_str(), two_hours_ago, 0), 0);
  make_dir_tier(d.path);
  EXPECT_FALSE(fs::exists(old_tmp));
  EXPECT_FALSE(fs::exists(old_stale));
  EXPECT_TRUE(fs::exists(new_tmp));  // may be a live writer's
}

// ---------------------------------------------------------------------------------------------------
// Redis tier

std::string find_redis_server() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string p = dir + "/redis-server";
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  close(fd);
  return ntohs(a.sin_port);
}

bool accepts(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(uint16_t(port));
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  close(fd);
  return ok;
}

/// A redis-server of the test's own on 127.0.0.1:port, without persistence, in a temporary directory.
class RedisServer {
 public:
  RedisServer(std::string binary, int port, std::vector<std::string> extra = {})
      : binary_(std::move(binary)), port_(port), extra_(std::move(extra)) {
    start();
  }
  ~RedisServer() { kill(SIGKILL); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }

  void start() {
    std::vector<std::string> args = {binary_,    "--port", std::to_string(port_), "--bind", "127.0.0.1",
                                     "--save",   "",       "--appendonly",       "no",     "--dir",
                                     dir_.path,  "--logfile", dir_.path + "/redis.log"};
    args.insert(args.end(), extra_.begin(), extra_.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    const int rc = posix_spawn(&pid_, binary_.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) throw std::runtime_error("cannot start redis-server");
    const auto t0 = Clock::now();
    while (!accepts(port_)) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("redis-server exited at start: " + read_file(dir_.path + "/redis.log"));
      }
      if (seconds_since(t0) > 10) throw std::runtime_error("redis-server did not listen within 10 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  void kill(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    if (sig == SIGKILL || sig == SIGTERM) {
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

 private:
  std::string binary_;
  int port_;
  std::vector<std::string> extra_;
  TempDir dir_;
  pid_t pid_ = -1;
};

/// The test's own Redis client, to look at what the tier stored.
class RawRedis {
 public:
  explicit RawRedis(int port, const std::string& password = "") {
    c_ = redisConnect("127.0.0.1", port);
    if (!c_ || c_->err) throw std::runtime_error("raw client cannot connect");
    if (!password.empty()) cmd({"AUTH", password});
  }
  ~RawRedis() { redisFree(c_); }
  /// The reply as text: a string or status as is, an integer in decimal, nil as "(nil)", an array's
  /// elements joined by '\n'.
  std::string cmd(const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(redisCommandArgv(c_, int(argv.size()), argv.data(), lens.data()));
    if (!r) throw std::runtime_error("raw client: no reply");
    const std::string out = text(r);
    freeReplyObject(r);
    return out;
  }
  std::vector<std::string> keys(const std::string& pattern) {
    std::vector<std::string> out;
    std::stringstream s(cmd({"KEYS", pattern}));
    for (std::string k; std::getline(s, k);) out.push_back(k);
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  static std::string text(const redisReply* r) {
    switch (r->type) {
      case REDIS_REPLY_INTEGER: return std::to_string(r->integer);
      case REDIS_REPLY_NIL: return "(nil)";
      case REDIS_REPLY_ARRAY: {
        std::string s;
        for (size_t i = 0; i < r->elements; ++i) s += (i ? "\n" : "") + text(r->element[i]);
        return s;
      }
      default: return std::string(r->str, r->len);
    }
  }
  redisContext* c_ = nullptr;
};

class ContextTierRedis : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    binary_ = find_redis_server();
    if (!binary_.empty()) server_ = std::make_unique<RedisServer>(binary_, free_port());
  }
  static void TearDownTestSuite() { server_.reset(); }
  void SetUp() override {
    if (binary_.empty()) GTEST_SKIP() << "redis-server not installed (Debian redis-server)";
    RawRedis(server_->port()).cmd({"FLUSHALL"});
  }
  static RedisTierOptions options(int port, const std::string& path = "") {
    RedisTierOptions o;
    o.url = "redis://127.0.0.1:" + std::to_string(port) + path;
    o.prefix = "t:";
    o.chunk_bytes = 1000;
    o.timeout_s = 0.5;
    return o;
  }
  int port() const { return server_->port(); }
  std::string where() const { return "127.0.0.1:" + std::to_string(port()); }

  static inline std::string binary_;
  static inline std::unique_ptr<RedisServer> server_;
};

TEST_F(ContextTierRedis, RoundTripInChunks) {
  auto tier = make_redis_tier(options(port()));
  EXPECT_STREQ(tier->name(), "redis");
  RawRedis raw(port());
  const std::string key = key_of(kSpec, 40, "00112233aabbccdd"), head = "t:ctx:" + key;
  EXPECT_EQ(tier->get(key), std::nullopt);

  const std::string a = random_bytes(10000, 3);
  tier->put(key, a);
  EXPECT_EQ(tier->get(key), a);
  // Ten values of 1000 bytes under one generation, and the head naming it, the count and the size.
  const std::string gen = raw.cmd({"GET", head}).substr(0, raw.cmd({"GET", head}).find(' '));
  EXPECT_EQ(raw.cmd({"GET", head}), gen + " 10 10000");
  auto chunks = raw.keys(head + ":*");
  ASSERT_EQ(chunks.size(), 10u);
  std::string joined;
  for (int i = 0; i < 10; ++i) {
    const std::string v = raw.cmd({"GET", head + ":" + gen + ":" + std::to_string(i)});
    EXPECT_EQ(v.size(), 1000u);
    joined += v;
  }
  EXPECT_EQ(joined, a);
  EXPECT_EQ(raw.cmd({"PTTL", head}), "-1");  // no TTL asked

  // Replacing: the new image, and the old generation's values are gone.
  const std::string b = random_bytes(5500, 4);
  tier->put(key, b);
  EXPECT_EQ(tier->get(key), b);
  EXPECT_EQ(raw.keys(head + ":*").size(), 6u);
  EXPECT_EQ(raw.keys(head + ":" + gen + ":*").size(), 0u);

  for (size_t n : {0, 1, 999, 1000, 1001}) {
    const std::string img = random_bytes(n, 10 + n);
    tier->put(key, img);
    EXPECT_EQ(tier->get(key), img) << n;
    EXPECT_EQ(raw.keys(head + ":*").size(), (n + 999) / 1000) << n;
  }

  // Hundreds of chunks (asked for in several batches), then replaced and erased.
  auto o = options(port());
  o.chunk_bytes = 10;
  auto small = make_redis_tier(o);
  const std::string c = random_bytes(6005, 13);
  small->put(key, c);
  EXPECT_EQ(raw.keys(head + ":*").size(), 601u);
  EXPECT_EQ(small->get(key), c);
  EXPECT_EQ(tier->get(key), c);  // a reader with another chunk size reads it too
  small->put(key, b);
  EXPECT_EQ(raw.keys(head + ":*").size(), 550u);
  EXPECT_EQ(tier->get(key), b);

  tier->erase(key);
  EXPECT_EQ(tier->get(key), std::nullopt);
  EXPECT_TRUE(raw.keys(head + "*").empty());
  EXPECT_NO_THROW(tier->erase(key));
}

TEST_F(ContextTierRedis, IncompleteEntriesAreMisses) {
  auto tier = make_redis_tier(options(port()));
  RawRedis raw(port());
  const std::string key = key_of(kSpec, 7, "77"), head = "t:ctx:" + key;
  tier->put(key, random_bytes(10000, 5));
  const std::string h = raw.cmd({"GET", head}), gen = h.substr(0, h.find(' '));
  raw.cmd({"DEL", head + ":" + gen + ":4"});
  EXPECT_EQ(tier->get(key), std::nullopt);

  tier->put(key, random_bytes(10000, 6));
  const std::string h2 = raw.cmd({"GET", head}), gen2 = h2.substr(0, h2.find(' '));
  raw.cmd({"SET", head, gen2 + " 10 9999"});  // the sizes do not add up
  EXPECT_EQ(tier->get(key), std::nullopt);
  raw.cmd({"SET", head, "not a head"});
  EXPECT_EQ(tier->get(key), std::nullopt);
  raw.cmd({"SET", head, gen2 + " 11 10000"});  // a chunk past the last
  EXPECT_EQ(tier->get(key), std::nullopt);
  // A head naming far more chunks than exist costs one batch of lookups, not one per chunk named.
  raw.cmd({"SET", head, gen2 + " 100000000 100000000"});
  const auto t0 = Clock::now();
  EXPECT_EQ(tier->get(key), std::nullopt);
  tier->erase(key);
  EXPECT_LT(seconds_since(t0), 1.0);
  EXPECT_TRUE(raw.keys(head + "*").empty());
}

TEST_F(ContextTierRedis, EntriesExpire) {
  auto o = options(port());
  o.ttl_s = 0.5;
  auto tier = make_redis_tier(o);
  RawRedis raw(port());
  const std::string key = key_of(kSpec, 8, "88"), head = "t:ctx:" + key;
  const std::string img = random_bytes(2500, 7);
  tier->put(key, img);
  EXPECT_EQ(tier->get(key), img);
  std::vector<std::string> all = raw.keys("t:*");
  EXPECT_EQ(all.size(), 5u);  // head, 3 chunks, the spec's length set
  for (const auto& k : all) {
    const int ttl = std::stoi(raw.cmd({"PTTL", k}));
    EXPECT_GT(ttl, 0) << k;
    EXPECT_LE(ttl, 500) << k;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(650));
  EXPECT_EQ(tier->get(key), std::nullopt);
  EXPECT_TRUE(raw.keys("t:*").empty());
}

TEST_F(ContextTierRedis, Lengths) {
  auto tier = make_redis_tier(options(port()));
  EXPECT_TRUE(tier->lengths(kSpec).empty());
  tier->put(key_of(kSpec, 5, "aaaa"), "1");
  tier->put(key_of(kSpec, 12, "bbbb"), "2");
  tier->put(key_of(kSpec, 12, "cccc"), "3");
  tier->put(key_of(kSpec, 100, "dddd"), "4");
  tier->put(key_of("fedcba9876543210", 7, "eeee"), "5");
  EXPECT_EQ(tier->lengths(kSpec), (std::vector<int>{100, 12, 5}));
  EXPECT_EQ(tier->lengths("fedcba9876543210"), std::vector<int>{7});
  EXPECT_TRUE(tier->lengths("ffffffffffffffff").empty());
  // Another prefix is another store.
  auto o = options(port());
  o.prefix = "other:";
  EXPECT_TRUE(make_redis_tier(o)->lengths(kSpec).empty());
}

TEST_F(ContextTierRedis, LocksBetweenReplicas) {
  auto a = make_redis_tier(options(port())), b = make_redis_tier(options(port()));
  RawRedis raw(port());
  const std::string key = key_of(kSpec, 9, "99");
  EXPECT_TRUE(a->try_lock(key, 30));
  EXPECT_NE(raw.cmd({"GET", "t:lock:" + key}), "(nil)");
  EXPECT_FALSE(b->try_lock(key, 30));
  b->unlock(key);
  EXPECT_FALSE(b->try_lock(key, 30));
  a->unlock(key);
  EXPECT_EQ(raw.cmd({"GET", "t:lock:" + key}), "(nil)");
  EXPECT_TRUE(b->try_lock(key, 30));
  b->unlock(key);

  const std::string k2 = key_of(kSpec, 10, "aa");
  EXPECT_TRUE(a->try_lock(k2, 0.5));
  EXPECT_FALSE(b->try_lock(k2, 30));
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_TRUE(b->try_lock(k2, 30));
  a->unlock(k2);  // expired: b's lock stays
  EXPECT_NE(raw.cmd({"GET", "t:lock:" + k2}), "(nil)");
  EXPECT_FALSE(a->try_lock(k2, 30));
  b->unlock(k2);
  EXPECT_TRUE(a->try_lock(k2, 30));
  a->unlock(k2);
}

TEST_F(ContextTierRedis, ConcurrentReplaceNeverMixes) {
  auto writer = make_redis_tier(options(port())), reader = make_redis_tier(options(port()));
  const std::string key = key_of(kSpec, 11, "bb");
  const std::string a = random_bytes(10000, 8), b = random_bytes(7000, 9);
  writer->put(key, a);
  std::atomic<bool> stop{false};
  std::thread w([&] {
    for (int i = 0; i < 150 && !stop; ++i) writer->put(key, i % 2 ? a : b);
  });
  int seen_a = 0, seen_b = 0, misses = 0;
  for (int i = 0; i < 300; ++i) {
    const auto got = reader->get(key);
    if (!got)
      ++misses;
    else if (*got == a)
      ++seen_a;
    else if (*got == b)
      ++seen_b;
    else
      ADD_FAILURE() << "a mix of two images, " << got->size() << " bytes";
  }
  stop = true;
  w.join();
  EXPECT_GT(seen_a + seen_b, 0);
  // Several threads on one tier object.
  std::vector<std::thread> ts;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&, t] {
      const std::string k = key_of(kSpec, 20 + t, "cc"), img = random_bytes(3000, 100 + t);
      for (int i = 0; i < 20; ++i) {
        writer->put(k, img);
        if (writer->get(k) != img) ++wrong;
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST_F(ContextTierRedis, DatabaseSelection) {
  auto db3 = make_redis_tier(options(port(), "/3")), db0 = make_redis_tier(options(port()));
  const std::string key = key_of(kSpec, 12, "dd");
  db3->put(key, "in three");
  EXPECT_EQ(db3->get(key), "in three");
  EXPECT_EQ(db0->get(key), std::nullopt);
  RawRedis raw(port());
  EXPECT_EQ(raw.cmd({"EXISTS", "t:ctx:" + key}), "0");
  raw.cmd({"SELECT", "3"});
  EXPECT_EQ(raw.cmd({"EXISTS", "t:ctx:" + key}), "1");
  raw.cmd({"FLUSHDB"});
  // A database the server does not have.
  const std::string msg = error_of([&] { make_redis_tier(options(port(), "/99"))->get(key); });
  EXPECT_NE(msg.find("SELECT 99"), std::string::npos) << msg;
  EXPECT_NE(msg.find(where()), std::string::npos) << msg;
}

TEST_F(ContextTierRedis, Password) {
  // '@', '/' and ':' in the password, percent-encoded in the URL.
  RedisServer locked(binary_, free_port(), {"--requirepass", "p@ss/w:rd"});
  const std::string at = "127.0.0.1:" + std::to_string(locked.port());
  RedisTierOptions o = options(locked.port());
  o.url = "redis://:p%40ss%2Fw%3Ard@" + at;
  auto tier = make_redis_tier(o);
  const std::string key = key_of(kSpec, 13, "ee"), img = random_bytes(4000, 11);
  tier->put(key, img);
  EXPECT_EQ(tier->get(key), img);
  EXPECT_EQ(RawRedis(locked.port(), "p@ss/w:rd").cmd({"EXISTS", "t:ctx:" + key}), "1");

  o.url = "redis://" + at;
  std::string msg = error_of([&] { make_redis_tier(o)->get(key); });
  EXPECT_NE(msg.find(at), std::string::npos) << msg;
  EXPECT_NE(msg.find("NOAUTH"), std::string::npos) << msg;

  o.url = "redis://:wrongsecret@" + at;
  msg = error_of([&] { make_redis_tier(o)->put(key, "x"); });
  EXPECT_NE(msg.find(at), std::string::npos) << msg;
  EXPECT_NE(msg.find("AUTH"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("wrongsecret"), std::string::npos) << msg;
  // The stored entry is untouched.
  EXPECT_EQ(tier->get(key), img);
}

TEST_F(ContextTierRedis, ServerDownTimesOutAndRecovers) {
  const int p = free_port();
  RedisServer own(binary_, p);
  const std::string at = "127.0.0.1:" + std::to_string(p);
  auto tier = make_redis_tier(options(p));  // timeout 0.5 s
  const std::string key = key_of(kSpec, 14, "ff"), img = random_bytes(5000, 12);
  tier->put(key, img);
  ASSERT_EQ(tier->get(key), img);

  // Killed: every call fails at once with the store named; unlock does not throw.
  own.kill(SIGKILL);
  for (int i = 0; i < 2; ++i) {
    auto t0 = Clock::now();
    std::string msg = error_within([&] { tier->get(key); }, std::chrono::milliseconds(3000));
    EXPECT_LT(seconds_since(t0), 1.5);
    EXPECT_NE(msg.find("redis " + at), std::string::npos) << msg;
    t0 = Clock::now();
    msg = error_within([&] { tier->put(key, img); }, std::chrono::milliseconds(3000));
    EXPECT_LT(seconds_since(t0), 1.5);
    EXPECT_NE(msg.find(at), std::string::npos) << msg;
  }
  EXPECT_NE(error_of([&] { tier->lengths(kSpec); }).find(at), std::string::npos);
  EXPECT_NE(error_of([&] { tier->erase(key); }).find(at), std::string::npos);
  EXPECT_NE(error_of([&] { tier->try_lock(key, 1); }).find(at), std::string::npos);
  EXPECT_NO_THROW(tier->unlock(key));

  // Restarted on the same port (empty: no persistence): the same tier object works again.
  own.start();
  EXPECT_EQ(tier->get(key), std::nullopt);
  tier->put(key, img);
  EXPECT_EQ(tier->get(key), img);

  // Stopped (it accepts connections but never answers): the call gives up after the timeout.
  own.kill(SIGSTOP);
  auto t0 = Clock::now();
  std::string msg = error_within([&] { tier->get(key); }, std::chrono::milliseconds(5000));
  const double took = seconds_since(t0);
  own.kill(SIGCONT);
  EXPECT_GE(took, 0.4);
  EXPECT_LT(took, 2.0);
  EXPECT_NE(msg.find(at), std::string::npos) << msg;
  EXPECT_NE(msg.find("no answer within 0.5 s"), std::string::npos) << msg;
  EXPECT_EQ(tier->get(key), img);
}

TEST_F(ContextTierRedis, NothingListening) {
  const int p = free_port();
  auto tier = make_redis_tier(options(p));
  const auto t0 = Clock::now();
  const std::string msg = error_within([&] { tier->get(key_of(kSpec, 1, "aa")); }, std::chrono::milliseconds(3000));
  EXPECT_LT(seconds_since(t0), 1.5);
  EXPECT_NE(msg.find("redis 127.0.0.1:" + std::to_string(p)), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot connect"), std::string::npos) << msg;
}

TEST(ContextTierRedisUrl, MalformedUrlsAreErrorsNamingThem) {
  struct Case {
    const char* url;
    const char* why;
    const char* shown = nullptr;  // the URL as the message quotes it, when not as given (a password)
  };
  for (const Case& c : {Case{"http://127.0.0.1:6379", "scheme"}, Case{"rediss://h:6379", "TLS"},
                        Case{"redis://", "no host"}, Case{"redis://:6379", "no host"},
                        Case{"redis://h:0", "port \"0\""}, Case{"redis://h:65536", "port \"65536\""},
                        Case{"redis://h:", "port \"\""}, Case{"redis://h:63a", "port \"63a\""},
                        Case{"redis://h:6379/x", "database \"x\""}, Case{"redis://h:6379/1/2", "database \"1/2\""},
                        Case{"redis://h:6379?db=1", "query"},
                        Case{"redis://:@h", "password is empty", "redis://:***@h"},
                        Case{"redis://user@h", "no ':'", "redis://***@h"},
                        Case{"redis://:pw%zz@h", "'%'", "redis://:***@h"}, Case{"redis://h h:1", "host \"h h\""},
                        Case{"redis://[::1:6379", "no ']'"}, Case{"redis://[::1]x", "after the IPv6"},
                        Case{"", "scheme"}}) {
    RedisTierOptions o;
    o.url = c.url;
    const std::string msg = error_of([&] { make_redis_tier(o); });
    EXPECT_NE(msg.find(std::string("\"") + (c.shown ? c.shown : c.url) + "\""), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.why), std::string::npos) << msg;
  }
  // The password is never shown.
  RedisTierOptions o;
  o.url = "redis://:topsecret@h:99999";
  std::string msg = error_of([&] { make_redis_tier(o); });
  EXPECT_EQ(msg.find("topsecret"), std::string::npos) << msg;
  EXPECT_NE(msg.find("redis://:***@h:99999"), std::string::npos) << msg;
  o.url = "redis://admin:topsecret@h/x";
  msg = error_of([&] { make_redis_tier(o); });
  EXPECT_EQ(msg.find("topsecret"), std::string::npos) << msg;
  EXPECT_NE(msg.find("redis://admin:***@h/x"), std::string::npos) << msg;
}

TEST(ContextTierRedisUrl, GoodUrlsAndOptions) {
  // Parsed without connecting: nothing listens there.
  for (const char* url : {"redis://localhost", "redis://127.0.0.1:6380/2", "redis://:pw@h:1/0", "redis://u:p@h",
                          "redis://[::1]:6380/1", "redis://[::1]", "redis://h/"}) {
    RedisTierOptions o;
    o.url = url;
    EXPECT_NO_THROW(make_redis_tier(o)) << url;
  }
  RedisTierOptions o;
  o.url = "redis://h";
  o.timeout_s = 0;
  EXPECT_NE(error_of([&] { make_redis_tier(o); }).find("timeout"), std::string::npos);
  o.timeout_s = 1;
  o.ttl_s = -1;
  EXPECT_NE(error_of([&] { make_redis_tier(o); }).find("TTL"), std::string::npos);
  o.ttl_s = 0;
  o.chunk_bytes = 0;
  EXPECT_NE(error_of([&] { make_redis_tier(o); }).find("chunk size"), std::string::npos);
  // Keys are checked before any connection is tried.
  o.chunk_bytes = 1000;
  auto tier = make_redis_tier(o);
  EXPECT_NE(error_of([&] { tier->get("../x"); }).find("is not valid"), std::string::npos);
  EXPECT_NE(error_of([&] { tier->put("A", "x"); }).find("is not valid"), std::string::npos);
  EXPECT_NE(error_of([&] { tier->lengths("x y"); }).find("is not valid"), std::string::npos);
  EXPECT_NE(error_of([&] { tier->try_lock("a\nb", 1); }).find("is not valid"), std::string::npos);
}

}  // namespace
