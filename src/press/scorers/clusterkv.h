#pragma once
// ClusterKV: after prefill the keys of each KV head are grouped by k-means in cosine space; at
// every decode step the clusters are ranked by the query's dot product with their centroids and
// attention reads only whole top clusters up to a budget, plus the sink entries and every entry
// added after the context. Nothing is evicted ("recallable" compression). Liu et al., "ClusterKV:
// Manipulating LLM KV Cache in Semantic Space for Recallable Compression", arXiv 2412.03213.
#include <cstdint>
#include <string>
#include <vector>

#include "press/authoring.h"

namespace kvslim {

/// k-means under cosine similarity (spherical k-means) of n vectors x [n][d]: assignment by the
/// largest cosine to the unit centroids, centroids re-estimated as the normalised mean of their
/// members, at most `iters` rounds (stops when nothing moves). Seeds: the vectors at evenly spaced
/// indices (deterministic). An emptied cluster is re-seeded with the vector least similar to its
/// centroid. Returns the cluster of each vector in `assign`; `centroids` [k][d] receives the plain
/// (unnormalised) mean of each cluster's vectors, which ranks clusters by mean query-key logit.
/// k is clamped to [1, n]; n == 0 gives empty outputs.
void kmeans_cosine(const float* x, int n, int d, int k, int iters, std::vector<int>& assign,
                   std::vector<float>& centroids);

/// The press ("clusterkv"): compress() evicts nothing and marks the context; the first decode step
/// clusters each (layer, KV head)'s context keys after the sinks (k = min(`clusters`, keys), the
/// authors' 400); each decode step then, per query head (or, gqa=mean, per KV head with the GQA
/// group's mean query), ranks clusters by query . centroid and attends to the sinks, the best
/// clusters' entries cut at exactly `budget` - sinks, and every entry added after the context.
/// budget = 0 means floor((1 - ratio) x context entries). Layers below min(`full_layers`,
/// n_layer - 1) and heads whose budget covers their context attend to everything, so a budget of
/// at least the sequence length is exactly full attention.
class ClusterKVPress : public PressImpl, private LayerHook {
 public:
  ClusterKVPress(double ratio, int budget, int sink, int clusters, int iters, int full_layers,
                 bool per_query_head = true);
  std::string describe() const override;
  double ratio() const override { return 0.0; }  // nothing is evicted
  void set_ratio(double r) override;
  size_t kept_after(const Target& t) const override { return t.n_context; }
  /// At decode: the press itself, as the hook choosing what attention reads.
  ObservationNeeds decode_needs() const override;
  bool selects_in_decode() const override { return true; }
  void reset() override;
  std::string report() const override;
  void apply(KVCache& cache, const Model& model, const Observation& obs, const Target& target) override;
  /// The decode-time selection of `layer` for the batch's n queries q [n][n_head][head_dim] (RoPE
  /// applied; the batch's entries are the segments' last n): as LayerHook::before_attention.
  bool select(int layer, const float* q, int n, const KVCache& cache, std::vector<std::vector<int32_t>>& subset);

  /// Fraction of the attention reads (old entries x KV heads x layers, over the decode steps of
  /// this request) that were skipped.
  double work_saved() const { return available_ ? 1.0 - double(attended_) / available_ : 0.0; }
  size_t attended() const { return attended_; }
  size_t available() const { return available_; }

 private:
  /// LayerHook: per layer, the old entries the decode token attends to (select()).
  bool before_attention(const LayerStep& step, std::vector<std::vector<int32_t>>& subset) override {
    return select(step.layer, step.q, step.n, *step.cache, subset);
  }
  struct Index {
    std::vector<std::vector<int32_t>> members;  // entry indices per cluster, increasing
    std::vector<float> centroids;               // [k][head_dim], plain means of the keys
  };
  int budget_for(size_t m) const;
  void build(int layer, const KVCache& cache);

  double ratio_;
  int budget_, sink_, clusters_, iters_, full_layers_;
  bool per_query_head_;
  int group_ = 1;
  std::vector<std::vector<size_t>> ctx_;   // [layer][kv head]: context entries (clustered)
  std::vector<std::vector<Index>> index_;  // [layer][kv head]; empty layer = not built yet
  size_t attended_ = 0, available_ = 0;
};

}  // namespace kvslim
