#include "cli/flag_names.h"

#include <cctype>
#include <utility>

namespace kvslim::cli {

namespace {

/// Library parameter -> the flag that sets it, the same in every subcommand that has it.
constexpr std::pair<const char*, const char*> kFlags[] = {
    // KV cache (SessionOptions, KVQuantOptions)
    {"kivi_bits", "--kivi-bits"},
    {"kivi_group", "--kivi-group"},
    {"kivi_residual", "--kivi-residual"},
    {"cache_type_k", "--cache-type-k"},
    {"cache_type_v", "--cache-type-v"},
    {"n_ctx", "-c"},
    // the request runner (RequestOptions)
    {"RequestOptions::chunk_size", "--chunk-size"},
    // kvslim synth (SynthOptions)
    {"SynthOptions::shape", "--shape"},
    {"SynthOptions::type", "--type"},
    {"SynthOptions::layers", "--layers"},
    {"SynthOptions::vocab_from", "--vocab-from"},
    {"SynthOptions::output", "-o"},
    // kvslim serve (EngineOptions, ServerOptions)
    {"EngineOptions::parallel", "--parallel"},
    {"EngineOptions::max_queue", "--queue"},
    {"EngineOptions::kv_budget", "--kv-budget"},
    {"ServerOptions::max_body", "--max-body"},
    {"ServerOptions::timeout_s", "--timeout"},
    {"ServerOptions::context_dir", "--context-dir"},
    {"ServerOptions::context_store", "--context-store"},
    // kvslim latent-calibrate (LatentCalibration)
    {"LatentCalibration::k_bits", "--k-bits"},
    {"LatentCalibration::v_bits", "--v-bits"},
    {"LatentCalibration::memory_ratio", "--memory-ratio"},
    // kvslim duo-calibrate (DuoCalibration)
    {"DuoCalibration::length", "--length"},
    // files the library reads
    {"chat_template_file", "--chat-template-file"},
    {"chat_template", "--chat-template"},
    {"text_config", "--text-config"},
};

bool word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

}  // namespace

std::string flags_in(std::string message) {
  for (const auto& [param, flag] : kFlags) {
    const std::string p(param), f(flag);
    for (size_t at = message.find(p); at != std::string::npos; at = message.find(p, at)) {
      // Not part of a longer name (n_ctx_train, RunOptions::n_ctx), a dotted key
      // (tokenizer.chat_template) or a quoted JSON key ("kivi_bits").
      const size_t end = at + p.size();
      const bool starts = at == 0 || (!word_char(message[at - 1]) && message[at - 1] != '.' &&
                                      message[at - 1] != '"' && !(at >= 2 && message.compare(at - 2, 2, "::") == 0));
      const bool ends = end == message.size() || (!word_char(message[end]) && message.compare(end, 2, "::") != 0);
      const bool whole = starts && ends;
      if (whole) {
        message.replace(at, p.size(), f);
        at += f.size();
      } else {
        at += p.size();
      }
    }
  }
  return message;
}

}  // namespace kvslim::cli
