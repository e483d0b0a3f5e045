// AVX2 + F16C decoders of the quantized KV formats (see decode_avx2.h).
#include "kv/decode_avx2.h"

#include <immintrin.h>

#include <cstring>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#ifdef __clang__  // clang ignores the GCC target pragma (see kernels/quant_dot_avx2.cpp)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#endif

namespace kvslim::kv::avx2 {

namespace {

constexpr int kTile = 16;  // kKVTile: entries per key tile

inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline __m128i load64(const void* p) { return _mm_loadl_epi64(static_cast<const __m128i*>(p)); }

// 16 f16 scales as two registers of 8 floats (exact).
inline void halves16(const uint16_t* p, __m256& a, __m256& b) {
  a = _mm256_cvtph_ps(load128(p));
  b = _mm256_cvtph_ps(load128(p + 8));
}
inline float half1(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// 16 signed bytes -> two registers of 8 floats.
inline void i8x16(__m128i x, __m256& a, __m256& b) {
  a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x));
  b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(x, 8)));
}
// 16 unsigned bytes -> two registers of 8 floats.
inline void u8x16(__m128i x, __m256& a, __m256& b) {
  a = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(x));
  b = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(x, 8)));
}
// 8 bytes -> 16 nibbles in lane order: lane 2m = low nibble of byte m, lane 2m+1 = its high one.
inline __m128i nibbles_interleaved(const uint8_t* p) {
  const __m128i x = load64(p), m = _mm_set1_epi8(0x0F);
  return _mm_unpacklo_epi8(_mm_and_si128(x, m), _mm_and_si128(_mm_srli_epi16(x, 4), m));
}
// 4 bytes -> 16 two-bit codes, lane j = bits 2j..2j+1 of the little-endian word.
inline void crumbs16(const uint8_t* p, __m256& a, __m256& b) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  const __m256i v = _mm256_set1_epi32(static_cast<int>(w)), three = _mm256_set1_epi32(3);
  a = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(v, _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)), three));
  b = _mm256_cvtepi32_ps(
      _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30)), three));
}
// Codes of 16 lanes at `p` for KIVI: 4 bits (8 bytes, interleaved nibbles) or 2 bits (4 bytes).
inline void kivi16(const uint8_t* p, int bits, __m256& a, __m256& b) {
  if (bits == 4) u8x16(nibbles_interleaved(p), a, b);
  else crumbs16(p, a, b);
}

}  // namespace

void q8_0_tile_decode(int hd, int qb, const uint8_t* tile, float* kt) {
  const int nb = hd / qb;
  const auto* sc = reinterpret_cast<const uint16_t*>(tile);
  const uint8_t* c = tile + nb * kTile * 2;
  for (int b = 0; b < nb; ++b) {
    __m256 s0, s1;
    halves16(sc + b * kTile, s0, s1);
    for (int d = b * qb; d < (b + 1) * qb; ++d) {
      __m256 a, bb;
      i8x16(load128(c + d * kTile), a, bb);
      _mm256_storeu_ps(kt + d * kTile, _mm256_mul_ps(a, s0));
      _mm256_storeu_ps(kt + d * kTile + 8, _mm256_mul_ps(bb, s1));
    }
  }
}

void q8_0_rows_decode(int hd, int qb, const uint8_t* src, float* out, size_t n) {
  const size_t nblocks = n * static_cast<size_t>(hd / qb);
  for (size_t b = 0; b < nblocks; ++b, src += 2 + qb, out += qb) {
    const __m256 d = _mm256_set1_ps(half1(src));
    for (int j = 0; j < qb; j += 8)
      _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load64(src + 2 + j))), d));
  }
}

void q4_0_tile_decode(int hd, int qb, const uint8_t* tile, float* kt) {
  const int nb = hd / qb;
  const auto* sc = reinterpret_cast<const uint16_t*>(tile);
  const uint8_t* c = tile + nb * kTile * 2;
  const __m256 eight = _mm256_set1_ps(8.0f);
  for (int b = 0; b < nb; ++b) {
    __m256 s0, s1;
    halves16(sc + b * kTile, s0, s1);
    for (int d = b * qb; d < (b + 1) * qb; ++d) {
      __m256 a, bb;
      u8x16(nibbles_interleaved(c + d * (kTile / 2)), a, bb);
      _mm256_storeu_ps(kt + d * kTile, _mm256_mul_ps(_mm256_sub_ps(a, eight), s0));
      _mm256_storeu_ps(kt + d * kTile + 8, _mm256_mul_ps(_mm256_sub_ps(bb, eight), s1));
    }
  }
}

void q4_0_rows_decode(int hd, int qb, const uint8_t* src, float* out, size_t n) {
  const size_t nblocks = n * static_cast<size_t>(hd / qb);
  const __m256 eight = _mm256_set1_ps(8.0f);
  const __m128i m = _mm_set1_epi8(0x0F);
  for (size_t b = 0; b < nblocks; ++b, src += 2 + qb / 2, out += qb) {
    const __m256 d = _mm256_set1_ps(half1(src));
    for (int j = 0; j < qb / 2; j += 16) {
      const __m128i x = load128(src + 2 + j);
      __m256 a, bb;
      u8x16(_mm_and_si128(x, m), a, bb);  // values j .. j+15: low nibbles
      _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_sub_ps(a, eight), d));
      _mm256_storeu_ps(out + j + 8, _mm256_mul_ps(_mm256_sub_ps(bb, eight), d));
      u8x16(_mm_and_si128(_mm_srli_epi16(x, 4), m), a, bb);  // values qb/2 + j ..: high nibbles
      _mm256_storeu_ps(out + qb / 2 + j, _mm256_mul_ps(_mm256_sub_ps(a, eight), d));
      _mm256_storeu_ps(out + qb / 2 + j + 8, _mm256_mul_ps(_mm256_sub_ps(bb, eight), d));
    }
  }
}

void q2_1_tile_decode(int hd, int qb, const uint8_t* tile, float* kt) {
  const int nb = hd / qb;
  const auto* st = reinterpret_cast<const uint16_t*>(tile);  // steps [nb][16], then minimums [nb][16]
  const uint8_t* c = tile + nb * kTile * 4;
  for (int b = 0; b < nb; ++b) {
    __m256 d0, d1, m0, m1;
    halves16(st + b * kTile, d0, d1);
    halves16(st + (nb + b) * kTile, m0, m1);
    for (int ch = b * qb; ch < (b + 1) * qb; ++ch) {
      __m256 a, bb;
      crumbs16(c + ch * (kTile / 4), a, bb);
      _mm256_storeu_ps(kt + ch * kTile, _mm256_fmadd_ps(a, d0, m0));  // a * d exact: one rounding either way
      _mm256_storeu_ps(kt + ch * kTile + 8, _mm256_fmadd_ps(bb, d1, m1));
    }
  }
}

void q2_1_rows_decode(int hd, int qb, const uint8_t* src, float* out, size_t n) {
  const int nb = hd / qb;
  const size_t row = static_cast<size_t>(nb) * 4 + (hd + 3) / 4;
  for (size_t r = 0; r < n; ++r, src += row, out += hd) {
    const uint8_t* c = src + nb * 4;
    for (int b = 0; b < nb; ++b) {
      const __m256 d = _mm256_set1_ps(half1(src + b * 4)), m = _mm256_set1_ps(half1(src + b * 4 + 2));
      for (int j = b * qb; j < (b + 1) * qb; j += 16) {
        __m256 a, bb;
        crumbs16(c + j / 4, a, bb);
        _mm256_storeu_ps(out + j, _mm256_fmadd_ps(a, d, m));
        _mm256_storeu_ps(out + j + 8, _mm256_fmadd_ps(bb, d, m));
      }
    }
  }
}

void kivi_group_keys_t(const uint8_t* grp, int hd, int bits, size_t cs, int t0, float* kt) {
  const auto* zero = reinterpret_cast<const uint16_t*>(grp);
  const auto* step = zero + hd;
  const uint8_t* codes = grp + static_cast<size_t>(hd) * 4;
  const size_t first = static_cast<size_t>(t0) * bits / 8;  // t0 is a multiple of 16
  for (int c = 0; c < hd; ++c) {
    // Lanes past a partial block read neighbouring bytes (or the store's slack): unspecified.
    const __m256 z = _mm256_set1_ps(_cvtsh_ss(zero[c])), s = _mm256_set1_ps(_cvtsh_ss(step[c]));
    __m256 a, b;
    kivi16(codes + c * cs + first, bits, a, b);
    _mm256_storeu_ps(kt + c * kTile, _mm256_fmadd_ps(a, s, z));
    _mm256_storeu_ps(kt + c * kTile + 8, _mm256_fmadd_ps(b, s, z));
  }
}

void kivi_group_values(const uint8_t* rec, size_t vrec, int hd, int gv, int bits, int nb, float* out) {
  for (int j = 0; j < nb; ++j, rec += vrec, out += hd) {
    const auto* par = reinterpret_cast<const uint16_t*>(rec);
    const uint8_t* codes = rec + (hd / gv) * 4;
    for (int g = 0; g < hd / gv; ++g) {
      const __m256 z = _mm256_set1_ps(_cvtsh_ss(par[2 * g])), s = _mm256_set1_ps(_cvtsh_ss(par[2 * g + 1]));
      for (int c = g * gv; c < (g + 1) * gv; c += 16) {
        __m256 a, b;
        kivi16(codes + c * bits / 8, bits, a, b);
        _mm256_storeu_ps(out + c, _mm256_fmadd_ps(a, s, z));
        _mm256_storeu_ps(out + c + 8, _mm256_fmadd_ps(b, s, z));
      }
    }
  }
}

}  // namespace kvslim::kv::avx2

#ifdef __clang__
#pragma clang attribute pop
#endif
#pragma GCC pop_options
