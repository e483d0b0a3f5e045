#pragma once
// Cross-layer sharing of latent bases: adjacent layers (same KV head, same side: keys or values)
// whose keys or values lie in nearly the same subspace use ONE basis, fitted by PCA on the rows of
// all of them, so the basis is stored (and counted) once for the group. The idea is xKV's (Chang
// et al., "xKV: Cross-Layer SVD for KV-Cache Compression", arXiv 2503.18893: the dominant
// singular vectors of adjacent layers' KV are well aligned, so one basis serves several layers);
// MiniCache (arXiv 2405.14366) and CLA (arXiv 2405.12981) share across adjacent layers too, as
// entries rather than bases. kvslim shares bases; every layer keeps its own codes (entries).
//
// Similarity is measured, not assumed: a layer joins the group of the layers before it only when
// the group's pooled basis keeps, for EVERY member, at least (kept fraction with its own basis)
// - tol of that member's variance (variance measured about the member's own mean, so a shared
// mean that does not fit a member counts against it). Computed in float64 from each layer's
// PCA (covariance = sum_i var_i a_i a_i^T).
#include <memory>
#include <string>
#include <vector>

#include "kv/latent.h"

namespace kvslim {

/// One layer's rows (keys or values of one KV head): rows[n][head_dim], row-major.
struct LayerRows {
  const float* rows = nullptr;
  size_t n = 0;
};

/// Groups of adjacent layers and their bases (see the file comment).
struct LatentShare {
  /// [n_layer]: the first layer of the group each layer belongs to (its own index when alone).
  std::vector<int> group;
  /// [n_layer]: the basis each layer uses; the same object for every member of a group.
  std::vector<std::shared_ptr<const LatentBasis>> basis;
  /// [n_layer]: fraction of the layer's variance its own basis (at its own rank) keeps, and the
  /// fraction the basis it uses keeps (equal when alone).
  std::vector<double> kept_own, kept;
  /// Number of distinct bases (groups).
  int n_groups() const;
};

/// Fits a basis per layer (rank ranks[l], clamped to [1, head_dim]; ranks[l] <= 0: the smallest
/// rank keeping `energy` of the layer's variance) and merges adjacent layers
/// greedily from layer 0 up: layer l joins the current group when the pooled basis of group + l
/// passes the test above for every member; the pooled basis has the largest rank of the members
/// (`min_rank` false) or the smallest (`min_rank` true: a byte budget allocated per layer holds).
/// tol < 0: no sharing. max_group > 0 caps the layers per group. Throws kvslim::Error when a layer
/// has no rows or the sizes disagree.
LatentShare share_adjacent_layers(const std::vector<LayerRows>& layers, int head_dim, const std::vector<int>& ranks,
                                  double energy, double tol, int max_group = 0, bool min_rank = false);

/// Fraction of the variance of `rows` (about their own mean) that `basis` keeps: 1 - mean
/// ||x - m - P^T P (x - m)||^2 / mean ||x - mean(x)||^2, in float64 (1 for rows without variance).
double latent_kept_fraction(const LatentBasis& basis, const float* rows, size_t n);

}  // namespace kvslim
