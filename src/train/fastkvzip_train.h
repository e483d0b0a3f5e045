#pragma once
// Training Fast KVzip's gates (press/fastkvzip.h) on a model and text: KVzip's replay scores every
// token of the documents, then SGD with momentum fits the gates to them (the reference's recipe).
#include <cstdint>
#include <functional>
#include <vector>

#include "kvslim/model.h"
#include "press/scorers/fastkvzip.h"
#include "press/scorers/kvzip.h"

namespace kvslim {

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
