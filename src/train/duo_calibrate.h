#pragma once
// DuoAttention's calibration (arXiv 2410.10819): scores every KV head as a retrieval or a streaming
// head on passkey prompts, by the paper's gate objective linearised (duo_gates.cpp) or by the
// deviation of each head's projected output; the labels are what the press (press/duo_attention.h)
// reads.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvslim/model.h"
#include "press/scorers/duo_attention.h"

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

// ---- Gate training (duo_gates.cpp) ---------------------------------------------------------
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
