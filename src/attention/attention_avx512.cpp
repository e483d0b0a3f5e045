// Attention group kernels with 512-bit registers, for the AVX-512 level (attention.cpp runs the
// AVX2 group kernels at the other x86 levels).
//
// Why a copy for 512 bits: where a core issues 512-bit fmas at full width (AMD Zen 5, Intel Xeon
// with two FMA units) a 16-float register does twice the work of an 8-float one per issue slot,
// and attention over the cache is bound by fma issue (8 query rows share each key and value of a
// GQA group). Its 32 registers hold 16 independent fma chains (8 rows x 2 tiles of 16 entries) with
// no spills. On Zen 4, which splits 512-bit operations into halves, it has not been timed (the AVX2
// kernels had matched a generic 16-float kernel there); KVSLIM_SIMD=avx2 runs the AVX2 kernels.
//
// Layout as in the AVX2 kernels: keys of a tile transposed ([head_dim][16], one register per
// channel), values as rows, scores transposed after the score loop into ST[entry * 8 + row], so the
// online softmax runs on all 8 rows at once (here two entries per register). Each score is one
// chain of fmas over the channels in order, each output one chain over the entries in order, and
// every other step is lane-wise per row, so a row's result does not depend on the rows beside it.
#include "attention/attention_tiles.h"
#include "kernels/vexp.h"

// GCC 12's avx512fintrin.h trips -W(maybe-)uninitialized on its own _mm512_undefined_ps and
// _mm256_undefined_pd (the unused merge operands of its casts and extracts).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#ifdef __clang__  // clang has no GCC target pragma (see quant_dot_avx2.cpp)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avx512f,avx512dq,avx512vl,avx512bw"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512dq,avx512vl,avx512bw")
#endif

namespace kvslim::attn {
namespace {

#define KV512_INLINE inline __attribute__((always_inline))

template <int HD>
KV512_INLINE int head_dim_of(int hd) {
  if constexpr (HD > 0) return HD;
  else return hd;
}

// The 16 entries of channel d of a transposed key tile, f16 or f32.
template <class KT>
KV512_INLINE __m512 key16(const KT* kt, int d) {
  if constexpr (sizeof(KT) == 2)
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(kt + d * 16)));
  else
    return _mm512_loadu_ps(kt + d * 16);
}

// Columns [c, c + 16) of value row j, f16 or f32.
template <class VT>
KV512_INLINE __m512 value16(const VT* v, size_t j, int hd, int c) {
  if constexpr (sizeof(VT) == 2)
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + j * hd + c)));
  else
    return _mm512_loadu_ps(v + j * hd + c);
}

// x[i]: row i's scores of the 16 entries of a tile -> ST[e * 8 + i]. In each 128-bit lane L the
// unpack/shuffle steps leave u[m + 4h] = rows 4h..4h+3 of entry 4L + m; two lane shuffles then put
// entry m's 8 rows in one half and entry m + 4's in the other.
KV512_INLINE void transpose_store(const __m512* x, float* ST) {
  __m512 t[8], u[8];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]);
  }
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i) {
    u[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
#pragma GCC unroll 4
  for (int m = 0; m < 4; ++m) {
    // [u[m].L0, u[m+4].L0, u[m].L1, u[m+4].L1]: entries m and m + 4; lanes 2, 3: entries m + 8, m + 12.
    const __m512 lo = _mm512_shuffle_f32x4(u[m], u[m + 4], 0x44), hi = _mm512_shuffle_f32x4(u[m], u[m + 4], 0xEE);
    const __m512 y0 = _mm512_shuffle_f32x4(lo, lo, 0xD8), y1 = _mm512_shuffle_f32x4(hi, hi, 0xD8);
    _mm256_storeu_ps(ST + m * 8, _mm512_castps512_ps256(y0));
    _mm256_storeu_ps(ST + (m + 4) * 8, _mm512_extractf32x8_ps(y0, 1));
    _mm256_storeu_ps(ST + (m + 8) * 8, _mm512_castps512_ps256(y1));
    _mm256_storeu_ps(ST + (m + 12) * 8, _mm512_extractf32x8_ps(y1, 1));
  }
}

// Scores of rows [0, R) against nt (1 or 2) tiles into ST[(16 t + j) * 8 + i] (rows >= R: 0).
// key(t, d): the 16 entries of channel d of tile t. fetch(d): called before each pair of channels
// of two tiles (the f16 kernel's prefetches; a no-op elsewhere).
template <int R, int HD, class Key, class Fetch>
KV512_INLINE void scores16_rows(const float* Q, int hd_rt, int nt, float* ST, Key key, Fetch fetch) {
  const int hd = head_dim_of<HD>(hd_rt);
  __m512 a[2][8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) a[0][i] = a[1][i] = _mm512_setzero_ps();
  if (nt == 2) {
    for (int d = 0; d < hd; d += 2) {
      fetch(d);
#pragma GCC unroll 2
      for (int dd = d; dd < d + 2; ++dd) {
        const __m512 k0 = key(0, dd), k1 = key(1, dd);
#pragma GCC unroll 8
        for (int i = 0; i < R; ++i) {
          const __m512 q = _mm512_set1_ps(Q[i * hd + dd]);
          a[0][i] = _mm512_fmadd_ps(k0, q, a[0][i]);
          a[1][i] = _mm512_fmadd_ps(k1, q, a[1][i]);
        }
      }
    }
  } else {
    for (int d = 0; d < hd; ++d) {
      const __m512 k0 = key(0, d);
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) a[0][i] = _mm512_fmadd_ps(k0, _mm512_set1_ps(Q[i * hd + d]), a[0][i]);
    }
  }
  transpose_store(a[0], ST);
  if (nt == 2) transpose_store(a[1], ST + 128);
}

// scores16_rows over f16 or f32 key tiles. pf: four lines per two channels to fetch (into L2, as
// the AVX2 kernel: the next pair while this one is computed, or this pair's own lines, already
// cached); unused for one tile.
template <int R, int HD, class KT>
KV512_INLINE void scores16(const float* Q, int hd_rt, const KT* const* kt, int nt, float* ST, const char* const* pf) {
  scores16_rows<R, HD>(
      Q, hd_rt, nt, ST, [&](int t, int d) __attribute__((always_inline)) { return key16(kt[t], d); },
      [&](int d) __attribute__((always_inline)) {
#pragma GCC unroll 4
        for (int f = 0; f < 4; ++f) _mm_prefetch(pf[f] + d * 32, _MM_HINT_T1);
      });
}

// scores16 over q8_0 (Q4: q4_0) key tiles read straight from the cache: the 16 codes of a channel
// times their block's scales, exact in f32 (codes of at most 8 bits, 11-bit scales), so the same
// values, and the same fma chains, as scores16 over tiles decoded first. qb: channels per scale block.
template <int R, int HD, bool Q4>
KV512_INLINE void scores16_q8(const float* Q, int hd_rt, int qb, const uint8_t* const* tiles, int nt, float* ST,
                              const char* const* pf) {
  const int hd = head_dim_of<HD>(hd_rt);
  const int nb = hd / qb;
  __m512 a[2][8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) a[0][i] = a[1][i] = _mm512_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    __m512 sc[2];
    const uint8_t* codes[2];
    for (int t = 0; t < nt; ++t) {
      sc[t] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tiles[t] + b * 32)));
      codes[t] = tiles[t] + nb * 32;
    }
    for (int d = b * qb; d < (b + 1) * qb; d += 2) {
      if (pf)
#pragma GCC unroll 4
        for (int f = 0; f < 4; ++f) _mm_prefetch(pf[f] + d * 32, _MM_HINT_T1);
#pragma GCC unroll 2
      for (int dd = d; dd < d + 2; ++dd) {
        if (nt == 2) {
          __m512 k[2];
#pragma GCC unroll 2
          for (int t = 0; t < 2; ++t)
            k[t] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(key_codes_i8<Q4>(codes[t], dd))), sc[t]);
#pragma GCC unroll 8
          for (int i = 0; i < R; ++i) {
            const __m512 q = _mm512_set1_ps(Q[i * hd + dd]);
            a[0][i] = _mm512_fmadd_ps(k[0], q, a[0][i]);
            a[1][i] = _mm512_fmadd_ps(k[1], q, a[1][i]);
          }
        } else {
          const __m512 k0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(key_codes_i8<Q4>(codes[0], dd))), sc[0]);
#pragma GCC unroll 8
          for (int i = 0; i < R; ++i) a[0][i] = _mm512_fmadd_ps(k0, _mm512_set1_ps(Q[i * hd + dd]), a[0][i]);
        }
      }
    }
  }
  transpose_store(a[0], ST);
  if (nt == 2) transpose_store(a[1], ST + 128);
}

// Columns [c, c + 16) of q8_0 (Q4: q4_0) value row `row` (qb values a block: an f16 scale, then
// the codes; q4_0: value j in the low nibble of byte j, j + qb / 2 in the high one, code - 8), as
// rows_decode gives them (code * scale, exact). qb is 16 or 32.
template <bool Q4>
KV512_INLINE __m512 value16_q8(const uint8_t* row, int qb, int c) {
  const int b = c / qb, off = c - b * qb;
  const uint8_t* blk = row + static_cast<size_t>(b) * (2 + (Q4 ? qb / 2 : qb));
  uint16_t h;
  std::memcpy(&h, blk, 2);
  const __m512i codes = _mm512_cvtepi8_epi32(value_codes_i8<Q4>(blk, qb, off));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(codes), _mm512_set1_ps(_cvtsh_ss(h)));
}

// The codes of 16 entries (entry j at bit j * BITS of p; BITS 4 or 2) in the low bits of int32
// lanes in entry order: the 4-byte words holding them spread over the lanes, each lane shifted by
// its own amount. The lanes' other bits hold the later entries' codes: kivi_codes16 masks them off;
// vpermps reads only the low 4 bits of an index anyway.
template <int BITS>
KV512_INLINE __m512i kivi_index16(const uint8_t* p) {
  if constexpr (BITS == 4) {
    const __m512i w = _mm512_permutexvar_epi32(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                                               _mm512_castsi128_si512(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
    return _mm512_srlv_epi32(w, _mm512_set_epi32(28, 24, 20, 16, 12, 8, 4, 0, 28, 24, 20, 16, 12, 8, 4, 0));
  } else {
    uint32_t w;
    std::memcpy(&w, p, sizeof w);
    return _mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int>(w)),
                             _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0));
  }
}

template <int BITS>
KV512_INLINE __m512i kivi_codes16(const uint8_t* p) {
  return _mm512_and_si512(kivi_index16<BITS>(p), _mm512_set1_epi32((1 << BITS) - 1));
}

// scores16 over KIVI key blocks read straight from the cache: each channel's 16 codes decoded in
// registers to the values the KIVI decoders give (fma(code, step, zero), looked up in a table of
// the channel's 16 possible values: 2-3% faster than converting and scaling each code), so the
// same values, and the same fma chains, as scores16 over tiles decoded first.
template <int R, int HD, int BITS>
KV512_INLINE void scores16_kivi(const float* Q, int hd_rt, const KiviBlock* kb, int nt, float* ST) {
  const int hd = head_dim_of<HD>(hd_rt);
  // [tile][channel][code]: each channel's 16 possible decoded values, fma(code, step, zero) as the
  // KIVI decoders compute them (2 bits: indexed by 4 bits of which the upper 2 belong to the next
  // entry, so entry k holds the value of code k & 3); a pair in one group builds them once.
  alignas(64) float tab[2][kKiviMaxHeadDim][16];
  const __m512 iota = BITS == 4 ? _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
                                : _mm512_set_ps(3, 2, 1, 0, 3, 2, 1, 0, 3, 2, 1, 0, 3, 2, 1, 0);
  const int ntab = nt == 2 && kb[1].zero == kb[0].zero ? 1 : nt;
  for (int t = 0; t < ntab; ++t) {
    alignas(64) float zf[16], sf[16];
    for (int d0 = 0; d0 < hd; d0 += 16) {
      _mm512_store_ps(zf, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(kb[t].zero + d0))));
      _mm512_store_ps(sf, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(kb[t].step + d0))));
#pragma GCC unroll 16
      for (int d = 0; d < 16; ++d)
        _mm512_store_ps(tab[t][d0 + d], _mm512_fmadd_ps(iota, _mm512_set1_ps(sf[d]), _mm512_set1_ps(zf[d])));
    }
  }
  auto key = [&](int t, int d) __attribute__((always_inline)) {
    const __m512i idx = kivi_index16<BITS>(kb[t].codes + d * kb[t].code_stride);
    return _mm512_permutexvar_ps(idx, _mm512_load_ps(tab[t < ntab ? t : 0][d]));
  };
  scores16_rows<R, HD>(Q, hd, nt, ST, key, [](int) __attribute__((always_inline)) {});
}

// O[i][c] += sum_j PT[(16 t + j) * 8 + i] * v[t][j][c] for rows [0, R), over the nb[t] rows of
// each of the nt tiles in order; hd % 16 == 0. 32 columns per pass (16 chains for 8 rows).
// load(t, j, c): columns [c, c + 16) of row j of tile t.
template <int R, int HD, class Load>
KV512_INLINE void pv16_rows(const float* PT, const int* nb, int nt, int hd_rt, float* O, Load load) {
  const int hd = head_dim_of<HD>(hd_rt);
  int c = 0;
  for (; c + 32 <= hd; c += 32) {
    __m512 a[8][2];
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      a[i][0] = _mm512_loadu_ps(O + i * hd + c);
      a[i][1] = _mm512_loadu_ps(O + i * hd + c + 16);
    }
    for (int t = 0; t < nt; ++t) {
      const float* P = PT + t * 128;
      for (int j = 0; j < nb[t]; ++j) {
        const __m512 v0 = load(t, j, c), v1 = load(t, j, c + 16);
#pragma GCC unroll 8
        for (int i = 0; i < R; ++i) {
          const __m512 p = _mm512_set1_ps(P[j * 8 + i]);
          a[i][0] = _mm512_fmadd_ps(v0, p, a[i][0]);
          a[i][1] = _mm512_fmadd_ps(v1, p, a[i][1]);
        }
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      _mm512_storeu_ps(O + i * hd + c, a[i][0]);
      _mm512_storeu_ps(O + i * hd + c + 16, a[i][1]);
    }
  }
  for (; c < hd; c += 16) {
    __m512 a[8];
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) a[i] = _mm512_loadu_ps(O + i * hd + c);
    for (int t = 0; t < nt; ++t) {
      const float* P = PT + t * 128;
      for (int j = 0; j < nb[t]; ++j) {
        const __m512 v0 = load(t, j, c);
#pragma GCC unroll 8
        for (int i = 0; i < R; ++i) a[i] = _mm512_fmadd_ps(v0, _mm512_set1_ps(P[j * 8 + i]), a[i]);
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) _mm512_storeu_ps(O + i * hd + c, a[i]);
  }
}

// pv16_rows over f16 or f32 value rows ([nb][hd]).
template <int R, int HD, class VT>
KV512_INLINE void pv16(const float* PT, const VT* const* v, const int* nb, int nt, int hd_rt, float* O) {
  const int hd = head_dim_of<HD>(hd_rt);
  pv16_rows<R, HD>(PT, nb, nt, hd, O,
                   [&](int t, int j, int c) __attribute__((always_inline)) { return value16(v[t], j, hd, c); });
}

// pv16_rows over q8_0 (Q4: q4_0) value rows read straight from the cache (the same values and fma
// chains as over decoded rows).
template <int R, int HD, bool Q4>
KV512_INLINE void pv16_q8(const float* PT, const uint8_t* const* v, size_t vstride, int qb, const int* nb, int nt,
                          int hd_rt, float* O) {
  pv16_rows<R, HD>(PT, nb, nt, hd_rt, O, [&](int t, int j, int c) __attribute__((always_inline)) {
    return value16_q8<Q4>(v[t] + j * vstride, qb, c);
  });
}

// pv16_rows over KIVI value records read straight from the cache, decoded in registers as the
// KIVI decoders do (fma(code, step, zero) per value group of gv % 16 == 0 channels).
template <int R, int HD, int BITS>
KV512_INLINE void pv16_kivi(const float* PT, const KiviBlock* kb, const int* nb, int nt, int hd_rt, float* O) {
  const int hd = head_dim_of<HD>(hd_rt);
  alignas(64) float par[2][kKiviMaxParams];
  for (int t = 0; t < nt; ++t) kivi_value_params(kb[t], nb[t], hd, par[t]);
  pv16_rows<R, HD>(PT, nb, nt, hd, O, [&](int t, int j, int c) __attribute__((always_inline)) {
    const int ng = hd / kb[t].gv;
    const float* zs = par[t] + (j * ng + c / kb[t].gv) * 2;
    const __m512 code = _mm512_cvtepi32_ps(kivi_codes16<BITS>(kb[t].values + j * kb[t].value_bytes + ng * 4 + c * BITS / 8));
    return _mm512_fmadd_ps(code, _mm512_set1_ps(zs[1]), _mm512_set1_ps(zs[0]));
  });
}

// The online softmax of a group of `rows` (lanes of 8) over the scores ST[j * 8 + i] of the pair's
// 16 * nt entries, in place: ST becomes the probabilities (0 where not visible). m, l: the rows'
// running max and sum; O: their outputs ([8][hd], rescaled on a new max). Returns whether any row
// saw an entry. Registers hold two entries (j = 2q, 2q + 1) of the 8 rows.
KV512_INLINE bool softmax16(float* ST, int nt, const int32_t* lg, const int32_t* vis, int rows, float* m, float* l,
                            float* O, int hd) {
  const int ne = 16 * nt;
  alignas(64) int32_t visb[16];
  for (int i = 0; i < 8; ++i) visb[i] = visb[i + 8] = i < rows ? vis[i] : INT_MIN;
  const __m512i visv = _mm512_load_si512(visb);
  const bool full = group_sees_all(lg, ne, vis, rows);  // every lane of every entry visible
  // seeing[q]: the lanes (rows) that see entries 2q (low half) and 2q + 1 (high half).
  __mmask16 seeing[16];
  if (!full)
    for (int q = 0; q < ne / 2; ++q) {
      const __m512i lgv = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(lg[2 * q])),
                                             _mm256_set1_epi32(lg[2 * q + 1]), 1);
      seeing[q] = _mm512_cmpgt_epi32_mask(visv, lgv);
    }
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  __m512 mx = ninf;
  for (int q = 0; q < ne / 2; ++q) {
    __m512 s = _mm512_loadu_ps(ST + q * 16);
    if (!full) s = _mm512_mask_blend_ps(seeing[q], ninf, s);
    mx = _mm512_max_ps(mx, s);
  }
  const __m256 mx8 = _mm256_max_ps(_mm512_castps512_ps256(mx), _mm512_extractf32x8_ps(mx, 1));
  if (!_mm256_movemask_ps(_mm256_cmp_ps(mx8, _mm256_set1_ps(-INFINITY), _CMP_GT_OQ))) {
    for (int q = 0; q < ne / 2; ++q) _mm512_storeu_ps(ST + q * 16, _mm512_setzero_ps());
    return false;
  }
  // Rows with a new maximum: the AVX2 kernel's rescaling, row by row.
  alignas(32) float mxb[8];
  _mm256_store_ps(mxb, mx8);
  rescale_rows(_mm256_movemask_ps(_mm256_cmp_ps(mx8, _mm256_loadu_ps(m), _CMP_GT_OQ)), mxb, m, l, O, hd);
  const __m256 m8 = _mm256_loadu_ps(m);
  const __m512 mr = _mm512_insertf32x8(_mm512_castps256_ps512(m8), m8, 1);
  __m512 lv = _mm512_setzero_ps();
  for (int q = 0; q < ne / 2; ++q) {
    // Lanes <= 0, or NaN in rows that see nothing (masked below).
    __m512 p = vexp::exp16(_mm512_sub_ps(_mm512_loadu_ps(ST + q * 16), mr));
    if (!full) p = _mm512_maskz_mov_ps(seeing[q], p);
    _mm512_storeu_ps(ST + q * 16, p);
    lv = _mm512_add_ps(lv, p);
  }
  const __m256 l8 = _mm256_add_ps(_mm512_castps512_ps256(lv), _mm512_extractf32x8_ps(lv, 1));
  _mm256_storeu_ps(l, _mm256_add_ps(_mm256_loadu_ps(l), l8));
  return true;
}

template <int HD, int R, class KT>
KV512_INLINE void scores16_hd(const float* Q, int hd, const KT* const* kt, int nt, float* ST, const char* const* pf) {
  if constexpr (HD > 0) scores16<R, HD>(Q, hd, kt, nt, ST, pf);
  else if (hd == 64) scores16<R, 64>(Q, hd, kt, nt, ST, pf);
  else if (hd == 128) scores16<R, 128>(Q, hd, kt, nt, ST, pf);
  else scores16<R, 0>(Q, hd, kt, nt, ST, pf);
}
// The q8_0 kernels stay out of line, and pair_group16 tests the f16 cases first: inlined and
// first, they slowed its f16 decode by 2-4% (16,384 entries, one thread; 1-2% out of line).
template <int R, bool Q4>
__attribute__((noinline)) void scores16_q8_hd(const float* Q, int hd, int qb, const uint8_t* const* tiles, int nt,
                                              float* ST, const char* const* pf) {
  if (hd == 64) scores16_q8<R, 64, Q4>(Q, hd, qb, tiles, nt, ST, pf);
  else if (hd == 128) scores16_q8<R, 128, Q4>(Q, hd, qb, tiles, nt, ST, pf);
  else scores16_q8<R, 0, Q4>(Q, hd, qb, tiles, nt, ST, pf);
}
template <int R, bool Q4>
__attribute__((noinline)) void pv16_q8_hd(const float* PT, const uint8_t* const* v, size_t vstride, int qb,
                                          const int* nb, int nt, int hd, float* O) {
  if (hd == 64) pv16_q8<R, 64, Q4>(PT, v, vstride, qb, nb, nt, hd, O);
  else if (hd == 128) pv16_q8<R, 128, Q4>(PT, v, vstride, qb, nb, nt, hd, O);
  else pv16_q8<R, 0, Q4>(PT, v, vstride, qb, nb, nt, hd, O);
}
template <int R, int BITS>
__attribute__((noinline)) void scores16_kivi_hd(const float* Q, int hd, const KiviBlock* kb, int nt, float* ST) {
  if (hd == 64) scores16_kivi<R, 64, BITS>(Q, hd, kb, nt, ST);
  else if (hd == 128) scores16_kivi<R, 128, BITS>(Q, hd, kb, nt, ST);
  else scores16_kivi<R, 0, BITS>(Q, hd, kb, nt, ST);
}
template <int R>
KV512_INLINE void scores16_kivi_bits(const float* Q, int hd, const KiviBlock* kb, int nt, float* ST) {
  if (kb[0].bits == 4) scores16_kivi_hd<R, 4>(Q, hd, kb, nt, ST);
  else scores16_kivi_hd<R, 2>(Q, hd, kb, nt, ST);
}
template <int R, int BITS>
__attribute__((noinline)) void pv16_kivi_hd(const float* PT, const KiviBlock* kb, const int* nb, int nt, int hd,
                                            float* O) {
  if (hd == 64) pv16_kivi<R, 64, BITS>(PT, kb, nb, nt, hd, O);
  else if (hd == 128) pv16_kivi<R, 128, BITS>(PT, kb, nb, nt, hd, O);
  else pv16_kivi<R, 0, BITS>(PT, kb, nb, nt, hd, O);
}
template <int R>
KV512_INLINE void pv16_kivi_bits(const float* PT, const KiviBlock* kb, const int* nb, int nt, int hd, float* O) {
  if (kb[0].bits == 4) pv16_kivi_hd<R, 4>(PT, kb, nb, nt, hd, O);
  else pv16_kivi_hd<R, 2>(PT, kb, nb, nt, hd, O);
}
template <int R, class VT>
KV512_INLINE void pv16_hd(const float* PT, const VT* const* v, const int* nb, int nt, int hd, float* O) {
  if (hd == 64) pv16<R, 64>(PT, v, nb, nt, hd, O);
  else if (hd == 128) pv16<R, 128>(PT, v, nb, nt, hd, O);
  else pv16<R, 0>(PT, v, nb, nt, hd, O);
}

// One pair of blocks for a group of R rows: scores, softmax, values.
// fetch: prefetch the next pair of f16 tiles (the call's first group does it for all).
template <int R>
__attribute__((noinline)) void pair_group16(const PairData& pd, const BlockRef* blk, const float* Q, int hd,
                                            const int32_t* vis, float* m, float* l, float* O, float* raw, size_t n,
                                            bool fetch) {
  alignas(64) float ST[32 * 8];
  const int nt = pd.nt;
  if (nt == 2 && pd.k16[0] && pd.k16[1]) {
    const char* pf[4];
    for (int t = 0; t < 2; ++t) {
      pf[t] = reinterpret_cast<const char*>(pd.k16[t] + (fetch ? 32 * hd : 0));
      pf[2 + t] = reinterpret_cast<const char*>(pd.v16[t] ? pd.v16[t] + (fetch ? 32 * hd : 0) : pd.k16[t]);
    }
    scores16_hd<0, R>(Q, hd, pd.k16, 2, ST, pf);
  } else if (nt == 2 && pd.k8[0] && pd.k8[1] && pd.k4[0] == pd.k4[1]) {
    // q8_0 tiles straight from the cache, fetching the next pair's keys and values as the f16
    // branch above does.
    const size_t tile_bytes = static_cast<size_t>(hd / pd.qb) * 32 + static_cast<size_t>(hd) * (pd.k4[0] ? 8 : 16);
    const char* pf[4];
    for (int t = 0; t < 2; ++t) {
      pf[t] = reinterpret_cast<const char*>(pd.k8[t] + (fetch ? 2 * tile_bytes : 0));
      pf[2 + t] = reinterpret_cast<const char*>(pd.v8[t] ? pd.v8[t] + (fetch ? 32 * pd.vstride[t] : 0) : pd.k8[t]);
    }
    if (pd.k4[0]) scores16_q8_hd<R, true>(Q, hd, pd.qb, pd.k8, 2, ST, pf);
    else scores16_q8_hd<R, false>(Q, hd, pd.qb, pd.k8, 2, ST, pf);
  } else if (nt == 2 && pd.kq[0].codes && pd.kq[1].codes && pd.kq[0].bits == pd.kq[1].bits) {
    scores16_kivi_bits<R>(Q, hd, pd.kq, 2, ST);
  } else if (nt == 2 && !pd.k16[0] && !pd.k16[1] && !pd.k8[0] && !pd.k8[1] && !pd.kq[0].codes && !pd.kq[1].codes) {
    const char* pf[4];
    for (int t = 0; t < 4; ++t) pf[t] = reinterpret_cast<const char*>(pd.kt[t % 2]);
    scores16_hd<0, R>(Q, hd, pd.kt, 2, ST, pf);
  } else {
    // A lone block, or a pair across the end of a KIVI part (one tile f16, one decoded).
    for (int t = 0; t < nt; ++t) {
      if (pd.k16[t]) scores16_hd<0, R>(Q, hd, &pd.k16[t], 1, ST + t * 128, nullptr);
      else if (pd.k8[t] && pd.k4[t]) scores16_q8_hd<R, true>(Q, hd, pd.qb, &pd.k8[t], 1, ST + t * 128, nullptr);
      else if (pd.k8[t]) scores16_q8_hd<R, false>(Q, hd, pd.qb, &pd.k8[t], 1, ST + t * 128, nullptr);
      else if (pd.kq[t].codes) scores16_kivi_bits<R>(Q, hd, &pd.kq[t], 1, ST + t * 128);
      else scores16_hd<0, R>(Q, hd, &pd.kt[t], 1, ST + t * 128, nullptr);
    }
  }
  if (raw) copy_raw_scores(pd, blk, ST, R, vis, raw, n);
  alignas(64) int32_t lg[32];
  pair_logical(pd, blk, lg);
  if (!softmax16(ST, nt, lg, vis, R, m, l, O, hd)) return;
  if (nt == 2 && pd.v16[0] && pd.v16[1]) return pv16_hd<R>(ST, pd.v16, pd.nb, 2, hd, O);
  if (nt == 2 && pd.v8[0] && pd.v8[1] && pd.v4[0] == pd.v4[1])
    return pd.v4[0] ? pv16_q8_hd<R, true>(ST, pd.v8, pd.vstride[0], pd.qb, pd.nb, 2, hd, O)
                    : pv16_q8_hd<R, false>(ST, pd.v8, pd.vstride[0], pd.qb, pd.nb, 2, hd, O);
  if (nt == 2 && kivi_direct_values(pd.kq[0]) && kivi_direct_values(pd.kq[1]) && pd.kq[0].bits == pd.kq[1].bits)
    return pv16_kivi_bits<R>(ST, pd.kq, pd.nb, 2, hd, O);
  if (nt == 2 && pd.v[0] && pd.v[1]) return pv16_hd<R>(ST, pd.v, pd.nb, 2, hd, O);
  for (int t = 0; t < nt; ++t) {
    if (pd.v16[t]) pv16_hd<R>(ST + t * 128, &pd.v16[t], &pd.nb[t], 1, hd, O);
    else if (pd.v8[t] && pd.v4[t]) pv16_q8_hd<R, true>(ST + t * 128, &pd.v8[t], pd.vstride[t], pd.qb, &pd.nb[t], 1, hd, O);
    else if (pd.v8[t]) pv16_q8_hd<R, false>(ST + t * 128, &pd.v8[t], pd.vstride[t], pd.qb, &pd.nb[t], 1, hd, O);
    else if (kivi_direct_values(pd.kq[t])) pv16_kivi_bits<R>(ST + t * 128, &pd.kq[t], &pd.nb[t], 1, hd, O);
    else pv16_hd<R>(ST + t * 128, &pd.v[t], &pd.nb[t], 1, hd, O);
  }
}

}  // namespace

void pair_groups_avx512(const PairData& pd, const BlockRef* blk, const float* Q, int rows, int hd,
                        const int32_t* vis, float* m, float* l, float* O, float* raw, size_t n) {
  for (int r0 = 0; r0 < rows; r0 += 8) {
    const float* Qg = Q + static_cast<size_t>(r0) * hd;
    float* Og = O + static_cast<size_t>(r0) * hd;
    float* rg = raw ? raw + static_cast<size_t>(r0) * n : nullptr;
    switch (std::min(8, rows - r0)) {
#define KV_CASE(R) \
  case R: pair_group16<R>(pd, blk, Qg, hd, vis + r0, m + r0, l + r0, Og, rg, n, r0 == 0); break;
      KV_CASE(8) KV_CASE(7) KV_CASE(6) KV_CASE(5) KV_CASE(4) KV_CASE(3) KV_CASE(2) KV_CASE(1)
#undef KV_CASE
    }
  }
}

}  // namespace kvslim::attn

#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
