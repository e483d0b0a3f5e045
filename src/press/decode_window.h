#pragma once
// The observation window of decode-time presses (decoding, cam): the newest queries of the decode
// steps, seeded with the prefill's last window. Internal to src/press.
#include "press/authoring.h"

namespace kvslim {

/// Appends the decode step's recorded window queries (`step`) to `buf`, keeping the newest
/// `window` rows per layer and query head (buf.queries [layer][n_head][rows][head_dim] and
/// buf.window_positions). Nothing happens when window <= 0 or the step recorded no queries.
void append_decode_window(Observation& buf, const Observation& step, const Model& model, int window);

}  // namespace kvslim
