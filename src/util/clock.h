#pragma once
// The one clock for measured durations (prefill / decode / press times, trials, calibration).
#include <chrono>

namespace kvslim {

/// Seconds on the steady clock (monotonic; the origin is arbitrary, so only differences mean
/// anything: elapsed wall time).
inline double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace kvslim
