#pragma once
// The prefill half of a request over a bare session: what press calibration, training and tests
// run when they hold a Session rather than a Request.
#include <cstddef>
#include <vector>

#include "kvslim/press.h"
#include "model/session.h"

namespace kvslim {

/// Prefills `tokens` into `session` and applies `press` (after every `chunk_size` tokens when
/// > 0, else once at the end), resetting the press first: the prefill half of a Request, for
/// callers that hold a bare Session (press calibration, tests). Returns the logits of the last
/// token. `peak_bytes` receives the largest cache size observed.
std::vector<float> prefill_and_compress(Session& session, PressImpl& press, const std::vector<Token>& tokens,
                                        int chunk_size, size_t* peak_bytes = nullptr, double* press_seconds = nullptr);

}  // namespace kvslim
