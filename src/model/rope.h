#pragma once
// RoPE (Su et al., "RoFormer", arXiv 2104.09864), the one copy: the forward pass rotates queries
// and keys with tables from these angles, and presses that move keys or queries between positions
// (key re-rotation; Expected Attention's pre-RoPE queries and averaged rotation) use the same
// angles. Pair i < head_dim / 2 turns by position x base^(-2i/head_dim) x freq_scale /
// rope_freqs[i] (Llama 3 factors when the model has them). Internal.
#include <cmath>
#include <vector>

#include "kvslim/model.h"

namespace kvslim::rope {

/// Angle per position of each rotated pair i < head_dim / 2.
inline std::vector<double> inv_freq(const HParams& hp, const std::vector<float>& freq_factors) {
  const int half = hp.head_dim / 2;
  std::vector<double> f(half);
  for (int i = 0; i < half; ++i) {
    f[i] = std::pow(double(hp.rope_freq_base), -2.0 * i / hp.head_dim) * hp.rope_freq_scale;
    if (!freq_factors.empty()) f[i] /= freq_factors[i];
  }
  return f;
}
inline std::vector<double> inv_freq(const Model& model) { return inv_freq(model.hparams(), model.rope_freqs()); }

/// Indices of pair i: (2i, 2i+1) in the llama ("normal") layout, (i, i + d/2) in neox.
inline void pair(bool neox, int head_dim, int i, int& a, int& b) {
  a = neox ? i : 2 * i;
  b = neox ? i + head_dim / 2 : 2 * i + 1;
}

/// cos and sin of every angle for n positions: cs, sn [n][head_dim / 2] (computed in double,
/// stored as float: what the forward pass multiplies with).
inline void tables(const HParams& hp, const std::vector<float>& freq_factors, const int32_t* pos, int n,
                   std::vector<float>& cs, std::vector<float>& sn) {
  const std::vector<double> f = inv_freq(hp, freq_factors);
  const int half = hp.head_dim / 2;
  cs.resize(static_cast<size_t>(n) * half);
  sn.resize(cs.size());
  for (int i = 0; i < half; ++i)
    for (int t = 0; t < n; ++t) {
      const double th = pos[t] * f[i];
      cs[static_cast<size_t>(t) * half + i] = static_cast<float>(std::cos(th));
      sn[static_cast<size_t>(t) * half + i] = static_cast<float>(std::sin(th));
    }
}

/// Rotates n_heads vectors of head_dim floats at x (one position) with one row of tables.
inline void apply(float* x, int n_heads, int head_dim, const float* cs, const float* sn, bool neox) {
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<size_t>(h) * head_dim;
    for (int i = 0; i < head_dim / 2; ++i) {
      int a, b;
      pair(neox, head_dim, i, a, b);
      const float x0 = v[a], x1 = v[b];
      v[a] = x0 * cs[i] - x1 * sn[i];
      v[b] = x0 * sn[i] + x1 * cs[i];
    }
  }
}

/// Rotates x[head_dim] by `delta` positions (negative = back), in double: pair (x_a, x_b) ->
/// (x_a cos - x_b sin, x_a sin + x_b cos) with angle delta * inv_freq[i].
template <typename T>
inline void rotate(T* x, int head_dim, bool neox, const std::vector<double>& inv_freq, double delta) {
  for (int i = 0; i < head_dim / 2; ++i) {
    int a, b;
    pair(neox, head_dim, i, a, b);
    const double th = delta * inv_freq[i], c = std::cos(th), s = std::sin(th);
    const double x0 = x[a], x1 = x[b];
    x[a] = static_cast<T>(x0 * c - x1 * s);
    x[b] = static_cast<T>(x0 * s + x1 * c);
  }
}

}  // namespace kvslim::rope
