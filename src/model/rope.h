#pragma once
// RoPE (Su et al., "RoFormer", arXiv 2104.09864), the one copy: the forward pass rotates queries
// and keys with tables from these angles, and presses that move keys or queries between positions
// (key re-rotation; Expected Attention's pre-RoPE queries and averaged rotation) use the same
// angles. Pair i < head_dim / 2 turns by position x base^(-2i/head_dim) / rope_freqs[i] (Llama 3
// factors when the model has them) x freq_scale, or with YaRN (arXiv 2309.00071) x the blend
// freq_scale (1 - m_i) + m_i of interpolation and extrapolation; the forward pass's tables also
// carry YaRN's magnitude factor, which multiplies the rotated q and k. The angles stay linear in
// the position, so moving a rotated key by a number of positions is a pure rotation (rotate()).
// Internal.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kvslim/model.h"

namespace kvslim::rope {

/// YaRN's correction dimension for `n_rot` full rotations over `n_ctx_orig` tokens (the pair index,
/// as a real number, whose wavelength fits the original context n_rot times).
inline double yarn_corr_dim(int head_dim, int n_ctx_orig, double n_rot, double base) {
  return head_dim * std::log(n_ctx_orig / (n_rot * 2 * M_PI)) / (2 * std::log(base));
}

/// The ramp's ends [low, high] as ggml computes them: floor of beta_fast's dimension, ceil of
/// beta_slow's, clamped to [0, head_dim - 1].
inline void yarn_corr_dims(const HParams& hp, double& low, double& high) {
  const int orig = hp.yarn_orig_ctx > 0 ? hp.yarn_orig_ctx : hp.n_ctx_train;
  low = std::max(0.0, std::floor(yarn_corr_dim(hp.head_dim, orig, hp.yarn_beta_fast, hp.rope_freq_base)));
  high = std::min(double(hp.head_dim - 1), std::ceil(yarn_corr_dim(hp.head_dim, orig, hp.yarn_beta_slow, hp.rope_freq_base)));
}

/// Share of extrapolation of pair i: ext_factor x (1 below `low`, 0 above `high`, linear between).
inline double yarn_mix(const HParams& hp, int i) {
  if (hp.yarn_ext_factor == 0.0f) return 0.0;
  double low, high;
  yarn_corr_dims(hp, low, high);
  const double y = (i - low) / std::max(0.001, high - low);
  return (1.0 - std::min(1.0, std::max(0.0, y))) * hp.yarn_ext_factor;
}

/// The factor multiplying rotated queries and keys: attn_factor, times YaRN's 1 + 0.1 ln(s) for
/// a context scaling s = 1 / freq_scale > 1 when the extrapolation factor is not 0.
inline double magnitude(const HParams& hp) {
  double m = hp.yarn_attn_factor;
  const double s = 1.0 / hp.rope_freq_scale;
  if (hp.yarn_ext_factor != 0.0f && s > 1.0) m *= 1.0 + 0.1 * std::log(s);
  return m;
}

/// Angle per position of each rotated pair i < head_dim / 2.
inline std::vector<double> inv_freq(const HParams& hp, const std::vector<float>& freq_factors) {
  const int half = hp.head_dim / 2;
  std::vector<double> f(half);
  for (int i = 0; i < half; ++i) {
    const double mix = yarn_mix(hp, i);
    f[i] = std::pow(double(hp.rope_freq_base), -2.0 * i / hp.head_dim) *
           (mix == 0.0 ? double(hp.rope_freq_scale) : hp.rope_freq_scale * (1.0 - mix) + mix);
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

/// cos and sin of every angle for n positions, times magnitude(hp): cs, sn [n][head_dim / 2]
/// (computed in double, stored as float: what the forward pass multiplies with).
inline void tables(const HParams& hp, const std::vector<float>& freq_factors, const int32_t* pos, int n,
                   std::vector<float>& cs, std::vector<float>& sn) {
  const std::vector<double> f = inv_freq(hp, freq_factors);
  const int half = hp.head_dim / 2;
  const double mag = magnitude(hp);
  cs.resize(static_cast<size_t>(n) * half);
  sn.resize(cs.size());
  for (int i = 0; i < half; ++i)
    for (int t = 0; t < n; ++t) {
      const double th = pos[t] * f[i];
      cs[static_cast<size_t>(t) * half + i] = static_cast<float>(std::cos(th) * mag);
      sn[static_cast<size_t>(t) * half + i] = static_cast<float>(std::sin(th) * mag);
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
