#pragma once
// DuoAttention: retrieval heads keep the full cache, streaming heads keep only the attention sinks
// and the most recent entries. Xiao et al., "DuoAttention: Efficient Long-Context LLM Inference
// with Retrieval and Streaming Heads", arXiv 2410.10819. The paper learns a gate per KV head by
// optimisation (github.com/mit-han-lab/duo-attention duo_attn/train.py): attention output =
// g x full + (1 - g) x streaming, gates fitted so that the final hidden states reproduce the
// full model's on the question/answer tokens of passkey text, plus an L1 penalty on the gates.
// kvslim fits the gates to that objective linearised around the full model (duo_gates.cpp: one
// convex quadratic in the gates, solved exactly); the earlier heuristic (relative change of each
// head's projected output) stays as method "deviation".
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
  int window = 32;     ///< last queries of each prompt compared (method "deviation" only)
  uint64_t seed = 7;
  /// "gates" (default): the paper's objective, linearised (duo_train_gates); "deviation": the
  /// relative change of each head's projected output on the last `window` queries.
  std::string method = "gates";
  double reg = 0.05;   ///< L1 weight on the mean gate (the repository's reg_weight, 0.05)
};

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
  /// (A_kk, duo_gates.cpp); it orders heads whose gates tie (several at 0), where the reference's
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

/// A synthetic passkey prompt of about `approx_tokens` tokens of the model's tokenizer: filler
/// sentences, the 5-digit `key` sentence at relative `depth` in [0, 1], then the question
/// "What is the pass key? The pass key is".
std::string duo_passkey_prompt(const Model& model, int approx_tokens, double depth, int key);

/// The question that ends duo_passkey_prompt (the answer " KEY." follows it in gate training).
const char* duo_passkey_question();

/// Scores every head on `cal.samples` passkey prompts by `cal.method` ("gates": duo_train_gates;
/// "deviation"). Throws kvslim::Error when the prompts would not be longer than sink + recent +
/// the compared queries (nothing to compare), do not fit the model's context, or the method is
/// unknown. `progress(i, n)` after each prompt when given.
DuoLabels duo_calibrate(const Model& model, const DuoCalibration& cal,
                        const std::function<void(int, int)>& progress = nullptr);

// ---- Gate training (duo_gates.cpp) ----------------------------------------------------------
//
// The repository's loss (duo_attn/train.py) for gates alpha in [0, 1]^(n_layer x n_head_kv):
//   L(alpha) = 1/T sum_t mean_c (h_full(t) - h_mixed(t))_c^2 + reg x mean_k |alpha_k|
// over the T labelled (question and answer) tokens, h = the final hidden states (after the output
// norm), every head's attention output mixed as alpha o_full + (1 - alpha) o_stream. Linearised
// around the full model: head k's mix changes its layer's output by (1 - alpha_k) W_o,k (o_full -
// o_stream), which reaches the final norm along the residual stream (later layers' responses are
// left out), where it is scaled by w_out / rms(x): e_k(t) = w_out . W_o,k (o_full - o_stream) /
// rms(x_last(t)), x_last = the residual stream entering the last layer (the final one is not
// recorded). Then with beta = 1 - alpha and A_kj = 1/(T n_embd) sum_t e_k(t).e_j(t):
//   L(alpha) = beta^T A beta + c sum_k alpha_k,   c = reg / (n_layer x n_head_kv),
// a convex quadratic over a box, minimised exactly (cyclic coordinate descent). The repository
// instead runs AdamW (lr 0.02, 2,000 steps, gates clamped to [0, 1] before each step) through the
// whole model.

/// One passkey sample: e[(t x n_gates + k) x n_embd + c] for the last n_label tokens (above),
/// gate k = layer x n_head_kv + KV head. Computed from one full-cache forward pass (f32 cache).
struct DuoGateSample {
  int n_label = 0, n_gates = 0, n_embd = 0;
  std::vector<double> e;
};

/// Runs `tokens` and computes e for the last `n_label` of them (streaming = the first `sink`
/// entries and the `recent` newest ones, the query's own included). Throws kvslim::Error for
/// n_label outside [1, tokens] or tokens beyond the model's context.
DuoGateSample duo_gate_sample(const Model& model, const std::vector<Token>& tokens, int n_label, int sink, int recent);

/// gram[k x n + j] += sum over the sample's labelled tokens of e_k(t).e_j(t) / n_embd (gram is
/// resized to n_gates^2 when empty).
void duo_add_gram(const DuoGateSample& s, std::vector<double>& gram);

/// beta^T A beta + c sum(alpha), beta = 1 - alpha; A is n x n (row major).
double duo_gate_objective(const std::vector<double>& A, double c, const std::vector<double>& alpha);
/// Its gradient in alpha: c - 2 (A beta)_k.
std::vector<double> duo_gate_gradient(const std::vector<double>& A, double c, const std::vector<double>& alpha);
/// The minimiser over [0, 1]^n (A symmetric positive semi-definite): cyclic coordinate descent,
/// each step the exact minimiser in one gate, from alpha = 1 (the repository's initial value),
/// until no gate moves by 1e-13. `sweeps` receives the number of sweeps.
std::vector<double> duo_solve_gates(const std::vector<double>& A, double c, int* sweeps = nullptr);

/// Fits the gates on `cal.samples` passkey prompts of `cal.length` tokens (needle depth (s + 0.5) /
/// samples), each followed by the answer " KEY."; the labelled tokens are the question and the
/// answer. Labels: method "gates", score = alpha.
DuoLabels duo_train_gates(const Model& model, const DuoCalibration& cal,
                          const std::function<void(int, int)>& progress = nullptr);

}  // namespace kvslim
