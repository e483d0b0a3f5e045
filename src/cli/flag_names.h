#pragma once
// Library errors name parameters (kivi_bits, n_ctx, SynthOptions::shape, ...), never command-line
// flags, so the same message serves the CLI, the server and the Python binding. The CLI shows the
// flag the user typed instead: every library error reaching main() goes through flags_in().
#include <string>

namespace kvslim::cli {

/// `message` with each library parameter name the CLI sets from a flag replaced by that flag
/// (kivi_bits -> --kivi-bits, n_ctx -> -c, SynthOptions::shape -> --shape; the table is in
/// flag_names.cpp and docs/ARCHITECTURE.md). Only whole names are replaced: not part of a longer
/// name, a dotted key (tokenizer.chat_template) or a quoted JSON key ("kivi_bits": 0).
std::string flags_in(std::string message);

}  // namespace kvslim::cli
