#pragma once
// Where an evaluation result came from: the model file and its hash, the kvslim version, the
// command line and the shard. Written as the first line of samples.jsonl and into summary.json,
// so a result read later (or merged from many machines) names what produced it.
#include <cstdint>
#include <string>
#include <vector>

namespace kvslim {

struct RunInfo {
  std::string kind;             ///< "fidelity", "niah" or "ruler"
  std::string kvslim_version;
  std::string command;          ///< the full command line, shell-quoted
  std::string model;            ///< the model path as given
  std::string model_sha256;     ///< hex SHA-256 of the model file's bytes
  uint64_t model_bytes = 0;
  int shard_index = 0, shard_count = 1;
  size_t units = 0;             ///< runs in the whole sweep (all shards)
  /// The sweep's settings (presses, ratios, lengths, samples, seed, ...) as JSON object text, keys
  /// sorted (sweep_config writes it): shards merge only when these are equal.
  std::string config = "{}";
  /// Set by `eval merge` and MPI runs: the command lines of the parts a merged result came from.
  std::vector<std::string> merged_from;
};

/// Fills kind, version, command (command_line()), model path, size and SHA-256. Throws
/// kvslim::Error when the model file cannot be read.
RunInfo make_run_info(const std::string& kind, const std::string& model_path);

/// Hex SHA-256 of a file's bytes (OpenSSL). Throws kvslim::Error naming the file when it cannot
/// be read.
std::string sha256_file(const std::string& path);

/// This process's command line (from /proc/self/cmdline), each argument shell-quoted where it
/// needs it, so it can be pasted back into a shell. "" where /proc is not available.
std::string command_line();

/// Quotes one argument for a POSIX shell when it holds anything but [A-Za-z0-9_./:=,+@%-].
std::string shell_quote(const std::string& arg);


}  // namespace kvslim
