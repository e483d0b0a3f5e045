// Window attention probabilities (see window_attention.h): logits against keys in blocks of 16
// entries, then a vectorised softmax per row, in GCC vector extensions compiled per SIMD level.
#include "attention/window_attention.h"
#include "kernels/clones.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kvslim {

std::vector<float> keys_blocked(const Segment& s) {
  constexpr size_t kKB = kKeyBlock;
  const size_t n = s.size(), nb = (n + kKB - 1) / kKB;
  const int hd = s.head_dim();
  std::vector<float> keys(n * hd), kt(nb * kKB * hd, 0.0f);
  s.keys(0, n, keys.data());
  for (size_t j = 0; j < n; ++j)
    for (int d = 0; d < hd; ++d) kt[((j / kKB) * hd + d) * kKB + j % kKB] = keys[j * hd + d];
  return kt;
}

namespace {

// 16 floats / int32s as one value: GCC keeps them in vector registers (one zmm, two ymm or four
// xmm depending on the clone below), which plain arrays at -O2 are not.
typedef float vf16 __attribute__((vector_size(64)));
typedef int32_t vi16 __attribute__((vector_size(64)));
static_assert(kKeyBlock == 16, "key blocks hold one vf16");
constexpr size_t kKB = kKeyBlock;

// Internal helpers are always inlined into the clones below, so no vector value crosses a call
// and the psABI note about 64-byte vector arguments does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
#if defined(__clang__)
// Clang rejects a 64-byte vector returned by a function compiled without AVX-512 (the avx2 and
// default clones), inlined or not: there (the sanitizer and fuzzing builds) the load is an
// unaligned vector read.
typedef float vf16_unaligned __attribute__((vector_size(64), aligned(4), may_alias));
#define load16(p) (*reinterpret_cast<const vf16_unaligned*>(p))
#else
__attribute__((always_inline)) inline vf16 load16(const float* p) {
  vf16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
#endif

/// out[r][j] = sum_d q[r][d] * key_j[d] for r < rb, j < n, with keys in blocks of 16 entries,
/// [block][head_dim][16] (keys_t): a block is contiguous and stays in L1 while four rows at a
/// time use it, with four independent accumulators (SIMD chosen at run time).
KVSLIM_TARGET_CLONES void logits_block(const float* __restrict q, int rb,
                                                                                const float* __restrict kt, size_t n,
                                                                                int hd, float* __restrict out) {
  for (size_t j = 0; j < n; j += kKB) {
    const float* kb = kt + (j / kKB) * hd * kKB;
    const size_t m = std::min(kKB, n - j);
    int r0 = 0;
    for (; r0 + 4 <= rb; r0 += 4) {
      const float *q0 = q + static_cast<size_t>(r0) * hd, *q1 = q0 + hd, *q2 = q1 + hd, *q3 = q2 + hd;
      vf16 a0 = {}, a1 = {}, a2 = {}, a3 = {};
      for (int d = 0; d < hd; ++d) {
        const vf16 k = load16(kb + static_cast<size_t>(d) * kKB);
        a0 += q0[d] * k;
        a1 += q1[d] * k;
        a2 += q2[d] * k;
        a3 += q3[d] * k;
      }
      float* o = out + static_cast<size_t>(r0) * n + j;
      std::memcpy(o, &a0, m * sizeof(float));
      std::memcpy(o + n, &a1, m * sizeof(float));
      std::memcpy(o + 2 * n, &a2, m * sizeof(float));
      std::memcpy(o + 3 * n, &a3, m * sizeof(float));
    }
    for (; r0 < rb; ++r0) {
      const float* q0 = q + static_cast<size_t>(r0) * hd;
      vf16 a0 = {};
      for (int d = 0; d < hd; ++d) a0 += q0[d] * load16(kb + static_cast<size_t>(d) * kKB);
      std::memcpy(out + static_cast<size_t>(r0) * n + j, &a0, m * sizeof(float));
    }
  }
}

/// 2^y for y <= 0 (clamped at -126, -inf included), 16 at a time: 2^floor(y) from the exponent bits times a
/// degree-7 polynomial for 2^frac (relative error < 2e-6).
__attribute__((always_inline)) inline void exp2_nonpos(vf16& y) {
  constexpr float c1 = 0.693147180559945f, c2 = 0.240226506959101f, c3 = 0.0555041086648216f,
                  c4 = 0.00961812910762848f, c5 = 0.00133335581464284f, c6 = 0.000154035303933816f,
                  c7 = 1.52527338040598e-05f;  // ln2^k / k!
  // The floor as a vector of its own: taken as y - y - 126, it was NaN where y is -inf (the tail's
  // padding), so -inf went through unclamped and its exponent overflowed int (UBSan) and gave NaN.
  const vf16 lo = vf16{} - 126.0f;
  y = y < lo ? lo : y;
  vi16 ki = __builtin_convertvector(y, vi16);  // truncates toward zero
  vf16 k = __builtin_convertvector(ki, vf16);
  const vi16 above = k > y;  // -1 where truncation rounded up
  ki += above;
  k += __builtin_convertvector(above, vf16);
  const vf16 f = y - k;
  const vf16 p = 1.0f + f * (c1 + f * (c2 + f * (c3 + f * (c4 + f * (c5 + f * (c6 + f * c7))))));
  vf16 two_k;
  const vi16 bits = (ki + 127) << 23;
  std::memcpy(&two_k, &bits, sizeof two_k);
  y = p * two_k;
}

// x[0, n) <- softmax(x[0, n)), 16 values at a time (SIMD chosen at run time). Defined under its
// own name, not as softmax_inplace (declared in the header): clang 14 compiles a target_clones
// definition that follows a plain declaration as its first (AVX-512) clone only, for every CPU.
KVSLIM_TARGET_CLONES void softmax_clones(float* __restrict x, size_t n) {
  if (n == 0) return;
  constexpr size_t kL = 16;
  constexpr float kLog2e = 1.44269504088896341f;
  const size_t nb = n / kL * kL;
  // The tail is padded with -inf (exp gives 0) so every step is a full vector.
  float tail[kL];
  for (size_t t = 0; t < kL; ++t) tail[t] = nb + t < n ? x[nb + t] : -INFINITY;
  vf16 vm = load16(tail);
  for (size_t j = 0; j < nb; j += kL) {
    const vf16 v = load16(x + j);
    vm = v > vm ? v : vm;
  }
  float mx = vm[0];
  for (size_t t = 1; t < kL; ++t) mx = std::max(mx, vm[t]);
  vf16 vs = {};
  for (size_t j = 0; j < nb; j += kL) {
    vf16 e = (load16(x + j) - mx) * kLog2e;
    exp2_nonpos(e);
    std::memcpy(x + j, &e, sizeof e);
    vs += e;
  }
  vf16 et = (load16(tail) - mx) * kLog2e;
  exp2_nonpos(et);
  float sum = 0;
  for (size_t t = 0; t < kL; ++t) sum += vs[t] + (nb + t < n ? et[t] : 0.0f);
  const float inv = 1.0f / sum;
  for (size_t j = 0; j < nb; j += kL) {
    const vf16 v = load16(x + j) * inv;
    std::memcpy(x + j, &v, sizeof v);
  }
  for (size_t j = nb; j < n; ++j) x[j] = et[j - nb] * inv;
}

}  // namespace

void softmax_inplace(float* __restrict x, size_t n) { softmax_clones(x, n); }

void window_probabilities(const float* q, int rows, float scale, const float* keys_t, size_t n, int hd,
                          const size_t* visible, float* out) {
  std::vector<float> qs(static_cast<size_t>(rows) * hd);
  for (size_t k = 0; k < qs.size(); ++k) qs[k] = q[k] * scale;
  logits_block(qs.data(), rows, keys_t, n, hd, out);
  for (int i = 0; i < rows; ++i) {
    float* row = out + static_cast<size_t>(i) * n;
    softmax_inplace(row, visible[i]);
    std::fill(row + visible[i], row + n, 0.0f);
  }
}

}  // namespace kvslim
