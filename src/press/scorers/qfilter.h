#pragma once
// Q-Filters: one direction per (layer, KV head), the principal right singular vector of the
// attention queries, oriented so that queries project positively on it. Keys that project far on
// it draw the most attention (q . k ~ <q, u> <k, u> when queries concentrate along u), so the
// press keeps the keys with the largest <k, u>. Godey et al., "Q-Filters: Leveraging QK Geometry
// for Efficient KV Cache Compression", arXiv 2503.02812; kvpress's QFilterPress loads such
// directions from the model hub (nthngdy/<model>_qfilt, scoring -<k, filter>); kvslim computes
// them on the user's model with `kvslim qfilter-calibrate` (train/qfilter_calibrate.h) and stores
// them as GGUF.
#include <functional>
#include <string>
#include <vector>

#include "kvslim/model.h"

namespace kvslim {

struct QFilters {
  int n_layer = 0, n_head_kv = 0, head_dim = 0;
  /// Unit directions, [n_layer][n_head_kv][head_dim] (post-RoPE query space = the cache's key space).
  std::vector<float> dir;
  /// Share of the queries' squared norm along each direction (sigma_1^2 / sum sigma_i^2),
  /// [n_layer][n_head_kv]: how anisotropic the queries are.
  std::vector<float> explained;
  std::string base_model;
  const float* at(int layer, int kv_head) const {
    return dir.data() + (static_cast<size_t>(layer) * n_head_kv + kv_head) * head_dim;
  }
  /// Writes a GGUF file (qfilter.* metadata, tensors qfilter.dir [head_dim, n_head_kv, n_layer] and
  /// qfilter.explained). Throws kvslim::Error on I/O failure.
  void save(const std::string& path) const;
  /// Reads a file written by save(). Throws kvslim::Error naming the file and the field.
  static QFilters load(const std::string& path);
  /// Throws kvslim::Error unless the shapes fit the model.
  void check(const HParams& hp, const std::string& what) const;
};

}  // namespace kvslim
