#pragma once
// OpenAI's request and response shapes for /v1/completions and /v1/chat/completions: parsing and
// validation of a request body (every error names the field), and the JSON of responses, stream
// chunks and errors. No HTTP and no model work here, so each rule is testable on its own.
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvslim/error.h"
#include "kvslim/sampling.h"
#include "tools/tools.h"

namespace kvslim::server {

/// A request the server refuses: HTTP status, OpenAI error type ("invalid_request_error",
/// "authentication_error", "server_error", ...), the request field at fault ("" when none) and an
/// optional code ("context_length_exceeded", ...).
class ApiError : public Error {
 public:
  ApiError(int status, std::string message, std::string param = "", std::string type = "invalid_request_error",
           std::string code = "")
      : Error(message), status(status), param(std::move(param)), type(std::move(type)), code(std::move(code)) {}
  int status;
  std::string param, type, code;
};

/// {"error": {"message", "type", "param", "code"}} (param and code null when empty).
nlohmann::json error_json(const ApiError& e);

/// A validated completion or chat-completion request.
struct CompletionRequest {
  bool chat = false;
  std::string model;                      ///< as sent ("" when absent); any value is served by the one model
  std::string prompt;                     ///< /v1/completions: the context text
  std::vector<int32_t> prompt_tokens;     ///< /v1/completions: a prompt given as token ids
  std::vector<ChatMessage> messages;      ///< /v1/chat/completions
  std::string question;                   ///< extension: appended after compression, never compressed
  int max_tokens = -1;                    ///< -1: until end of generation or the context size
  std::optional<float> temperature, top_p;
  std::optional<int> top_k;               ///< extension (llama-server's name)
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;          ///< at most 4 strings; the text ends before the first match
  bool stream = false;
  bool include_usage = false;             ///< stream_options.include_usage: a last chunk with usage
  std::optional<std::string> press;       ///< extension: press spec for this request
  std::optional<double> compression_ratio;  ///< extension: fills the press's unset ratios
  std::optional<std::string> cache_type_k, cache_type_v;  ///< extension: KV codecs for this request
  /// llama-server's name: reuse a stored context the prompt begins with, and store this one's
  /// (and, for chat, the conversation after the reply) for later requests.
  bool cache_prompt = true;
  /// Extension: answer from the stored context with this id (POST /v1/contexts); the prompt or
  /// messages, when given, continue it (no BOS), then the question.
  std::optional<std::string> context_id;
};

/// Parses and checks a request body. Throws ApiError (status 400, param = the field, e.g.
/// "messages[1].content") for invalid JSON, a body that is not an object, a missing or empty
/// prompt/messages, a field of the wrong type or out of range (max_tokens < 0, temperature outside
/// [0, 2], top_p outside (0, 1], n != 1, more than 4 stop strings, compression_ratio outside
/// [0, 1)), and options the server does not implement (logprobs, non-zero presence/frequency
/// penalties, tools) rather than ignoring them. Unknown fields are ignored, as OpenAI's clients
/// send many. A prompt of token ids is read as 64-bit integers and each must lie in [0, n_vocab)
/// (n_vocab <= 0: in the int32 range), else 400 naming the index ("prompt[1]: token id 4294967301
/// is outside the vocabulary 0..511").
/// With "context_id" a completion's prompt may be absent (the question alone continues the stored
/// context); "cache_prompt" must be a boolean.
CompletionRequest parse_completion_request(const std::string& body, bool chat, int32_t n_vocab = 0);

/// Token counts and the measured cache statistics reported in `usage`.
struct Usage {
  int prompt_tokens = 0;       ///< context + question tokens
  int completion_tokens = 0;
  size_t kv_bytes = 0;         ///< cache bytes after compressing the context (measured)
  size_t kv_bytes_final = 0;   ///< cache bytes when the request ended
  size_t kv_bytes_shared = 0;  ///< of those, a stored context's entries read in place (shared, not held alone)
  size_t full_f16_bytes = 0;   ///< a full f16 cache of the context
  int cached_tokens = 0;       ///< prompt tokens taken from a stored context, not prefilled
  /// The whole request when it ended: entries the cache held, and entries a full cache would hold
  /// (every token run x layers x KV heads); decode-time eviction counts.
  size_t entries_now = 0, entries_seen = 0;
  size_t entries_kept = 0, entries_total = 0;
  std::string press;           ///< the press as run (its describe())
};
nlohmann::json usage_json(const Usage& u);

/// Text appended to a completion so far, and whether a stop string ended it.
struct StopMatch {
  size_t safe = 0;      ///< bytes that can be sent now: no stop string can start before this
  bool stopped = false; ///< a stop string occurs; `text` must be cut at `cut`
  size_t cut = 0;
};
/// Scans `text` for the first occurrence of any of `stops`. Without a match, `safe` leaves out
/// the longest tail that is a prefix of a stop string and any incomplete UTF-8 sequence at the
/// end, so a streamed piece never splits a stop string or a character.
StopMatch find_stop(const std::string& text, const std::vector<std::string>& stops);

/// JSON dump that replaces invalid UTF-8 (a model may emit a partial character at the end).
std::string dump(const nlohmann::json& j);

}  // namespace kvslim::server
