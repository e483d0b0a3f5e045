// Attention over latent codes: queries absorbed into the key basis, values summed in the value
// basis and expanded once per row.
#include "kernels/attention_latent.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

namespace kvslim {

namespace {

constexpr size_t kBlock = 64;  // entries whose codes are decoded at once

// Scratch reused across calls on the same thread.
struct LatentScratch {
  std::vector<float> qp, S, codes, acc;
  std::vector<int32_t> idx;
};
thread_local LatentScratch tls;

}  // namespace

void attend_latent(const Segment& seg, const int32_t* sel, int n_sel, const float* q, int rows,
                   const int32_t* visible, float scale, float* out, int64_t out_stride, float* mass, float* probs) {
  if (rows <= 0) return;
  const LatentCodes& K = seg.latent_keys();
  const LatentCodes& V = seg.latent_values();
  const int hd = seg.head_dim(), rk = K.rank(), rv = V.rank();
  LatentScratch& sc = tls;
  int32_t maxvis = 0;
  for (int r = 0; r < rows; ++r) maxvis = std::max(maxvis, visible[r]);
  maxvis = std::min<int32_t>(maxvis, static_cast<int32_t>(seg.size()));
  // The entries read, in order.
  std::vector<int32_t>& idx = sc.idx;
  idx.clear();
  if (sel) {
    for (int k = 0; k < n_sel && sel[k] < maxvis; ++k) idx.push_back(sel[k]);
  } else {
    idx.resize(maxvis);
    for (int32_t j = 0; j < maxvis; ++j) idx[j] = j;
  }
  const size_t m = idx.size();
  if (probs) std::fill(probs, probs + static_cast<size_t>(rows) * seg.size(), 0.0f);
  if (m == 0) {
    for (int r = 0; r < rows; ++r) std::fill(out + r * out_stride, out + r * out_stride + hd, 0.0f);
    return;
  }
  sc.qp.resize(static_cast<size_t>(rows) * rk);
  for (int r = 0; r < rows; ++r) {
    float* p = sc.qp.data() + static_cast<size_t>(r) * rk;
    K.basis().project(q + static_cast<size_t>(r) * hd, p);
    for (int i = 0; i < rk; ++i) p[i] *= scale;
  }
  // Scores, block of codes by block of codes (contiguous runs decoded in one call).
  sc.S.resize(static_cast<size_t>(rows) * m);
  sc.codes.resize(kBlock * static_cast<size_t>(std::max(rk, rv)));
  auto decode = [&](const LatentCodes& C, size_t b, size_t e, int rank) {
    // idx[b, e) -> sc.codes[(e-b) * rank]; runs of consecutive indices decode together.
    size_t i = b;
    while (i < e) {
      size_t j = i + 1;
      while (j < e && idx[j] == idx[j - 1] + 1) ++j;
      C.coords(idx[i], idx[j - 1] + 1, sc.codes.data() + (i - b) * rank);
      i = j;
    }
  };
  for (size_t b = 0; b < m; b += kBlock) {
    const size_t e = std::min(m, b + kBlock);
    decode(K, b, e, rk);
    for (int r = 0; r < rows; ++r) {
      const float* qp = sc.qp.data() + static_cast<size_t>(r) * rk;
      float* S = sc.S.data() + static_cast<size_t>(r) * m;
      for (size_t j = b; j < e; ++j) {
        const float* c = sc.codes.data() + (j - b) * rk;
        float s = 0.0f;
        for (int i = 0; i < rk; ++i) s += qp[i] * c[i];
        S[j] = idx[j] < visible[r] ? s : -INFINITY;
      }
    }
  }
  // Softmax per row.
  for (int r = 0; r < rows; ++r) {
    float* S = sc.S.data() + static_cast<size_t>(r) * m;
    float mx = -INFINITY;
    for (size_t j = 0; j < m; ++j) mx = std::max(mx, S[j]);
    if (mx == -INFINITY) {
      std::fill(S, S + m, 0.0f);
      continue;
    }
    double sum = 0.0;
    for (size_t j = 0; j < m; ++j) {
      S[j] = S[j] == -INFINITY ? 0.0f : std::exp(S[j] - mx);
      sum += S[j];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (size_t j = 0; j < m; ++j) S[j] *= inv;
  }
  // Probability-weighted value codes, then one expansion per row.
  sc.acc.assign(static_cast<size_t>(rows) * rv, 0.0f);
  for (size_t b = 0; b < m; b += kBlock) {
    const size_t e = std::min(m, b + kBlock);
    decode(V, b, e, rv);
    for (int r = 0; r < rows; ++r) {
      const float* P = sc.S.data() + static_cast<size_t>(r) * m;
      float* a = sc.acc.data() + static_cast<size_t>(r) * rv;
      for (size_t j = b; j < e; ++j) {
        const float p = P[j];
        if (p == 0.0f) continue;
        const float* c = sc.codes.data() + (j - b) * rv;
        for (int i = 0; i < rv; ++i) a[i] += p * c[i];
      }
    }
  }
  for (int r = 0; r < rows; ++r) {
    const float* P = sc.S.data() + static_cast<size_t>(r) * m;
    bool any = false;
    for (size_t j = 0; j < m && !any; ++j) any = P[j] > 0.0f;
    float* o = out + r * out_stride;
    if (!any) {
      std::fill(o, o + hd, 0.0f);
      continue;
    }
    V.basis().decode(sc.acc.data() + static_cast<size_t>(r) * rv, o);
    if (mass)
      for (size_t j = 0; j < m; ++j) mass[idx[j]] += P[j];
    if (probs)
      for (size_t j = 0; j < m; ++j) probs[static_cast<size_t>(r) * seg.size() + idx[j]] = P[j];
  }
}

}  // namespace kvslim
