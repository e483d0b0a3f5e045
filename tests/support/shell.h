#pragma once
// Building command lines for the tests that run the CLI through the shell.
#include <string>

/// `s` as one single-quoted shell word (a quote inside becomes '\'').
inline std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}
