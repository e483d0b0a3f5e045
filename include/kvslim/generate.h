#pragma once
// The main job in one call: prefill a context, compress it with a press, append the question,
// decode. A thin wrapper over Request (kvslim/request.h), which every job shares.
#include <functional>
#include <string>
#include <vector>

#include "kvslim/press.h"
#include "kvslim/request.h"
#include "kvslim/sampling.h"
#include "kvslim/session.h"

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

/// Prefills `tokens` into `session` and applies `press` (after every `chunk_size` tokens when
/// > 0, else once at the end), resetting the press first: the prefill half of a Request, for
/// callers that hold a bare Session (press calibration, tests). Returns the logits of the last
/// token. `peak_bytes` receives the largest cache size observed.
std::vector<float> prefill_and_compress(Session& session, Press& press, const std::vector<Token>& tokens,
                                        int chunk_size, size_t* peak_bytes = nullptr, double* press_seconds = nullptr);

}  // namespace kvslim
