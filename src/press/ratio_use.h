// Whether a press spec uses the caller's compression ratio (internal: CLI and server checks).
#pragma once

#include <memory>
#include <string>

#include "kvslim/press.h"

namespace kvslim {

/// make_press(spec, ratio), and `ratio_used` = whether the press keeps its entries by `ratio`:
/// false for presses without a ratio (think, simlayerkv, duo_attention, latent, ...), for
/// threshold and per_layer policies (their own parameters decide), and for terms whose spec
/// writes its own ratio. A composition uses it when any of its terms does.
/// Throws kvslim::Error as make_press.
std::unique_ptr<Press> make_press(const std::string& spec, double ratio, bool& ratio_used);

/// Throws kvslim::Error naming `what` (the flag or field, e.g. "--compression-ratio") when
/// `ratio` > 0 and the press of `spec` would ignore it, instead of running it silently unused.
/// Builds the press to find out; a caller that has built it passes the flag instead (below).
void check_ratio_used(const std::string& spec, double ratio, const std::string& what);

/// The same check with `ratio_used` as make_press(spec, ratio, ratio_used) set it (no second build).
void check_ratio_used(const std::string& spec, double ratio, bool ratio_used, const std::string& what);

}  // namespace kvslim
