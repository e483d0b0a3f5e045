#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace kvslim {

__attribute__((target_clones("avx512f", "avx2", "default"))) float dot_f32(const float* a, const float* b,
                                                                            int64_t n) {
  // Eight partial sums let the compiler vectorize without -ffast-math.
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += a[i + k] * b[i + k];
  float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void axpy_f32(float a, const float* x, float* y,
                                                                            int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void attend_segment(const Segment& seg, const float* q, int n_rows, const int32_t* visible, float scale,
                    float* out, int64_t out_stride, float* mass, float* probs) {
  const int hd = seg.head_dim();
  const size_t n = seg.size();
  const int64_t block = 64;
  int32_t max_vis = 0;
  for (int r = 0; r < n_rows; ++r) max_vis = std::max(max_vis, visible[r]);
  std::vector<float> s(static_cast<size_t>(n_rows) * std::max<int32_t>(max_vis, 1));
  std::vector<float> buf;
  const float* kf = seg.keys_f32();
  const float* vf = seg.values_f32();
  if (!kf || !vf) buf.resize(block * hd);
  // Scores, key block by key block (a block is decoded once for all rows).
  for (int64_t b0 = 0; b0 < max_vis; b0 += block) {
    int64_t b1 = std::min<int64_t>(b0 + block, max_vis);
    const float* kb = kf ? kf + b0 * hd : buf.data();
    if (!kf) seg.keys(b0, b1, buf.data());
    for (int r = 0; r < n_rows; ++r) {
      int64_t e = std::min<int64_t>(b1, visible[r]);
      float* sr = s.data() + static_cast<size_t>(r) * max_vis;
      for (int64_t j = b0; j < e; ++j) sr[j] = dot_f32(q + static_cast<int64_t>(r) * hd, kb + (j - b0) * hd, hd) * scale;
    }
  }
  for (int r = 0; r < n_rows; ++r) {
    float* sr = s.data() + static_cast<size_t>(r) * max_vis;
    int32_t v = visible[r];
    float mx = -INFINITY;
    for (int32_t j = 0; j < v; ++j) mx = std::max(mx, sr[j]);
    double sum = 0;
    for (int32_t j = 0; j < v; ++j) {
      sr[j] = std::exp(sr[j] - mx);
      sum += sr[j];
    }
    float inv = v > 0 ? static_cast<float>(1.0 / sum) : 0.0f;
    for (int32_t j = 0; j < v; ++j) sr[j] *= inv;
    std::memset(out + r * out_stride, 0, hd * sizeof(float));
    if (mass)
      for (int32_t j = 0; j < v; ++j) mass[j] += sr[j];
    if (probs) {
      float* pr = probs + static_cast<size_t>(r) * n;
      std::memcpy(pr, sr, v * sizeof(float));
      std::fill(pr + v, pr + n, 0.0f);
    }
  }
  for (int64_t b0 = 0; b0 < max_vis; b0 += block) {
    int64_t b1 = std::min<int64_t>(b0 + block, max_vis);
    const float* vb = vf ? vf + b0 * hd : buf.data();
    if (!vf) seg.values(b0, b1, buf.data());
    for (int r = 0; r < n_rows; ++r) {
      int64_t e = std::min<int64_t>(b1, visible[r]);
      const float* sr = s.data() + static_cast<size_t>(r) * max_vis;
      float* o = out + r * out_stride;
      for (int64_t j = b0; j < e; ++j) axpy_f32(sr[j], vb + (j - b0) * hd, o, hd);
    }
  }
}

}  // namespace kvslim
