#pragma once
// Fast KVzip: small per-layer gates predict, from a token's attention input alone, the KVzip score
// its entries would get in each KV head, so KVzip's context replay is not run at inference.
// Kim, Han, Yun, "Fast KVzip" (NAVER AI Lab), arXiv 2601.17668; reference code: kvpress
// kvpress/presses/fastkvzip_press.py (the gate and the press) and github.com/Janghyun1230/FastKVzip
// optim.py / utils.py (the training: binary cross-entropy against KVzip scores, SGD with momentum).
// kvpress downloads gates trained by the authors for a few models; kvslim trains them on the user's
// model and text (`kvslim fastkvzip-train`, train_fastkvzip below) and stores them as GGUF.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvslim/model.h"
#include "press/kvzip.h"

namespace kvslim {

/// The gates of every layer. For a token with attention input x (n_embd values: the layer-input
/// hidden state after the attention RMSNorm) and KV head h, with D = dim:
///   q_g = rmsnorm(Wq[h, g] x + bq[h, g]) * q_norm   (g < n_group; D values)
///   k   = rmsnorm(Wk[h] x) * k_norm                 (D values)
///   l_g = k . q_g / sqrt(D) + b[h, g],   s_{g,j} = k_base[h, j] . q_g / sqrt(D)   (j < n_sink)
///   p_g = exp(l_g) / (exp(l_g) + sum_j exp(s_{g,j}))  (the token's share of an attention over itself
///         and n_sink learned keys; sigmoid(l_g) when n_sink = 0, as the authors' code)
///   score(h) = mean over g of p_g, in (0, 1).
/// rmsnorm(u) = u / sqrt(mean(u^2) + eps) (Qwen3's RMSNorm, eps 1e-6).
struct FastKVzipGates {
  int n_layer = 0, input_dim = 0, n_head_kv = 0, n_group = 1, dim = 16, n_sink = 16;
  float eps = 1e-6f;
  struct Layer {
    std::vector<float> wq;      ///< [n_head_kv * n_group * dim][input_dim], row (h * n_group + g) * dim + e
    std::vector<float> bq;      ///< [n_head_kv * n_group * dim]
    std::vector<float> wk;      ///< [n_head_kv * dim][input_dim], row h * dim + e
    std::vector<float> q_norm;  ///< [dim]
    std::vector<float> k_norm;  ///< [dim]
    std::vector<float> k_base;  ///< [n_head_kv][n_sink][dim]
    std::vector<float> b;       ///< [n_head_kv][n_group]
  };
  std::vector<Layer> layers;

  /// Zero-filled tensors of the given shape (q_norm, k_norm = 1).
  static FastKVzipGates shaped(int n_layer, int input_dim, int n_head_kv, int n_group, int dim, int n_sink);
  /// Scores of n tokens: x [n][input_dim] -> out [n][n_head_kv] (float64 arithmetic).
  void predict(int layer, const float* x, int n, float* out) const;
  /// Writes a GGUF file (fastkvzip.* metadata, fastkvzip.L.* tensors); `model_desc` names the base model.
  void save(const std::string& path, const std::string& model_desc) const;
  /// Reads a file written by save(). Throws kvslim::Error naming the file and the field.
  static FastKVzipGates load(const std::string& path);
  /// Throws kvslim::Error unless the shapes fit the model (layers, n_embd, KV heads).
  void check(const HParams& hp, const std::string& what) const;
};

/// p_g of the formula above for one query of KV head h: l = l_g, q = q_g (dim values), s_j scaled by
/// 1/sd. sink_probs ([n_sink] values) receives exp(s_{g,j}) over the same denominator, which the
/// training's gradient needs. Sums in j order from the maximum, in float64.
double fastkvzip_gate_probability(const FastKVzipGates::Layer& L, int h, int n_sink, int dim, const double* q,
                                  double sd, double l, double* sink_probs);

/// Training options: the reference's recipe (optim.py, utils.py) by default.
struct FastKVzipTrainOptions {
  int dim = 16;                ///< gate width D
  int n_sink = 16;             ///< learned sink keys per KV head
  int n_group = 0;             ///< query vectors per KV head; 0: the model's GQA group (n_head / n_head_kv)
  int steps = 5000;            ///< SGD steps
  int batch = 1000;            ///< tokens per step (all layers see the same tokens)
  double lr = 0.2;             ///< peak learning rate; schedule fastkvzip_lr_scale
  double momentum = 0.9;
  int test_every = 100;        ///< every test_every-th token (1-based) is held out
  uint64_t seed = 0;           ///< initialisation and shuffling
  KVzipOptions kvzip = [] {    ///< the replay that makes the targets: plain KVzip scores
    KVzipOptions o;
    o.plus = false;
    return o;
  }();
};

/// The reference's learning-rate factor at step `step` of `steps`: 0.01 step during the first 1%
/// of the steps, then 1, 0.5 from half-way, 0.25 from three quarters.
double fastkvzip_lr_scale(int step, int steps);

/// Binary cross-entropy of one layer's gates on n tokens (the reference's loss: for every KV head
/// the mean over tokens of -(y log p + (1 - y) log(1 - p)), each log clamped at -100 as torch does,
/// summed over heads), and when `grad` is given its gradient, added into grad (shaped like the
/// layer). x [n][input_dim], y [n][n_head_kv] in [0, 1]. Projections in float (BLAS), the rest in
/// float64.
double fastkvzip_layer_loss(const FastKVzipGates& g, int layer, const float* x, const float* y, int n,
                            FastKVzipGates::Layer* grad = nullptr);

/// (attention input, KVzip score) rows per layer: X[l] [n][n_embd], Y[l] [n][n_head_kv].
struct FastKVzipData {
  std::vector<std::vector<float>> X, Y;
  size_t rows = 0;
};

/// Every token of every document: each document is prefilled alone and scored by KVzip's replay
/// (`opt`; plain KVzip by default). `progress(i, n)` after each document when given.
FastKVzipData collect_fastkvzip_data(const Model& model, const std::vector<std::vector<Token>>& docs,
                                     const KVzipOptions& opt,
                                     const std::function<void(size_t, size_t)>& progress = nullptr);

/// What train_fastkvzip fitted and measured (held-out: every test_every-th row).
struct FastKVzipTrainResult {
  FastKVzipGates gates;
  size_t train_rows = 0, test_rows = 0;
  std::vector<double> test_loss_init, test_loss;  ///< [layer] held-out loss before and after training
  std::vector<double> test_accuracy;  ///< [layer] share of (token, head) with (p >= 0.05) == (y >= 0.05)
  double seconds = 0;
};

/// Initialises gates as torch does (nn.Linear weights and bias U(-1/sqrt(in), 1/sqrt(in)), norms 1,
/// k_base and b 0; seeded) and trains each layer by SGD with momentum on shuffled batches of the
/// training rows (reshuffled every epoch). `on_step(step, steps)` every 100 steps when given.
/// Throws kvslim::Error when the data are empty or shapes do not fit the model.
FastKVzipTrainResult train_fastkvzip(const Model& model, const FastKVzipData& data, const FastKVzipTrainOptions& opt,
                                     const std::function<void(int, int)>& on_step = nullptr);

}  // namespace kvslim
