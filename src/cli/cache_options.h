#pragma once
// The KV cache flags shared by subcommands that run a model: --cache-type-k/-v (llama.cpp's names),
// --kivi-bits/--kivi-group/--kivi-residual and --kv-hadamard.
#include <CLI/CLI.hpp>
#include <string>

#include "tools/tools.h"


namespace kvslim::cli {

/// Registers the cache flags on `sub`, storing into the given variables (which must outlive the
/// parse). Incompatible combinations (unknown types, KIVI with q8_0/q4_0, KIVI options without
/// --kivi-bits, bits other than 2/4) are rejected while the arguments are parsed, as a
/// CLI::ValidationError whose message names the flags.
void add_cache_options(CLI::App* sub, std::string& cache_type_k, std::string& cache_type_v, KVQuantOptions& q);

}  // namespace kvslim::cli
