// printable(): text from a file, made safe to echo in an error message.
#include <fmt/format.h>

#include "kvslim/error.h"

namespace kvslim {

namespace {

/// Length of the valid UTF-8 sequence starting at s[i] whose code point is printable (not C0, DEL
/// or C1), or 0 when the bytes there are not one.
size_t printable_sequence(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c >= 0x20 && c < 0x7f) return 1;
  size_t n;
  char32_t cp;
  if (c >= 0xc2 && c <= 0xdf) n = 2, cp = c & 0x1f;
  else if (c >= 0xe0 && c <= 0xef) n = 3, cp = c & 0x0f;
  else if (c >= 0xf0 && c <= 0xf4) n = 4, cp = c & 0x07;
  else return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3f);
  }
  const char32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min_cp[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;  // overlong, surrogate
  if (cp < 0xa0) return 0;                                                         // C1 controls
  return n;
}

}  // namespace

std::string printable(std::string_view text, size_t max_bytes) {
  std::string out;
  size_t i = 0;
  while (i < text.size() && out.size() < max_bytes) {
    const size_t n = printable_sequence(text, i);
    if (n > 0) {
      out.append(text.substr(i, n));
      i += n;
      continue;
    }
    const unsigned char c = static_cast<unsigned char>(text[i++]);
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default: out += fmt::format("\\x{:02x}", c);
    }
  }
  if (i < text.size()) out += fmt::format("...({} more bytes)", text.size() - i);
  return out;
}

}  // namespace kvslim
