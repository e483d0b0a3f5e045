#pragma once
// Internal to the attention kernels (attention.cpp, attention_avx512.cpp): the blocks of a segment
// as the group kernels consume them, two at a time.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/intrinsics.h"
#include "kv/store.h"

namespace kvslim::attn {

/// One block of kKVTile (16) entries: store entries [b, e), lane j attended by row r iff lg[j] <
/// vis[r] (lg[j] = INT_MAX for lanes not attended at all).
struct BlockRef {
  const KVStore* st;
  size_t b, e;
  alignas(64) int32_t lg[16];
};

/// Keys and values of the (one or two) blocks of a pair as the group kernels read them: f16
/// straight from the cache (k16: a transposed tile [head_dim][16]; v16: rows [16][head_dim]), or
/// decoded f32 in the same layouts (kt, v). nb[t]: entries in block t.
struct PairData {
  int nt;
  int nb[2];
  const uint16_t* k16[2];
  const float* kt[2];
  const uint16_t* v16[2];
  const float* v[2];
  // Integer products for the quantized codecs (q8_0, q4_0; see attention_int.h), else nullptr.
  // kp[t]: the keys of block t as int16 channel pairs, kp[t][((d / 2) * 16 + j) * 2 + d % 2],
  // with their f32 scales dk[t][blk * 16 + j] (blk = d / qb). vp: the values of the pair's
  // entries e = 16 t + j as int16 entry pairs, vp[((e / 2) * head_dim + c) * 2 + e % 2], with
  // scales dv[blk * 32 + e] (0 past a block's last entry). qb: channels per scale block.
  const int16_t* kp[2] = {nullptr, nullptr};
  const float* dk[2] = {nullptr, nullptr};
  const int16_t* vp = nullptr;
  const float* dv = nullptr;
  int qb = 0;
  // q8_0 or q4_0 read straight from the cache by the 512-bit kernels, else nullptr: k8[t] the key
  // tile of block t (scales [head_dim / qb][16] f16, then codes [head_dim][16] int8, or q4_0's
  // [head_dim][8] nibble pairs); v8[t] the value rows from block t's first entry (ggml's block_q8_0
  // or block_q4_0 per qb values, vstride[t] bytes a row). k4, v4: q4_0 rather than q8_0.
  const uint8_t* k8[2] = {nullptr, nullptr};
  const uint8_t* v8[2] = {nullptr, nullptr};
  bool k4[2] = {false, false};
  bool v4[2] = {false, false};
  size_t vstride[2] = {0, 0};
  // KIVI group blocks read straight from the cache by the group kernels in decode (kv/store.h),
  // else kq[t].codes == nullptr. Their values too where the value groups are whole 16-column
  // chunks (kivi_direct_values), else the values are decoded into v.
  KiviBlock kq[2] = {};
};

/// Whether the group kernels read the values of KIVI block `k` in place (value groups of whole
/// 16-column chunks).
inline bool kivi_direct_values(const KiviBlock& k) { return k.codes && k.gv % 16 == 0; }

/// Largest head_dim the in-place KIVI kernels take (their zero points, steps and, at AVX-512, the
/// keys' value tables, 16 floats a channel, go to the stack).
constexpr int kKiviMaxHeadDim = 256;
/// Floats of kivi_value_params for a block at most (value groups of at least 16 channels).
constexpr int kKiviMaxParams = 16 * 2 * (kKiviMaxHeadDim / 16);

/// The (zero, step) pairs of the value records of the nb entries of KIVI block `k` as floats,
/// par[(j * (hd / gv) + g) * 2 + {0, 1}], converted once per block rather than per column chunk.
inline __attribute__((always_inline, target("avx2,f16c"))) void kivi_value_params(const KiviBlock& k, int nb, int hd,
                                                                                  float* par) {
  const int np = 2 * (hd / k.gv);
  for (int j = 0; j < nb; ++j) {
    const auto* h = reinterpret_cast<const uint16_t*>(k.values + j * k.value_bytes);
    for (int i = 0; i < np; ++i) par[j * np + i] = _cvtsh_ss(h[i]);
  }
}

// Steps of the group kernels that do not depend on the register width, shared by the AVX2 kernels
// (attention.cpp) and the 512-bit ones (attention_avx512.cpp); inlined into each.

/// x[e] <- (x[0][e], ..., x[7][e]): an 8 x 8 transpose of floats (the group kernels' scores,
/// from one register per row to one per entry).
inline __attribute__((always_inline, target("avx2"))) void transpose8(__m256* x) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(x[2 * i], x[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(x[2 * i], x[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    x[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    x[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

/// The 16 codes of channel d of a q8_0 key tile (codes: [head_dim][16] int8) or, with Q4, a q4_0
/// one ([head_dim][8] bytes, lane 2m in the low nibble and 2m + 1 in the high one), as int8 lanes
/// (q4_0: code - 8). The integer path (attention_int.cpp) and the 512-bit kernels read them alike.
template <bool Q4>
inline __attribute__((always_inline)) __m128i key_codes_i8(const uint8_t* codes, int d) {
  if constexpr (!Q4) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + d * 16));
  } else {
    const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + d * 8)), m4 = _mm_set1_epi8(15);
    return _mm_sub_epi8(_mm_unpacklo_epi8(_mm_and_si128(x, m4), _mm_and_si128(_mm_srli_epi16(x, 4), m4)),
                        _mm_set1_epi8(8));
  }
}

/// Channels [off, off + 16) of a q8_0 value block (blk: its f16 scale, then qb codes) or, with Q4,
/// a q4_0 one (value j in the low nibble of byte j, j + qb / 2 in the high one), as int8 lanes
/// (q4_0: code - 8). qb is 16 or 32; off is 0 or 16.
template <bool Q4>
inline __attribute__((always_inline)) __m128i value_codes_i8(const uint8_t* blk, int qb, int off) {
  if constexpr (!Q4) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2 + off));
  } else {
    const __m128i m4 = _mm_set1_epi8(15);
    __m128i nib;
    if (qb == 32) {
      const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
      nib = _mm_and_si128(off == 0 ? x : _mm_srli_epi16(x, 4), m4);
    } else {
      const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2));
      nib = _mm_unpacklo_epi64(_mm_and_si128(x, m4), _mm_and_si128(_mm_srli_epi16(x, 4), m4));
    }
    return _mm_sub_epi8(nib, _mm_set1_epi8(8));
  }
}

/// raw[i][lg] = ST[(16 t + j) * 8 + i] for every entry j of the pair's tiles that row i (< rows)
/// sees (lg = blk[t].lg[j]); raw: [rows][n].
inline void copy_raw_scores(const PairData& pd, const BlockRef* blk, const float* ST, int rows, const int32_t* vis,
                            float* raw, size_t n) {
  for (int t = 0; t < pd.nt; ++t)
    for (int j = 0; j < pd.nb[t]; ++j)
      for (int i = 0; i < rows; ++i)
        if (blk[t].lg[j] < vis[i]) raw[static_cast<size_t>(i) * n + blk[t].lg[j]] = ST[(16 * t + j) * 8 + i];
}

/// The pair's logical indices, tile 0's then tile 1's, into lg[32].
inline void pair_logical(const PairData& pd, const BlockRef* blk, int32_t* lg) {
  std::memcpy(lg, blk[0].lg, sizeof blk[0].lg);
  if (pd.nt == 2) std::memcpy(lg + 16, blk[1].lg, sizeof blk[1].lg);
}

/// Whether a group of `rows` sees every one of the ne entries lg[0, ne) in every row (only a full
/// group of 8 can: the lanes past `rows` see nothing).
/// ne: 16 or 32. In registers: the scalar min and max took 48 of the ~1,950 TSC cycles of a prefill
/// group (8 rows x 32 entries, AVX2, Zen 4); this takes 7.
inline __attribute__((always_inline, target("avx2"))) bool group_sees_all(const int32_t* lg, int ne,
                                                                         const int32_t* vis, int rows) {
  if (rows != 8) return false;
  __m256i mx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lg));
  for (int j = 8; j < ne; j += 8) mx = _mm256_max_epi32(mx, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lg + j)));
  __m256i mn = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vis));
  // Every lane to the max (min) of all 8: across the halves, then the pairs of pairs, then pairs.
  mx = _mm256_max_epi32(mx, _mm256_permute2x128_si256(mx, mx, 1));
  mn = _mm256_min_epi32(mn, _mm256_permute2x128_si256(mn, mn, 1));
  mx = _mm256_max_epi32(mx, _mm256_shuffle_epi32(mx, 0x4E));
  mn = _mm256_min_epi32(mn, _mm256_shuffle_epi32(mn, 0x4E));
  mx = _mm256_max_epi32(mx, _mm256_shuffle_epi32(mx, 0xB1));
  mn = _mm256_min_epi32(mn, _mm256_shuffle_epi32(mn, 0xB1));
  return _mm256_cvtsi256_si32(_mm256_cmpgt_epi32(mn, mx)) != 0;
}

/// The online softmax's step for rows whose maximum rose: for each set bit i of `up`, l[i] and
/// the output row O[i][0, hd) are scaled by exp(m[i] - mx[i]) (0 for a row that saw nothing
/// before), and m[i] = mx[i].
inline void rescale_rows(int up, const float* mx, float* m, float* l, float* O, int hd) {
  for (; up; up &= up - 1) {
    const int i = __builtin_ctz(up);
    const float alpha = m[i] == -INFINITY ? 0.0f : std::exp(m[i] - mx[i]);
    l[i] *= alpha;
    float* Oi = O + static_cast<size_t>(i) * hd;
    for (int d = 0; d < hd; ++d) Oi[d] *= alpha;
    m[i] = mx[i];
  }
}

/// All `rows` query rows (Q: [rows][hd], scaled and rotated) against one pair, 8 rows at a time,
/// with 512-bit registers (AVX-512F/DQ; hd % 16 == 0): scores, the online softmax (m, l: running
/// max and sum per row, room for rows rounded up to 8; O: [rows][hd] unnormalised outputs) and
/// values. raw (when non-null): [rows][n] raw scores of the visible entries. Each row's result
/// depends only on that row (not on the rows beside it in its group of 8).
void pair_groups_avx512(const PairData& pd, const BlockRef* blk, const float* Q, int rows, int hd,
                        const int32_t* vis, float* m, float* l, float* O, float* raw, size_t n);

}  // namespace kvslim::attn
