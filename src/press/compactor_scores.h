#pragma once
// The two scores Compactor blends (Chari & Van Durme, "Compactor: Calibrated Query-Agnostic KV
// Cache Compression with Approximate Leverage Scores", arXiv 2507.08143), as kvpress's
// LeverageScorePress and NonCausalAttnPress compute them. Internal to src/press.
#include <cstdint>
#include <random>
#include <vector>

#include "press/authoring.h"

namespace kvslim {

/// Approximate leverage of each row of K [S][d] (keys before RoPE): rows centred over the
/// sequence, sketched by a Gaussian Phi [d][sketch] / sqrt(sketch) drawn from `rng`, X = K Phi;
/// score_i = x_i^T (X^T X + j I)^{-1} x_i, clamped at 0, where j is the first jitter of 1e-2,
/// 1e-1, 1, 10, 100 for which the Cholesky factorisation succeeds (kvslim::Error otherwise).
std::vector<double> leverage_scores(const std::vector<float>& K, int S, int d, int sketch, std::mt19937& rng);

/// Non-causal chunked attention column sums: the S rows of q and k [S][hd] are cut into chunks of
/// `chunk` (the last one zero-padded to a full chunk); within a chunk every query attends to every
/// key of the chunk, logits q . k unscaled, softmax in float64; returns, per key, the sum over the
/// chunk's queries. As kvpress: in a padded last chunk the padded keys keep logit -1e-9 and the
/// padded (zero) queries attend uniformly, so each real key there also receives their share.
std::vector<double> noncausal_column_sums(const float* q, const float* k, int S, int hd, int chunk);

/// NonCausalAttnPress's score of one layer before normalisation, for the entries [b, e) of each
/// segment: per KV head, the column sums averaged over its GQA group's query heads, times the
/// value's L2 norm, then average-pooled over 3 neighbours (zero padding, divided by 3).
/// Queries are recomputed from the recorded hidden states. out[h] has e_h - b_h values.
void noncausal_scores(const LayerView& view, const std::vector<int>& b, const std::vector<int>& e, int chunk,
                      const char* press, std::vector<std::vector<double>>& out);

/// LeverageScorePress's score of one layer before normalisation, for the entries [b, e) of each
/// segment (pre-RoPE keys recomputed from the hidden states; sketch seeded per layer and head).
void leverage_layer_scores(const LayerView& view, const std::vector<int>& b, const std::vector<int>& e, int sketch,
                           uint32_t seed, const char* press, std::vector<std::vector<double>>& out);

/// z-scores over every value of the layer (mean and unbiased std over all heads, std at least
/// 1e-6), in place.
void zscore_layer(std::vector<std::vector<double>>& x);

}  // namespace kvslim
