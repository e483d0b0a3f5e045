#include "server/metrics.h"

#include <fmt/format.h>

namespace kvslim::server {

std::string prometheus_text(const EngineMetrics& m, const std::vector<Refusals>& refused,
                            const ContextCacheMetrics* contexts) {
  std::string out;
  auto put = [&](const char* name, const char* type, const char* help, double v) {
    out += fmt::format("# HELP kvslim_{} {}\n# TYPE kvslim_{} {}\nkvslim_{} {}\n", name, help, name, type, name, v);
  };
  put("requests_finished_total", "counter", "Requests that ended normally (stop or length).", double(m.requests_finished));
  put("requests_failed_total", "counter", "Requests that ended with an error after being accepted.", double(m.requests_failed));
  put("requests_cancelled_total", "counter", "Requests dropped because the client disconnected.", double(m.requests_cancelled));
  out += "# HELP kvslim_requests_rejected_total Requests refused with an HTTP error, by status and reason (a 4xx's "
         "request field at fault, a 5xx's cause).\n# TYPE kvslim_requests_rejected_total counter\n";
  for (const Refusals& r : refused) {
    // Label values escaped as the exposition format asks (backslash, quote, newline).
    std::string reason;
    for (char c : r.reason) {
      if (c == '\\' || c == '"') reason += '\\';
      if (c == '\n') {
        reason += "\\n";
        continue;
      }
      reason += c;
    }
    out += fmt::format("kvslim_requests_rejected_total{{status=\"{}\",reason=\"{}\"}} {}\n", r.status, reason, r.count);
  }
  put("prompt_tokens_total", "counter", "Prompt tokens prefilled (context and question).", double(m.prompt_tokens));
  put("tokens_generated_total", "counter", "Tokens generated.", double(m.generated_tokens));
  put("prefill_seconds_total", "counter", "Engine time spent in prefill (chunks and compression).", m.prefill_seconds);
  put("decode_seconds_total", "counter", "Engine time spent in decode steps.", m.decode_seconds);
  put("prompt_tokens_per_second", "gauge", "Prefill rate over the server's life (prompt tokens / prefill seconds).",
      m.prefill_seconds > 0 ? m.prompt_tokens / m.prefill_seconds : 0.0);
  put("decode_tokens_per_second", "gauge", "Aggregate decode rate over the server's life (decoded rows / decode seconds).",
      m.decode_seconds > 0 ? m.decode_rows / m.decode_seconds : 0.0);
  put("decode_passes_total", "counter", "Forward passes over the weights made by decode steps.", double(m.decode_steps));
  put("decode_rows_total", "counter", "Tokens run by those passes (rows / passes = mean batch size).",
      double(m.decode_rows));
  put("decode_batch_size", "gauge", "Requests in the last decode pass.", m.last_batch);
  put("requests_processing", "gauge", "Requests holding a slot.", m.active);
  put("requests_prefilling", "gauge", "Requests still reading their prompt.", m.prefilling);
  put("requests_queued", "gauge", "Requests waiting for a slot or for KV budget.", m.queued);
  put("slots", "gauge", "Slots (EngineOptions::parallel).", m.parallel);
  put("kv_bytes_in_use", "gauge", "Measured KV cache bytes of the running requests.", double(m.kv_bytes_in_use));
  put("kv_bytes_saved", "gauge", "Full f16 cache bytes of the running requests' tokens minus kv_bytes_in_use.",
      m.kv_bytes_full_f16 > m.kv_bytes_in_use ? double(m.kv_bytes_full_f16 - m.kv_bytes_in_use) : 0.0);
  put("kv_bytes_shared", "gauge",
      "Stored contexts' KV bytes the running requests read in place, each once (part of kv_bytes_in_use).",
      double(m.kv_bytes_shared));
  put("kv_bytes_reserved", "gauge", "KV bytes reserved by the running requests (admission).", double(m.kv_bytes_reserved));
  put("kv_budget_bytes", "gauge", "KV budget over all requests (EngineOptions::kv_budget; 0 = none).", double(m.kv_budget));
  if (!contexts) return out;
  const ContextCacheMetrics& c = *contexts;
  auto per_tier = [&](const char* name, const char* type, const char* help, auto field) {
    out += fmt::format("# HELP kvslim_{} {}\n# TYPE kvslim_{} {}\n", name, help, name, type);
    for (const ContextTierMetrics& t : c.tiers) out += fmt::format("kvslim_{}{{tier=\"{}\"}} {}\n", name, t.tier, double(field(t)));
  };
  per_tier("context_hits_total", "counter", "Stored-context lookups answered by each tier.",
           [](const ContextTierMetrics& t) { return t.hits; });
  per_tier("context_misses_total", "counter", "Stored-context lookups a tier could not answer.",
           [](const ContextTierMetrics& t) { return t.misses; });
  per_tier("context_errors_total", "counter",
           "Failed or timed-out tier calls and refused entries (checksum, model); the request ran as if uncached.",
           [](const ContextTierMetrics& t) { return t.errors; });
  per_tier("context_stores_total", "counter", "Contexts written to each shared tier.",
           [](const ContextTierMetrics& t) { return t.stores; });
  per_tier("context_bytes", "gauge", "Memory tier: bytes held now; shared tiers: bytes written.",
           [](const ContextTierMetrics& t) { return t.bytes; });
  put("context_prefill_tokens_saved_total", "counter", "Prompt tokens taken from stored contexts instead of prefilled.",
      double(c.prefill_tokens_saved));
  put("context_stored_total", "counter", "Contexts stored (built, kept after a reply, or restored by name).",
      double(c.builds));
  put("context_flight_waits_total", "counter", "Requests that waited for another's build of the same context.",
      double(c.flight_waits));
  put("context_evictions_total", "counter", "Stored contexts dropped from memory for space.", double(c.evictions));
  put("contexts_in_memory", "gauge", "Stored contexts held in memory.", double(c.entries));
  return out;
}

}  // namespace kvslim::server
