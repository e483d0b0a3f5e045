// read_text_file(): a text input checked (kind, size) before it is read.
#include "util/text_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include <fmt/format.h>

#include "kvslim/error.h"

namespace kvslim {

std::string read_text_file(const std::string& path, const std::string& source, size_t max_bytes) {
  const bool is_stdin = path == "-";
  const std::string what = is_stdin ? fmt::format("{} -: standard input", source) : fmt::format("{} {}", source, path);
  if (!is_stdin) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) throw Error(fmt::format("{}: cannot open file: {}", what, std::strerror(errno)));
    if (S_ISDIR(st.st_mode)) throw Error(fmt::format("{}: is a directory, expected a text file", what));
    if (S_ISREG(st.st_mode) && static_cast<unsigned long long>(st.st_size) > max_bytes)
      throw Error(fmt::format("{}: file of {} bytes is larger than the limit of {} bytes", what,
                              static_cast<unsigned long long>(st.st_size), max_bytes));
  }
  std::unique_ptr<FILE, int (*)(FILE*)> f(is_stdin ? stdin : std::fopen(path.c_str(), "rb"),
                                          is_stdin ? [](FILE*) { return 0; } : &std::fclose);
  if (!f) throw Error(fmt::format("{}: cannot open file: {}", what, std::strerror(errno)));
  std::string text;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) {
    if (text.size() + n > max_bytes)
      throw Error(fmt::format("{}: more than the limit of {} bytes", what, max_bytes));
    text.append(buf, n);
  }
  if (std::ferror(f.get())) throw Error(fmt::format("{}: read error", what));
  if (text.empty()) throw Error(fmt::format("{}: {} is empty, expected text", what, is_stdin ? "input" : "file"));
  return text;
}

}  // namespace kvslim
