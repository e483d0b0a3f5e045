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
#include "press/scorers/kvzip.h"

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

/// The surrogate's layers, which its training (train/kvzap_train.h) runs too: Y[n][o] = X[n][in]
/// W^T + b (W [o][in], BLAS), and GELU in its erf form.
void kvzap_linear(const float* X, int n, int in, const float* W, const float* b, int o, float* Y);
float kvzap_gelu(float x);

}  // namespace kvslim
