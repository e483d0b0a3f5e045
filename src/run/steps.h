#pragma once
// The two steps every job shares, used by Request (and, until they move onto it, by the few
// callers that hold a bare Session): one prefill chunk followed by compression, and one decode step.
#include <functional>
#include <string>
#include <vector>

#include "press/authoring.h"
#include "kvslim/generate.h"
#include "kvslim/request.h"
#include "model/session.h"

namespace kvslim::run {

/// Runs tokens [0, n) at session.next_position() with the observation press.needs() asks for,
/// then lets the press compress. Returns the last token's logits. `peak_bytes` (optional) is raised
/// to the cache size before compression; `press_seconds` (optional) accumulates compression time.
/// `context_end` is the position after the context's last token (Observation::context_end; -1:
/// unknown).
std::vector<float> prefill_chunk(Session& session, PressImpl& press, const Token* tokens, size_t n, size_t* peak_bytes,
                                 double* press_seconds, int32_t context_end = -1);

/// The decode step: runs `token` with what press.decode_needs() asks (recorders and the press's own
/// hooks: decode-time scoring, attention selection), then press.after_decode(). Returns the logits.
std::vector<float> decode_step(Session& session, PressImpl& press, Token token);


/// Runs `req` to its end, passing each released piece of text to `on_text` (may be empty); returns
/// its text, tokens, statistics and finish reason (generate(), and generate() from a stored context).
GenerateResult run_to_end(Request& req, const std::function<void(const std::string&)>& on_text);

}  // namespace kvslim::run
