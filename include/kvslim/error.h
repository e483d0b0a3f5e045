#pragma once
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace kvslim {

/// The one exception type of the library. The message names the file, field or value at fault,
/// so the CLI can print it as is and exit non-zero.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

/// `text` (from a file, a request or a command line) made safe to echo in an error message: bytes
/// that are not printable UTF-8 (C0 and C1 control characters, DEL, invalid or overlong
/// sequences) become \n, \r, \t or \xNN, so a message cannot drive the terminal; text longer than
/// `max_bytes` is cut (at a character boundary) and ends with "...(N more bytes)". Every error
/// message that quotes such text passes it through here.
std::string printable(std::string_view text, size_t max_bytes = 200);

}  // namespace kvslim
