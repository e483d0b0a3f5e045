#pragma once
// /metrics: the engine's counters and gauges in Prometheus' text exposition format (version 0.0.4).
#include <string>

#include "server/engine.h"

namespace kvslim::server {

/// Renders `m` with HELP and TYPE lines; every name starts with "kvslim_".
std::string prometheus_text(const EngineMetrics& m);

}  // namespace kvslim::server
