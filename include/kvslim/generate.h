#pragma once
// The main job: prefill a context, compress it with a press, append the question, decode.
#include <functional>
#include <string>
#include <vector>

#include "kvslim/press.h"
#include "kvslim/sampling.h"
#include "kvslim/session.h"

namespace kvslim {

struct GenerateOptions {
  std::string context;      ///< compressed by the press
  std::string question;     ///< appended after compression, never compressed (may be empty)
  int n_predict = 64;       ///< tokens to generate; stops early at end-of-generation
  SamplingParams sampling;
  int chunk_size = 0;       ///< > 0: the press acts after every chunk of this many context tokens
  SessionOptions session;
};

/// Measured from the cache, never computed from the request.
struct GenerateStats {
  int context_tokens = 0;
  int question_tokens = 0;
  int generated_tokens = 0;
  size_t entries_kept = 0;              ///< after compressing the context
  size_t entries_total = 0;             ///< context tokens x layers x KV heads
  std::vector<size_t> kept_per_layer;   ///< entries per layer after compression
  size_t kv_bytes = 0;                  ///< cache bytes after compression
  size_t full_f16_bytes = 0;            ///< a full f16 cache of the context
  size_t peak_kv_bytes = 0;             ///< largest cache size seen during prefill
  size_t final_kv_bytes = 0;            ///< after generation
  double prefill_seconds = 0, press_seconds = 0, decode_seconds = 0;
  double compression_ratio() const { return entries_total ? 1.0 - double(entries_kept) / entries_total : 0.0; }
  double memory_ratio() const { return full_f16_bytes ? double(kv_bytes) / full_f16_bytes : 0.0; }
  double prefill_tps() const;
  double decode_tps() const;
};

struct GenerateResult {
  std::string text;
  std::vector<Token> tokens;
  GenerateStats stats;
};

/// Runs the job. `on_text` receives each generated piece as soon as it is sampled. Throws
/// kvslim::Error for an empty context or a prompt longer than the context size.
GenerateResult generate(const Model& model, Press& press, const GenerateOptions& opt,
                        const std::function<void(const std::string&)>& on_text = nullptr);

/// Prefills `tokens` into `session` and applies `press` (after every `chunk_size` tokens when
/// > 0, else once at the end). Returns the logits of the last token. `peak_bytes` receives the
/// largest cache size observed. Used by generate, the evaluation harness and benchmarks.
std::vector<float> prefill_and_compress(Session& session, Press& press, const std::vector<Token>& tokens,
                                        int chunk_size, size_t* peak_bytes = nullptr, double* press_seconds = nullptr);

}  // namespace kvslim
