// Products with raw latent codes (see latent_code_dot.h): a scalar reference and an AVX2 path.
#include "attention/latent_code_dot.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "kernels/quant_dot.h"
#include "kv/latent_widen.h"
#include "kvslim/error.h"
#include "kvslim/quant.h"

#include "kernels/intrinsics.h"

namespace kvslim::latent_dot {

namespace {

// Bytes before a row's codes: the exponent byte (per channel) or the f16 scale (per token).
int prefix(const CodeRows& c) { return c.channel ? 1 : 2; }

// d = q - 2^(bits-1) of code i of packed codes q (codes never straddle a byte: bits is 2, 4 or 8).
int centred_code(const uint8_t* q, int i, int bits) {
  const size_t bit = static_cast<size_t>(i) * bits;
  return ((q[bit / 8] >> (bit % 8)) & ((1 << bits) - 1)) - (1 << (bits - 1));
}

// w_j of a row (see row_weight), inlined into the kernels' entry loops.
inline float weight(const CodeRows& c, const uint8_t* r) {
  if (c.channel) return (c.widen ? c.widen : latent_widen_table())[r[0]];
  uint16_t h;
  std::memcpy(&h, r, sizeof h);
  return fp16_to_fp32(h);
}

}  // namespace

CodeRows code_rows(const LatentCodes& C) {
  if (C.bits() != 2 && C.bits() != 4 && C.bits() != 8)
    throw Error(fmt::format("latent code kernels: bits {} are not quantized codes (expected 2, 4 or 8)", C.bits()));
  CodeRows c;
  c.base = C.size() ? C.row(0) : nullptr;
  c.stride = C.row_bytes();
  c.bits = C.bits();
  c.rank = C.rank();
  c.channel = C.per_channel();
  c.widen = latent_widen_table();
  return c;
}

float row_weight(const CodeRows& c, const uint8_t* r) { return weight(c, r); }

// ---- scalar reference ----

void code_scores_scalar(const CodeRows& c, const int32_t* idx, size_t n, const float* a, const float* A, int rows,
                        float* S, size_t lds) {
  for (size_t k = 0; k < n; ++k) {
    const uint8_t* r = c.base + static_cast<size_t>(idx[k]) * c.stride;
    const float w = weight(c, r);
    const uint8_t* q = r + prefix(c);
    for (int row = 0; row < rows; ++row) {
      const float* ar = a + static_cast<size_t>(row) * c.rank;
      float s = 0.0f;
      for (int i = 0; i < c.rank; ++i) s += ar[i] * static_cast<float>(centred_code(q, i, c.bits));
      S[row * lds + k] = w * (s + A[row]);
    }
  }
}

void code_accumulate_scalar(const CodeRows& c, const int32_t* idx, size_t n, const float* P, size_t ldp, int rows,
                            float* u, float* t) {
  for (size_t k = 0; k < n; ++k) {
    const uint8_t* r = c.base + static_cast<size_t>(idx[k]) * c.stride;
    const float w = weight(c, r);
    const uint8_t* q = r + prefix(c);
    for (int row = 0; row < rows; ++row) {
      const float pw = P[row * ldp + k] * w;
      if (pw == 0.0f) continue;
      t[row] += pw;
      float* ur = u + static_cast<size_t>(row) * c.rank;
      for (int i = 0; i < c.rank; ++i) ur[i] += pw * static_cast<float>(centred_code(q, i, c.bits));
    }
  }
}

void basis_expand_scalar(const float* proj, const float* mean, int rank, int hd, const float* u, int rows, float* out,
                         int64_t out_stride) {
  for (int r = 0; r < rows; ++r) {
    float* o = out + r * out_stride;
    for (int d = 0; d < hd; ++d) o[d] = mean ? mean[d] : 0.0f;
    for (int i = 0; i < rank; ++i) {
      const float c = u[static_cast<size_t>(r) * rank + i];
      const float* p = proj + static_cast<size_t>(i) * hd;
      for (int d = 0; d < hd; ++d) o[d] += c * p[d];
    }
  }
}

float exp_shifted_scalar(float* x, size_t n) {
  if (n == 0) return 0.0f;
  const float mx = *std::max_element(x, x + n);
  float sum = 0.0f;
  for (size_t j = 0; j < n; ++j) sum += (x[j] = std::exp(x[j] - mx));
  return sum;
}

// ---- AVX2 (also what the AVX-512 level runs) ----

namespace {

#define LD_AVX2 inline __attribute__((always_inline, target("arch=x86-64-v3")))

// Codes 8g .. 8g+7 of packed codes q as floats d = q - 2^(BITS-1), exact.
template <int BITS>
LD_AVX2 __m256 codes8(const uint8_t* q, int g) {
  if constexpr (BITS == 8) {
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * g)));
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(v, _mm256_set1_epi32(128)));
  } else if constexpr (BITS == 4) {
    uint32_t w;
    std::memcpy(&w, q + 4 * g, sizeof w);  // code i in bits 4i .. 4i+3 (little end first)
    const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)), sh),
                                       _mm256_set1_epi32(15));
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(v, _mm256_set1_epi32(8)));
  } else {
    uint16_t w;
    std::memcpy(&w, q + 2 * g, sizeof w);
    const __m256i sh = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m256i v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)), sh),
                                       _mm256_set1_epi32(3));
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(v, _mm256_set1_epi32(2)));
  }
}

// The sums of the eight lanes of each of v[0..7], in order: one vector of 8 totals.
LD_AVX2 __m256 sum8x8(const float (*v)[8]) {
  const __m256 h0 = _mm256_hadd_ps(_mm256_load_ps(v[0]), _mm256_load_ps(v[1]));
  const __m256 h1 = _mm256_hadd_ps(_mm256_load_ps(v[2]), _mm256_load_ps(v[3]));
  const __m256 h2 = _mm256_hadd_ps(_mm256_load_ps(v[4]), _mm256_load_ps(v[5]));
  const __m256 h3 = _mm256_hadd_ps(_mm256_load_ps(v[6]), _mm256_load_ps(v[7]));
  const __m256 g0 = _mm256_hadd_ps(h0, h1);  // v0..v3: lanes 0-3 of each, then lanes 4-7
  const __m256 g1 = _mm256_hadd_ps(h2, h3);
  return _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
}

// Scores of R rows (see code_scores), eight entries at a time: each entry's partial sums stay in
// one accumulator per row across its codes, and eight entries' accumulators are reduced at once.
template <int BITS, int R>
LD_AVX2 void scores_rows(const CodeRows& c, const int32_t* idx, size_t n, const float* a, const float* A, float* S,
                         size_t lds) {
  // c's fields as locals: the stores below could alias them, and reloading them per entry costs
  // as much as the products at small ranks.
  const int rank = c.rank, ng = rank / 8, full = 8 * ng, pre = prefix(c);
  const bool has_tail = full < rank, channel = c.channel;
  const uint8_t* const base = c.base;
  const size_t stride = c.stride;
  const float* const widen = c.widen ? c.widen : latent_widen_table();
  alignas(32) float T[R][8][8];
  alignas(32) float tail[R][8] = {};
  alignas(32) float W[8];
  alignas(32) float out[8];
  for (size_t k0 = 0; k0 < n; k0 += 8) {
    const int ne = static_cast<int>(std::min<size_t>(8, n - k0));
    for (int e = 0; e < 8; ++e) {
      if (e >= ne) {
        for (int r = 0; r < R; ++r) {
          _mm256_store_ps(T[r][e], _mm256_setzero_ps());
          tail[r][e] = 0.0f;
        }
        W[e] = 0.0f;
        continue;
      }
      const uint8_t* row = base + static_cast<size_t>(idx[k0 + e]) * stride;
      W[e] = channel ? widen[row[0]] : weight(c, row);
      const uint8_t* q = row + pre;
      // The row loops are unrolled so that the accumulators live in registers (at -O2 GCC keeps
      // them on the stack otherwise: a store-to-load chain per code group and row).
      __m256 acc[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
      for (int g = 0; g < ng; ++g) {
        const __m256 x = codes8<BITS>(q, g);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
          acc[r] = _mm256_fmadd_ps(x, _mm256_loadu_ps(a + static_cast<size_t>(r) * rank + 8 * g), acc[r]);
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) _mm256_store_ps(T[r][e], acc[r]);
      if (has_tail)
        for (int r = 0; r < R; ++r) {
          float s = 0.0f;
          for (int i = full; i < rank; ++i)
            s += a[static_cast<size_t>(r) * rank + i] * static_cast<float>(centred_code(q, i, BITS));
          tail[r][e] = s;
        }
    }
    const __m256 w = _mm256_load_ps(W);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 d = _mm256_add_ps(_mm256_add_ps(sum8x8(T[r]), _mm256_load_ps(tail[r])), _mm256_set1_ps(A[r]));
      const __m256 s = _mm256_mul_ps(w, d);
      float* dst = S + r * lds + k0;
      if (ne == 8) {
        _mm256_storeu_ps(dst, s);
      } else {
        _mm256_store_ps(out, s);
        std::copy(out, out + ne, dst);
      }
    }
  }
}

// Value accumulation of R rows over CW groups of 8 channels at a time: the R x CW accumulators
// stay in registers across all entries (each code converted once per entry and used by every row).
template <int BITS, int R, int CW>
LD_AVX2 void accumulate_rows(const CodeRows& c, const int32_t* idx, size_t n, const float* PW, size_t ldw, float* u) {
  const int ng = c.rank / 8, pre = prefix(c);
  for (int g0 = 0; g0 < ng; g0 += CW) {
    const int gw = std::min(CW, ng - g0);
    __m256 acc[R][CW];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int w = 0; w < CW; ++w)
        acc[r][w] = w < gw ? _mm256_loadu_ps(u + static_cast<size_t>(r) * c.rank + 8 * (g0 + w)) : _mm256_setzero_ps();
    for (size_t k = 0; k < n; ++k) {
      const uint8_t* q = c.base + static_cast<size_t>(idx[k]) * c.stride + pre;
      __m256 p[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) p[r] = _mm256_set1_ps(PW[r * ldw + k]);
#pragma GCC unroll 8
      for (int w = 0; w < CW; ++w) {
        if (w >= gw) break;
        const __m256 x = codes8<BITS>(q, g0 + w);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[r][w] = _mm256_fmadd_ps(x, p[r], acc[r][w]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int w = 0; w < CW; ++w)
        if (w < gw) _mm256_storeu_ps(u + static_cast<size_t>(r) * c.rank + 8 * (g0 + w), acc[r][w]);
  }
}

// Expansion of R rows, 8 dimensions at a time: the R accumulators stay in registers across the
// rank, each basis vector's 8 floats loaded once for all rows (the scalar reference's sums in its
// order, with fused multiply-adds).
template <int R>
LD_AVX2 void expand_rows(const float* proj, const float* mean, int rank, int hd, const float* u, float* out,
                         int64_t out_stride) {
  int d = 0;
  for (; d + 8 <= hd; d += 8) {
    __m256 acc[R];
    const __m256 m0 = mean ? _mm256_loadu_ps(mean + d) : _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = m0;
    for (int i = 0; i < rank; ++i) {
      const __m256 p = _mm256_loadu_ps(proj + static_cast<size_t>(i) * hd + d);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
        acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(u + static_cast<size_t>(r) * rank + i), p, acc[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + r * out_stride + d, acc[r]);
  }
  for (; d < hd; ++d)
    for (int r = 0; r < R; ++r) {
      float s = mean ? mean[d] : 0.0f;
      for (int i = 0; i < rank; ++i) s += u[static_cast<size_t>(r) * rank + i] * proj[static_cast<size_t>(i) * hd + d];
      out[r * out_stride + d] = s;
    }
}

// Row blocks of up to 6: as many accumulators as AVX2's 16 registers hold next to the codes.
constexpr int kMaxRows = 6;

template <int BITS>
LD_AVX2 void scores_bits(const CodeRows& c, const int32_t* idx, size_t n, const float* a, const float* A, int rows,
                         float* S, size_t lds) {
  for (int r0 = 0; r0 < rows; r0 += kMaxRows) {
    const float* ar = a + static_cast<size_t>(r0) * c.rank;
    float* Sr = S + r0 * lds;
    switch (std::min(kMaxRows, rows - r0)) {
      case 1: scores_rows<BITS, 1>(c, idx, n, ar, A + r0, Sr, lds); break;
      case 2: scores_rows<BITS, 2>(c, idx, n, ar, A + r0, Sr, lds); break;
      case 3: scores_rows<BITS, 3>(c, idx, n, ar, A + r0, Sr, lds); break;
      case 4: scores_rows<BITS, 4>(c, idx, n, ar, A + r0, Sr, lds); break;
      case 5: scores_rows<BITS, 5>(c, idx, n, ar, A + r0, Sr, lds); break;
      default: scores_rows<BITS, 6>(c, idx, n, ar, A + r0, Sr, lds); break;
    }
  }
}

template <int BITS>
LD_AVX2 void accumulate_bits(const CodeRows& c, const int32_t* idx, size_t n, const float* PW, size_t ldw, int rows,
                             float* u) {
  for (int r0 = 0; r0 < rows; r0 += kMaxRows) {
    const float* Pr = PW + r0 * ldw;
    float* ur = u + static_cast<size_t>(r0) * c.rank;
    switch (std::min(kMaxRows, rows - r0)) {
      case 1: accumulate_rows<BITS, 1, 8>(c, idx, n, Pr, ldw, ur); break;
      case 2: accumulate_rows<BITS, 2, 4>(c, idx, n, Pr, ldw, ur); break;
      case 3: accumulate_rows<BITS, 3, 3>(c, idx, n, Pr, ldw, ur); break;
      case 4: accumulate_rows<BITS, 4, 2>(c, idx, n, Pr, ldw, ur); break;
      case 5: accumulate_rows<BITS, 5, 2>(c, idx, n, Pr, ldw, ur); break;
      default: accumulate_rows<BITS, 6, 1>(c, idx, n, Pr, ldw, ur); break;
    }
  }
}

__attribute__((target("arch=x86-64-v3"), noinline)) void code_scores_avx2(const CodeRows& c, const int32_t* idx,
                                                                          size_t n, const float* a, const float* A,
                                                                          int rows, float* S, size_t lds) {
  switch (c.bits) {
    case 8: return scores_bits<8>(c, idx, n, a, A, rows, S, lds);
    case 4: return scores_bits<4>(c, idx, n, a, A, rows, S, lds);
    default: return scores_bits<2>(c, idx, n, a, A, rows, S, lds);
  }
}

__attribute__((target("arch=x86-64-v3"), noinline)) void code_accumulate_avx2(const CodeRows& c, const int32_t* idx,
                                                                              size_t n, const float* PW, size_t ldw,
                                                                              int rows, float* u) {
  switch (c.bits) {
    case 8: return accumulate_bits<8>(c, idx, n, PW, ldw, rows, u);
    case 4: return accumulate_bits<4>(c, idx, n, PW, ldw, rows, u);
    default: return accumulate_bits<2>(c, idx, n, PW, ldw, rows, u);
  }
}

// 2^y for y <= 0: 2^k (k = round(y), from the exponent bits) times e^(f ln 2), f = y - k in
// [-1/2, 1/2], by its Taylor polynomial of degree 7 (remainder < (ln2 / 2)^8 / 8! < 5e-9);
// 0 where y < -126.
LD_AVX2 __m256 exp2_nonpositive(__m256 y) {
  const __m256 underflow = _mm256_cmp_ps(y, _mm256_set1_ps(-126.0f), _CMP_LT_OQ);
  y = _mm256_max_ps(y, _mm256_set1_ps(-126.0f));
  const __m256 k = _mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(y, k);
  // ln2^i / i!, i = 7 .. 1.
  __m256 p = _mm256_set1_ps(1.525273380405984e-05f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.540353039338161e-04f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.333355814642844e-03f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618129107628477e-03f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550410866482158e-02f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402265069591007e-01f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931471805599453e-01f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

__attribute__((target("arch=x86-64-v3"), noinline)) float exp_shifted_avx2(float* x, size_t n) {
  const size_t nb = n / 8 * 8;
  float mx = -INFINITY;
  if (nb > 0) {
    __m256 vm = _mm256_loadu_ps(x);
    for (size_t j = 8; j < nb; j += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(x + j));
    alignas(32) float m8[8];
    _mm256_store_ps(m8, vm);
    mx = *std::max_element(m8, m8 + 8);
  }
  for (size_t j = nb; j < n; ++j) mx = std::max(mx, x[j]);
  const __m256 vmx = _mm256_set1_ps(mx), l2e = _mm256_set1_ps(1.4426950408889634f);
  __m256 vs = _mm256_setzero_ps();
  for (size_t j = 0; j < nb; j += 8) {
    const __m256 e = exp2_nonpositive(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), vmx), l2e));
    _mm256_storeu_ps(x + j, e);
    vs = _mm256_add_ps(vs, e);
  }
  if (nb < n) {
    alignas(32) float t[8];
    for (size_t k = 0; k < 8; ++k) t[k] = nb + k < n ? x[nb + k] : -INFINITY;
    const __m256 e = exp2_nonpositive(_mm256_mul_ps(_mm256_sub_ps(_mm256_load_ps(t), vmx), l2e));
    _mm256_store_ps(t, e);  // -inf lanes give 0
    for (size_t k = 0; nb + k < n; ++k) x[nb + k] = t[k];
    vs = _mm256_add_ps(vs, e);
  }
  alignas(32) float s8[8];
  _mm256_store_ps(s8, vs);
  return ((s8[0] + s8[1]) + (s8[2] + s8[3])) + ((s8[4] + s8[5]) + (s8[6] + s8[7]));
}

__attribute__((target("arch=x86-64-v3"), noinline)) void basis_expand_avx2(const float* proj, const float* mean,
                                                                           int rank, int hd, const float* u, int rows,
                                                                           float* out, int64_t out_stride) {
  for (int r0 = 0; r0 < rows; r0 += kMaxRows) {
    const float* ur = u + static_cast<size_t>(r0) * rank;
    float* o = out + r0 * out_stride;
    switch (std::min(kMaxRows, rows - r0)) {
      case 1: expand_rows<1>(proj, mean, rank, hd, ur, o, out_stride); break;
      case 2: expand_rows<2>(proj, mean, rank, hd, ur, o, out_stride); break;
      case 3: expand_rows<3>(proj, mean, rank, hd, ur, o, out_stride); break;
      case 4: expand_rows<4>(proj, mean, rank, hd, ur, o, out_stride); break;
      case 5: expand_rows<5>(proj, mean, rank, hd, ur, o, out_stride); break;
      default: expand_rows<6>(proj, mean, rank, hd, ur, o, out_stride); break;
    }
  }
}

// pw[r * n + k] = P[r * ldp + k] w[k] and t[r] += sum_k pw[r * n + k] (eight partial sums).
__attribute__((target("arch=x86-64-v3"), noinline)) void weigh_avx2(const float* P, size_t ldp, const float* w,
                                                                    size_t n, int rows, float* pw, float* t) {
  const size_t nb = n / 8 * 8;
  for (int r = 0; r < rows; ++r) {
    const float* Pr = P + r * ldp;
    float* o = pw + r * n;
    __m256 s = _mm256_setzero_ps();
    for (size_t k = 0; k < nb; k += 8) {
      const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(Pr + k), _mm256_loadu_ps(w + k));
      _mm256_storeu_ps(o + k, v);
      s = _mm256_add_ps(s, v);
    }
    alignas(32) float s8[8];
    _mm256_store_ps(s8, s);
    float tr = ((s8[0] + s8[1]) + (s8[2] + s8[3])) + ((s8[4] + s8[5]) + (s8[6] + s8[7]));
    for (size_t k = nb; k < n; ++k) tr += (o[k] = Pr[k] * w[k]);
    t[r] += tr;
  }
}

#undef LD_AVX2

// Scratch for the entries' weights w_j and the weighted probabilities p_j w_j, reused across calls
// on the same thread.
thread_local std::vector<float> tls_pw, tls_w;

}  // namespace

void code_scores(const CodeRows& c, const int32_t* idx, size_t n, const float* a, const float* A, int rows, float* S,
                 size_t lds) {
  if (n == 0 || rows <= 0) return;
  if (qdot::level() == qdot::Level::Scalar) return code_scores_scalar(c, idx, n, a, A, rows, S, lds);
  code_scores_avx2(c, idx, n, a, A, rows, S, lds);
}

float exp_shifted(float* x, size_t n) {
  if (n == 0) return 0.0f;
  if (qdot::level() == qdot::Level::Scalar) return exp_shifted_scalar(x, n);
  return exp_shifted_avx2(x, n);
}

void basis_expand(const float* proj, const float* mean, int rank, int hd, const float* u, int rows, float* out,
                  int64_t out_stride) {
  if (rows <= 0 || hd <= 0) return;
  if (qdot::level() == qdot::Level::Scalar) return basis_expand_scalar(proj, mean, rank, hd, u, rows, out, out_stride);
  basis_expand_avx2(proj, mean, rank, hd, u, rows, out, out_stride);
}

void code_accumulate(const CodeRows& c, const int32_t* idx, size_t n, const float* P, size_t ldp, int rows, float* u,
                     float* t) {
  if (n == 0 || rows <= 0) return;
  if (qdot::level() == qdot::Level::Scalar) return code_accumulate_scalar(c, idx, n, P, ldp, rows, u, t);
  // p_j w_j once per (row, entry) and t (weigh_avx2); the channels of a row beyond the last full 8
  // are accumulated here.
  std::vector<float>& pw = tls_pw;
  std::vector<float>& w = tls_w;
  pw.resize(static_cast<size_t>(rows) * n);
  w.resize(n);
  {
    // Locals, so the loop keeps them in registers (stores through wp could alias c or the vector).
    float* wp = w.data();
    const uint8_t* base = c.base;
    const size_t stride = c.stride;
    if (c.channel) {
      const float* widen = c.widen ? c.widen : latent_widen_table();
      for (size_t k = 0; k < n; ++k) wp[k] = widen[base[static_cast<size_t>(idx[k]) * stride]];
    } else {
      for (size_t k = 0; k < n; ++k) wp[k] = weight(c, base + static_cast<size_t>(idx[k]) * stride);
    }
  }
  weigh_avx2(P, ldp, w.data(), n, rows, pw.data(), t);
  const int full = c.rank / 8 * 8;
  if (full < c.rank) {
    const int pre = prefix(c);
    for (size_t k = 0; k < n; ++k) {
      const uint8_t* q = c.base + static_cast<size_t>(idx[k]) * c.stride + pre;
      for (int row = 0; row < rows; ++row) {
        const float v = pw[row * n + k];
        if (v == 0.0f) continue;
        float* ur = u + static_cast<size_t>(row) * c.rank;
        for (int i = full; i < c.rank; ++i) ur[i] += v * static_cast<float>(centred_code(q, i, c.bits));
      }
    }
  }
  if (full > 0) code_accumulate_avx2(c, idx, n, pw.data(), n, rows, u);
}

}  // namespace kvslim::latent_dot
