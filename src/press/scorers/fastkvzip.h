#pragma once
// Fast KVzip: small per-layer gates predict, from a token's attention input alone, the KVzip score
// its entries would get in each KV head, so KVzip's context replay is not run at inference.
// Kim, Han, Yun, "Fast KVzip" (NAVER AI Lab), arXiv 2601.17668; reference code: kvpress
// kvpress/presses/fastkvzip_press.py (the gate and the press) and github.com/Janghyun1230/FastKVzip
// optim.py / utils.py (the training: binary cross-entropy against KVzip scores, SGD with momentum).
// kvpress downloads gates trained by the authors for a few models; kvslim trains them on the user's
// model and text (`kvslim fastkvzip-train`, train_fastkvzip in train/fastkvzip_train.h) and stores them as GGUF.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvslim/model.h"
#include "press/scorers/kvzip.h"

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

}  // namespace kvslim
