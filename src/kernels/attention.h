#pragma once
// Scaled dot-product attention read directly from a KV segment (never expanded to query heads).
#include <cstdint>

#include "kvslim/kv_cache.h"

namespace kvslim {

/// Attention of `n_rows` query rows against one segment. Row r is q[r*head_dim ..], sees the
/// entries [0, visible[r]) of the segment (a prefix: causal order is insertion order), and writes
/// out[r*out_stride ..] (head_dim values). All rows typically belong to one GQA group.
/// When `mass` is non-null, mass[j] += the softmax probability of entry j, summed over rows.
/// When `probs` is non-null it receives the probability rows, [n_rows][seg.size()], zero where
/// not visible.
void attend_segment(const Segment& seg, const float* q, int n_rows, const int32_t* visible, float scale,
                    float* out, int64_t out_stride, float* mass = nullptr, float* probs = nullptr);

/// Dot product of two f32 vectors (SIMD chosen at run time).
float dot_f32(const float* a, const float* b, int64_t n);
/// y += a * x over n values.
void axpy_f32(float a, const float* x, float* y, int64_t n);

}  // namespace kvslim
