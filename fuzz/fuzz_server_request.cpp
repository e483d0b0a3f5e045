// libFuzzer target: the server's request reader (`kvslim serve`'s POST /v1/completions and
// /v1/chat/completions bodies). The first byte selects the endpoint (bit 0: chat) and the
// vocabulary size the token ids are checked against (bits 1-2: none, 1, 512, 2^31 - 1); the rest is
// the body. Every input must end in a CompletionRequest that keeps the parser's promises or in an
// ApiError with a 4xx status and a JSON error body, never in a crash or another exception type.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/api.h"

using namespace kvslim;
using namespace kvslim::server;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool chat = data[0] & 1;
  static const int32_t vocabs[] = {0, 1, 512, INT32_MAX};
  const int32_t n_vocab = vocabs[(data[0] >> 1) & 3];
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    CompletionRequest r = parse_completion_request(body, chat, n_vocab);
    const int64_t limit = n_vocab > 0 ? n_vocab : int64_t{INT32_MAX} + 1;
    for (int32_t t : r.prompt_tokens)
      if (t < 0 || t >= limit) std::abort();  // a token id outside the vocabulary was let through
    if (chat ? r.messages.empty() : (r.prompt.empty() && r.prompt_tokens.empty())) std::abort();
    if (r.stop.size() > 4) std::abort();
    for (const std::string& s : r.stop)
      if (s.empty()) std::abort();
    if (r.compression_ratio && !(*r.compression_ratio >= 0.0 && *r.compression_ratio < 1.0)) std::abort();
    // What the server then does with the text: stop-string scanning as the stream is cut.
    const std::string& text = chat ? r.messages.back().content : r.prompt;
    const StopMatch m = find_stop(text, r.stop);
    if (m.safe > text.size() || (m.stopped && m.cut > text.size())) std::abort();
  } catch (const ApiError& e) {
    if (e.status < 400 || e.status >= 500) std::abort();
    (void)dump(error_json(e));
  }
  return 0;
}
