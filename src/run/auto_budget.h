#pragma once
// Auto-budget (RequestOptions::auto_budget): the press's compression ratio chosen per request for
// a byte budget and/or a fidelity target measured on the request's own text.
#include <vector>

#include "kvslim/press.h"
#include "kvslim/request.h"
#include "model/session.h"

namespace kvslim::run {

/// Prefills `context` on an empty `session` and leaves it compressed by `press` at the ratio
/// chosen for `opt` (see AutoBudget in request.h; the question is not appended). When the
/// fidelity target needs a probe and there is no question, the last probe tokens of the context
/// are held out of compression and appended after it. Returns the last context token's logits
/// [n_vocab]; fills `report`, raises `peak_bytes` to the uncompressed cache size and adds the
/// compression time of every trial to `press_seconds`.
/// Throws kvslim::Error for invalid options, a press without a compression ratio, or a context
/// too short to hold out a probe.
std::vector<float> prefill_auto_budget(Session& session, PressImpl& press, const std::vector<Token>& context,
                                       const std::vector<Token>& question, const AutoBudget& opt,
                                       AutoBudgetReport& report, size_t* peak_bytes, double* press_seconds);

}  // namespace kvslim::run
