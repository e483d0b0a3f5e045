// ggml tensor types: size facts, fp16/bf16 conversion, and row (de)quantization bit-exact with
// ggml's reference code (ggml-quants.c). Block layouts follow ggml-common.h.
//
// Exactness notes: every float expression below keeps ggml's operation order and types
// (float, never double), and a*b+c must not be fused into an FMA (ggml's reference code is built
// for baseline x86-64, which has none). With -march=native and GNU mode GCC would fuse, and the
// k-quant scale searches would then pick different quants, so contraction is switched off here.
#include "kvslim/quant.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>

#include "kvslim/error.h"

// See the exactness note at the top; applies to every function defined below.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace kvslim {

namespace {

constexpr int QK = 32;     // block size of the legacy formats (q4_0 ... q8_1)
constexpr int QK_K = 256;  // super-block size of the k-quants

// ---- Block layouts (little-endian, no padding; checked by the static_asserts) ----

struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[QK / 2];
};
struct BlockQ4_1 {
  uint16_t d, m;
  uint8_t qs[QK / 2];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // 5th bit of each quant, bit j = element j
  uint8_t qs[QK / 2];
};
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[QK / 2];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[QK];
};
struct BlockQ2_K {
  uint8_t scales[QK_K / 16];  // low nibble: scale, high nibble: min
  uint8_t qs[QK_K / 4];
  uint16_t d, dmin;
};
struct BlockQ3_K {
  uint8_t hmask[QK_K / 8];
  uint8_t qs[QK_K / 4];
  uint8_t scales[12];  // 16 six-bit scales
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];  // 8 six-bit scales + 8 six-bit mins
  uint8_t qs[QK_K / 2];
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[QK_K / 8];
  uint8_t qs[QK_K / 2];
};
struct BlockQ6_K {
  uint8_t ql[QK_K / 2];
  uint8_t qh[QK_K / 4];
  int8_t scales[QK_K / 16];
  uint16_t d;
};
struct BlockQ8_K {
  float d;
  int8_t qs[QK_K];
  int16_t bsums[QK_K / 16];
};
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292);

// Blocks are copied in and out with memcpy: tensor data (an mmap'd byte buffer) carries no
// objects of these types, and this keeps us clear of aliasing and alignment trouble.
template <class B>
B load_block(const void* src, int64_t i) {
  B b;
  std::memcpy(&b, static_cast<const uint8_t*>(src) + i * sizeof(B), sizeof(B));
  return b;
}
template <class B>
void store_block(void* dst, int64_t i, const B& b) {
  std::memcpy(static_cast<uint8_t*>(dst) + i * sizeof(B), &b, sizeof(B));
}

float h2f(uint16_t h) { return fp16_to_fp32(h); }
uint16_t f2h(float f) { return fp32_to_fp16(f); }

// ---- Type table ----

struct Entry {
  GGMLType type;
  TypeTraits traits;
};
constexpr Entry kTypes[] = {
    {GGMLType::F32, {"f32", 1, 4, true}},
    {GGMLType::F16, {"f16", 1, 2, true}},
    {GGMLType::Q4_0, {"q4_0", 32, 18, true}},
    {GGMLType::Q4_1, {"q4_1", 32, 20, true}},
    {GGMLType::Q5_0, {"q5_0", 32, 22, true}},
    {GGMLType::Q5_1, {"q5_1", 32, 24, true}},
    {GGMLType::Q8_0, {"q8_0", 32, 34, true}},
    {GGMLType::Q8_1, {"q8_1", 32, 36, false}},
    {GGMLType::Q2_K, {"q2_K", 256, 84, true}},
    {GGMLType::Q3_K, {"q3_K", 256, 110, true}},
    {GGMLType::Q4_K, {"q4_K", 256, 144, true}},
    {GGMLType::Q5_K, {"q5_K", 256, 176, true}},
    {GGMLType::Q6_K, {"q6_K", 256, 210, true}},
    {GGMLType::Q8_K, {"q8_K", 256, 292, true}},
    {GGMLType::I8, {"i8", 1, 1, false}},
    {GGMLType::I16, {"i16", 1, 2, false}},
    {GGMLType::I32, {"i32", 1, 4, false}},
    {GGMLType::I64, {"i64", 1, 8, false}},
    {GGMLType::F64, {"f64", 1, 8, false}},
    {GGMLType::BF16, {"bf16", 1, 2, true}},
};

// ---- Rounding helpers shared by the k-quant searches ----

// Round to nearest, ties to even, as ggml does it: adding 1.5*2^23 leaves the rounded integer
// in the low mantissa bits. Valid for |x| <= 4194303.
int nearest_int(float x) {
  const float v = x + 12582912.f;
  return static_cast<int>(std::bit_cast<uint32_t>(v) & 0x007fffff) - 0x00400000;
}

constexpr float kGroupMaxEps = 1e-15f;  // below this a group counts as all zero

// Symmetric quantization of n values to [-nmax, nmax-1] (stored +nmax in L). With rmse_type 1
// the scale is refined over 19 candidate inverse scales, minimizing x^2-weighted squared error.
// Returns the scale. (ggml: make_qx_quants, used by q6_K with rmse_type 1 and no weights.)
float make_qx_quants(int n, int nmax, const float* x, int8_t* L, int rmse_type) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  auto weight = [&](int i) -> float {
    switch (rmse_type) {
      case 1: return x[i] * x[i];
      case 2: return 1;
      case 3: return std::fabs(x[i]);
      default: return std::sqrt(std::fabs(x[i]));
    }
  };
  auto clampq = [&](int l) { return std::max(-nmax, std::min(nmax - 1, l)); };
  float iscale = -nmax / max;
  if (rmse_type == 0) {
    for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(nmax + clampq(nearest_int(iscale * x[i])));
    return 1 / iscale;
  }
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clampq(nearest_int(iscale * x[i]));
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = weight(i);
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clampq(nearest_int(iscale * x[i]));
      const float w = weight(i);
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    // Compare sumlx^2/suml2 (the error reduction) without dividing.
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(nmax + clampq(nearest_int(iscale * x[i])));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Symmetric 3-bit-style quantization with a greedy per-element refinement (up to 5 passes) of
// the x^3-weighted fit. L gets values in [0, 2*nmax). Returns the scale. (ggml: make_q3_quants
// with do_rmse = true.)
float make_q3_quants(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  const float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::max(-nmax, std::min(nmax - 1, nearest_int(iscale * x[i])));
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * L[i];
      if (slx > 0) {
        float sl2 = suml2 - w * L[i] * L[i];
        int new_l = nearest_int(x[i] * sl2 / slx);
        new_l = std::max(-nmax, std::min(nmax - 1, new_l));
        if (new_l != L[i]) {
          slx += w * x[i] * new_l;
          sl2 += w * new_l * new_l;
          if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (!n_changed) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Asymmetric quantization x ~ scale*L - the_min with L in [0, nmax]: start from the min/max
// grid, then try nstep+1 inverse scales (rmin + rdelta*is + nmax)/(max-min), solving the weighted
// least-squares scale and offset for each and keeping the best (squared or absolute error).
// Returns the scale; *the_min gets the (non-negative) offset. (ggml: make_qkx2_quants.)
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                       float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep,
                       bool use_mad) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    float diff = scale * L[i] + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  if (nstep < 1) {
    *the_min = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::max(0, std::min(nmax, nearest_int(iscale * (x[i] - min))));
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {  // the offset may only lower values; refit the scale alone
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * Laux[i] + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        std::copy(Laux, Laux + n, L);
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// Six-bit scale and min j (0..7) of a q4_K/q5_K block: j<4 use the low 6 bits of bytes j and j+4;
// j>=4 use a nibble of byte j+4 plus the top 2 bits of bytes j-4 (scale) and j (min).
void get_scale_min_k4(int j, const uint8_t* q, uint8_t& d, uint8_t& m) {
  if (j < 4) {
    d = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
  }
}

// Inverse of get_scale_min_k4 for all 8 pairs.
void set_scales_mins_k4(uint8_t* q, const uint8_t* ls, const uint8_t* lm) {
  for (int j = 0; j < QK_K / 32; ++j) {
    if (j < 4) {
      q[j] = ls[j];
      q[j + 4] = lm[j];
    } else {
      q[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
      q[j - 4] |= (ls[j] >> 4) << 6;
      q[j - 0] |= (lm[j] >> 4) << 6;
    }
  }
}

// Signed six-bit scale j (0..15) of a q3_K block: low nibble from bytes 0..7, high 2 bits from
// bytes 8..11.
int q3k_scale(const uint8_t* s, int j) {
  const int lo = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
  const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

// ---- Dequantization (ggml's dequantize_row_*) ----

void dq_q4_0(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK) {
    const auto b = load_block<BlockQ4_0>(src, i);
    const float d = h2f(b.d);
    for (int j = 0; j < QK / 2; ++j) {
      y[j] = ((b.qs[j] & 0x0F) - 8) * d;
      y[j + QK / 2] = ((b.qs[j] >> 4) - 8) * d;
    }
  }
}

void dq_q4_1(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK) {
    const auto b = load_block<BlockQ4_1>(src, i);
    const float d = h2f(b.d), m = h2f(b.m);
    for (int j = 0; j < QK / 2; ++j) {
      y[j] = (b.qs[j] & 0x0F) * d + m;
      y[j + QK / 2] = (b.qs[j] >> 4) * d + m;
    }
  }
}

void dq_q5_0(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK) {
    const auto b = load_block<BlockQ5_0>(src, i);
    const float d = h2f(b.d);
    uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    for (int j = 0; j < QK / 2; ++j) {
      const int h0 = ((qh >> j) << 4) & 0x10;
      const int h1 = (qh >> (j + 12)) & 0x10;
      y[j] = (((b.qs[j] & 0x0F) | h0) - 16) * d;
      y[j + QK / 2] = (((b.qs[j] >> 4) | h1) - 16) * d;
    }
  }
}

void dq_q5_1(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK) {
    const auto b = load_block<BlockQ5_1>(src, i);
    const float d = h2f(b.d), m = h2f(b.m);
    uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    for (int j = 0; j < QK / 2; ++j) {
      const int h0 = ((qh >> j) << 4) & 0x10;
      const int h1 = (qh >> (j + 12)) & 0x10;
      y[j] = ((b.qs[j] & 0x0F) | h0) * d + m;
      y[j + QK / 2] = ((b.qs[j] >> 4) | h1) * d + m;
    }
  }
}

void dq_q8_0(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK) {
    const auto b = load_block<BlockQ8_0>(src, i);
    const float d = h2f(b.d);
    for (int j = 0; j < QK; ++j) y[j] = b.qs[j] * d;
  }
}

void dq_q2_K(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<BlockQ2_K>(src, i);
    const float d = h2f(b.d), min = h2f(b.dmin);
    const uint8_t* q = b.qs;
    int is = 0;
    // Each 32 bytes of qs hold 128 values: 4 bit-planes (shift 0,2,4,6) of 32, each split into
    // two 16-value sub-blocks with their own 4-bit scale and min.
    for (int n = 0; n < QK_K; n += 128, q += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int half = 0; half < 2; ++half) {
          const uint8_t sc = b.scales[is++];
          const float dl = d * (sc & 0xF), ml = min * (sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * ((q[l + 16 * half] >> shift) & 3) - ml;
        }
      }
    }
  }
}

void dq_q3_K(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<BlockQ3_K>(src, i);
    const float d_all = h2f(b.d);
    const uint8_t* q = b.qs;
    uint8_t m = 1;  // hmask bit: one per 32-value plane
    int is = 0;
    for (int n = 0; n < QK_K; n += 128, q += 32) {
      for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
        for (int half = 0; half < 2; ++half) {
          const float dl = d_all * q3k_scale(b.scales, is++);
          for (int l = 0; l < 16; ++l) {
            const int k = l + 16 * half;
            *y++ = dl * (((q[k] >> shift) & 3) - ((b.hmask[k] & m) ? 0 : 4));
          }
        }
      }
    }
  }
}

void dq_q4_K(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<BlockQ4_K>(src, i);
    const float d = h2f(b.d), min = h2f(b.dmin);
    const uint8_t* q = b.qs;
    for (int is = 0; is < QK_K / 32; is += 2, q += 32) {
      uint8_t sc, m;
      get_scale_min_k4(is, b.scales, sc, m);
      const float d1 = d * sc, m1 = min * m;
      get_scale_min_k4(is + 1, b.scales, sc, m);
      const float d2 = d * sc, m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
    }
  }
}

void dq_q5_K(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<BlockQ5_K>(src, i);
    const float d = h2f(b.d), min = h2f(b.dmin);
    const uint8_t* ql = b.qs;
    uint8_t u1 = 1, u2 = 2;
    for (int is = 0; is < QK_K / 32; is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
      uint8_t sc, m;
      get_scale_min_k4(is, b.scales, sc, m);
      const float d1 = d * sc, m1 = min * m;
      get_scale_min_k4(is + 1, b.scales, sc, m);
      const float d2 = d * sc, m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (b.qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (b.qh[l] & u2 ? 16 : 0)) - m2;
    }
  }
}

void dq_q6_K(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<BlockQ6_K>(src, i);
    const float d = h2f(b.d);
    const uint8_t* ql = b.ql;
    const uint8_t* qh = b.qh;
    const int8_t* sc = b.scales;
    for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * sc[is + 0] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
    }
  }
}

void dq_q8_K(const void* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<BlockQ8_K>(src, i);
    for (int j = 0; j < QK_K; ++j) *y++ = b.d * b.qs[j];
  }
}

// ---- Quantization (ggml's quantize_row_*_ref) ----

// Value of largest magnitude (signed) in x[0..n).
float signed_absmax(const float* x, int n) {
  float amax = 0, max = 0;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void q_q4_0(const float* x, void* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    BlockQ4_0 b{};
    // The extreme value maps exactly to -8, the one level without a +8 counterpart.
    const float d = signed_absmax(x, QK) / -8;
    const float id = d ? 1.0f / d : 0.0f;
    b.d = f2h(d);
    for (int j = 0; j < QK / 2; ++j) {
      // Truncation of v + 8.5 is round-half-up of v + 8; values are >= 0 here.
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + QK / 2] * id + 8.5f)));
      b.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
    store_block(dst, i, b);
  }
}

void q_q4_1(const float* x, void* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    BlockQ4_1 b{};
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < QK; ++j) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / 15;
    const float id = d ? 1.0f / d : 0.0f;
    b.d = f2h(d);
    b.m = f2h(min);
    for (int j = 0; j < QK / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - min) * id + 0.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j + QK / 2] - min) * id + 0.5f)));
      b.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
    store_block(dst, i, b);
  }
}

void q_q5_0(const float* x, void* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    BlockQ5_0 b{};
    const float d = signed_absmax(x, QK) / -16;
    const float id = d ? 1.0f / d : 0.0f;
    b.d = f2h(d);
    uint32_t qh = 0;
    for (int j = 0; j < QK / 2; ++j) {
      const int q0 = std::min(31, static_cast<int>(static_cast<int8_t>(x[j] * id + 16.5f)));
      const int q1 = std::min(31, static_cast<int>(static_cast<int8_t>(x[j + QK / 2] * id + 16.5f)));
      b.qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
      qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + QK / 2);
    }
    std::memcpy(b.qh, &qh, 4);
    store_block(dst, i, b);
  }
}

void q_q5_1(const float* x, void* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    BlockQ5_1 b{};
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < QK; ++j) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / 31;
    const float id = d ? 1.0f / d : 0.0f;
    b.d = f2h(d);
    b.m = f2h(min);
    uint32_t qh = 0;
    for (int j = 0; j < QK / 2; ++j) {
      const int q0 = static_cast<uint8_t>((x[j] - min) * id + 0.5f);
      const int q1 = static_cast<uint8_t>((x[j + QK / 2] - min) * id + 0.5f);
      b.qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
      qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + QK / 2);
    }
    std::memcpy(b.qh, &qh, 4);
    store_block(dst, i, b);
  }
}

void q_q8_0(const float* x, void* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    BlockQ8_0 b{};
    float amax = 0;
    for (int j = 0; j < QK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d ? 1.0f / d : 0.0f;
    b.d = f2h(d);
    for (int j = 0; j < QK; ++j) b.qs[j] = static_cast<int8_t>(std::round(x[j] * id));  // half away from 0
    store_block(dst, i, b);
  }
}

void q_q8_K(const float* x, void* dst, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    BlockQ8_K b{};  // an all-zero block stays all zero (ggml leaves bsums unset there)
    const float max = signed_absmax(x, QK_K);
    if (max != 0) {
      // -127 rather than -128 keeps every quant in [-127, 127].
      const float iscale = -127.f / max;
      for (int j = 0; j < QK_K; ++j) b.qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
      for (int j = 0; j < QK_K / 16; ++j) {
        int sum = 0;
        for (int k = 0; k < 16; ++k) sum += b.qs[16 * j + k];
        b.bsums[j] = static_cast<int16_t>(sum);
      }
      b.d = 1 / iscale;
    }
    store_block(dst, i, b);
  }
}

// Packs 2-bit values L[0..256) as q2_K/q3_K do: byte l of each 32-byte group holds elements
// l, l+32, l+64, l+96 of that 128-value half.
void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < QK_K; j += 128) {
    for (int l = 0; l < 32; ++l) {
      qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) |
                                            (L[j + l + 96] << 6));
    }
  }
}

void q_q2_K(const float* x, void* dst, int64_t nb) {
  constexpr float q4scale = 15.f;
  uint8_t L[QK_K], Laux[16];
  float weights[16], mins[QK_K / 16], scales[QK_K / 16];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    BlockQ2_K b{};
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f,
                                   0.1f, 15, true);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    // Sub-block scales and mins become 4-bit multiples of per-super-block steps.
    if (max_scale > 0) {
      const float iscale = q4scale / max_scale;
      for (int j = 0; j < QK_K / 16; ++j) b.scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
      b.d = f2h(max_scale / q4scale);
    } else {
      b.d = f2h(0.f);
    }
    if (max_min > 0) {
      const float iscale = q4scale / max_min;
      for (int j = 0; j < QK_K / 16; ++j) b.scales[j] |= static_cast<uint8_t>(nearest_int(iscale * mins[j]) << 4);
      b.dmin = f2h(max_min / q4scale);
    } else {
      b.dmin = f2h(0.f);
    }
    // Requantize against the scales as stored, so the quants fit what decoding will see.
    for (int j = 0; j < QK_K / 16; ++j) {
      const float d = h2f(b.d) * (b.scales[j] & 0xF);
      if (!d) continue;
      const float dm = h2f(b.dmin) * (b.scales[j] >> 4);
      for (int k = 0; k < 16; ++k) {
        L[16 * j + k] = static_cast<uint8_t>(std::max(0, std::min(3, nearest_int((x[16 * j + k] + dm) / d))));
      }
    }
    pack_2bit(L, b.qs);
    store_block(dst, i, b);
  }
}

void q_q3_K(const float* x, void* dst, int64_t nb) {
  int8_t L[QK_K];
  float scales[QK_K / 16];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    BlockQ3_K b{};
    float max_scale = 0, amax = 0;
    for (int j = 0; j < QK_K / 16; ++j) {
      scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
      const float scale = std::fabs(scales[j]);
      if (scale > amax) {
        amax = scale;
        max_scale = scales[j];
      }
    }
    if (max_scale) {
      // Signed 6-bit scales: low nibbles in bytes 0..7, top 2 bits packed in bytes 8..11.
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < QK_K / 16; ++j) {
        int8_t l = static_cast<int8_t>(nearest_int(iscale * scales[j]));
        l = static_cast<int8_t>(std::max<int>(-32, std::min<int>(31, l)) + 32);
        if (j < 8) {
          b.scales[j] = l & 0xF;
        } else {
          b.scales[j - 8] |= (l & 0xF) << 4;
        }
        b.scales[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
      }
      b.d = f2h(1 / iscale);
    } else {
      b.d = f2h(0.f);
    }
    for (int j = 0; j < QK_K / 16; ++j) {
      const float d = h2f(b.d) * q3k_scale(b.scales, j);
      if (!d) continue;
      for (int k = 0; k < 16; ++k) {
        L[16 * j + k] = static_cast<int8_t>(std::max(-4, std::min(3, nearest_int(x[16 * j + k] / d))) + 4);
      }
    }
    // High bit of element j goes to hmask[j % 32], bit j / 32; the low 2 bits pack as in q2_K.
    uint8_t low[QK_K];
    for (int j = 0; j < QK_K; ++j) {
      if (L[j] > 3) b.hmask[j % 32] |= static_cast<uint8_t>(1 << (j / 32));
      low[j] = static_cast<uint8_t>(L[j] & 3);
    }
    pack_2bit(low, b.qs);
    store_block(dst, i, b);
  }
}

// Shared by q4_K and q5_K: 8 sub-blocks of 32 with asymmetric nmax-level quants, fitted by
// make_qkx2_quants with weights |x| + rms(x); 6-bit scales and mins. Fills d, dmin, scales and
// returns the final quants in L.
template <class B>
void quantize_k4_scales(const float* x, int nmax, float rmin, int nstep, B& b, uint8_t* L) {
  uint8_t Laux[32];
  float weights[32], mins[QK_K / 32], scales[QK_K / 32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < QK_K / 32; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin,
                                 0.1f, nstep, false);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t ls[QK_K / 32], lm[QK_K / 32];
  for (int j = 0; j < QK_K / 32; ++j) {
    ls[j] = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * scales[j])));
    lm[j] = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * mins[j])));
  }
  set_scales_mins_k4(b.scales, ls, lm);
  b.d = f2h(max_scale / 63.f);
  b.dmin = f2h(max_min / 63.f);
  // Requantize against the stored (rounded) scales and mins.
  for (int j = 0; j < QK_K / 32; ++j) {
    uint8_t sc, m;
    get_scale_min_k4(j, b.scales, sc, m);
    const float d = h2f(b.d) * sc;
    if (!d) continue;
    const float dm = h2f(b.dmin) * m;
    for (int k = 0; k < 32; ++k) {
      L[32 * j + k] = static_cast<uint8_t>(std::max(0, std::min(nmax, nearest_int((x[32 * j + k] + dm) / d))));
    }
  }
}

void q_q4_K(const float* x, void* dst, int64_t nb) {
  uint8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    BlockQ4_K b{};
    quantize_k4_scales(x, 15, -1.f, 20, b, L);
    // Each 32 bytes: low nibbles = sub-block 2k, high nibbles = sub-block 2k+1.
    for (int j = 0; j < QK_K; j += 64) {
      for (int l = 0; l < 32; ++l) b.qs[j / 2 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
    }
    store_block(dst, i, b);
  }
}

void q_q5_K(const float* x, void* dst, int64_t nb) {
  uint8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    BlockQ5_K b{};
    quantize_k4_scales(x, 31, -0.5f, 15, b, L);
    // Low nibbles as q4_K; the 5th bit of sub-block s goes to qh[l] bit s.
    for (int j = 0; j < QK_K; j += 64) {
      const int s = j / 32;
      for (int l = 0; l < 32; ++l) {
        const int l1 = L[j + l], l2 = L[j + l + 32];
        b.qs[j / 2 + l] = static_cast<uint8_t>((l1 & 0xF) | ((l2 & 0xF) << 4));
        b.qh[l] |= static_cast<uint8_t>(((l1 >> 4) << s) | ((l2 >> 4) << (s + 1)));
      }
    }
    store_block(dst, i, b);
  }
}

void q_q6_K(const float* x, void* dst, int64_t nb) {
  int8_t L[QK_K];
  float scales[QK_K / 16];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    BlockQ6_K b{};
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < QK_K / 16; ++ib) {
      scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1);
      if (std::fabs(scales[ib]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[ib]);
        max_scale = scales[ib];
      }
    }
    if (max_abs_scale < kGroupMaxEps) {  // all zero: zero block
      store_block(dst, i, b);
      continue;
    }
    const float iscale = -128.f / max_scale;
    b.d = f2h(1 / iscale);
    for (int ib = 0; ib < QK_K / 16; ++ib) b.scales[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
    for (int j = 0; j < QK_K / 16; ++j) {
      const float d = h2f(b.d) * b.scales[j];
      if (!d) continue;
      for (int k = 0; k < 16; ++k) {
        L[16 * j + k] = static_cast<int8_t>(std::max(-32, std::min(31, nearest_int(x[16 * j + k] / d))) + 32);
      }
    }
    // Per 128 values: ql holds low nibbles (l | l+64 <<4, l+32 | l+96 <<4); qh the 2-bit tops.
    for (int j = 0; j < QK_K; j += 128) {
      uint8_t* ql = b.ql + j / 2;
      uint8_t* qh = b.qh + j / 4;
      for (int l = 0; l < 32; ++l) {
        const int a = L[j + l], c = L[j + l + 32], e = L[j + l + 64], g = L[j + l + 96];
        ql[l] = static_cast<uint8_t>((a & 0xF) | ((e & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((c & 0xF) | ((g & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((a >> 4) | ((c >> 4) << 2) | ((e >> 4) << 4) | ((g >> 4) << 6));
      }
    }
    store_block(dst, i, b);
  }
}

// Checks t is known and n a non-negative multiple of its block size; returns the traits.
const TypeTraits& checked(GGMLType t, int64_t n, const char* what) {
  const TypeTraits* tr = type_traits(t);
  if (!tr) throw Error(std::string(what) + ": unknown ggml type " + type_name(t));
  if (n < 0 || n % tr->block_size != 0) {
    throw Error(std::string(what) + ": row of " + std::to_string(n) + " elements is not a multiple of the " +
                tr->name + " block size " + std::to_string(tr->block_size));
  }
  return *tr;
}

}  // namespace

const TypeTraits* type_traits(GGMLType t) {
  for (const Entry& e : kTypes) {
    if (e.type == t) return &e.traits;
  }
  return nullptr;
}

const char* type_name(GGMLType t) {
  if (const TypeTraits* tr = type_traits(t)) return tr->name;
  // Unknown numbers: formatted into a per-thread buffer, valid until the next such call.
  thread_local std::string buf;
  buf = "type#" + std::to_string(static_cast<uint32_t>(t));
  return buf.c_str();
}

size_t row_bytes(GGMLType t, int64_t n) {
  const TypeTraits& tr = checked(t, n, "row_bytes");
  return static_cast<size_t>(n / tr.block_size) * tr.type_size;
}

void dequantize_row(GGMLType t, const void* src, float* dst, int64_t n) {
  const TypeTraits& tr = checked(t, n, "dequantize_row");
  const int64_t nb = n / tr.block_size;
  const auto* s16 = static_cast<const uint8_t*>(src);
  switch (t) {
    case GGMLType::F32: std::memcpy(dst, src, n * sizeof(float)); return;
    case GGMLType::F16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s16 + 2 * i, 2);
        dst[i] = fp16_to_fp32(h);
      }
      return;
    case GGMLType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s16 + 2 * i, 2);
        dst[i] = bf16_to_fp32(h);
      }
      return;
    case GGMLType::Q4_0: dq_q4_0(src, dst, nb); return;
    case GGMLType::Q4_1: dq_q4_1(src, dst, nb); return;
    case GGMLType::Q5_0: dq_q5_0(src, dst, nb); return;
    case GGMLType::Q5_1: dq_q5_1(src, dst, nb); return;
    case GGMLType::Q8_0: dq_q8_0(src, dst, nb); return;
    case GGMLType::Q2_K: dq_q2_K(src, dst, nb); return;
    case GGMLType::Q3_K: dq_q3_K(src, dst, nb); return;
    case GGMLType::Q4_K: dq_q4_K(src, dst, nb); return;
    case GGMLType::Q5_K: dq_q5_K(src, dst, nb); return;
    case GGMLType::Q6_K: dq_q6_K(src, dst, nb); return;
    case GGMLType::Q8_K: dq_q8_K(src, dst, nb); return;
    default: throw Error(std::string("dequantize_row: type ") + tr.name + " is not supported");
  }
}

void quantize_row(GGMLType t, const float* src, void* dst, int64_t n) {
  const TypeTraits& tr = checked(t, n, "quantize_row");
  const int64_t nb = n / tr.block_size;
  auto* d8 = static_cast<uint8_t*>(dst);
  switch (t) {
    case GGMLType::F32: std::memcpy(dst, src, n * sizeof(float)); return;
    case GGMLType::F16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_fp16(src[i]);
        std::memcpy(d8 + 2 * i, &h, 2);
      }
      return;
    case GGMLType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_bf16(src[i]);
        std::memcpy(d8 + 2 * i, &h, 2);
      }
      return;
    case GGMLType::Q4_0: q_q4_0(src, dst, nb); return;
    case GGMLType::Q4_1: q_q4_1(src, dst, nb); return;
    case GGMLType::Q5_0: q_q5_0(src, dst, nb); return;
    case GGMLType::Q5_1: q_q5_1(src, dst, nb); return;
    case GGMLType::Q8_0: q_q8_0(src, dst, nb); return;
    case GGMLType::Q8_K: q_q8_K(src, dst, nb); return;
    case GGMLType::Q2_K: q_q2_K(src, dst, nb); return;
    case GGMLType::Q3_K: q_q3_K(src, dst, nb); return;
    case GGMLType::Q4_K: q_q4_K(src, dst, nb); return;
    case GGMLType::Q5_K: q_q5_K(src, dst, nb); return;
    case GGMLType::Q6_K: q_q6_K(src, dst, nb); return;
    default: throw Error(std::string("quantize_row: type ") + tr.name + " is not supported");
  }
}

// ---- fp16 / bf16 ----

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  if (exp == 0x1F) {  // Inf / NaN: keep the payload, make NaNs quiet (as F16C does)
    return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13) | (mant ? 0x400000u : 0));
  }
  if (exp == 0) {  // zero / subnormal: mant * 2^-24, exact in float
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(v));
  }
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t fp32_to_fp16(float f) {
  const uint32_t w = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((w >> 16) & 0x8000);
  const uint32_t aw = w & 0x7FFFFFFF;
  if (aw > 0x7F800000) {  // NaN: quiet, top payload bits kept
    return static_cast<uint16_t>(sign | 0x7E00 | ((aw >> 13) & 0x3FF));
  }
  if (aw >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7C00);  // rounds to >= 65536: Inf
  if (aw < 0x38800000) {
    // Below the smallest normal half (2^-14): the result is a subnormal multiple of 2^-24.
    // Adding 0.5 (2^-1) makes the FPU round |f| to that grid, nearest-even.
    const float r = std::bit_cast<float>(aw) + 0.5f;
    return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(r) - 0x3F000000u));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest
  // even; a carry out of the mantissa correctly bumps the exponent.
  const uint32_t odd = (aw >> 13) & 1;
  const uint32_t r = aw + 0xFFF + odd;
  return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));
}

float bf16_to_fp32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t fp32_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((u >> 16) | 64);  // quiet NaN
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

}  // namespace kvslim
