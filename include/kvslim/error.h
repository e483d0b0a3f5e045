#pragma once
#include <stdexcept>
#include <string>

namespace kvslim {

/// The one exception type of the library. The message names the file, field or value at fault,
/// so the CLI can print it as is and exit non-zero.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

}  // namespace kvslim
