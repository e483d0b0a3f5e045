#pragma once
// KVzap: a small per-layer surrogate predicts, from the attention input of a token, the log KVzip+
// score its entries will get in each KV head; entries are scored when created and evicted when
// they leave a sliding window with a predicted score under a threshold (prefill and decode).
// Jegou et al., "KVzap: Fast, Adaptive, and Faithful KV Cache Pruning", arXiv 2601.07891; the
// threshold/sliding-window rule is DMS's (Lancucki et al., arXiv 2506.05345).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvslim/model.h"
#include "press/kvzip.h"

namespace kvslim {

/// The surrogate: for each layer, x (the layer's attention input, n_embd values: the layer-input
/// hidden state after the attention RMSNorm, as kvpress feeds it) -> n_head_kv predicted log
/// KVzip+ scores. Linear: y = W x + b. MLP: y = W2 gelu(W1 x + b1) + b2 (exact erf GELU).
struct KVzapSurrogate {
  enum class Kind { Linear, MLP };
  Kind kind = Kind::Linear;
  int n_layer = 0, input_dim = 0, output_dim = 0, hidden_dim = 0;  ///< hidden_dim: MLP only
  /// Per layer, row-major: Linear uses w1 [output_dim][input_dim] and b1 [output_dim]; MLP uses
  /// w1 [hidden][input], b1 [hidden], w2 [output][hidden], b2 [output].
  std::vector<std::vector<float>> w1, b1, w2, b2;

  /// Predictions for n rows of x ([n][input_dim]) into out [n][output_dim].
  void predict(int layer, const float* x, int n, float* out) const;
  /// Writes a GGUF file (kvzap.* metadata, kvzap.L.* tensors); `model_desc` names the base model.
  void save(const std::string& path, const std::string& model_desc) const;
  /// Reads a file written by save(). Throws kvslim::Error naming the file and field.
  static KVzapSurrogate load(const std::string& path);
  /// Throws kvslim::Error unless the shapes fit the model (layers, n_embd, KV heads).
  void check(const HParams& hp, const std::string& what) const;
  const char* kind_name() const { return kind == Kind::Linear ? "linear" : "mlp"; }
};

/// Ridge regression with an intercept, closed form (centred normal equations solved by Cholesky in
/// float64): minimises |Y - X W^T - b|^2 + alpha |W|^2. X [n][d], Y [n][k] -> W [k][d], b [k].
/// Throws kvslim::Error when n == 0 or the system is not positive definite.
void ridge_fit(const float* X, const float* Y, size_t n, int d, int k, double alpha, std::vector<float>& W,
               std::vector<float>& b);

/// MLP training options (kvpress's KVzap recipe: AdamW, cosine schedule per epoch, gradient-norm
/// clipping at 1, MSE loss, batches of 512).
struct MLPTrainOptions {
  int hidden = 512;
  int epochs = 15;
  double lr = 5e-3;
  int batch = 512;
  double weight_decay = 0.01;
  double clip = 1.0;
  uint64_t seed = 42;
};
/// Trains a one-hidden-layer GELU MLP mapping X [n][d] to Y [n][k]. Outputs as in KVzapSurrogate.
void mlp_fit(const float* X, const float* Y, size_t n, int d, int k, const MLPTrainOptions& opt,
             std::vector<float>& W1, std::vector<float>& b1, std::vector<float>& W2, std::vector<float>& b2);

/// Pearson correlation of a and b (float64); 0 when either is constant or n < 2.
double pearson(const float* a, const float* b, size_t n);

/// (attention input, log KVzip+ target) pairs, per layer: X[l] [n][n_embd], Y[l] [n][n_head_kv];
/// doc[i] is the document row i came from (rows are aligned across layers).
struct KVzapData {
  std::vector<std::vector<float>> X, Y;
  std::vector<int> doc;
  size_t rows() const { return doc.size(); }
};

/// Collects training pairs: each document is prefilled (with BOS when the vocabulary wants it),
/// scored with KVzip's replay (KVzip+; sinks not special-cased), and up to `per_doc` of its tokens
/// are sampled (seeded). Targets are log(max(score, 1e-12)). `progress(i, n)` is called after each
/// document when given.
KVzapData collect_kvzap_data(const Model& model, const std::vector<std::vector<Token>>& docs, int per_doc,
                             uint64_t seed, const KVzipOptions& kvzip,
                             const std::function<void(size_t, size_t)>& progress = nullptr);

}  // namespace kvslim
