#pragma once
// DuoAttention: retrieval heads keep the full cache, streaming heads keep only the attention sinks
// and the most recent entries. Xiao et al., "DuoAttention: Efficient Long-Context LLM Inference
// with Retrieval and Streaming Heads", arXiv 2410.10819. The paper learns a gate per KV head by
// optimisation (github.com/mit-han-lab/duo-attention duo_attn/train.py): attention output =
// g x full + (1 - g) x streaming, gates fitted so that the final hidden states reproduce the
// full model's on the question/answer tokens of passkey text, plus an L1 penalty on the gates.
// kvslim fits the gates to that objective linearised around the full model (train/duo_calibrate.h:
// one convex quadratic in the gates, solved exactly); the earlier heuristic (relative change of each
// head's projected output) stays as method "deviation". This header holds what the press reads: the
// labels.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvslim/model.h"

namespace kvslim {

/// Per (layer, KV head) retrieval score and the streaming-head shape it was measured for.
struct DuoLabels {
  int sink = 128, recent = 256;
  /// How the scores were made: "gates" (score = the optimised gate in [0, 1], 1 = full attention,
  /// as the repository's full_attention_heads.tsv that kvpress reads) or "deviation" (score = sum
  /// over compared queries of |W_o,g (o_full - o_stream)| divided by the sum of |W_o,g o_full|,
  /// the largest over the GQA group's query heads). Higher = retrieval in both.
  std::string method = "deviation";
  std::vector<std::vector<float>> score;
  std::string base_model;
  double reg = 0;  ///< the L1 weight the gates were fitted with (method "gates")
  /// cost[layer][kv head] (method "gates"; empty otherwise): the loss of streaming that head alone
  /// (A_kk, train/duo_gates.cpp); it orders heads whose gates tie (several at 0), where the reference's
  /// argsort leaves the order undefined.
  std::vector<std::vector<float>> cost;

  /// Writes a small GGUF (duo.* metadata, tensors duo.head_scores and, with costs, duo.head_costs,
  /// both [n_head_kv, n_layer]).
  void save(const std::string& path) const;
  /// Reads a file written by save(); errors name the file and field.
  static DuoLabels load(const std::string& path);
  /// Throws kvslim::Error unless the labels have the model's layers and KV heads.
  void check(const HParams& hp, const std::string& what) const;
  /// streaming[l][h] = 1 for the round(head_ratio x n_layer x n_head_kv) lowest-scoring heads (ties:
  /// the lower cost when there are costs, then the earlier layer, then head, becomes streaming
  /// first). Throws for head_ratio outside [0, 1].
  std::vector<std::vector<uint8_t>> streaming(double head_ratio) const;
};

/// Labels for a model when the press has no labels file (kvpress downloads the authors'; kvslim
/// calibrates on the model, once per file): train/duo_calibrate.cpp sets its calibration here at
/// start-up. Without one set, such a press fails with an error asking for labels=FILE.
using DuoAutoCalibration = DuoLabels (*)(const Model& model);
void set_duo_auto_calibration(DuoAutoCalibration f);

}  // namespace kvslim
