#pragma once
// The flags shared by the subcommands that learn a file from text files (restorekv-train,
// fastkvzip-train, qfilter-calibrate, lukv-curve, ea-stats): one spelling, meaning and check each.
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "kvslim/model.h"

namespace kvslim::cli {

/// What those subcommands share: the model, the text they learn from, the file they write, and
/// how they run.
struct TrainerArgs {
  std::string model;              ///< -m,--model GGUF (required)
  ModelLoadOptions load;          ///< --rope-* / --yarn-* over the model's RoPE settings
  std::vector<std::string> text;  ///< -f,--file: one or more text files (required)
  std::string out;                ///< -o,--out: the GGUF file written (required)
  std::string json;               ///< --json FILE|-: a JSON summary ("-" = stdout, which then holds only it)
  int threads = 0;                ///< -t,--threads (0 = all cores)
  bool no_progress = false;       ///< --no-progress
};

/// Adds -m, -f/--file (described by `text_help`) and -o/--out (`out_help`) to `sub`, all required.
/// Returns the -f option, e.g. for `->expected(1)` where one file is taken.
CLI::Option* add_trainer_io_options(CLI::App* sub, TrainerArgs& a, const std::string& text_help,
                                    const std::string& out_help);

/// Adds -t/--threads, --json and --no-progress (after the subcommand's own options in --help).
void add_trainer_run_options(CLI::App* sub, TrainerArgs& a);

}  // namespace kvslim::cli
