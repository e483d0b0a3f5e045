#pragma once
// Detects NaN/inf in the forward pass once per layer (one pass over the hidden states, cheap next
// to the layer's products) so that an overflow is reported where it happens instead of turning
// into silent garbage or a NaN score.
#include <cstddef>
#include <vector>

#include "kv/cache.h"

namespace kvslim {

/// True when every value of x[0, n) is finite.
bool all_finite(const float* x, size_t n);

/// Throws kvslim::Error when the hidden states x[0, n) after layer `layer` hold NaN or inf. The
/// message names the layer and the cause where it can tell: keys or values that were finite
/// before the cache but not in it (the cache codec overflowed, e.g. |k| > 65504 in f16; the hint
/// is --cache-type-k/-v f32 or bf16), or keys/values non-finite already (the weights or input overflow).
/// `k`/`v` hold this batch's keys/values (n_tokens x n_kv_heads x head_dim, after RoPE) and
/// n_old[h] the entries segment (layer, h) had before the batch was appended.
void check_layer_finite(const float* x, size_t n, int layer, const float* k, const float* v, int n_tokens,
                        const KVCache& cache, const std::vector<size_t>& n_old);

/// Throws kvslim::Error naming layer `layer`, the key or value and the codec when the entry k, v
/// (head_dim floats each, about to be appended to segment s) does not fit s's codecs
/// (Segment::check_fit): an f16 cache overflows where it is written, not layers later; the hint is
/// --cache-type-k/-v f32 or bf16. Non-finite keys or values (the weights or input overflow float32)
/// are named as such.
void check_entry_fits(const Segment& s, const float* k, const float* v, int layer);

/// Throws kvslim::Error when logits[0, n) hold NaN or inf (naming the output layer).
void check_logits_finite(const float* logits, size_t n);

}  // namespace kvslim
