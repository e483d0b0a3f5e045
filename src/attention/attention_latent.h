#pragma once
// Attention over a latent segment (see src/kv/latent.h) without reconstructing keys
// or values: the query is projected into the key basis (P_k q), scores are dot products with the
// key codes, the probabilities weight the value codes, and only the weighted sum goes back
// through the value basis (mean_v + P_v^T sum_j p_j c_j, since the probabilities sum to 1).
// Exact up to the codes' rounding: the key mean adds the same logit to every entry of a row.
#include <cstdint>

#include "kv/cache.h"

namespace kvslim {

/// Same contract as attend_segment / attend_segment_subset (attention/attention.h) for a segment
/// with seg.latent(): rows of q (head_dim each, RoPE applied), row r sees the entries [0,
/// visible[r]); when `sel` is non-null only the entries sel[0, n_sel) (increasing) are read.
/// mass[j] += probability of entry j summed over rows; probs: [n_rows][seg.size()].
void attend_latent(const Segment& seg, const int32_t* sel, int n_sel, const float* q, int n_rows,
                   const int32_t* visible, float scale, float* out, int64_t out_stride, float* mass, float* probs);

}  // namespace kvslim
