// Attention over latent codes: queries absorbed into the key basis, values summed in the value
// basis and expanded once per row. Quantized codes (2, 4, 8 bits) are read raw by
// attention/latent_code_dot.h, never dequantized; f16 / f32 coordinates a block at a time.
#include "attention/attention_latent.h"

#include "attention/attention.h"
#include "kernels/clones.h"
#include "attention/latent_code_dot.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <vector>

namespace kvslim {

namespace {

constexpr size_t kBlock = 64;  // entries whose f16 / f32 coordinates are read at once

// Scratch reused across calls on the same thread.
struct LatentScratch {
  std::vector<float> qp, S, codes, acc, a, A, t, inv;
  std::vector<int32_t> idx;
};
thread_local LatentScratch tls;

// Codes the raw-code kernels read (2, 4 or 8 bits); f16 and f32 coordinates are read as floats.
bool quantized(const LatentCodes& C) { return C.bits() == 2 || C.bits() == 4 || C.bits() == 8; }

}  // namespace

namespace detail {

// S[j] = qp . codes[j] for the n rows of `rank` codes (eight partial sums, as dot_f32, so the
// compiler vectorizes it; one copy per SIMD level and one call per block).
KVSLIM_TARGET_CLONES void latent_block_scores(const float* __restrict qp, const float* __restrict codes, size_t n,
                                              int rank, float* __restrict S) {
  for (size_t j = 0; j < n; ++j) {
    const float* c = codes + j * rank;
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= rank; i += 8)
      for (int k = 0; k < 8; ++k) s[k] += qp[i + k] * c[i + k];
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < rank; ++i) r += qp[i] * c[i];
    S[j] = r;
  }
}

// acc += sum_j P[j] codes[j] over the n rows of `rank` codes (entries with P[j] = 0 skipped).
KVSLIM_TARGET_CLONES void latent_block_accumulate(const float* __restrict P, const float* __restrict codes, size_t n,
                                                  int rank, float* __restrict acc) {
  for (size_t j = 0; j < n; ++j) {
    const float p = P[j];
    if (p == 0.0f) continue;
    const float* c = codes + j * rank;
    int i = 0;
    for (; i + 8 <= rank; i += 8)
      for (int k = 0; k < 8; ++k) acc[i + k] += p * c[i + k];
    for (; i < rank; ++i) acc[i] += p * c[i];
  }
}

}  // namespace detail

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
  const LatentBasis& kb = K.basis();
  for (int r = 0; r < rows; ++r) {
    float* p = sc.qp.data() + static_cast<size_t>(r) * rk;
    const float* qr = q + static_cast<size_t>(r) * hd;
    if (kb.is_selection()) {
      kb.project(qr, p);
    } else {
      // P_k q with the vectorized dot product (LatentBasis::project's loop is a serial chain).
      for (int i = 0; i < rk; ++i) p[i] = dot_f32(kb.proj.data() + static_cast<size_t>(i) * hd, qr, hd);
    }
    for (int i = 0; i < rk; ++i) p[i] *= scale;
  }
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
  if (quantized(K)) {
    // Scores on the raw codes: qp . c_j = qp . o + w_j (a . d_j + A) with a_i = qp_i f_i (see
    // attention/latent_code_dot.h); qp . o is the same for every entry and left out.
    sc.a.resize(static_cast<size_t>(rows) * rk);
    sc.A.resize(rows);
    const std::vector<float>& f = K.per_channel() ? K.steps() : K.basis().scale;
    for (int r = 0; r < rows; ++r) {
      const float* p = sc.qp.data() + static_cast<size_t>(r) * rk;
      float* a = sc.a.data() + static_cast<size_t>(r) * rk;
      float A = 0.0f;
      for (int i = 0; i < rk; ++i) A += (a[i] = f.empty() ? p[i] : p[i] * f[i]);
      sc.A[r] = 0.5f * A;
    }
    latent_dot::code_scores(latent_dot::code_rows(K), idx.data(), m, sc.a.data(), sc.A.data(), rows, sc.S.data(), m);
  } else {
    // f16 / f32 coordinates, a block at a time.
    for (size_t b = 0; b < m; b += kBlock) {
      const size_t e = std::min(m, b + kBlock);
      decode(K, b, e, rk);
      for (int r = 0; r < rows; ++r) {
        const float* qp = sc.qp.data() + static_cast<size_t>(r) * rk;
        float* S = sc.S.data() + static_cast<size_t>(r) * m;
        detail::latent_block_scores(qp, sc.codes.data(), e - b, rk, S + b);
      }
    }
  }
  // Softmax per row over its visible entries (a prefix of idx, which increases; the rest get 0),
  // left unnormalized: exp(s_j - max) weights the value codes, and 1 / sum scales each row's sums
  // once (inv[r] = 0 for a row that sees no entry).
  sc.inv.resize(rows);
  for (int r = 0; r < rows; ++r) {
    float* S = sc.S.data() + static_cast<size_t>(r) * m;
    const size_t nvis = static_cast<size_t>(std::lower_bound(idx.begin(), idx.end(), visible[r]) - idx.begin());
    const float sum = latent_dot::exp_shifted(S, nvis);
    std::fill(S + nvis, S + m, 0.0f);
    sc.inv[r] = nvis > 0 ? 1.0f / sum : 0.0f;
  }
  // Weighted value codes, normalized, then one expansion for all rows.
  sc.acc.assign(static_cast<size_t>(rows) * rv, 0.0f);
  if (quantized(V)) {
    // sum_j p_j c_j = o sum_j p_j + f * (u + t / 2) from the raw codes (attention/latent_code_dot.h),
    // with sum_j p_j = 1 for a row that sees an entry.
    sc.t.assign(rows, 0.0f);
    latent_dot::code_accumulate(latent_dot::code_rows(V), idx.data(), m, sc.S.data(), m, rows, sc.acc.data(),
                                sc.t.data());
    const bool pc = V.per_channel();
    const std::vector<float>& f = pc ? V.steps() : V.basis().scale;
    for (int r = 0; r < rows; ++r) {
      float* u = sc.acc.data() + static_cast<size_t>(r) * rv;
      const float inv = sc.inv[r], half_t = 0.5f * sc.t[r], psum = inv > 0.0f ? 1.0f : 0.0f;
      for (int i = 0; i < rv; ++i) {
        const float x = (u[i] + half_t) * inv;
        u[i] = (f.empty() ? x : f[i] * x) + (pc ? V.centers()[i] * psum : 0.0f);
      }
    }
  } else {
    for (size_t b = 0; b < m; b += kBlock) {
      const size_t e = std::min(m, b + kBlock);
      decode(V, b, e, rv);
      for (int r = 0; r < rows; ++r)
        detail::latent_block_accumulate(sc.S.data() + static_cast<size_t>(r) * m + b, sc.codes.data(), e - b, rv,
                                        sc.acc.data() + static_cast<size_t>(r) * rv);
    }
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < rv; ++i) sc.acc[static_cast<size_t>(r) * rv + i] *= sc.inv[r];
  }
  const LatentBasis& vb = V.basis();
  if (vb.is_selection()) {
    for (int r = 0; r < rows; ++r) vb.decode(sc.acc.data() + static_cast<size_t>(r) * rv, out + r * out_stride);
  } else {
    latent_dot::basis_expand(vb.proj.data(), vb.mean.empty() ? nullptr : vb.mean.data(), rv, hd, sc.acc.data(), rows,
                             out, out_stride);
  }
  for (int r = 0; r < rows; ++r) {
    const float inv = sc.inv[r];
    if (inv == 0.0f) {
      std::fill(out + r * out_stride, out + r * out_stride + hd, 0.0f);
      continue;
    }
    const float* E = sc.S.data() + static_cast<size_t>(r) * m;
    if (mass)
      for (size_t j = 0; j < m; ++j) mass[idx[j]] += E[j] * inv;
    if (probs)
      for (size_t j = 0; j < m; ++j) probs[static_cast<size_t>(r) * seg.size() + idx[j]] = E[j] * inv;
  }
}

}  // namespace kvslim
