#pragma once
// /metrics: the engine's counters and gauges in Prometheus' text exposition format (version 0.0.4).
#include <cstdint>
#include <string>
#include <vector>

#include "server/context_cache.h"
#include "server/engine.h"

namespace kvslim::server {

/// Requests refused with one HTTP status for one reason (a 4xx's field at fault, e.g. "prompt" or
/// "messages[].content"; a 5xx's code, e.g. "queue_full").
struct Refusals {
  int status = 0;
  std::string reason;
  uint64_t count = 0;
};

/// Renders `m` and the refusals (kvslim_requests_rejected_total{status="...",reason="..."}) with
/// HELP and TYPE lines; every name starts with "kvslim_".
/// With `contexts`, the stored contexts' counters too (kvslim_context_*{tier="..."}).
std::string prometheus_text(const EngineMetrics& m, const std::vector<Refusals>& refused = {},
                            const ContextCacheMetrics* contexts = nullptr);

}  // namespace kvslim::server
