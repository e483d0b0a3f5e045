#pragma once
// A context longer than the model was trained on runs (the positions are valid RoPE angles), but
// the model never saw such positions, so its outputs may degrade: llama.cpp warns, and so do we.
#include <cstdint>

#include "kvslim/model.h"

namespace kvslim::cli {

/// Prints one warning line on stderr when n_ctx (tokens; 0 = the model's own) exceeds the
/// model's training context (GGUF `<arch>.context_length`). Never throws.
void warn_context_size(const Model& model, int64_t n_ctx);

}  // namespace kvslim::cli
