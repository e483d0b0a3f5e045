#pragma once
// Query statistics for Expected Attention computed offline (kvpress's ExpectedAttentionStatsPress
// loads them from the model hub; kvslim computes them on the user's model and a text with
// `kvslim ea-stats`, train/query_stats.h, and stores them as GGUF). Per (layer, query head): the
// mean and the unbiased covariance (N - 1) of the queries before RoPE, over every token of every
// sample except the first n_sink of each, as kvpress's collect_queries. Devoto, Jeblick, Jegou,
// arXiv 2510.00636.
#include <functional>
#include <string>
#include <vector>

#include "kvslim/model.h"

namespace kvslim {

struct QueryStatsFile {
  int n_layer = 0, n_head = 0, head_dim = 0;
  int n_sink = 4, samples = 0;
  double tokens = 0;  ///< queries counted per head
  std::vector<float> mean;  ///< [n_layer][n_head][head_dim]
  std::vector<float> cov;   ///< [n_layer][n_head][head_dim][head_dim]
  std::string base_model;
  const float* mean_at(int l, int qh) const {
    return mean.data() + (static_cast<size_t>(l) * n_head + qh) * head_dim;
  }
  const float* cov_at(int l, int qh) const {
    return cov.data() + (static_cast<size_t>(l) * n_head + qh) * head_dim * head_dim;
  }
  /// GGUF with ea_stats.* metadata and tensors ea_stats.mean, ea_stats.cov. I/O failure -> Error.
  void save(const std::string& path) const;
  /// Reads a file written by save(); errors name the file and the field.
  static QueryStatsFile load(const std::string& path);
  /// Throws kvslim::Error unless the shapes fit the model.
  void check(const HParams& hp, const std::string& what) const;
};

}  // namespace kvslim
