// The directory tier of stored contexts (--context-dir): one file per entry, shared by every process
// that names the same directory (also over NFS: only rename, O_EXCL and link are relied on).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <set>

#include <fmt/format.h>

#include "kvslim/error.h"
#include "server/context_tier.h"
#include "server/context_tier_key.h"

namespace kvslim::server {

namespace {

constexpr const char* kTier = "dir";  // in key errors and name()
// Temporary files of writers that died (".tmp-*", ".stale-*") are removed when a tier opens the
// directory and they are older than this; a live writer renames its file long before.
constexpr auto kLeftoverAge = std::chrono::hours(1);
// A lock file is created empty and its expiry written just after; one that stays without a readable
// expiry this long belongs to a process that died in between.
constexpr int64_t kUnreadableLockGraceMs = 10'000;

std::string errno_text(int e) { return std::strerror(e); }

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string random_hex() {
  static std::mutex mu;
  static std::mt19937_64 gen{[] {
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ rd() ^ uint64_t(getpid());
  }()};
  std::lock_guard<std::mutex> lock(mu);
  return fmt::format("{:016x}{:016x}", gen(), gen());
}

/// Closes a descriptor when it goes out of scope.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  /// close(2) with its error (a write-back error of NFS shows up only here).
  int close() {
    const int r = ::close(fd);
    fd = -1;
    return r;
  }
};

/// Removes a temporary file unless it was renamed into place.
struct TempFile {
  std::string path;
  ~TempFile() {
    if (!path.empty()) ::unlink(path.c_str());
  }
};

class DirTier : public ContextTier {
 public:
  explicit DirTier(std::string dir) : dir_(std::move(dir)) {}

  const char* name() const override { return kTier; }

  std::optional<std::string> get(const std::string& key) override {
    tier_key::check(key, kTier, "key");
    const std::string path = entry_path(key);
    Fd f(open_regular(path));
    if (f.fd < 0) return std::nullopt;
    struct stat st{};
    if (::fstat(f.fd, &st) != 0) fail(path, "cannot stat", errno);
    std::string image;
    image.reserve(size_t(st.st_size));
    char buf[1 << 16];
    for (;;) {
      const ssize_t n = ::read(f.fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail(path, "cannot read", errno);
      if (n == 0) break;
      image.append(buf, size_t(n));
    }
    return image;
  }

  void put(const std::string& key, const std::string& image) override {
    tier_key::check(key, kTier, "key");
    const std::string path = entry_path(key);
    TempFile tmp{dir_ + "/.tmp-" + key + "-XXXXXX"};
    Fd f(::mkostemp(tmp.path.data(), O_CLOEXEC));
    if (f.fd < 0) {
      const int e = errno;
      tmp.path.clear();
      fail(dir_, "cannot create a temporary file", e);
    }
    // mkostemp makes the file 0600; other replicas may run as other users of a shared group.
    ::fchmod(f.fd, 0644);
    const char* p = image.data();
    size_t left = image.size();
    while (left > 0) {
      const ssize_t n = ::write(f.fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail(tmp.path, "cannot write", errno);
      p += n;
      left -= size_t(n);
    }
    // The data must be on disk before the rename makes it visible, or a crash could leave a whole-
    // looking name with missing blocks.
    if (::fsync(f.fd) != 0) fail(tmp.path, "cannot fsync", errno);
    if (f.close() != 0) fail(tmp.path, "cannot close", errno);
    if (::rename(tmp.path.c_str(), path.c_str()) != 0) fail(path, "cannot rename " + tmp.path + " to it", errno);
    tmp.path.clear();
    sync_dir();
  }

  void erase(const std::string& key) override {
    tier_key::check(key, kTier, "key");
    const std::string path = entry_path(key);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) fail(path, "cannot remove", errno);
  }

  std::vector<int> lengths(const std::string& spec) override {
    tier_key::check(spec, kTier, "spec");
    std::set<int, std::greater<int>> found;
    DIR* d = ::opendir(dir_.c_str());
    if (!d) fail(dir_, "cannot list", errno);
    for (;;) {
      errno = 0;
      const dirent* e = ::readdir(d);
      if (!e) {
        const int err = errno;
        ::closedir(d);
        if (err != 0) fail(dir_, "cannot list", err);
        break;
      }
      std::string_view n(e->d_name);
      if (n.size() <= 4 || n.substr(n.size() - 4) != ".kvc") continue;
      n.remove_suffix(4);
      if (!tier_key::valid(n)) continue;
      if (auto parts = tier_key::parse(n); parts && parts->spec == spec) found.insert(parts->tokens);
    }
    return {found.begin(), found.end()};
  }

  bool try_lock(const std::string& key, double ttl_s) override {
    tier_key::check(key, kTier, "key");
    if (!std::isfinite(ttl_s) || ttl_s <= 0 || ttl_s > 1e9)
      throw Error(
          fmt::format("context directory: lock time {} s for {} is not a positive number of seconds", ttl_s, key));
    const std::string path = lock_path(key);
    const std::string token = random_hex();
    // Two rounds: a stale lock moved aside leaves the path free for the create of the second.
    for (int round = 0; round < 2; ++round) {
      const int64_t expiry = now_ms() + std::max<int64_t>(1, std::llround(ttl_s * 1000));
      Fd f(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
      if (f.fd >= 0) {
        const std::string content = fmt::format("{} {}\n", expiry, token);
        if (::write(f.fd, content.data(), content.size()) != ssize_t(content.size()) || f.close() != 0) {
          const int e = errno;
          ::unlink(path.c_str());
          fail(path, "cannot write lock", e);
        }
        tokens_.put(key, token);
        return true;
      }
      if (errno != EEXIST) fail(path, "cannot create lock", errno);
      const LockFile held = read_lock(path);
      if (!held.exists) continue;  // released between the create and the read
      if (!held.stale(now_ms())) return false;
      if (!remove_if_unchanged(path, held.content)) return false;
    }
    return false;
  }

  void unlock(const std::string& key) override {
    const std::optional<std::string> held_token = tokens_.take(key);
    if (!held_token) return;
    const std::string& token = *held_token;
    // The lock expires by itself, so a failure here only delays the next builder: not worth an
    // exception out of what callers run on their way out.
    try {
      const std::string path = lock_path(key);
      const LockFile held = read_lock(path);
      if (held.exists && held.token == token) remove_if_unchanged(path, held.content);
    } catch (const Error&) {
    }
  }

  /// Creates nothing; checks that the directory is one and takes files (a probe file), and removes
  /// temporary files that dead writers left.
  void open_dir() {
    struct stat st{};
    if (::stat(dir_.c_str(), &st) != 0) fail(dir_, "cannot open", errno);
    if (!S_ISDIR(st.st_mode)) throw Error(fmt::format("context directory: {}: not a directory", dir_));
    {
      TempFile probe{dir_ + "/.tmp-probe-XXXXXX"};
      Fd f(::mkostemp(probe.path.data(), O_CLOEXEC));
      if (f.fd < 0) {
        const int e = errno;
        probe.path.clear();
        fail(dir_, "not writable", e);
      }
    }
    remove_leftovers();
  }

 private:
  struct LockFile {
    bool exists = false;
    std::string content, token;
    int64_t expiry_ms = -1;  // -1 when the content is not "<expiry> <token>"
    int64_t mtime_ms = 0;
    bool stale(int64_t now) const {
      return expiry_ms >= 0 ? expiry_ms <= now : mtime_ms + kUnreadableLockGraceMs <= now;
    }
  };

  std::string entry_path(const std::string& key) const { return dir_ + "/" + key + ".kvc"; }
  std::string lock_path(const std::string& key) const { return dir_ + "/" + key + ".lock"; }

  [[noreturn]] static void fail(const std::string& path, const std::string& what, int e) {
    throw Error(fmt::format("context directory: {}: {}: {}", path, what, errno_text(e)));
  }

  /// A descriptor of the regular file at `path`, or -1 when there is none. A FIFO, device, socket,
  /// directory or symbolic link there is an error: opened without blocking (a FIFO with no writer
  /// would hang a plain open) and checked before anything is read.
  static int open_regular(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return -1;
      if (errno == ELOOP) throw Error(fmt::format("context directory: {}: a symbolic link, not a regular file", path));
      fail(path, "cannot open", errno);
    }
    struct stat st{};
    if (::fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      fail(path, "cannot stat", e);
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      throw Error(fmt::format("context directory: {}: not a regular file", path));
    }
    return fd;
  }

  static LockFile read_lock(const std::string& path) {
    LockFile l;
    Fd f(open_regular(path));
    if (f.fd < 0) return l;
    l.exists = true;
    struct stat st{};
    if (::fstat(f.fd, &st) == 0) l.mtime_ms = int64_t(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1'000'000;
    char buf[256];
    const ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n < 0) fail(path, "cannot read", errno);
    l.content.assign(buf, size_t(n));
    const size_t sp = l.content.find(' ');
    if (sp == std::string::npos || l.content.empty() || l.content.back() != '\n') return l;
    int64_t expiry = 0;
    const auto r = std::from_chars(l.content.data(), l.content.data() + sp, expiry);
    if (r.ec != std::errc() || r.ptr != l.content.data() + sp || expiry < 0) return l;
    l.expiry_ms = expiry;
    l.token = l.content.substr(sp + 1, l.content.size() - sp - 2);
    return l;
  }

  /// Removes the lock file at `path` if it still holds `content`; returns whether it did. The file is
  /// first renamed to a name of this call's own, so of several processes that judged the same lock
  /// stale only one removes it. When what was moved is another process's newer lock (taken between
  /// the read and the rename), it is linked back; should a third process have taken the path in that
  /// instant, two processes build the same entry once, which costs time but stores nothing wrong.
  bool remove_if_unchanged(const std::string& path, const std::string& content) {
    const std::string aside = dir_ + "/.stale-" + random_hex();
    if (::rename(path.c_str(), aside.c_str()) != 0) {
      if (errno == ENOENT) return false;
      fail(path, "cannot move aside lock", errno);
    }
    TempFile remove_aside{aside};
    if (read_lock(aside).content == content) return true;
    ::link(aside.c_str(), path.c_str());
    return false;
  }

  /// Makes the rename of a new entry durable (the directory's own blocks).
  void sync_dir() const {
    Fd d(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (d.fd < 0) fail(dir_, "cannot open", errno);
    if (::fsync(d.fd) != 0 && errno != EINVAL) fail(dir_, "cannot fsync", errno);
  }

  void remove_leftovers() const {
    DIR* d = ::opendir(dir_.c_str());
    if (!d) return;
    const auto old = std::chrono::system_clock::now() - kLeftoverAge;
    const time_t old_s = std::chrono::system_clock::to_time_t(old);
    while (const dirent* e = ::readdir(d)) {
      const std::string_view n(e->d_name);
      if (n.rfind(".tmp-", 0) != 0 && n.rfind(".stale-", 0) != 0) continue;
      struct stat st{};
      const std::string p = dir_ + "/" + std::string(n);
      if (::lstat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_mtime < old_s) ::unlink(p.c_str());
    }
    ::closedir(d);
  }

  std::string dir_;
  tier_key::LockTokens tokens_;
};

}  // namespace

std::unique_ptr<ContextTier> make_dir_tier(const std::string& dir) {
  if (dir.empty()) throw Error("context directory: the path is empty");
  if (dir.find('\0') != std::string::npos) throw Error("context directory: the path contains a NUL byte");
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  struct stat st{};
  if (::stat(d.c_str(), &st) != 0) {
    // Parents too, as `mkdir -p`; an existing one of another user's is left as it is.
    for (size_t i = 1; i <= d.size(); ++i) {
      if (i < d.size() && d[i] != '/') continue;
      const std::string part = d.substr(0, i);
      if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST)
        throw Error(fmt::format("context directory: {}: cannot create: {}", part, errno_text(errno)));
    }
  }
  auto tier = std::make_unique<DirTier>(d);
  tier->open_dir();
  return tier;
}

}  // namespace kvslim::server
