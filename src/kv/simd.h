#pragma once
// 16-lane helpers for the codecs' decoders (GCC vector extensions). They are always inlined into
// functions compiled per instruction set (KV_SIMD_LEVELS below), so one source serves AVX-512,
// AVX2 and the SSE2 baseline.
#include <cstdint>
#include <cstring>

#include "kernels/quant_dot.h"
#include "kvslim/quant.h"

#pragma GCC diagnostic ignored "-Wpsabi"  // vector values never cross a non-inlined call

namespace kvslim::kv::simd {

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));

#define KV_SIMD_INLINE inline __attribute__((always_inline))

/// Defines `ret name params` as three copies of the always-inline function `body` (called with
/// `args`) compiled for x86-64-v4 (AVX-512), x86-64-v3 (AVX2 + FMA + F16C) and the baseline, and
/// picks one per call by qdot::level(), the level of the weight kernels (AVXVNNI takes the v3
/// copy). Unlike target_clones (chosen once by the CPU), this follows KVSLIM_SIMD and
/// qdot::set_level, so forcing a lower level in a test or a benchmark covers the KV decoders too.
#define KV_SIMD_LEVELS(ret, name, params, args, body)                                  \
  __attribute__((target("arch=x86-64-v4"))) static ret name##_v4 params { return body args; } \
  __attribute__((target("arch=x86-64-v3"))) static ret name##_v3 params { return body args; } \
  static ret name##_base params { return body args; }                                  \
  ret name params {                                                                    \
    switch (::kvslim::qdot::level()) {                                                 \
      case ::kvslim::qdot::Level::AVX512: return name##_v4 args;                       \
      case ::kvslim::qdot::Level::AVXVNNI:                                             \
      case ::kvslim::qdot::Level::AVX2: return name##_v3 args;                         \
      default: return name##_base args;                                                \
    }                                                                                  \
  }

/// As KV_SIMD_LEVELS, but on AVX2 the call `avx2_call` (a hand-written kv::avx2 decoder, see
/// kv/decode_avx2.h) is made instead of the generic body when `avx2_ok` holds.
#define KV_SIMD_LEVELS_AVX2(ret, name, params, args, body, avx2_ok, avx2_call)                 \
  __attribute__((target("arch=x86-64-v4"))) static ret name##_v4 params { return body args; } \
  __attribute__((target("arch=x86-64-v3"))) static ret name##_v3 params { return body args; } \
  static ret name##_base params { return body args; }                                  \
  ret name params {                                                                    \
    switch (::kvslim::qdot::level()) {                                                 \
      case ::kvslim::qdot::Level::AVX512: return name##_v4 args;                       \
      case ::kvslim::qdot::Level::AVXVNNI:                                             \
      case ::kvslim::qdot::Level::AVX2:                                                \
        if (avx2_ok) return avx2_call;                                                 \
        return name##_v3 args;                                                         \
      default: return name##_base args;                                                \
    }                                                                                  \
  }

KV_SIMD_INLINE v16 load(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
KV_SIMD_INLINE void store(float* p, const v16& v) { std::memcpy(p, &v, sizeof v); }

typedef uint32_t u32x4 __attribute__((vector_size(16)));
typedef uint32_t u32x2 __attribute__((vector_size(8)));

// The unpacking below works on 32-bit lanes (replicate a word, shift each lane by its own
// amount, mask, convert): GCC turns that into vpermd / vpsrlvd / vcvtdq2ps, where byte-wise
// widening through __builtin_convertvector is scalarized by GCC 12.

typedef uint32_t u32x8 __attribute__((vector_size(32)));

/// 32 bytes as 8 words. Callers guarantee 32 readable bytes (the KV stores keep 32 bytes of
/// slack after their payload for this).
KV_SIMD_INLINE u32x8 load32(const void* p) {
  u32x8 w;
  std::memcpy(&w, p, sizeof w);
  return w;
}

/// Bytes 16K..16K+15 of W as int8 codes, as floats.
template <int K>
KV_SIMD_INLINE v16 i8_lanes(const u32x8& W) {
  const u32x16 r = __builtin_shufflevector(W, W, 4 * K, 4 * K, 4 * K, 4 * K, 4 * K + 1, 4 * K + 1, 4 * K + 1, 4 * K + 1,
                                           4 * K + 2, 4 * K + 2, 4 * K + 2, 4 * K + 2, 4 * K + 3, 4 * K + 3, 4 * K + 3,
                                           4 * K + 3);
  const u32x16 sh = {24, 16, 8, 0, 24, 16, 8, 0, 24, 16, 8, 0, 24, 16, 8, 0};
  return __builtin_convertvector(reinterpret_cast<i32x16>(r << sh) >> 24, v16);
}

/// Bytes 8K..8K+7 of W as 16 nibbles: lane 2m = low nibble of byte m, lane 2m+1 = its high one.
template <int K>
KV_SIMD_INLINE v16 nib_lanes(const u32x8& W) {
  const u32x16 r = __builtin_shufflevector(W, W, 2 * K, 2 * K, 2 * K, 2 * K, 2 * K, 2 * K, 2 * K, 2 * K, 2 * K + 1,
                                           2 * K + 1, 2 * K + 1, 2 * K + 1, 2 * K + 1, 2 * K + 1, 2 * K + 1, 2 * K + 1);
  const u32x16 sh = {0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28};
  return __builtin_convertvector(reinterpret_cast<i32x16>((r >> sh) & 15), v16);
}

/// Bytes 0..15 of W: their low nibbles (lo) and high nibbles (hi) in byte order (ggml's q4_0
/// puts value j in the low nibble of byte j and value j + 16 in its high nibble).
KV_SIMD_INLINE void nib_split(const u32x8& W, v16& lo, v16& hi) {
  const u32x16 r = __builtin_shufflevector(W, W, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const u32x16 sh = {0, 8, 16, 24, 0, 8, 16, 24, 0, 8, 16, 24, 0, 8, 16, 24};
  lo = __builtin_convertvector(reinterpret_cast<i32x16>((r >> sh) & 15), v16);
  hi = __builtin_convertvector(reinterpret_cast<i32x16>((r >> (sh + 4)) & 15), v16);
}

/// One f16 value as a float: vcvtph2ps in the AVX2 / AVX-512 clones (F16C), a libgcc call in the
/// baseline. Exact, as every f16 value is a float; inlined, unlike kvslim::fp16_to_fp32.
/// Clang before 15 has no _Float16 on x86 without AVX512-FP16: there (the sanitizer and fuzzing builds,
/// fuzz/README.md) both conversions go through kvslim::fp16_to_fp32, equally exact.
#if defined(__clang__) && __clang_major__ < 15
KV_SIMD_INLINE float half(uint16_t h) { return fp16_to_fp32(h); }

KV_SIMD_INLINE v16 from_f16(const uint16_t* p) {
  v16 f;
  for (int i = 0; i < 16; ++i) f[i] = fp16_to_fp32(p[i]);
  return f;
}
#else
KV_SIMD_INLINE float half(uint16_t h) {
  _Float16 f;
  std::memcpy(&f, &h, sizeof f);
  return static_cast<float>(f);
}

/// 16 f16 values as floats (exact, one vcvtph2ps on AVX-512).
KV_SIMD_INLINE v16 from_f16(const uint16_t* p) {
  typedef _Float16 h16x16 __attribute__((vector_size(32)));
  h16x16 h;
  std::memcpy(&h, p, sizeof h);
  return __builtin_convertvector(h, v16);
}
#endif

/// 16 bf16 values as floats.
KV_SIMD_INLINE v16 from_bf16(const uint16_t* p) {
  u16x16 h;
  std::memcpy(&h, p, sizeof h);
  const u32x16 w = __builtin_convertvector(h, u32x16) << 16;
  v16 f;
  std::memcpy(&f, &w, sizeof f);
  return f;
}

/// 4 bytes -> 16 two-bit codes as floats, lane j = bits 2j..2j+1 of the little-endian word.
KV_SIMD_INLINE v16 crumbs(const uint8_t* p) {
  uint32_t w;
  std::memcpy(&w, p, sizeof w);
  const u32x16 sh = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
  return __builtin_convertvector(reinterpret_cast<i32x16>(((u32x16{} + w) >> sh) & 3), v16);
}

}  // namespace kvslim::kv::simd
