// Attention over KV segments: blocks of kKVTile entries are decoded from their codec into small
// buffers (keys transposed, values as rows) and consumed at once by all query rows of the call
// (a GQA group in decode, a tile of tokens x the group in prefill), with an online softmax
// (running max and sum per row) so the segment is read exactly once.
//
// The hot loops use GCC vector extensions of 8 floats (the online softmax included) inside one
// function compiled twice (x86-64-v3 = AVX2 + FMA, for the x86 levels, and the SSE2 baseline) and
// chosen at run time; for head_dim % 16 == 0 the AVX2 and AVX-VNNI levels run the group kernels
// below (AVX2 intrinsics) and the AVX-512 level their 512-bit copy (attention_avx512.cpp). On
// the AVX2 and AVX-VNNI levels, q8_0 and q4_0 keys and values take integer products instead
// (attention_int.h). Decode groups (at most 8 rows) read f16 tiles, and at the x86 levels KIVI
// groups (and at AVX-512 q8_0 and q4_0 tiles), straight from the cache, decoding them in
// registers to the values the buffers would hold.
#include "attention/attention.h"
#include "attention/attention_int.h"
#include "attention/attention_latent.h"
#include "attention/attention_tiles.h"
#include "kernels/clones.h"

#include "kernels/quant_dot.h"
#include "kernels/vexp.h"
#include "kv/store.h"

#include "kernels/intrinsics.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

namespace kvslim {

namespace {

// The clones are defined under their own names, with no earlier declaration: clang 14 compiles a
// target_clones definition that follows a plain declaration (the header's) as its first clone
// only, without a resolver, which ran AVX-512 code on every CPU (an illegal instruction on AVX2
// machines in the sanitizer builds). The public functions below forward to them.
KVSLIM_TARGET_CLONES float dot_f32_clones(const float* a, const float* b, int64_t n) {
  // Eight partial sums let the compiler vectorize without -ffast-math.
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += a[i + k] * b[i + k];
  float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

KVSLIM_TARGET_CLONES void axpy_f32_clones(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

float dot_f32(const float* a, const float* b, int64_t n) { return dot_f32_clones(a, b, n); }

void axpy_f32(float a, const float* x, float* y, int64_t n) { axpy_f32_clones(a, x, y, n); }

namespace {

static_assert(kKVTile == 16, "the kernels below hold one tile of scores in a 16-float vector");

#define KV_INLINE inline __attribute__((always_inline))

// The vector helpers below are always inlined into the per-target kernels, so no 32-byte vector
// crosses a call of the baseline (SSE2) build and the psABI note about their passing does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

typedef float v4 __attribute__((vector_size(16)));

template <class V>
KV_INLINE V loadv(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class V>
KV_INLINE void storev(float* p, const V& v) {
  std::memcpy(p, &v, sizeof v);
}

template <class V>
struct IntVec;
template <>
struct IntVec<v8> {
  using type = v8i;
};

// Broadcasts of 8-lane vectors. (16-float generic vectors are not used: GCC 12 lowers their
// broadcasts for x86-64-v3 to scalar stores and reloads through the stack.)
template <class V, class T>
KV_INLINE V splatv(T x) {
  return V{} + x;
}

// exp on 8 lanes for the generic kernels: kernels/vexp.h's in vector extensions. Inputs must be
// <= 88 (the online softmax's s - max is <= 0).
template <class V>
KV_INLINE V vexp_v(const V& x) {
  return vexp::expv<V, typename IntVec<V>::type>(x);
}

// Max of the lanes of an 8-lane vector.
KV_INLINE float hmax_n(const v8& m8) {
  const v4 c = __builtin_shufflevector(m8, m8, 0, 1, 2, 3), d = __builtin_shufflevector(m8, m8, 4, 5, 6, 7);
  const v4 m4 = c > d ? c : d;
  return std::max(std::max(m4[0], m4[1]), std::max(m4[2], m4[3]));
}
// Sum of 16 lanes held as two 8-lane vectors, by halving (a tree; the order of the additions is fixed).
KV_INLINE float hsum16(const v8* p) {
  const v8 s8 = p[0] + p[1];
  const v4 s4 = __builtin_shufflevector(s8, s8, 0, 1, 2, 3) + __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// S[i * ss + t * 16 + j] = sum_d Q[i][d] * kt_t[d][j] for NR rows and NT key tiles (kt_t =
// kt + t * hd * 16). With two tiles each broadcast query value feeds two fmas: the loop is bound
// by loads (one broadcast per fma with a single tile), so sharing them is what makes it faster.
// V is the register type (8 floats); each lane computes the same sums on every level.
template <int NR, int NT, class V>
KV_INLINE void tile_scores(const float* Q, int hd, const float* kt, float* S, int ss) {
  constexpr int L = sizeof(V) / sizeof(float), H = 16 / L;
  // The row loops are unrolled so that the accumulators live in registers.
  V acc[NT][H][NR];
#pragma GCC unroll 8
  for (int i = 0; i < NR; ++i)
    for (int t = 0; t < NT; ++t)
      for (int h = 0; h < H; ++h) acc[t][h][i] = V{};
  for (int d = 0; d < hd; ++d) {
    V k[NT][H];
    for (int t = 0; t < NT; ++t)
      for (int h = 0; h < H; ++h) k[t][h] = loadv<V>(kt + (static_cast<size_t>(t) * hd + d) * 16 + h * L);
#pragma GCC unroll 8
    for (int i = 0; i < NR; ++i) {
      // A scalar operand, not splatv(): GCC broadcasts it with vbroadcastss.
      const float q = Q[i * hd + d];
      for (int t = 0; t < NT; ++t)
        for (int h = 0; h < H; ++h) acc[t][h][i] += k[t][h] * q;
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < NR; ++i)
    for (int t = 0; t < NT; ++t)
      for (int h = 0; h < H; ++h) storev<V>(S + i * ss + t * 16 + h * L, acc[t][h][i]);
}

// O[i][c..c+16 CH) += sum_j P[i * ps + j] * V[j][c..c+16 CH) for NR rows, nb value rows; columns
// [c0, c1) in steps of 16 CH (CH chunks share each broadcast probability).
template <int NR, int CH, class V>
KV_INLINE void tile_pv(const float* P, int ps, const float* Vr, int nb, int hd, float* O, int c0, int c1) {
  constexpr int L = sizeof(V) / sizeof(float), H = 16 * CH / L;
  for (int c = c0; c + 16 * CH <= c1; c += 16 * CH) {
    V acc[NR][H];
#pragma GCC unroll 8
    for (int i = 0; i < NR; ++i)
      for (int h = 0; h < H; ++h) acc[i][h] = loadv<V>(O + i * hd + c + L * h);
    for (int j = 0; j < nb; ++j) {
      V v[H];
      for (int h = 0; h < H; ++h) v[h] = loadv<V>(Vr + j * hd + c + L * h);
#pragma GCC unroll 8
      for (int i = 0; i < NR; ++i) {
        const float p = P[i * ps + j];
        for (int h = 0; h < H; ++h) acc[i][h] += v[h] * p;
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < NR; ++i)
      for (int h = 0; h < H; ++h) storev<V>(O + i * hd + c + L * h, acc[i][h]);
  }
}

struct Scratch {
  std::vector<float> Q, O, m, l, S, kt, v;
  // Integer products (attention_int.h): the query rows as int16 with their scales, and a pair's
  // keys and values expanded to int16 pairs with theirs.
  std::vector<int16_t> Qs, kp, vp;
  std::vector<float> sq, dk, dv;
};

using attn::BlockRef;

// ---- AVX2: groups of up to 8 query rows, scores transposed ----
//
// On AVX2 (16 registers of 8 floats) the kernel above spends a third of its time outside the
// score and value loops: the online softmax of each row on its own (horizontal max and sums,
// scalar bookkeeping). Here the rows go 8 at a time (a decode GQA group; 8 rows of a prefill
// tile): the scores of a key register (8 entries) for the 8 rows are 8 accumulators, transposed
// at the end into one register per entry holding the 8 rows, so the softmax runs on all rows at
// once with lane-wise operations. f16 keys and values are converted in the loops that use them
// (read straight from the cache, never into f32 buffers). Every sum is formed in the order
// of the kernel above (scores: one fma per channel in channel order; probabilities: vexp::exp8,
// vexp_v's operations; row sums: hsum16's tree, lane-wise; a new running max: std::exp and the
// same rescaling; values: one fma per entry in entry order), so the AVX2 level gives the same bits
// as before.
#define KV_AVX2_INLINE inline __attribute__((always_inline, target("arch=x86-64-v3")))

// Key register h (entries 8h .. 8h+7) of channel d of a transposed tile, f32 or f16.
template <class KT>
KV_AVX2_INLINE __m256 key8(const KT* kt, int d, int h) {
  if constexpr (sizeof(KT) == 2)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kt + d * 16 + h * 8)));
  else
    return _mm256_loadu_ps(kt + d * 16 + h * 8);
}

// Value register: columns [c, c + 8) of row j, f32 or f16.
template <class VT>
KV_AVX2_INLINE __m256 value8(const VT* v, size_t j, int hd, int c) {
  if constexpr (sizeof(VT) == 2)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + j * hd + c)));
  else
    return _mm256_loadu_ps(v + j * hd + c);
}

using attn::transpose8;

// The codes of 8 entries (entry j at bit j * BITS of p; BITS 4 or 2) as int32 lanes in entry
// order: the word holding them in every lane, each lane shifted by its own amount.
template <int BITS>
KV_AVX2_INLINE __m256i kivi_codes8(const uint8_t* p) {
  uint32_t w = 0;
  std::memcpy(&w, p, BITS);
  const __m256i sh = BITS == 4 ? _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28) : _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)), sh), _mm256_set1_epi32((1 << BITS) - 1));
}

// A KIVI key block read in place (kv/store.h KiviBlock), its zero points and steps as floats:
// key8 decodes each channel's codes in registers as the KIVI decoders do (fma(code, step, zero)),
// so the score kernels form the same values, and the same fma chains, as over decoded tiles.
template <int BITS>
struct KiviKeys8 {
  const uint8_t* codes;
  size_t stride;
  const float* zero;
  const float* step;
};
template <int BITS>
KV_AVX2_INLINE __m256 key8(const KiviKeys8<BITS>* k, int d, int h) {
  const __m256 code = _mm256_cvtepi32_ps(kivi_codes8<BITS>(k->codes + d * k->stride + h * BITS));
  return _mm256_fmadd_ps(code, _mm256_broadcast_ss(k->step + d), _mm256_broadcast_ss(k->zero + d));
}

// KIVI value records read in place, decoded in registers as the KIVI decoders do. par: each
// entry's (zero, step) pairs as floats, [entry][hd / gv][2] (attn::kivi_value_params).
template <int BITS>
struct KiviValues8 {
  const KiviBlock* kb;
  const float* par;
};
template <int BITS>
KV_AVX2_INLINE __m256 value8(const KiviValues8<BITS>* v, size_t j, int hd, int c) {
  const KiviBlock& kb = *v->kb;
  const int ng = hd / kb.gv;
  const float* zs = v->par + (j * ng + c / kb.gv) * 2;
  const __m256 code = _mm256_cvtepi32_ps(kivi_codes8<BITS>(kb.values + j * kb.value_bytes + ng * 4 + c * BITS / 8));
  return _mm256_fmadd_ps(code, _mm256_broadcast_ss(zs + 1), _mm256_broadcast_ss(zs));
}

// ST[j * 8 + i] = sum_d Q[i][d] * kt[d][j] for R rows (lanes i >= R: 0) and the 16 entries of a tile.
// f32 keys (decoded codecs): rows 4 at a time against both key registers of a channel, so that each
// broadcast query value feeds two fmas (6 loads per 8 fmas instead of 9: the loop was bound by
// loads); f16 keys are converted once per channel and register, 8 rows per key register.
// Each score is the same chain of fmas over the channels in order either way.
template <int R, class KT>
KV_AVX2_INLINE void scores_t8(const float* Q, int hd, const KT* kt, float* ST) {
  if constexpr (std::is_same_v<KT, float>) {
    __m256 x[2][8];
#pragma GCC unroll 8
    for (int i = R; i < 8; ++i) x[0][i] = x[1][i] = _mm256_setzero_ps();
#pragma GCC unroll 2
    for (int i0 = 0; i0 < R; i0 += 4) {
      constexpr int kMaxRows = 4;
      const int nr = std::min(kMaxRows, R - i0);
      __m256 acc[2][4];
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) acc[0][i] = acc[1][i] = _mm256_setzero_ps();
      const float* Qi = Q + i0 * hd;
      if (nr == 4) {
        for (int d = 0; d < hd; ++d) {
          const __m256 k0 = key8(kt, d, 0), k1 = key8(kt, d, 1);
#pragma GCC unroll 4
          for (int i = 0; i < 4; ++i) {
            const __m256 q = _mm256_broadcast_ss(Qi + i * hd + d);
            acc[0][i] = _mm256_fmadd_ps(k0, q, acc[0][i]);
            acc[1][i] = _mm256_fmadd_ps(k1, q, acc[1][i]);
          }
        }
      } else {
        for (int d = 0; d < hd; ++d) {
          const __m256 k0 = key8(kt, d, 0), k1 = key8(kt, d, 1);
#pragma GCC unroll 4
          for (int i = 0; i < 3; ++i)
            if (i < nr) {
              const __m256 q = _mm256_broadcast_ss(Qi + i * hd + d);
              acc[0][i] = _mm256_fmadd_ps(k0, q, acc[0][i]);
              acc[1][i] = _mm256_fmadd_ps(k1, q, acc[1][i]);
            }
        }
      }
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i)
        if (i < nr) {
          x[0][i0 + i] = acc[0][i];
          x[1][i0 + i] = acc[1][i];
        }
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      transpose8(x[h]);
#pragma GCC unroll 8
      for (int e = 0; e < 8; ++e) _mm256_storeu_ps(ST + (h * 8 + e) * 8, x[h][e]);
    }
    return;
  }
  for (int h = 0; h < 2; ++h) {
    __m256 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
    for (int d = 0; d < hd; ++d) {
      const __m256 k = key8(kt, d, h);
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) acc[i] = _mm256_fmadd_ps(k, _mm256_broadcast_ss(Q + i * hd + d), acc[i]);
    }
    __m256 x[8];  // a copy, so that acc stays in registers in the loop above
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) x[i] = acc[i];
    transpose8(x);
#pragma GCC unroll 8
    for (int e = 0; e < 8; ++e) _mm256_storeu_ps(ST + (h * 8 + e) * 8, x[e]);
  }
}

// O[i][c] += sum_{j < nb} PT[j * 8 + i] * V[j][c] for R rows, all hd columns (hd % 8 == 0).
// f32 values (prefill) with hd % 16 == 0: 4 rows x 16 columns per pass, each broadcast probability
// feeding two fmas (as scores_t8); each output is the same chain of fmas over the entries in order.
template <int R, class VT>
KV_AVX2_INLINE void pv_t8(const float* PT, const VT* V, int nb, int hd, float* O) {
  if constexpr (std::is_same_v<VT, float>) {
    if (hd % 16 == 0) {
      for (int c = 0; c < hd; c += 16) {
#pragma GCC unroll 2
        for (int i0 = 0; i0 < R; i0 += 4) {
          constexpr int kMaxRows = 4;
          const int nr = std::min(kMaxRows, R - i0);
          float* Oi = O + i0 * hd + c;
          const float* P = PT + i0;
          if (nr == 4) {
            __m256 acc[4][2];
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) {
              acc[i][0] = _mm256_loadu_ps(Oi + i * hd);
              acc[i][1] = _mm256_loadu_ps(Oi + i * hd + 8);
            }
            for (int j = 0; j < nb; ++j) {
              const __m256 v0 = _mm256_loadu_ps(V + j * hd + c), v1 = _mm256_loadu_ps(V + j * hd + c + 8);
#pragma GCC unroll 4
              for (int i = 0; i < 4; ++i) {
                const __m256 p = _mm256_broadcast_ss(P + j * 8 + i);
                acc[i][0] = _mm256_fmadd_ps(v0, p, acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(v1, p, acc[i][1]);
              }
            }
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) {
              _mm256_storeu_ps(Oi + i * hd, acc[i][0]);
              _mm256_storeu_ps(Oi + i * hd + 8, acc[i][1]);
            }
          } else {
            for (int i = 0; i < nr; ++i) {
              __m256 a0 = _mm256_loadu_ps(Oi + i * hd), a1 = _mm256_loadu_ps(Oi + i * hd + 8);
              for (int j = 0; j < nb; ++j) {
                const __m256 p = _mm256_broadcast_ss(P + j * 8 + i);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(V + j * hd + c), p, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(V + j * hd + c + 8), p, a1);
              }
              _mm256_storeu_ps(Oi + i * hd, a0);
              _mm256_storeu_ps(Oi + i * hd + 8, a1);
            }
          }
        }
      }
      return;
    }
  }
  for (int c = 0; c < hd; c += 8) {
    __m256 acc[R];
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) acc[i] = _mm256_loadu_ps(O + i * hd + c);
    for (int j = 0; j < nb; ++j) {
      const __m256 v = value8(V, j, hd, c);
#pragma GCC unroll 8
      for (int i = 0; i < R; ++i) acc[i] = _mm256_fmadd_ps(v, _mm256_broadcast_ss(PT + j * 8 + i), acc[i]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) _mm256_storeu_ps(O + i * hd + c, acc[i]);
  }
}

// ---- AVX2: a group of 8 rows against a pair of full tiles, 12 chains of fmas ----
//
// The loops above keep 8 accumulators, 8 independent chains of fmas: with an fma latency of 4
// cycles and two fma pipes that is the bare minimum, and on this kind of CPU (Zen 3) 8 chains
// issue about 1.65 fmas per cycle against 1.94 for 12. For a group of 8 rows against a pair of
// tiles (the decode group with f16 keys and values read straight from the cache, or a prefill
// group with decoded f32 blocks) these two kernels keep 12 chains where they can: rows 0-5
// against the two key registers of one tile (12 accumulators),
// then rows 6-7 against the four key registers of both tiles (8); values: rows 0-5 x 16 columns
// (12), rows 6-7 x 32 columns (8). Each score and each output is the same chain of fmas, in the
// same order, as in scores_t8 and pv_t8, so the results are bit for bit those of the kernels
// above (and of the prefill path, which the tests compare row by row).

// HD: head_dim when known at compile time (64, 128), else 0 and hd at run time. With HD fixed,
// every query, output and value address is one base register plus a constant, which frees the
// general registers that otherwise hold a pointer per row (GCC spilled and reloaded five of them
// in each step of the score loop, the kernel's hottest).
template <int HD>
KV_AVX2_INLINE int head_dim_of(int hd) {
  if constexpr (HD > 0) return HD;
  else return hd;
}

// Scores of the 8 rows against tiles kt[0], kt[1] (16 entries each, f16 or f32) into
// ST[(16 t + j) * 8 + i]. pf: four 16 * hd f16 blocks (a later pair's key tiles and value rows,
// or, when there is none, this pair's own) fetched into the cache, one line per two channels,
// while these scores are computed. Into L2 (hint T1), not L1: the 128 lines of a pair requested
// at once outnumber the L1's miss buffers, and a decode over a cold 16K cache then waited on
// memory (AMD Zen 4: 88 heads x 16,384 entries 53-58 -> 39-42 ms; warm tiles unchanged).
template <int HD, class KT>
KV_AVX2_INLINE void scores_pair8(const float* Q, int hd_rt, const KT* const* kt, float* ST, const char* const* pf) {
  const int hd = head_dim_of<HD>(hd_rt);
  __m256 x[2][2][8];  // [tile][key register][row]
  for (int t = 0; t < 2; ++t) {
    __m256 a[6][2];
#pragma GCC unroll 6
    for (int i = 0; i < 6; ++i) a[i][0] = a[i][1] = _mm256_setzero_ps();
    const char* pft = pf[t];
    const KT* k = kt[t];
    for (int d = 0; d < hd; d += 2) {
      _mm_prefetch(pft + d * 32, _MM_HINT_T1);
#pragma GCC unroll 2
      for (int dd = d; dd < d + 2; ++dd) {
        const __m256 k0 = key8(k, dd, 0), k1 = key8(k, dd, 1);
#pragma GCC unroll 6
        for (int i = 0; i < 6; ++i) {
          const __m256 q = _mm256_broadcast_ss(Q + i * hd + dd);
          a[i][0] = _mm256_fmadd_ps(k0, q, a[i][0]);
          a[i][1] = _mm256_fmadd_ps(k1, q, a[i][1]);
        }
      }
    }
#pragma GCC unroll 6
    for (int i = 0; i < 6; ++i) {
      x[t][0][i] = a[i][0];
      x[t][1][i] = a[i][1];
    }
  }
  {
    __m256 a[2][4];
#pragma GCC unroll 2
    for (int i = 0; i < 2; ++i) a[i][0] = a[i][1] = a[i][2] = a[i][3] = _mm256_setzero_ps();
    const char* pf2 = pf[2];
    const char* pf3 = pf[3];
    const KT* k0p = kt[0];
    const KT* k1p = kt[1];
    for (int d = 0; d < hd; d += 2) {
      _mm_prefetch(pf2 + d * 32, _MM_HINT_T1);
      _mm_prefetch(pf3 + d * 32, _MM_HINT_T1);
#pragma GCC unroll 2
      for (int dd = d; dd < d + 2; ++dd) {
        const __m256 k00 = key8(k0p, dd, 0), k01 = key8(k0p, dd, 1), k10 = key8(k1p, dd, 0),
                     k11 = key8(k1p, dd, 1);
#pragma GCC unroll 2
        for (int i = 0; i < 2; ++i) {
          const __m256 q = _mm256_broadcast_ss(Q + (6 + i) * hd + dd);
          a[i][0] = _mm256_fmadd_ps(k00, q, a[i][0]);
          a[i][1] = _mm256_fmadd_ps(k01, q, a[i][1]);
          a[i][2] = _mm256_fmadd_ps(k10, q, a[i][2]);
          a[i][3] = _mm256_fmadd_ps(k11, q, a[i][3]);
        }
      }
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; ++i) {
      x[0][0][6 + i] = a[i][0];
      x[0][1][6 + i] = a[i][1];
      x[1][0][6 + i] = a[i][2];
      x[1][1][6 + i] = a[i][3];
    }
  }
#pragma GCC unroll 2
  for (int t = 0; t < 2; ++t)
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      transpose8(x[t][h]);
#pragma GCC unroll 8
      for (int e = 0; e < 8; ++e) _mm256_storeu_ps(ST + (16 * t + h * 8 + e) * 8, x[t][h][e]);
    }
}

// O[i][c] += sum_j PT[j * 8 + i] * V[j][c] for the 8 rows over the nb0 rows of v[0], then the
// nb1 of v[1] (f16 or f32; each output one chain of fmas in that order); hd % 32 == 0.
template <int HD, class VT>
KV_AVX2_INLINE void pv_pair8(const float* PT, const VT* const* v, int nb0, int nb1, int hd_rt, float* O) {
  const int hd = head_dim_of<HD>(hd_rt);
  const VT* v0p = v[0];
  const VT* v1p = v[1];
  for (int c = 0; c < hd; c += 16) {
    __m256 a[6][2];
#pragma GCC unroll 6
    for (int i = 0; i < 6; ++i) {
      a[i][0] = _mm256_loadu_ps(O + i * hd + c);
      a[i][1] = _mm256_loadu_ps(O + i * hd + c + 8);
    }
#pragma GCC unroll 2
    for (int t = 0; t < 2; ++t) {
      const float* P = PT + t * 128;
      const VT* vt = t ? v1p : v0p;
      const int nb = t ? nb1 : nb0;
      for (int j = 0; j < nb; ++j) {
        const __m256 v0 = value8(vt, j, hd, c), v1 = value8(vt, j, hd, c + 8);
#pragma GCC unroll 6
        for (int i = 0; i < 6; ++i) {
          const __m256 p = _mm256_broadcast_ss(P + j * 8 + i);
          a[i][0] = _mm256_fmadd_ps(v0, p, a[i][0]);
          a[i][1] = _mm256_fmadd_ps(v1, p, a[i][1]);
        }
      }
    }
#pragma GCC unroll 6
    for (int i = 0; i < 6; ++i) {
      _mm256_storeu_ps(O + i * hd + c, a[i][0]);
      _mm256_storeu_ps(O + i * hd + c + 8, a[i][1]);
    }
  }
  for (int c = 0; c < hd; c += 32) {
    __m256 a[2][4];
#pragma GCC unroll 2
    for (int i = 0; i < 2; ++i)
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) a[i][u] = _mm256_loadu_ps(O + (6 + i) * hd + c + 8 * u);
#pragma GCC unroll 2
    for (int t = 0; t < 2; ++t) {
      const float* P = PT + t * 128;
      const VT* vt = t ? v1p : v0p;
      const int nb = t ? nb1 : nb0;
      for (int j = 0; j < nb; ++j) {
        __m256 vv[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; ++u) vv[u] = value8(vt, j, hd, c + 8 * u);
#pragma GCC unroll 2
        for (int i = 0; i < 2; ++i) {
          const __m256 p = _mm256_broadcast_ss(P + j * 8 + 6 + i);
#pragma GCC unroll 4
          for (int u = 0; u < 4; ++u) a[i][u] = _mm256_fmadd_ps(vv[u], p, a[i][u]);
        }
      }
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; ++i)
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) _mm256_storeu_ps(O + (6 + i) * hd + c + 8 * u, a[i][u]);
  }
}

// The pair kernels for the head_dim at hand: compiled for 64 and 128, any other at run time.
template <class KT>
KV_AVX2_INLINE void scores_pair8_hd(const float* Q, int hd, const KT* const* kt, float* ST, const char* const* pf) {
  if (hd == 64) scores_pair8<64>(Q, hd, kt, ST, pf);
  else if (hd == 128) scores_pair8<128>(Q, hd, kt, ST, pf);
  else scores_pair8<0>(Q, hd, kt, ST, pf);
}
template <class VT>
KV_AVX2_INLINE void pv_pair8_hd(const float* PT, const VT* const* v, const int* nb, int hd, float* O) {
  if (hd == 64) pv_pair8<64>(PT, v, nb[0], nb[1], hd, O);
  else if (hd == 128) pv_pair8<128>(PT, v, nb[0], nb[1], hd, O);
  else pv_pair8<0>(PT, v, nb[0], nb[1], hd, O);
}

using attn::PairData;

// The online softmax of a group (rows lanes of 8) over the scores ST[j * 8 + i] of the pair's
// 16 * nt entries, in place: ST becomes the probabilities (0 where not visible). m, l: the rows'
// running max and sum (8 lanes each); O: their outputs ([8][hd], rescaled on a new max). Returns
// whether any row saw an entry.
// Lanes (rows) that see entry with logical index lg: all bits set where lg < vis.
KV_AVX2_INLINE __m256 lanes_seeing(__m256i visv, int32_t lg) {
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(visv, _mm256_set1_epi32(lg)));
}

// ST[j * 8 + i] <- exp(ST[j * 8 + i] - m[i]) (0 where row i does not see entry j unless FULL),
// l[i] += their sum in hsum16's tree per tile of 16 entries.
template <bool FULL>
KV_AVX2_INLINE void probabilities_t8(float* ST, int nt, const int32_t* lg, __m256i visv, const float* m, float* l) {
  const __m256 mr = _mm256_loadu_ps(m);
  __m256 lv = _mm256_loadu_ps(l);
  for (int t = 0; t < nt; ++t) {
    __m256 p[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) {
      float* Sj = ST + (16 * t + j) * 8;
      // vexp::exp8 rather than vexp_v: its clamp is one max where GCC made vexp_v's a compare and a
      // blend, and its constants stay in registers (prefill tile, Zen 4: 250 -> 217 TSC cycles a group).
      __m256 e = vexp::exp8(_mm256_sub_ps(_mm256_loadu_ps(Sj), mr));
      if constexpr (!FULL) e = _mm256_and_ps(e, lanes_seeing(visv, lg[16 * t + j]));
      p[j] = e;
      _mm256_storeu_ps(Sj, e);
    }
    // hsum16's tree over the 16 entries, for the 8 rows at once.
    __m256 s8[8], s4[4];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) s8[j] = _mm256_add_ps(p[j], p[j + 8]);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) s4[j] = _mm256_add_ps(s8[j], s8[j + 4]);
    lv = _mm256_add_ps(lv, _mm256_add_ps(_mm256_add_ps(s4[0], s4[2]), _mm256_add_ps(s4[1], s4[3])));
  }
  _mm256_storeu_ps(l, lv);
}

KV_AVX2_INLINE bool softmax_t8(float* ST, int nt, const int32_t* lg, const int32_t* vis, int rows, float* m, float* l,
                               float* O, int hd) {
  const int ne = 16 * nt;
  alignas(32) int32_t visb[8];
  for (int i = 0; i < 8; ++i) visb[i] = i < rows ? vis[i] : INT_MIN;
  const __m256i visv = _mm256_load_si256(reinterpret_cast<const __m256i*>(visb));
  const bool full = attn::group_sees_all(lg, ne, vis, rows);  // every lane of every entry visible
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  __m256 mx = ninf;
  for (int j = 0; j < ne; ++j) {
    __m256 s = _mm256_loadu_ps(ST + j * 8);
    if (!full) s = _mm256_blendv_ps(ninf, s, lanes_seeing(visv, lg[j]));
    mx = _mm256_max_ps(mx, s);
  }
  const int seen = _mm256_movemask_ps(_mm256_cmp_ps(mx, ninf, _CMP_GT_OQ));
  if (!seen) {
    for (int j = 0; j < ne; ++j) _mm256_storeu_ps(ST + j * 8, _mm256_setzero_ps());
    return false;
  }
  // Rows with a new maximum: the kernel above's rescaling, row by row.
  alignas(32) float mxb[8];
  _mm256_store_ps(mxb, mx);
  attn::rescale_rows(_mm256_movemask_ps(_mm256_cmp_ps(mx, _mm256_loadu_ps(m), _CMP_GT_OQ)), mxb, m, l, O, hd);
  if (full) probabilities_t8<true>(ST, nt, lg, visv, m, l);
  else probabilities_t8<false>(ST, nt, lg, visv, m, l);
  return true;
}

// scores_t8 and pv_t8 over a KIVI block read in place (one tile; 8 chains, so that each channel's
// codes are decoded once for the 8 rows, where the pair kernels' 12 chains decode them twice).
template <int R, int BITS>
__attribute__((target("arch=x86-64-v3"), noinline)) void kivi_scores_t8(const float* Q, int hd,
                                                                        const KiviBlock& kb, float* ST) {
  alignas(32) float zf[attn::kKiviMaxHeadDim], sf[attn::kKiviMaxHeadDim];
  for (int d = 0; d < hd; d += 8) {
    _mm256_store_ps(zf + d, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kb.zero + d))));
    _mm256_store_ps(sf + d, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kb.step + d))));
  }
  const KiviKeys8<BITS> k{kb.codes, kb.code_stride, zf, sf};
  scores_t8<R>(Q, hd, &k, ST);
}
template <int R, int BITS>
__attribute__((target("arch=x86-64-v3"), noinline)) void kivi_pv_t8(const float* PT, const KiviBlock& kb,
                                                                    int nb, int hd, float* O) {
  alignas(32) float par[attn::kKiviMaxParams];
  attn::kivi_value_params(kb, nb, hd, par);
  const KiviValues8<BITS> v{&kb, par};
  pv_t8<R>(PT, &v, nb, hd, O);
}

// One pair of blocks for a group of R rows: scores, softmax, values. raw (when non-null): the
// group's rows of the raw-score matrix, [R][n].
// fetch: prefetch the next pair of f16 tiles (the call's first group does it for all).
// Qs, sq: the group's 8 query rows as int16 and their scales, for the integer products.
template <int R>
__attribute__((target("arch=x86-64-v3"), noinline)) void pair_group(const PairData& pd, const BlockRef* blk,
                                                                    const float* Q, const int16_t* Qs, const float* sq,
                                                                    int hd, const int32_t* vis, float* m, float* l,
                                                                    float* O, float* raw, size_t n, bool fetch) {
  alignas(32) float ST[32 * 8];
  // A group of 8 rows against a pair of tiles: the 12-chain kernels above.
  // (Both tiles f16 from the cache or both decoded: a pair across the KIVI part's end mixes them.)
  const bool pair8 =
      R == 8 && pd.nt == 2 && hd % 32 == 0 && !pd.k16[0] == !pd.k16[1] && !pd.kq[0].codes && !pd.kq[1].codes;
  if (pd.kp[0]) {
    attn::scores_int(pd, Qs, sq, hd, ST);
  } else if (pair8) {
    if (pd.k16[0] && pd.k16[1]) {
      // f16 straight from the cache: the next pair of tiles (keys and values each contiguous in
      // store order, so two tiles on) is fetched while this one is computed, hiding the memory
      // latency that the hardware prefetchers leave at every 4 KiB page (one pair of tiles per
      // page at head_dim 64).
      // Without a fetch (groups after the first) each tile prefetches itself: already cached, so
      // the prefetch is only an instruction, cheaper than a test in the loop.
      const char* pf[4];
      for (int t = 0; t < 2; ++t) {
        pf[t] = reinterpret_cast<const char*>(pd.k16[t] + (fetch ? 32 * hd : 0));
        pf[2 + t] = reinterpret_cast<const char*>(pd.v16[t] ? pd.v16[t] + (fetch ? 32 * hd : 0) : pd.k16[t]);
      }
      scores_pair8_hd(Q, hd, pd.k16, ST, pf);
    } else {
      const char* pf[4];
      for (int t = 0; t < 4; ++t) pf[t] = reinterpret_cast<const char*>(pd.kt[t % 2]);
      scores_pair8_hd(Q, hd, pd.kt, ST, pf);
    }
  } else {
    for (int t = 0; t < pd.nt; ++t) {
      if (pd.k16[t]) scores_t8<R>(Q, hd, pd.k16[t], ST + t * 128);
      else if (pd.kq[t].codes && pd.kq[t].bits == 4) kivi_scores_t8<R, 4>(Q, hd, pd.kq[t], ST + t * 128);
      else if (pd.kq[t].codes) kivi_scores_t8<R, 2>(Q, hd, pd.kq[t], ST + t * 128);
      else scores_t8<R>(Q, hd, pd.kt[t], ST + t * 128);
    }
  }
  if (raw) attn::copy_raw_scores(pd, blk, ST, R, vis, raw, n);
  alignas(32) int32_t lg[32];
  attn::pair_logical(pd, blk, lg);
  if (!softmax_t8(ST, pd.nt, lg, vis, R, m, l, O, hd)) return;
  if (pd.vp) return attn::values_int(pd, ST, R, hd, O);
  if (pair8) {
    if (pd.v16[0] && pd.v16[1]) return pv_pair8_hd(ST, pd.v16, pd.nb, hd, O);
    if (!pd.v16[0] && !pd.v16[1]) return pv_pair8_hd(ST, pd.v, pd.nb, hd, O);
  }
  for (int t = 0; t < pd.nt; ++t) {
    if (pd.v16[t]) pv_t8<R>(ST + t * 128, pd.v16[t], pd.nb[t], hd, O);
    else if (pd.v[t]) pv_t8<R>(ST + t * 128, pd.v[t], pd.nb[t], hd, O);
    else if (pd.kq[t].bits == 4) kivi_pv_t8<R, 4>(ST + t * 128, pd.kq[t], pd.nb[t], hd, O);
    else kivi_pv_t8<R, 2>(ST + t * 128, pd.kq[t], pd.nb[t], hd, O);
  }
}

// All rows of the call in groups of 8 against one pair (the caller's m and l have room for the
// rows rounded up to 8).
__attribute__((target("arch=x86-64-v3"))) void pair_groups(const PairData& pd, const BlockRef* blk, const float* Q,
                                                          const int16_t* Qs, const float* sq, int rows, int hd,
                                                          const int32_t* vis, float* m, float* l, float* O,
                                                          float* raw, size_t n) {
  for (int r0 = 0; r0 < rows; r0 += 8) {
    const float* Qg = Q + static_cast<size_t>(r0) * hd;
    float* Og = O + static_cast<size_t>(r0) * hd;
    float* rg = raw ? raw + static_cast<size_t>(r0) * n : nullptr;
    const int16_t* Qsg = Qs ? Qs + static_cast<size_t>(r0) * hd : nullptr;  // null without integer keys
    const float* sqg = sq ? sq + r0 : nullptr;
    switch (std::min(8, rows - r0)) {
#define KV_CASE(R) \
  case R: pair_group<R>(pd, blk, Qg, Qsg, sqg, hd, vis + r0, m + r0, l + r0, Og, rg, n, r0 == 0); break;
      KV_CASE(8) KV_CASE(7) KV_CASE(6) KV_CASE(5) KV_CASE(4) KV_CASE(3) KV_CASE(2) KV_CASE(1)
#undef KV_CASE
    }
  }
}

// Register tiling. Each accumulator is an independent chain of fmas, and an fma's latency is about
// four times its issue interval, so at least 8 chains are needed to keep two fma ports busy. With
// 16 registers (a 16-entry tile being two): 2 rows x 2 tiles and 4 rows x 1 chunk (8 registers of
// accumulators, no spills).
// kGroups8: the AVX2 group kernels above (pair_groups) when head_dim % 16 == 0.
template <bool kGroups8>
KV_INLINE void attend_body(const Segment& seg, const int32_t* sel, int n_sel, const float* Q, int rows,
                           const int32_t* vis, float* out, int64_t out_stride, float* raw, Scratch& sc) {
  // NRS: query rows per score tile (two key tiles); NRP: rows per value tile (and per score tile
  // of a lone key tile); CH: 16-column value chunks per probability broadcast; VT: the register.
  constexpr int NRS = 2, NRP = 4, CH = 1;
  using VT = v8;
  const int hd = seg.head_dim();
  const size_t n = seg.size();
  const bool vec_hd = hd % 16 == 0;
  int32_t maxvis = 0;
  for (int r = 0; r < rows; ++r) maxvis = std::max(maxvis, std::min<int32_t>(vis[r], static_cast<int32_t>(n)));
  float* O = sc.O.data();
  float* m = sc.m.data();
  float* l = sc.l.data();
  float* S = sc.S.data();  // [rows][32]: the probabilities of up to two tiles
  float* kt = sc.kt.data();
  std::fill(O, O + static_cast<size_t>(rows) * hd, 0.0f);
  std::fill(sc.m.begin(), sc.m.end(), -INFINITY);
  std::fill(sc.l.begin(), sc.l.end(), 0.0f);
  // f16 keys and values are read straight from the cache and converted in the group kernels'
  // loops (exactly, so with the same bits) rather than into f32 buffers first: decode reads each
  // block once, and a prefill tile keeps the pair's 8 KiB of f16 in the L1 cache for all its
  // groups instead of 16 KiB of f32 (and skips the conversion pass).
  const bool direct16 = kGroups8;
  // The AVX-512 level runs the 512-bit group kernels (attention_avx512.cpp).
  const bool wide = kGroups8 && qdot::level() == qdot::Level::AVX512;
  const int qb = std::gcd(32, hd);  // channels per scale block of the quantized codecs
  bool q_keys = false, q_values = false;  // some store holds q8_0 or q4_0 keys / values
  for (int s = 0; s < seg.n_stores(); ++s) {
    q_keys = q_keys || attn::int_codec(seg.store(s).key_codec());
    q_values = q_values || attn::int_codec(seg.store(s).value_codec());
  }
  // q8_0 and q4_0 keys (and, on their own, values) of row-part tiles take integer products on the
  // AVX2 and AVX-VNNI levels. Not on AVX-512: there the 512-bit float kernels over the decoded tiles
  // were faster (AMD Zen 5, 16,384 q8_0 entries: 317 us a head against 382 for 512-bit integer
  // products, whose tile expansion and weight rounding do not shrink with the register width).
  const bool int_level = kGroups8 && !wide && vec_hd;
  // ... which read the query rows as int16.
  if (int_level && q_keys) {
    const int rows8 = (rows + 7) / 8 * 8;
    sc.Qs.resize(static_cast<size_t>(rows8) * hd);
    sc.sq.resize(rows8);
    attn::quantize_queries(Q, rows, rows8, hd, sc.Qs.data(), sc.sq.data());
  }
  // In decode (one group of rows) the 512-bit kernels read q8_0 and q4_0 keys and values straight
  // from the cache: code * scale is exact in f32, so the same bits as decoding the tiles first. A
  // prefill tile's 8 groups would convert each tile 8 times, which took longer (kv_attention_bench,
  // q8_0: prefill tile 1,687 -> 1,873 us) than decoding it once.
  const bool direct8 = wide && rows <= 8 && (q_keys || q_values);
  // KIVI groups likewise, at every x86 level (decoded in registers as the KIVI decoders decode
  // them: the same bits). For a prefill tile the same argument as for q8_0 applies: 8 groups would
  // decode each block 8 times.
  const bool direct_kivi = kGroups8 && vec_hd && rows <= 8 && hd <= attn::kKiviMaxHeadDim;

  // Blocks are consumed in pairs (two tiles share the loads of the score loop); a lone block
  // is consumed as a pair with an empty second tile.
  auto process = [&](const BlockRef* blk, int nt) __attribute__((always_inline)) {
    if constexpr (kGroups8) {
      if (vec_hd) {
        PairData pd;
        pd.nt = nt;
        // Integer products where both tiles of the pair take them.
        bool int_k = int_level && q_keys, int_v = int_level && q_values;
        for (int t = 0; t < nt; ++t) {
          const KVStore& st = *blk[t].st;
          int_k = int_k && attn::int_codec(st.key_codec()) && st.row_key_tile(blk[t].b);
          int_v = int_v && attn::int_codec(st.value_codec()) && st.row_values(blk[t].b);
        }
        pd.qb = qb;
        if (int_v) {
          pd.vp = sc.vp.data();
          pd.dv = sc.dv.data();
        }
        for (int t = 0; t < nt; ++t) {
          const KVStore& st = *blk[t].st;
          if (direct8) {
            if (attn::int_codec(st.key_codec())) pd.k8[t] = st.row_key_tile(blk[t].b);
            if (attn::int_codec(st.value_codec())) pd.v8[t] = st.row_values(blk[t].b);
            pd.k4[t] = st.key_codec() == KVCodec::Q4_0;
            pd.v4[t] = st.value_codec() == KVCodec::Q4_0;
            if (pd.v8[t]) pd.vstride[t] = st.value_row_bytes();
          }
          if (direct_kivi && st.kivi_bits()) st.kivi_block(blk[t].b, blk[t].e, pd.kq[t]);
          if (int_k) {
            int16_t* kp = sc.kp.data() + static_cast<size_t>(t) * hd * 16;
            float* dk = sc.dk.data() + static_cast<size_t>(t) * hd;
            attn::expand_keys(st, blk[t].b, hd, kp, dk);
            pd.kp[t] = kp;
            pd.dk[t] = dk;
          }
          if (int_v) attn::expand_values(st, blk[t].b, blk[t].e, hd, 16 * t, sc.vp.data(), sc.dv.data());
          pd.nb[t] = static_cast<int>(blk[t].e - blk[t].b);
          pd.k16[t] = direct16 ? st.f16_key_tile(blk[t].b) : nullptr;
          pd.kt[t] = kt + static_cast<size_t>(t) * hd * 16;
          if (!pd.k16[t] && !pd.k8[t] && !int_k && !pd.kq[t].codes)
            st.block_keys_t(blk[t].b, blk[t].e, kt + static_cast<size_t>(t) * hd * 16);
          pd.v16[t] = direct16 ? st.f16_value_rows(blk[t].b) : nullptr;
          pd.v[t] = pd.v16[t] || pd.v8[t] || int_v || attn::kivi_direct_values(pd.kq[t]) ? nullptr
                                       : st.block_values(blk[t].b, blk[t].e, sc.v.data() + static_cast<size_t>(t) * hd * 16);
        }
        if (wide) attn::pair_groups_avx512(pd, blk, Q, rows, hd, vis, m, l, O, raw, n);
        else pair_groups(pd, blk, Q, sc.Qs.data(), sc.sq.data(), rows, hd, vis, m, l, O, raw, n);
        return;
      }
    }
    for (int t = 0; t < nt; ++t) blk[t].st->block_keys_t(blk[t].b, blk[t].e, kt + static_cast<size_t>(t) * hd * 16);
    int r = 0;
    if (nt == 2) {
      for (; r + NRS <= rows; r += NRS) tile_scores<NRS, 2, VT>(Q + static_cast<size_t>(r) * hd, hd, kt, S + r * 32, 32);
      for (; r < rows; ++r) tile_scores<1, 2, VT>(Q + static_cast<size_t>(r) * hd, hd, kt, S + r * 32, 32);
    } else {
      for (; r + NRP <= rows; r += NRP) tile_scores<NRP, 1, VT>(Q + static_cast<size_t>(r) * hd, hd, kt, S + r * 32, 32);
      for (; r < rows; ++r) tile_scores<1, 1, VT>(Q + static_cast<size_t>(r) * hd, hd, kt, S + r * 32, 32);
    }
    // The online softmax of each row over the (up to) 32 scores, as four 8-float vectors. Each
    // lane computes the same values on every level, and the row sums add the lanes in the same
    // tree (see hsum16), so the levels agree bit for bit.
    constexpr int L = sizeof(VT) / sizeof(float), NV = 32 / L;
    using VI = typename IntVec<VT>::type;
    alignas(64) int32_t lgb[32];
    std::memcpy(lgb, blk[0].lg, sizeof blk[0].lg);
    if (nt == 2) std::memcpy(lgb + 16, blk[1].lg, sizeof blk[1].lg);
    else std::fill(lgb + 16, lgb + 32, INT_MAX);
    VI lgv[NV];
    for (int i = 0; i < NV; ++i) lgv[i] = loadv<VI>(reinterpret_cast<const float*>(lgb + i * L));
    bool any = false;
    for (r = 0; r < rows; ++r) {
      float* Sr = S + r * 32;
      const VI visr = splatv<VI>(vis[r]);
      VI valid[NV];
      VT sv[NV];
      VT mx = splatv<VT>(-INFINITY);
      for (int i = 0; i < NV; ++i) {
        valid[i] = lgv[i] < visr;
        sv[i] = valid[i] ? loadv<VT>(Sr + i * L) : splatv<VT>(-INFINITY);
        mx = mx > sv[i] ? mx : sv[i];
      }
      if (raw)
        for (int t = 0; t < nt; ++t)
          for (int j = 0; j < static_cast<int>(blk[t].e - blk[t].b); ++j)
            if (blk[t].lg[j] < vis[r]) raw[static_cast<size_t>(r) * n + blk[t].lg[j]] = Sr[16 * t + j];
      const float bm = hmax_n(mx);
      if (bm == -INFINITY) {
        for (int i = 0; i < NV; ++i) storev<VT>(Sr + i * L, VT{});
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
      const VT mr = splatv<VT>(m[r]);
      constexpr int PT = 16 / L;  // vectors per tile
      for (int t = 0; t < 2; ++t) {
        VT p[PT];
        for (int i = 0; i < PT; ++i) {
          p[i] = valid[t * PT + i] ? vexp_v(sv[t * PT + i] - mr) : VT{};
          storev<VT>(Sr + 16 * t + i * L, p[i]);
        }
        l[r] += hsum16(p);
      }
    }
    if (!any) return;
    for (int t = 0; t < nt; ++t) {
      const int nb = static_cast<int>(blk[t].e - blk[t].b);
      const float* V = blk[t].st->block_values(blk[t].b, blk[t].e, sc.v.data());
      const float* P = S + 16 * t;
      if (vec_hd) {
        const int c2 = hd / (16 * CH) * (16 * CH);  // columns done CH chunks at a time
        r = 0;
        for (; r + NRP <= rows; r += NRP) {
          float* Or = O + static_cast<size_t>(r) * hd;
          tile_pv<NRP, CH, VT>(P + r * 32, 32, V, nb, hd, Or, 0, c2);
          if (c2 < hd) tile_pv<NRP, 1, VT>(P + r * 32, 32, V, nb, hd, Or, c2, hd);
        }
        for (; r < rows; ++r) tile_pv<1, 1, VT>(P + r * 32, 32, V, nb, hd, O + static_cast<size_t>(r) * hd, 0, hd);
      } else {
        for (r = 0; r < rows; ++r) {
          float* Or = O + static_cast<size_t>(r) * hd;
          for (int j = 0; j < nb; ++j) {
            const float p = P[r * 32 + j];
            for (int d = 0; d < hd; ++d) Or[d] += p * V[j * hd + d];
          }
        }
      }
    }
  };

  std::vector<int32_t> ssel;
  BlockRef pend[2];
  int npend = 0;
  auto push = [&](const BlockRef& blk) __attribute__((always_inline)) {
    pend[npend++] = blk;
    if (npend == 2) {
      process(pend, 2);
      npend = 0;
    }
  };
  for (int s = 0; s < seg.n_stores(); ++s) {
    const KVStore& st = seg.store(s);
    const std::vector<int32_t> lidx = seg.store_entries(s);  // empty: consecutive from store_first
    const size_t first = lidx.empty() ? seg.store_first(s) : 0;
    auto logical = [&](size_t i) { return lidx.empty() ? static_cast<int32_t>(first + i) : lidx[i]; };
    BlockRef blk;
    blk.st = &st;
    if (!sel) {
      for (size_t b = 0; b < st.size();) {
        const size_t e = st.block_end(b);
        if (logical(b) >= maxvis) break;  // logical indices increase along a store
        blk.b = b;
        blk.e = e;
        for (int j = 0; j < 16; ++j) blk.lg[j] = b + j < e ? logical(b + j) : INT_MAX;
        push(blk);
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
        push(blk);
      }
    }
  }
  if (npend) process(pend, 1);

  for (int r = 0; r < rows; ++r) {
    const float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
    const float* Or = O + static_cast<size_t>(r) * hd;
    float* o = out + r * out_stride;
    for (int d = 0; d < hd; ++d) o[d] = Or[d] * inv;
  }
}

#define KV_ATTEND_ARGS                                                                                    \
  const Segment &seg, const int32_t *sel, int n_sel, const float *Q, int rows, const int32_t *vis, float *out, \
      int64_t out_stride, float *raw, Scratch &sc
__attribute__((target("arch=x86-64-v3"))) void attend_avx2(KV_ATTEND_ARGS) {
  attend_body<true>(seg, sel, n_sel, Q, rows, vis, out, out_stride, raw, sc);
}
void attend_default(KV_ATTEND_ARGS) { attend_body<false>(seg, sel, n_sel, Q, rows, vis, out, out_stride, raw, sc); }

// The level of the weight kernels (detected, or KVSLIM_SIMD) also picks the attention kernel.
// AVX-512 runs this body too, with the 512-bit group kernels (attend_body's `wide`): on AMD Zen 4
// (512-bit operations issued as two 256-bit halves) the AVX2 group kernels had beaten the 16-float
// generic kernels (decode over a 4,096-entry f16 segment 105 vs 137 us, prefill tile 788 vs 860
// us), and recompiling them for x86-64-v4 changed nothing; on Zen 5 (full-width 512-bit fmas) the
// 512-bit kernels halve both (104.5 -> 53.8 and 789 -> 396 us).
void attend_core(KV_ATTEND_ARGS) {
  switch (qdot::level()) {
    case qdot::Level::AVX512:
    case qdot::Level::AVXVNNI:
    case qdot::Level::AVX2: return attend_avx2(seg, sel, n_sel, Q, rows, vis, out, out_stride, raw, sc);
    default: return attend_default(seg, sel, n_sel, Q, rows, vis, out, out_stride, raw, sc);
  }
}
#undef KV_ATTEND_ARGS

thread_local Scratch tls_scratch;

// Copies the query rows, rotated as the keys are and pre-multiplied by the softmax scale.
void prepare(const Segment& seg, const float* q, int rows, float scale, Scratch& sc) {
  const int hd = seg.head_dim();
  sc.Q.resize(static_cast<size_t>(rows) * hd);
  sc.O.resize(sc.Q.size());
  sc.m.resize((rows + 7) / 8 * 8);  // the AVX2 group kernels read m and l 8 rows at a time
  sc.l.resize(sc.m.size());
  sc.S.resize(static_cast<size_t>(rows) * 32);
  sc.kt.resize(static_cast<size_t>(hd) * 32);
  sc.v.resize(static_cast<size_t>(hd) * 32);
  sc.kp.resize(static_cast<size_t>(hd) * 32);
  sc.dk.resize(static_cast<size_t>(hd) * 2);
  sc.vp.resize(static_cast<size_t>(hd) * 32);
  sc.dv.resize(static_cast<size_t>(hd) * 2);
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
  if (seg.latent()) return attend_latent(seg, nullptr, 0, q, n_rows, visible, scale, out, out_stride, mass, probs);
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
  if (seg.latent())
    return attend_latent(seg, idx, n_idx, q, n_rows, visible, scale, out, out_stride, nullptr, nullptr);
  Scratch& sc = tls_scratch;
  prepare(seg, q, n_rows, scale, sc);
  attend_core(seg, idx, n_idx, sc.Q.data(), n_rows, visible, out, out_stride, nullptr, sc);
}

}  // namespace kvslim
