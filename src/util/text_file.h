#pragma once
// Reading a text input file (a prompt, a corpus, an evaluation text, a JSON configuration) with
// the checks that come before reading it.
#include <cstddef>
#include <string>

namespace kvslim {

/// Largest text input read_text_file() accepts by default: 256 MiB (far above any context kvslim
/// runs: 2^24 tokens of text are about 64 MiB).
constexpr size_t kMaxTextFileBytes = size_t{256} << 20;

/// Whole contents of the file `path`; `what` names where the path came from in messages: the
/// parameter (text_config, chat_template_file), or in the CLI the flag the user typed ("-f").
/// "-" reads standard input. Before reading: a missing or unreadable path, a directory, or a file
/// larger than `max_bytes` -> kvslim::Error naming `what`, the path and the size; a pipe or
/// standard input is read up to `max_bytes` and fails the same way past it. An empty file (or
/// empty standard input) -> kvslim::Error as well, since every caller needs text.
std::string read_text_file(const std::string& path, const std::string& what, size_t max_bytes = kMaxTextFileBytes);

}  // namespace kvslim
