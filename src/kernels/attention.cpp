// Attention over KV segments: blocks of kKVTile entries are decoded from their codec into small
// buffers (keys transposed, values as rows) and consumed at once by all query rows of the call
// (a GQA group in decode, a tile of tokens x the group in prefill), with an online softmax
// (running max and sum per row) so the segment is read exactly once.
//
// The hot loops use GCC vector extensions (16 floats) inside one function compiled three times
// (x86-64-v4 = AVX-512, x86-64-v3 = AVX2 + FMA, baseline SSE2) and chosen at run time.
#include "kernels/attention.h"

#include <algorithm>
#include <climits>
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

namespace {

// The 64-byte vector helpers are always inlined into the multi-versioned kernel, so their
// nominal (default-target) ABI never applies.
#pragma GCC diagnostic ignored "-Wpsabi"

static_assert(kKVTile == 16, "the kernels below hold one tile of scores in a 16-float vector");

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

#define KV_INLINE inline __attribute__((always_inline))

KV_INLINE v16 load16(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
KV_INLINE void store16(float* p, const v16& v) { std::memcpy(p, &v, sizeof v); }
KV_INLINE v16 splat(float f) { return v16{} + f; }
KV_INLINE v16i splati(int32_t x) { return v16i{} + x; }

// exp on 16 lanes: Cody-Waite range reduction and Cephes' degree-6 polynomial (about 1e-7
// relative error). Inputs are clamped to [-87.3, 88], where 2^n stays a normal float.
KV_INLINE v16 vexp(const v16& x0) {
  v16 x = x0;
  x = x < splat(-87.3f) ? splat(-87.3f) : x;
  x = x > splat(88.0f) ? splat(88.0f) : x;
  const v16 nf = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  const v16 r = (x - nf * 0.693359375f) - nf * -2.12194440e-4f;
  v16 y = splat(1.9875691500e-4f);
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.0f;
  const v16i e = (__builtin_convertvector(nf, v16i) + 127) << 23;
  v16 p;
  std::memcpy(&p, &e, sizeof p);
  return y * p;
}

typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

// Horizontal max and sum by halving (a tree; the order of the additions is fixed).
KV_INLINE float hmax(const v16& v) {
  const v8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7), b = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const v8 m8 = a > b ? a : b;
  const v4 c = __builtin_shufflevector(m8, m8, 0, 1, 2, 3), d = __builtin_shufflevector(m8, m8, 4, 5, 6, 7);
  const v4 m4 = c > d ? c : d;
  return std::max(std::max(m4[0], m4[1]), std::max(m4[2], m4[3]));
}
KV_INLINE float hsum(const v16& v) {
  const v8 s8 = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const v4 s4 = __builtin_shufflevector(s8, s8, 0, 1, 2, 3) + __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// S[i][0..16) = sum_d Q[i][d] * kt[d][0..16) for NR rows.
template <int NR>
KV_INLINE void tile_scores(const float* Q, int hd, const float* kt, float* S) {
  // The row loops are unrolled so that the accumulators live in registers.
  v16 acc[NR];
#pragma GCC unroll 8
  for (int i = 0; i < NR; ++i) acc[i] = v16{};
  for (int d = 0; d < hd; ++d) {
    const v16 k = load16(kt + d * 16);
#pragma GCC unroll 8
    for (int i = 0; i < NR; ++i) acc[i] += Q[i * hd + d] * k;
  }
#pragma GCC unroll 8
  for (int i = 0; i < NR; ++i) store16(S + i * 16, acc[i]);
}

// O[i][c..c+16) += sum_j P[i][j] * V[j][c..c+16) for NR rows, nb value rows.
template <int NR>
KV_INLINE void tile_pv(const float* P, const float* V, int nb, int hd, float* O) {
  for (int c = 0; c < hd; c += 16) {
    v16 acc[NR];
#pragma GCC unroll 8
    for (int i = 0; i < NR; ++i) acc[i] = load16(O + i * hd + c);
    for (int j = 0; j < nb; ++j) {
      const v16 v = load16(V + j * hd + c);
#pragma GCC unroll 8
      for (int i = 0; i < NR; ++i) acc[i] += P[i * 16 + j] * v;
    }
#pragma GCC unroll 8
    for (int i = 0; i < NR; ++i) store16(O + i * hd + c, acc[i]);
  }
}

struct Scratch {
  std::vector<float> Q, O, m, l, S, kt, v;
};

// One decoded block: store entries [b, e), lane j attended by row r iff lg[j] < vis[r]
// (lg[j] = INT_MAX for lanes not attended at all).
struct BlockRef {
  const KVStore* st;
  size_t b, e;
  alignas(64) int32_t lg[16];
};

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void attend_core(
    const Segment& seg, const int32_t* sel, int n_sel, const float* Q, int rows, const int32_t* vis, float* out,
    int64_t out_stride, float* raw, Scratch& sc) {
  const int hd = seg.head_dim();
  const size_t n = seg.size();
  const bool vec_hd = hd % 16 == 0;
  int32_t maxvis = 0;
  for (int r = 0; r < rows; ++r) maxvis = std::max(maxvis, std::min<int32_t>(vis[r], static_cast<int32_t>(n)));
  float* O = sc.O.data();
  float* m = sc.m.data();
  float* l = sc.l.data();
  float* S = sc.S.data();
  float* kt = sc.kt.data();
  std::fill(O, O + static_cast<size_t>(rows) * hd, 0.0f);
  std::fill(m, m + rows, -INFINITY);
  std::fill(l, l + rows, 0.0f);

  auto process = [&](const BlockRef& blk) __attribute__((always_inline)) {
    const int nb = static_cast<int>(blk.e - blk.b);
    blk.st->block_keys_t(blk.b, blk.e, kt);
    int r = 0;
    for (; r + 4 <= rows; r += 4) tile_scores<4>(Q + static_cast<size_t>(r) * hd, hd, kt, S + r * 16);
    for (; r < rows; ++r) tile_scores<1>(Q + static_cast<size_t>(r) * hd, hd, kt, S + r * 16);
    v16i lgv;
    std::memcpy(&lgv, blk.lg, sizeof lgv);
    bool any = false;
    for (r = 0; r < rows; ++r) {
      float* Sr = S + r * 16;
      const v16i valid = lgv < splati(vis[r]);
      const v16 s = valid ? load16(Sr) : splat(-INFINITY);
      if (raw)
        for (int j = 0; j < nb; ++j)
          if (blk.lg[j] < vis[r]) raw[static_cast<size_t>(r) * n + blk.lg[j]] = Sr[j];
      const float bm = hmax(s);
      if (bm == -INFINITY) {
        store16(Sr, v16{});
        continue;
      }
      any = true;
      if (bm > m[r]) {
        const float alpha = m[r] == -INFINITY ? 0.0f : std::exp(m[r] - bm);
        l[r] *= alpha;
        float* Or = O + static_cast<size_t>(r) * hd;
        for (int d = 0; d < hd; ++d) Or[d] *= alpha;
        m[r] = bm;
      }
      const v16 p = valid ? vexp(s - m[r]) : v16{};
      l[r] += hsum(p);
      store16(Sr, p);
    }
    if (!any) return;
    const float* V = blk.st->block_values(blk.b, blk.e, sc.v.data());
    if (vec_hd) {
      r = 0;
      for (; r + 4 <= rows; r += 4) tile_pv<4>(S + r * 16, V, nb, hd, O + static_cast<size_t>(r) * hd);
      for (; r < rows; ++r) tile_pv<1>(S + r * 16, V, nb, hd, O + static_cast<size_t>(r) * hd);
    } else {
      for (r = 0; r < rows; ++r) {
        float* Or = O + static_cast<size_t>(r) * hd;
        for (int j = 0; j < nb; ++j) {
          const float p = S[r * 16 + j];
          for (int d = 0; d < hd; ++d) Or[d] += p * V[j * hd + d];
        }
      }
    }
  };

  std::vector<int32_t> ssel;
  for (int s = 0; s < seg.n_stores(); ++s) {
    const KVStore& st = seg.store(s);
    const std::vector<int32_t> lidx = seg.store_entries(s);  // empty: store index = segment index
    auto logical = [&](size_t i) { return lidx.empty() ? static_cast<int32_t>(i) : lidx[i]; };
    BlockRef blk;
    blk.st = &st;
    if (!sel) {
      for (size_t b = 0; b < st.size();) {
        const size_t e = st.block_end(b);
        if (logical(b) >= maxvis) break;  // logical indices increase along a store
        blk.b = b;
        blk.e = e;
        for (int j = 0; j < 16; ++j) blk.lg[j] = b + j < e ? logical(b + j) : INT_MAX;
        process(blk);
        b = e;
      }
    } else {
      ssel.clear();
      for (int k = 0; k < n_sel; ++k) {
        int ss;
        size_t j;
        seg.locate(static_cast<size_t>(sel[k]), ss, j);
        if (ss == s) ssel.push_back(static_cast<int32_t>(j));
      }
      for (size_t p = 0; p < ssel.size();) {
        if (logical(ssel[p]) >= maxvis) break;
        blk.b = st.block_begin(ssel[p]);
        blk.e = st.block_end(blk.b);
        for (int j = 0; j < 16; ++j) blk.lg[j] = INT_MAX;
        for (; p < ssel.size() && static_cast<size_t>(ssel[p]) < blk.e; ++p)
          blk.lg[ssel[p] - blk.b] = logical(ssel[p]);
        process(blk);
      }
    }
  }

  for (int r = 0; r < rows; ++r) {
    const float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
    const float* Or = O + static_cast<size_t>(r) * hd;
    float* o = out + r * out_stride;
    for (int d = 0; d < hd; ++d) o[d] = Or[d] * inv;
  }
}

thread_local Scratch tls_scratch;

// Copies the query rows, rotated as the keys are and pre-multiplied by the softmax scale.
void prepare(const Segment& seg, const float* q, int rows, float scale, Scratch& sc) {
  const int hd = seg.head_dim();
  sc.Q.resize(static_cast<size_t>(rows) * hd);
  sc.O.resize(sc.Q.size());
  sc.m.resize(rows);
  sc.l.resize(rows);
  sc.S.resize(static_cast<size_t>(rows) * 16);
  sc.kt.resize(static_cast<size_t>(hd) * 16);
  sc.v.resize(static_cast<size_t>(hd) * 16);
  for (int r = 0; r < rows; ++r) {
    float* d = sc.Q.data() + static_cast<size_t>(r) * hd;
    std::memcpy(d, q + static_cast<size_t>(r) * hd, hd * sizeof(float));
    seg.rotate(d);
    for (int i = 0; i < hd; ++i) d[i] *= scale;
  }
}

}  // namespace

void attend_segment(const Segment& seg, const float* q, int n_rows, const int32_t* visible, float scale,
                    float* out, int64_t out_stride, float* mass, float* probs) {
  if (n_rows <= 0) return;
  Scratch& sc = tls_scratch;
  prepare(seg, q, n_rows, scale, sc);
  const size_t n = seg.size();
  std::vector<float> raw;
  if (mass || probs) raw.assign(static_cast<size_t>(n_rows) * n, -INFINITY);
  attend_core(seg, nullptr, 0, sc.Q.data(), n_rows, visible, out, out_stride, raw.empty() ? nullptr : raw.data(),
              sc);
  if (raw.empty()) return;
  // Probabilities from the raw scores and the final running max and sum of each row.
  for (int r = 0; r < n_rows; ++r) {
    const float* rr = raw.data() + static_cast<size_t>(r) * n;
    const float mr = sc.m[r], inv = sc.l[r] > 0 ? 1.0f / sc.l[r] : 0.0f;
    float* pr = probs ? probs + static_cast<size_t>(r) * n : nullptr;
    for (size_t j = 0; j < n; ++j) {
      const float p = rr[j] == -INFINITY ? 0.0f : std::exp(rr[j] - mr) * inv;
      if (pr) pr[j] = p;
      if (mass) mass[j] += p;
    }
  }
}

void attend_segment_subset(const Segment& seg, const int32_t* idx, int n_idx, const float* q, int n_rows,
                           const int32_t* visible, float scale, float* out, int64_t out_stride) {
  if (n_rows <= 0) return;
  for (int k = 0; k < n_idx; ++k)
    if (idx[k] < 0 || static_cast<size_t>(idx[k]) >= seg.size() || (k > 0 && idx[k] <= idx[k - 1]))
      throw Error("attend_segment_subset: indices must be increasing and inside the segment");
  Scratch& sc = tls_scratch;
  prepare(seg, q, n_rows, scale, sc);
  attend_core(seg, idx, n_idx, sc.Q.data(), n_rows, visible, out, out_stride, nullptr, sc);
}

}  // namespace kvslim
