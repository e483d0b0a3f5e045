#pragma once
// Attention probabilities of a few query rows over a whole segment, materialised (not the online
// softmax of attend_segment): what presses read from the observation window (SnapKV, TOVA, PyramidKV,
// ZigZagKV's statistics, ...). The one copy; press/ calls it through LayerView.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kv/cache.h"

namespace kvslim {

/// Entries per key block of keys_blocked().
constexpr size_t kKeyBlock = 16;

/// Keys of `seg` decoded and transposed in blocks of 16 entries, [block][head_dim][16], zero-padded:
/// the layout window_probabilities() reads.
std::vector<float> keys_blocked(const Segment& seg);

/// Softmax probabilities of `rows` query rows q [rows][head_dim] (RoPE applied) times `scale` over
/// the n entries of keys_t (keys_blocked layout). Row r sees entries [0, visible[r]) (visible[r] <=
/// n); out [rows][n] gets its probabilities, zero beyond visible[r]. SIMD chosen at run time;
/// exp has a relative error below 2e-6.
void window_probabilities(const float* q, int rows, float scale, const float* keys_t, size_t n, int head_dim,
                          const size_t* visible, float* out);

/// x[0, n) <- softmax(x[0, n)) in place, 16 values at a time (SIMD chosen at run time). The values
/// must be finite or -inf (a -inf entry gets a probability below 2^-126), with at least one finite
/// (mask a tail by passing a shorter n). exp has a relative error below 2e-6.
void softmax_inplace(float* __restrict x, size_t n);

}  // namespace kvslim
