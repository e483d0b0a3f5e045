// The portable parts of the integer dot products: level selection, activation quantization, the
// scalar decomposition of every quantized type, and the scalar reference of the canonical
// computation (see quant_dot.h). The SIMD levels live in quant_dot_avx2.cpp / quant_dot_avx512.cpp.
#include "kernels/quant_dot.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "kvslim/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace kvslim::qdot {

namespace {

#if defined(__x86_64__) || defined(__i386__)
/// F16C from CPUID leaf 1 (ECX bit 29): clang before 15 does not know "f16c" in __builtin_cpu_supports.
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

/// AVX-VNNI from CPUID leaf 7 sub-leaf 1 (EAX bit 4): GCC 12's __builtin_cpu_supports("avxvnni")
/// answers 0 on AMD Zen 5, which has it, and clang 14 does not know the name.
bool cpu_has_avxvnni() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || a < 1) return false;  // no sub-leaf 1
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4));
}
#endif

Level initial_level() {
  const Level best = detected_level();
  if (const char* env = std::getenv("KVSLIM_SIMD")) {
    try {
      const Level want = parse_level(env);
      if (cpu_has(want)) return want;
      std::fprintf(stderr, "kvslim: KVSLIM_SIMD=%s: this CPU lacks that level; using %s\n", env, level_name(best));
    } catch (const Error& e) {
      std::fprintf(stderr, "kvslim: KVSLIM_SIMD=%s: %s; using %s\n", env, e.what(), level_name(best));
    }
  }
  return best;
}

std::atomic<int>& current() {
  static std::atomic<int> lv{static_cast<int>(initial_level())};
  return lv;
}

float h16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}

// Six-bit scale and min j (0..7) of a q4_K/q5_K super-block (ggml's packing: j < 4 in the low
// six bits of bytes j and j+4; j >= 4 from the nibbles of byte j+4 and the top bits of j-4 and j).
void scale_min_k4(int j, const uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Signed six-bit scale j (0..15) of a q3_K super-block.
int scale_q3k(const uint8_t* s, int j) {
  const int lo = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
  const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

}  // namespace

// Every level, lowest first.
constexpr Level kLevels[] = {Level::Scalar, Level::AVX2, Level::AVXVNNI, Level::AVX512};

bool cpu_has(Level l) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
  if (l == Level::AVX2) return avx2;
  if (l == Level::AVXVNNI) return avx2 && cpu_has_avxvnni();
  if (l == Level::AVX512)
    return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#endif
  return l == Level::Scalar;
}

std::vector<Level> supported_levels() {
  std::vector<Level> out;
  for (Level l : kLevels)
    if (cpu_has(l)) out.push_back(l);
  return out;
}

Level detected_level() {
  static const Level l = cpu_has(Level::AVX512)    ? Level::AVX512
                         : cpu_has(Level::AVXVNNI) ? Level::AVXVNNI
                         : cpu_has(Level::AVX2)    ? Level::AVX2
                                                   : Level::Scalar;
  return l;
}

Level level() { return static_cast<Level>(current().load(std::memory_order_relaxed)); }

void set_level(Level l) {
  if (!cpu_has(l)) throw Error(fmt::format("SIMD level {} is not supported by this CPU", level_name(l)));
  current().store(static_cast<int>(l));
}

const char* level_name(Level l) {
  switch (l) {
    case Level::Scalar: return "scalar";
    case Level::AVX2: return "avx2";
    case Level::AVXVNNI: return "avxvnni";
    case Level::AVX512: return "avx512";
  }
  return "?";
}

Level parse_level(const std::string& name) {
  for (Level l : kLevels)
    if (name == level_name(l)) return l;
  throw Error(fmt::format("unknown SIMD level '{}' (expected scalar, avx2, avxvnni or avx512)", name));
}

Format format_of(GGMLType t) {
  switch (t) {
    case GGMLType::Q8_0: return {32, 128, false};
    case GGMLType::Q4_0: return {32, 8, false};
    case GGMLType::Q4_1: return {32, 0, true};
    case GGMLType::Q5_0: return {32, 16, false};
    case GGMLType::Q5_1: return {32, 0, true};
    case GGMLType::Q4_K: return {32, 0, true};
    case GGMLType::Q5_K: return {32, 0, true};
    case GGMLType::Q6_K: return {16, 32, false};
    case GGMLType::Q3_K: return {16, 4, false};
    case GGMLType::Q2_K: return {16, 0, true};
    default: return {};
  }
}

float reduce64(float* l) {
  for (int w = 32; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) l[i] += l[i + w];
  return l[0];
}

void prepare_acts(int64_t rows, int64_t cols, const Format& f, Acts& a) {
  if (cols % 32 != 0) throw Error(fmt::format("quantize_acts: {} columns is not a multiple of 32", cols));
  const int G = f.group > 0 ? f.group : 32;
  a.rows = rows;
  a.cols = cols;
  a.group = G;
  a.q.resize(static_cast<size_t>(rows * cols));
  a.xd.resize(static_cast<size_t>(rows * (cols / G)));
  a.xs.resize(a.xd.size());
  a.ic.resize(a.xd.size());
}

void quantize_acts(const float* X, int64_t rows, int64_t cols, const Format& f, Acts& a) {
  prepare_acts(rows, cols, f, a);
  quantize_acts_rows(X, 0, rows, f, a);
}

#if defined(__x86_64__)
namespace {

// Sum of the 4 int32 lanes.
__attribute__((target("avx2"))) int32_t hsum4(__m128i x) {
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4E));
  x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xB1));
  return _mm_cvtsi128_si32(x);
}

// quantize_acts_rows on AVX2 (every level above scalar), for groups of 16 or 32: the same values
// as the SSE2 loop below. Max |x| ignoring NaN lanes as std::max(amax, |x|) does (maxps returns
// its second operand when one is NaN), the same products rounded by cvtps2dq and saturated by the
// same packs, exact integer group sums. (The SSE2 loop's scalar max and sums were 1.5% of a prefill.)
__attribute__((target("avx2"))) void quantize_rows_avx2(const float* X, int64_t r0, int64_t r1, const Format& f,
                                                        Acts& a) {
  const int64_t cols = a.cols;
  const int G = a.group;
  const int64_t ng = cols / G;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // packs works within 128-bit lanes
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = X + r * cols;
    int8_t* q = a.q.data() + r * cols;
    for (int64_t b = 0; b < cols / 32; ++b) {
      const float* xb = x + b * 32;
      __m256 v[4];
      __m256 m = _mm256_setzero_ps();
      for (int k = 0; k < 4; ++k) {
        v[k] = _mm256_loadu_ps(xb + 8 * k);
        m = _mm256_max_ps(_mm256_andnot_ps(sign, v[k]), m);
      }
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
      const float amax = _mm_cvtss_f32(h);
      const float d = amax / 127.0f;
      const float id = amax > 0 ? 127.0f / amax : 0.0f;
      const __m256 vid = _mm256_set1_ps(id);
      __m256i i[4];
      for (int k = 0; k < 4; ++k) i[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], vid));
      const __m256i qv = _mm256_permutevar8x32_epi32(
          _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3])), order);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * 32), qv);
      // Lane k of s4: the sum of bytes 4k .. 4k + 3.
      const __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, qv), ones16);
      const __m128i lo = _mm256_castsi256_si128(s4), hi = _mm256_extracti128_si256(s4, 1);
      int32_t s[2];
      if (G == 32) s[0] = hsum4(_mm_add_epi32(lo, hi));
      else s[0] = hsum4(lo), s[1] = hsum4(hi);
      for (int g = 0; g < 32 / G; ++g) {
        const size_t gi = static_cast<size_t>(r * ng + b * (32 / G) + g);
        a.xd[gi] = d;
        a.xs[gi] = d * static_cast<float>(s[g]);
        a.ic[gi] = -f.offset * s[g];
      }
    }
  }
}

}  // namespace
#endif

void quantize_acts_rows(const float* X, int64_t r0, int64_t r1, const Format& f, Acts& a) {
#if defined(__x86_64__)
  if (level() != Level::Scalar && (a.group == 16 || a.group == 32)) return quantize_rows_avx2(X, r0, r1, f, a);
#endif
  const int64_t cols = a.cols;
  const int G = a.group;
  const int64_t ng = cols / G;
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = X + r * cols;
    int8_t* q = a.q.data() + r * cols;
    for (int64_t b = 0; b < cols / 32; ++b) {
      const float* xb = x + b * 32;
      int8_t* qb = q + b * 32;
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
      const float d = amax / 127.0f;
      const float id = amax > 0 ? 127.0f / amax : 0.0f;
#if defined(__SSE2__)
      // cvtps2dq rounds to nearest even (the default MXCSR mode); values lie in [-127, 127].
      const __m128 vid = _mm_set1_ps(id);
      for (int j = 0; j < 32; j += 8) {
        __m128i i0 = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(xb + j), vid));
        __m128i i1 = _mm_cvtps_epi32(_mm_mul_ps(_mm_loadu_ps(xb + j + 4), vid));
        __m128i s16 = _mm_packs_epi32(i0, i1);
        _mm_storel_epi64(reinterpret_cast<__m128i*>(qb + j), _mm_packs_epi16(s16, s16));
      }
#else
      for (int j = 0; j < 32; ++j) qb[j] = static_cast<int8_t>(std::nearbyint(xb[j] * id));
#endif
      for (int g = 0; g < 32 / G; ++g) {
        int32_t s = 0;
        for (int j = 0; j < G; ++j) s += qb[g * G + j];
        const size_t gi = static_cast<size_t>(r * ng + b * (32 / G) + g);
        a.xd[gi] = d;
        a.xs[gi] = d * static_cast<float>(s);
        a.ic[gi] = -f.offset * s;
      }
    }
  }
}

void unpack_row(GGMLType t, const uint8_t* row, int64_t k0, int64_t k1, uint8_t* u, float* ws, float* wb,
                int stride) {
  int gi = 0;  // group index within [k0, k1)
  auto put = [&](float s, float m) {
    ws[gi * stride] = s;
    wb[gi * stride] = m;
    ++gi;
  };
  switch (t) {
    case GGMLType::Q8_0:
      for (int64_t b = k0 / 32; b < k1 / 32; ++b, u += 32) {
        const uint8_t* p = row + b * 34;
        for (int j = 0; j < 32; ++j) u[j] = static_cast<uint8_t>(p[2 + j] ^ 0x80);
        put(h16(p), 0.0f);
      }
      return;
    case GGMLType::Q4_0:
    case GGMLType::Q4_1: {
      const bool one = t == GGMLType::Q4_1;
      const int bs = one ? 20 : 18, qo = one ? 4 : 2;
      for (int64_t b = k0 / 32; b < k1 / 32; ++b, u += 32) {
        const uint8_t* p = row + b * bs;
        for (int j = 0; j < 16; ++j) {
          u[j] = p[qo + j] & 0xF;
          u[j + 16] = p[qo + j] >> 4;
        }
        put(h16(p), one ? h16(p + 2) : 0.0f);
      }
      return;
    }
    case GGMLType::Q5_0:
    case GGMLType::Q5_1: {
      const bool one = t == GGMLType::Q5_1;
      const int bs = one ? 24 : 22, ho = one ? 4 : 2;
      for (int64_t b = k0 / 32; b < k1 / 32; ++b, u += 32) {
        const uint8_t* p = row + b * bs;
        uint32_t qh;
        std::memcpy(&qh, p + ho, 4);
        const uint8_t* qs = p + ho + 4;
        for (int j = 0; j < 16; ++j) {
          u[j] = static_cast<uint8_t>((qs[j] & 0xF) | (((qh >> j) & 1) << 4));
          u[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
        }
        put(h16(p), one ? h16(p + 2) : 0.0f);
      }
      return;
    }
    case GGMLType::Q4_K:
    case GGMLType::Q5_K: {
      const bool five = t == GGMLType::Q5_K;
      const int bs = five ? 176 : 144;
      for (int64_t b = k0 / 256; b < k1 / 256; ++b) {
        const uint8_t* p = row + b * bs;
        const float d = h16(p), dmin = h16(p + 2);
        const uint8_t* sc = p + 4;
        const uint8_t* qh = p + 16;
        const uint8_t* qs = p + (five ? 48 : 16);
        for (int s = 0; s < 8; s += 2, qs += 32, u += 64) {
          for (int l = 0; l < 32; ++l) {
            u[l] = qs[l] & 0xF;
            u[l + 32] = qs[l] >> 4;
            if (five) {
              u[l] |= ((qh[l] >> s) & 1) << 4;
              u[l + 32] |= ((qh[l] >> (s + 1)) & 1) << 4;
            }
          }
          for (int h = 0; h < 2; ++h) {
            int scale, min;
            scale_min_k4(s + h, sc, scale, min);
            put(d * static_cast<float>(scale), -(dmin * static_cast<float>(min)));
          }
        }
      }
      return;
    }
    case GGMLType::Q6_K:
      for (int64_t b = k0 / 256; b < k1 / 256; ++b) {
        const uint8_t* p = row + b * 210;
        const uint8_t* ql = p;
        const uint8_t* qh = p + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
        const float d = h16(p + 208);
        for (int n = 0; n < 2; ++n, ql += 64, qh += 32, u += 128) {
          for (int l = 0; l < 32; ++l) {
            u[l] = static_cast<uint8_t>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4));
            u[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
            u[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
            u[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
          }
          for (int g = 0; g < 8; ++g) put(d * static_cast<float>(sc[n * 8 + g]), 0.0f);
        }
      }
      return;
    case GGMLType::Q3_K:
      for (int64_t b = k0 / 256; b < k1 / 256; ++b) {
        const uint8_t* p = row + b * 110;
        const uint8_t* hm = p;
        const uint8_t* q = p + 32;
        const uint8_t* sc = p + 96;
        const float d = h16(p + 108);
        int is = 0;
        uint8_t m = 1;
        for (int n = 0; n < 2; ++n, q += 32)
          for (int shift = 0; shift < 8; shift += 2, m <<= 1)
            for (int half = 0; half < 2; ++half, u += 16) {
              for (int l = 0; l < 16; ++l) {
                const int k = l + 16 * half;
                u[l] = static_cast<uint8_t>(((q[k] >> shift) & 3) | ((hm[k] & m) ? 4 : 0));
              }
              put(d * static_cast<float>(scale_q3k(sc, is++)), 0.0f);
            }
      }
      return;
    case GGMLType::Q2_K:
      for (int64_t b = k0 / 256; b < k1 / 256; ++b) {
        const uint8_t* p = row + b * 84;
        const uint8_t* sc = p;
        const uint8_t* q = p + 16;
        const float d = h16(p + 80), dmin = h16(p + 82);
        int is = 0;
        for (int n = 0; n < 2; ++n, q += 32)
          for (int shift = 0; shift < 8; shift += 2)
            for (int half = 0; half < 2; ++half, u += 16) {
              for (int l = 0; l < 16; ++l) u[l] = (q[l + 16 * half] >> shift) & 3;
              const uint8_t s = sc[is++];
              put(d * static_cast<float>(s & 0xF), -(dmin * static_cast<float>(s >> 4)));
            }
      }
      return;
    default:
      throw Error(fmt::format("unpack_row: type {} has no integer dot product", type_name(t)));
  }
}

namespace {

// The scalar reference of the canonical computation.
void scalar_dot_rows_q(const WeightView& W, int64_t r0, int64_t r1, const Acts& a, float* Y, int64_t ldy) {
  const Format f = format_of(W.type);
  const int G = f.group;
  const int64_t K = W.cols, ng = K / G;
  uint8_t u[256];
  float ws[16], wb[16];
  std::vector<float> acc(static_cast<size_t>(a.rows));
  for (int64_t r = r0; r < r1; ++r) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t k0 = 0; k0 < K; k0 += 256) {
      const int64_t k1 = std::min<int64_t>(K, k0 + 256);
      unpack_row(W.type, W.row(r), k0, k1, u, ws, wb, 1);
      for (int64_t t = 0; t < a.rows; ++t) {
        const int8_t* xq = a.q.data() + t * K;
        float s = acc[t];
        for (int64_t g = k0 / G; g < k1 / G; ++g) {
          const int64_t gi = t * ng + g;
          int32_t isum = a.ic[gi];
          const uint8_t* ug = u + (g * G - k0);
          for (int j = 0; j < G; ++j) isum += ug[j] * xq[g * G + j];
          s = std::fma(ws[g - k0 / G] * a.xd[gi], static_cast<float>(isum), s);
          if (f.has_min) s = std::fma(wb[g - k0 / G], a.xs[gi], s);
        }
        acc[t] = s;
      }
    }
    for (int64_t t = 0; t < a.rows; ++t) Y[t * ldy + r] = acc[t];
  }
}

float weight_f(GGMLType t, const uint8_t* row, int64_t i) {
  if (t == GGMLType::F32) {
    float v;
    std::memcpy(&v, row + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, row + 2 * i, 2);
  return t == GGMLType::F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
}

void scalar_dot_rows_f(const WeightView& W, int64_t r0, int64_t r1, const float* X, int64_t n_tok, float* Y,
                       int64_t ldy) {
  float lanes[64];
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t t = 0; t < n_tok; ++t) {
      const float* x = X + t * W.cols;
      std::fill(lanes, lanes + 64, 0.0f);
      for (int64_t i = 0; i < W.cols; ++i) lanes[i % 64] = std::fma(weight_f(W.type, W.row(r), i), x[i], lanes[i % 64]);
      Y[t * ldy + r] = reduce64(lanes);
    }
}

}  // namespace

void dot_rows_q(Level lv, const WeightView& W, int64_t r0, int64_t r1, const Acts& a, float* Y, int64_t ldy) {
  switch (lv) {
    case Level::AVX512: avx512::dot_rows_q(W, r0, r1, a, Y, ldy); return;
    case Level::AVXVNNI: avxvnni::dot_rows_q(W, r0, r1, a, Y, ldy); return;
    case Level::AVX2: avx2::dot_rows_q(W, r0, r1, a, Y, ldy); return;
    case Level::Scalar: scalar_dot_rows_q(W, r0, r1, a, Y, ldy); return;
  }
}

void dot_rows_f(Level lv, const WeightView& W, int64_t r0, int64_t r1, const float* X, int64_t n_tok, float* Y,
                int64_t ldy) {
  switch (lv) {
    case Level::AVX512: avx512::dot_rows_f(W, r0, r1, X, n_tok, Y, ldy); return;
    case Level::AVXVNNI: avxvnni::dot_rows_f(W, r0, r1, X, n_tok, Y, ldy); return;
    case Level::AVX2: avx2::dot_rows_f(W, r0, r1, X, n_tok, Y, ldy); return;
    case Level::Scalar: scalar_dot_rows_f(W, r0, r1, X, n_tok, Y, ldy); return;
  }
}

}  // namespace kvslim::qdot
