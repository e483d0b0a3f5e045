// The settings a sweep records in its provenance (RunInfo::config), built once for the CLI and the
// Python binding.
#include "kvslim/eval_results.h"

#include <nlohmann/json.hpp>

#include "eval/report.h"

namespace kvslim {

namespace {

/// What every sweep records: its runs, sampling, and how each sample runs (context size, chunked
/// compression, the cache's codecs and quantization).
nlohmann::json common_config(const std::vector<PressRun>& runs, int samples, uint64_t seed, const RunOptions& run) {
  nlohmann::json r = nlohmann::json::array();
  for (const auto& pr : runs) r.push_back({pr.spec, pr.ratio});
  const SessionOptions& s = run.session;
  nlohmann::json c = {{"runs", r},
          {"samples", samples},
          {"seed", seed},
          {"ctx_size", s.n_ctx},
          {"chunk_size", run.chunk_size},
          {"cache_type_k", codec_name(s.key_codec)},
          {"cache_type_v", codec_name(s.value_codec)},
          {"kivi_bits", s.kv_quant.kivi_bits},
          {"kivi_group", s.kv_quant.kivi_group},
          {"kivi_residual", s.kv_quant.kivi_residual},
          {"kv_hadamard", s.kv_quant.hadamard}};
  if (run.stored_context) c["stored_context"] = true;
  return c;
}

}  // namespace

std::string sweep_config(const std::vector<PressRun>& runs, const FidelitySweep& sweep, const std::string& text_file) {
  nlohmann::json c = common_config(runs, sweep.samples, sweep.seed, sweep.run);
  c.update({{"context_tokens", sweep.context_tokens},
            {"continuation_tokens", sweep.continuation_tokens},
            {"lmba_window", sweep.lmba_window},
            {"lmba_tau", sweep.lmba_tau},
            {"text", text_file}});
  if (!text_file.empty()) c["text_sha256"] = sha256_file(text_file);
  return c.dump();
}

std::string sweep_config(const std::vector<PressRun>& runs, const TaskSweep& sweep, const std::string& text_config) {
  nlohmann::json c = common_config(runs, sweep.samples, sweep.seed, sweep.run);
  const RulerOptions& r = sweep.ruler;
  c.update({{"tasks", sweep.tasks},
            {"lengths", sweep.lengths},
            {"depths", sweep.depths},
            {"n_predict", sweep.run.n_predict},
            {"text_config", text_config},
            {"ruler",
             {{"multi_keys", r.multi_keys},
              {"multi_values", r.multi_values},
              {"multi_queries", r.multi_queries},
              {"vt_chains", r.vt_chains},
              {"vt_hops", r.vt_hops},
              {"cwe_common", r.cwe_common},
              {"cwe_freq_common", r.cwe_freq_common},
              {"cwe_freq_uncommon", r.cwe_freq_uncommon},
              {"fwe_top", r.fwe_top},
              {"fwe_alpha", r.fwe_alpha},
              {"fwe_vocab", r.fwe_vocab}}}});
  if (!text_config.empty()) c["text_config_sha256"] = sha256_file(text_config);
  return c.dump();
}

}  // namespace kvslim
