#pragma once
// Reading a press parameter that names a file (qfilter filters=, expected_attention stats=,
// fastkvzip gates=, duo_attention labels=, kvzap surrogate=, latent file=, lukv curve=).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "kvslim/error.h"
#include "press/authoring.h"

namespace kvslim {

/// While it lives, press files on this thread must lie under `dir` (a server confines the files
/// a request's press spec may name: without it a client could make the server open any path).
/// Relative paths are taken from `dir`; `dir` "" refuses every press file, naming `option` (the
/// flag that allows them). Symbolic links out of `dir` are refused.
class PressFileConfinement {
 public:
  PressFileConfinement(std::string dir, std::string option)
      : dir_(std::move(dir)), option_(std::move(option)), outer_(current_) {
    current_ = this;
  }
  ~PressFileConfinement() { current_ = outer_; }
  PressFileConfinement(const PressFileConfinement&) = delete;
  PressFileConfinement& operator=(const PressFileConfinement&) = delete;

  /// The confinement of this thread, or nullptr.
  static const PressFileConfinement* current() { return current_; }

  /// `path` resolved under the directory. Throws kvslim::Error naming the press and parameter
  /// when files are refused or `path` leaves the directory (checked on the path's text before
  /// the file system is asked, so nothing outside is probed).
  std::string resolve(const std::string& path, const std::string& press, const std::string& key) const {
    namespace fs = std::filesystem;
    if (dir_.empty())
      throw Error(fmt::format("press {}: {}=: this server takes no press files from requests (start it with {} DIR "
                              "to allow files in DIR)",
                              press, key, option_));
    char buf[PATH_MAX];
    if (!::realpath(dir_.c_str(), buf))
      throw Error(fmt::format("{} {}: {}", option_, dir_, std::strerror(errno)));
    const fs::path root(buf);
    const fs::path p = fs::path(path).is_absolute() ? fs::path(path) : root / path;
    const fs::path lexical = p.lexically_normal();
    auto inside = [&](const fs::path& q) {
      const fs::path rel = q.lexically_relative(root);
      return !rel.empty() && *rel.begin() != "..";
    };
    const std::string refused = fmt::format("press {}: {}={}: not under the press files directory ({} {})", press,
                                            key, printable(path, 200), option_, root.string());
    if (!inside(lexical)) throw Error(refused);
    if (!::realpath(lexical.c_str(), buf))
      throw Error(fmt::format("press {}: {}={}: cannot open file: {}", press, key, printable(path, 200),
                              std::strerror(errno)));
    if (!inside(fs::path(buf))) throw Error(refused);  // a link pointing out
    return buf;
  }

 private:
  std::string dir_, option_;
  const PressFileConfinement* outer_;
  static inline thread_local const PressFileConfinement* current_ = nullptr;
};

/// The value of `key` (a file path; "" when not given). A path that cannot be opened for reading
/// throws kvslim::Error naming the press, the parameter and the reason, e.g. "press qfilter:
/// filters=nosuch.gguf: cannot open file: No such file or directory" (the file's loader would
/// report it as a missing model file). Under a PressFileConfinement, the path resolved there.
inline std::string param_file(const PressParams& p, const std::string& press, const std::string& key) {
  std::string path = param_str(p, press, key);
  if (path.empty()) return path;
  if (const PressFileConfinement* c = PressFileConfinement::current()) path = c->resolve(path, press, key);
  // O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer; only regular files are
  // press files.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    throw Error(fmt::format("press {}: {}={}: cannot open file: {}", press, key, path, std::strerror(errno)));
  struct stat st {};
  const bool regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  ::close(fd);
  if (!regular) throw Error(fmt::format("press {}: {}={}: not a regular file", press, key, path));
  return path;
}

}  // namespace kvslim
