// Products with raw latent codes (see latent_code_dot.h): a scalar reference and an AVX2 path.
#include "kernels/latent_code_dot.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "kernels/quant_dot.h"
#include "kv/latent_widen.h"
#include "kvslim/error.h"
#include "kvslim/quant.h"

// GCC 12's avx512fintrin.h trips -Wmaybe-uninitialized on its own _mm512_undefined_ps.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

namespace kvslim::latent_dot {

namespace {

// Bytes before a row's codes: the exponent byte (per channel) or the f16 scale (per token).
int prefix(const CodeRows& c) { return c.channel ? 1 : 2; }

// d = q - 2^(bits-1) of code i of packed codes q (codes never straddle a byte: bits is 2, 4 or 8).
int centred_code(const uint8_t* q, int i, int bits) {
  const size_t bit = static_cast<size_t>(i) * bits;
  return ((q[bit / 8] >> (bit % 8)) & ((1 << bits) - 1)) - (1 << (bits - 1));
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
  return c;
}

float row_weight(const CodeRows& c, const uint8_t* r) {
  if (c.channel) return latent_widen_table()[r[0]];
  uint16_t h;
  std::memcpy(&h, r, sizeof h);
  return fp16_to_fp32(h);
}

// ---- scalar reference ----

void code_scores_scalar(const CodeRows& c, const int32_t* idx, size_t n, const float* a, const float* A, int rows,
                        float* S, size_t lds) {
  for (size_t k = 0; k < n; ++k) {
    const uint8_t* r = c.base + static_cast<size_t>(idx[k]) * c.stride;
    const float w = row_weight(c, r);
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
    const float w = row_weight(c, r);
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
  const int ng = c.rank / 8, full = 8 * ng, pre = prefix(c);
  alignas(32) float T[R][8][8];
  alignas(32) float tail[R][8];
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
      const uint8_t* row = c.base + static_cast<size_t>(idx[k0 + e]) * c.stride;
      W[e] = row_weight(c, row);
      const uint8_t* q = row + pre;
      __m256 acc[R];
      for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
      for (int g = 0; g < ng; ++g) {
        const __m256 x = codes8<BITS>(q, g);
        for (int r = 0; r < R; ++r)
          acc[r] = _mm256_fmadd_ps(x, _mm256_loadu_ps(a + static_cast<size_t>(r) * c.rank + 8 * g), acc[r]);
      }
      for (int r = 0; r < R; ++r) {
        _mm256_store_ps(T[r][e], acc[r]);
        float s = 0.0f;
        for (int i = full; i < c.rank; ++i)
          s += a[static_cast<size_t>(r) * c.rank + i] * static_cast<float>(centred_code(q, i, BITS));
        tail[r][e] = s;
      }
    }
    const __m256 w = _mm256_load_ps(W);
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
    for (int r = 0; r < R; ++r)
      for (int w = 0; w < CW; ++w)
        acc[r][w] = w < gw ? _mm256_loadu_ps(u + static_cast<size_t>(r) * c.rank + 8 * (g0 + w)) : _mm256_setzero_ps();
    for (size_t k = 0; k < n; ++k) {
      const uint8_t* q = c.base + static_cast<size_t>(idx[k]) * c.stride + pre;
      __m256 p[R];
      for (int r = 0; r < R; ++r) p[r] = _mm256_set1_ps(PW[r * ldw + k]);
      for (int w = 0; w < CW; ++w) {
        if (w >= gw) break;
        const __m256 x = codes8<BITS>(q, g0 + w);
        for (int r = 0; r < R; ++r) acc[r][w] = _mm256_fmadd_ps(x, p[r], acc[r][w]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int w = 0; w < gw; ++w) _mm256_storeu_ps(u + static_cast<size_t>(r) * c.rank + 8 * (g0 + w), acc[r][w]);
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

#undef LD_AVX2

// Scratch for the weighted probabilities p_j w_j, reused across calls on the same thread.
thread_local std::vector<float> tls_pw;

}  // namespace

void code_scores(const CodeRows& c, const int32_t* idx, size_t n, const float* a, const float* A, int rows, float* S,
                 size_t lds) {
  if (n == 0 || rows <= 0) return;
  if (qdot::level() == qdot::Level::Scalar) return code_scores_scalar(c, idx, n, a, A, rows, S, lds);
  code_scores_avx2(c, idx, n, a, A, rows, S, lds);
}

void code_accumulate(const CodeRows& c, const int32_t* idx, size_t n, const float* P, size_t ldp, int rows, float* u,
                     float* t) {
  if (n == 0 || rows <= 0) return;
  if (qdot::level() == qdot::Level::Scalar) return code_accumulate_scalar(c, idx, n, P, ldp, rows, u, t);
  // p_j w_j once per (row, entry), summed into t in entry order as the reference does; the
  // channels of a row beyond the last full 8 are accumulated here too.
  std::vector<float>& pw = tls_pw;
  pw.resize(static_cast<size_t>(rows) * n);
  const int full = c.rank / 8 * 8;
  const int pre = prefix(c);
  for (size_t k = 0; k < n; ++k) {
    const uint8_t* r = c.base + static_cast<size_t>(idx[k]) * c.stride;
    const float w = row_weight(c, r);
    for (int row = 0; row < rows; ++row) {
      const float v = P[row * ldp + k] * w;
      pw[row * n + k] = v;
      if (v == 0.0f) continue;
      t[row] += v;
      float* ur = u + static_cast<size_t>(row) * c.rank;
      for (int i = full; i < c.rank; ++i) ur[i] += v * static_cast<float>(centred_code(r + pre, i, c.bits));
    }
  }
  if (full > 0) code_accumulate_avx2(c, idx, n, pw.data(), n, rows, u);
}

}  // namespace kvslim::latent_dot
