#pragma once
// 16-lane helpers for the codecs' decoders (GCC vector extensions). They are always inlined into
// functions compiled per instruction set (target_clones), so one source serves AVX-512, AVX2 and
// the SSE2 baseline.
#include <cstdint>
#include <cstring>

#pragma GCC diagnostic ignored "-Wpsabi"  // vector values never cross a non-inlined call

namespace kvslim::kv::simd {

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint8_t u8x16 __attribute__((vector_size(16)));
typedef int8_t i8x16 __attribute__((vector_size(16)));
typedef uint8_t u8x8 __attribute__((vector_size(8)));
typedef uint8_t u8x4 __attribute__((vector_size(4)));

#define KV_SIMD_INLINE inline __attribute__((always_inline))

KV_SIMD_INLINE v16 load(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
KV_SIMD_INLINE void store(float* p, v16 v) { std::memcpy(p, &v, sizeof v); }

/// 16 int8 codes as floats.
KV_SIMD_INLINE v16 from_i8(const int8_t* p) {
  i8x16 c;
  std::memcpy(&c, p, sizeof c);
  return __builtin_convertvector(c, v16);
}
/// 16 uint8 values as floats.
KV_SIMD_INLINE v16 from_u8(u8x16 c) { return __builtin_convertvector(c, v16); }

/// 16 bf16 values as floats.
KV_SIMD_INLINE v16 from_bf16(const uint16_t* p) {
  u16x16 h;
  std::memcpy(&h, p, sizeof h);
  const u32x16 w = __builtin_convertvector(h, u32x16) << 16;
  v16 f;
  std::memcpy(&f, &w, sizeof f);
  return f;
}

/// 8 bytes -> 16 nibbles, lane 2m = low nibble of byte m, lane 2m+1 = its high nibble.
KV_SIMD_INLINE u8x16 nibbles_interleaved(const uint8_t* p) {
  u8x8 b;
  std::memcpy(&b, p, sizeof b);
  const u8x8 lo = b & 15, hi = b >> 4;
  return __builtin_shufflevector(lo, hi, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
}
/// 16 bytes -> 32 nibbles as ggml's q4_0 orders them: lanes 0..15 = low nibbles, 16..31 = high.
KV_SIMD_INLINE void nibbles_split(const uint8_t* p, u8x16& lo, u8x16& hi) {
  u8x16 b;
  std::memcpy(&b, p, sizeof b);
  lo = b & 15;
  hi = b >> 4;
}
/// 4 bytes -> 16 two-bit codes, lane 4m+k = bits 2k..2k+1 of byte m.
KV_SIMD_INLINE u8x16 crumbs(const uint8_t* p) {
  u8x4 b;
  std::memcpy(&b, p, sizeof b);
  const u8x16 r = __builtin_shufflevector(b, b, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  const u8x16 sh = {0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6, 0, 2, 4, 6};
  return (r >> sh) & 3;
}

}  // namespace kvslim::kv::simd
