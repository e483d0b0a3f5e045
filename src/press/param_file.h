#pragma once
// Reading a press parameter that names a file (qfilter filters=, expected_attention stats=,
// fastkvzip gates=, duo_attention labels=, kvzap surrogate=, latent file=, lukv curve=).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "kvslim/error.h"
#include "press/authoring.h"

namespace kvslim {

/// The value of `key` (a file path; "" when not given). A path that cannot be opened for reading
/// throws kvslim::Error naming the press, the parameter and the reason, e.g. "press qfilter:
/// filters=nosuch.gguf: cannot open file: No such file or directory" (the file's loader would
/// report it as a missing model file).
inline std::string param_file(const PressParams& p, const std::string& press, const std::string& key) {
  std::string path = param_str(p, press, key);
  if (path.empty()) return path;
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0)
    throw Error(fmt::format("press {}: {}={}: cannot open file: {}", press, key, path, std::strerror(errno)));
  ::close(fd);
  return path;
}

}  // namespace kvslim
