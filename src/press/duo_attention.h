#pragma once
// DuoAttention: retrieval heads keep the full cache, streaming heads keep only the attention sinks
// and the most recent entries. Xiao et al., "DuoAttention: Efficient Long-Context LLM Inference
// with Retrieval and Streaming Heads", arXiv 2410.10819. The paper learns a gate per head by
// optimisation; here a head is scored by a calibration run on synthetic passkey prompts: how much
// its output (through W_o) changes when its attention is restricted to sinks + recent entries.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvslim/model.h"

namespace kvslim {

/// Calibration settings.
struct DuoCalibration {
  int samples = 8;     ///< passkey prompts
  int length = 1024;   ///< approximate prompt length, tokens
  int sink = 128;      ///< sink entries a streaming head keeps (the paper's and kvpress's 128)
  int recent = 256;    ///< recent entries a streaming head keeps (the paper's and kvpress's 256)
  int window = 32;     ///< last queries of each prompt that are compared
  uint64_t seed = 7;
};

/// Per (layer, KV head) retrieval score and the streaming-head shape it was measured for.
struct DuoLabels {
  int sink = 128, recent = 256;
  /// score[layer][kv head]: sum over compared queries of |W_o,g (o_full - o_stream)| divided by the
  /// sum of |W_o,g o_full|, the largest over the GQA group's query heads; higher = retrieval.
  std::vector<std::vector<float>> score;
  std::string base_model;

  /// Writes a small GGUF (duo.* metadata, tensor duo.head_scores [n_head_kv, n_layer]).
  void save(const std::string& path) const;
  /// Reads a file written by save(); errors name the file and field.
  static DuoLabels load(const std::string& path);
  /// Throws kvslim::Error unless the labels have the model's layers and KV heads.
  void check(const HParams& hp, const std::string& what) const;
  /// streaming[l][h] = 1 for the round(head_ratio x n_layer x n_head_kv) lowest-scoring heads (ties:
  /// the earlier layer, then head, becomes streaming first). Throws for head_ratio outside [0, 1].
  std::vector<std::vector<uint8_t>> streaming(double head_ratio) const;
};

/// A synthetic passkey prompt of about `approx_tokens` tokens of the model's tokenizer: filler
/// sentences, the 5-digit `key` sentence at relative `depth` in [0, 1], then the question
/// "What is the pass key? The pass key is".
std::string duo_passkey_prompt(const Model& model, int approx_tokens, double depth, int key);

/// Scores every head on `cal.samples` passkey prompts. Throws kvslim::Error when the prompts
/// would not be longer than sink + recent + window (nothing to compare) or do not fit the model's
/// context. `progress(i, n)` after each prompt when given.
DuoLabels duo_calibrate(const Model& model, const DuoCalibration& cal,
                        const std::function<void(int, int)>& progress = nullptr);

}  // namespace kvslim
