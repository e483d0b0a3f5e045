#pragma once
// The main job in one call: prefill a context, compress it with a press, append the question,
// decode. A thin wrapper over Request (kvslim/request.h), which every job shares.
#include <functional>
#include <string>
#include <vector>

#include "kvslim/press.h"
#include "kvslim/request.h"
#include "kvslim/sampling.h"

namespace kvslim {

/// A request's options (session, chunking, generation length, sampling, stop strings,
/// auto-budget) and the job's text.
struct GenerateOptions : RequestOptions {
  std::string context;      ///< compressed by the press
  /// When not empty, the context as tokens, used instead of tokenizing `context` (a chat
  /// template's output, whose special tokens the plain tokenization would not parse).
  std::vector<Token> context_tokens;
  std::string question;     ///< appended after compression, never compressed (may be empty)
};

/// Measured from the cache, never computed from the request.
using GenerateStats = RequestStats;

struct GenerateResult {
  std::string text;
  std::vector<Token> tokens;   ///< sampled tokens, end-of-generation included
  GenerateStats stats;
  FinishReason finish = FinishReason::None;
};

/// Runs the job through one Request. `on_text` receives each generated piece as soon as it is
/// sampled. Throws kvslim::Error for an empty context or a prompt longer than the context size.
GenerateResult generate(const Model& model, Press& press, const GenerateOptions& opt,
                        const std::function<void(const std::string&)>& on_text = nullptr);

}  // namespace kvslim
