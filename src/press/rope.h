#pragma once
// RoPE as the forward pass applies it, for presses that move keys or queries between positions
// (key re-rotation; Expected Attention's pre-RoPE queries and averaged rotation). Internal.
#include <cmath>
#include <vector>

#include "kvslim/model.h"

namespace kvslim::rope {

/// Angle per position of each rotated pair i < head_dim / 2, as Session's rope tables:
/// base^(-2i/d) * freq_scale / rope_freqs[i] (Llama 3 factors when the model has them).
inline std::vector<double> inv_freq(const Model& model) {
  const HParams& hp = model.hparams();
  const int half = hp.head_dim / 2;
  std::vector<double> f(half);
  for (int i = 0; i < half; ++i) {
    f[i] = std::pow(double(hp.rope_freq_base), -2.0 * i / hp.head_dim) * hp.rope_freq_scale;
    if (!model.rope_freqs().empty()) f[i] /= model.rope_freqs()[i];
  }
  return f;
}

/// Indices of pair i: (2i, 2i+1) in the llama ("normal") layout, (i, i + d/2) in neox.
inline void pair(bool neox, int head_dim, int i, int& a, int& b) {
  a = neox ? i : 2 * i;
  b = neox ? i + head_dim / 2 : 2 * i + 1;
}

/// Rotates x[head_dim] by `delta` positions (negative = back): pair (x_a, x_b) ->
/// (x_a cos - x_b sin, x_a sin + x_b cos) with angle delta * inv_freq[i].
template <typename T>
inline void rotate(T* x, int head_dim, bool neox, const std::vector<double>& inv_freq, double delta) {
  for (int i = 0; i < head_dim / 2; ++i) {
    int a, b;
    pair(neox, head_dim, i, a, b);
    double th = delta * inv_freq[i], c = std::cos(th), s = std::sin(th);
    double x0 = x[a], x1 = x[b];
    x[a] = static_cast<T>(x0 * c - x1 * s);
    x[b] = static_cast<T>(x0 * s + x1 * c);
  }
}

}  // namespace kvslim::rope
