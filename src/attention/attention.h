#pragma once
// Scaled dot-product attention read directly from a KV segment (never expanded to query heads).
// The segment is read block by block (kKVTile entries, decoded from its codec into a small
// buffer), with an online softmax, so a quantized cache is never expanded to full precision.
#include <cstdint>

#include "kv/cache.h"

namespace kvslim {

/// Attention of `n_rows` query rows against one segment. Row r is q[r*head_dim ..] (RoPE applied,
/// not rotated: the segment's key rotation is applied to it here), sees the entries [0,
/// visible[r]) of the segment (a prefix: causal order is insertion order), and writes
/// out[r*out_stride ..] (head_dim values; zeros when nothing is visible). All rows typically
/// belong to one GQA group, so every block is decoded once for the whole group.
/// When `mass` is non-null, mass[j] += the softmax probability of entry j, summed over rows.
/// When `probs` is non-null it receives the probability rows, [n_rows][seg.size()], zero where
/// not visible.
void attend_segment(const Segment& seg, const float* q, int n_rows, const int32_t* visible, float scale,
                    float* out, int64_t out_stride, float* mass = nullptr, float* probs = nullptr);

/// As attend_segment, restricted to the entries idx[0, n_idx) (strictly increasing segment
/// indices): decode-time selection without eviction (ClusterKV). Entry idx[k] is seen by row r
/// when idx[k] < visible[r]. Blocks holding no selected entry are not read.
void attend_segment_subset(const Segment& seg, const int32_t* idx, int n_idx, const float* q, int n_rows,
                           const int32_t* visible, float scale, float* out, int64_t out_stride);

/// Dot product of two f32 vectors (SIMD chosen at run time).
float dot_f32(const float* a, const float* b, int64_t n);
/// y += a * x over n values.
void axpy_f32(float a, const float* x, float* y, int64_t n);

}  // namespace kvslim
