// f32, f16 and bf16 keys (transposed tiles) and values (rows). Exact for f32; f16 and bf16 round
// to nearest even.
#include "kernels/intrinsics.h"

#include <algorithm>
#include <cstring>

#include "kv/codec.h"
#include "kv/simd.h"
#include "kvslim/quant.h"

namespace kvslim::kv {

namespace {

// f16 with intrinsics: GCC 12 scalarizes a conversion of a _Float16 vector without AVX512-FP16.
__attribute__((target("avx512f"))) void f16_to_f32_avx512(const uint16_t* s, float* d, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))));
  for (; i < n; ++i) d[i] = fp16_to_fp32(s[i]);
}

__attribute__((target("avx2,f16c"))) void f16_to_f32_f16c(const uint16_t* s, float* d, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) d[i] = fp16_to_fp32(s[i]);
}

KV_SIMD_INLINE void bf16_to_f32_body(const uint16_t* s, float* d, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) simd::store(d + i, simd::from_bf16(s + i));
  for (; i < n; ++i) d[i] = bf16_to_fp32(s[i]);
}

KV_SIMD_LEVELS(void, bf16_to_f32_n, (const uint16_t* s, float* d, size_t n), (s, d, n), bf16_to_f32_body)

// vcvtps2ph with round-to-nearest-even gives fp32_to_fp16's bits for every input (NaNs quieted
// with their top payload bits, overflow to inf, subnormal halves); MXCSR's flush modes do not
// apply to it. An entry's f16 key and value were 2 x head_dim calls of the scalar conversion.
__attribute__((target("avx512f"))) void f32_to_f16_avx512(const float* s, uint16_t* d, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), _mm512_cvtps_ph(_mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) d[i] = fp32_to_fp16(s[i]);
}

__attribute__((target("avx2,f16c"))) void f32_to_f16_f16c(const float* s, uint16_t* d, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) d[i] = fp32_to_fp16(s[i]);
}

float decode16(KVCodec c, uint16_t h) { return c == KVCodec::F16 ? fp16_to_fp32(h) : bf16_to_fp32(h); }

// n values of codec c (f16 or bf16) into d.
void encode16_n(KVCodec c, const float* s, uint16_t* d, size_t n) {
  if (c == KVCodec::F16) return f32_to_f16_n(s, d, n);
  for (size_t i = 0; i < n; ++i) d[i] = fp32_to_bf16(s[i]);
}

}  // namespace

void f32_to_f16_n(const float* src, uint16_t* dst, size_t n) {
  switch (qdot::level()) {  // the weight kernels' level, as KV_SIMD_LEVELS
    case qdot::Level::AVX512: return f32_to_f16_avx512(src, dst, n);
    case qdot::Level::AVXVNNI:
    case qdot::Level::AVX2: return f32_to_f16_f16c(src, dst, n);
    default:
      for (size_t i = 0; i < n; ++i) dst[i] = fp32_to_fp16(src[i]);
  }
}

void f16_to_f32_n(const uint16_t* src, float* dst, size_t n) {
  switch (qdot::level()) {  // the weight kernels' level, as KV_SIMD_LEVELS
    case qdot::Level::AVX512: return f16_to_f32_avx512(src, dst, n);
    case qdot::Level::AVXVNNI:
    case qdot::Level::AVX2: return f16_to_f32_f16c(src, dst, n);
    default:
      for (size_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(src[i]);
  }
}

void float_tile_put(KVCodec c, int hd, uint8_t* tile, int lane, const float* k) {
  if (c == KVCodec::F32) {
    auto* t = reinterpret_cast<float*>(tile);
    for (int d = 0; d < hd; ++d) t[d * kKVTile + lane] = k[d];
    return;
  }
  uint16_t buf[512];
  auto* t = reinterpret_cast<uint16_t*>(tile);
  for (int d0 = 0; d0 < hd; d0 += 512) {
    const int m = std::min(512, hd - d0);
    encode16_n(c, k + d0, buf, static_cast<size_t>(m));
    for (int d = 0; d < m; ++d) t[(d0 + d) * kKVTile + lane] = buf[d];
  }
}

void float_tile_get(KVCodec c, int hd, const uint8_t* tile, int lane, float* out) {
  if (c == KVCodec::F32) {
    const auto* t = reinterpret_cast<const float*>(tile);
    for (int d = 0; d < hd; ++d) out[d] = t[d * kKVTile + lane];
    return;
  }
  const auto* t = reinterpret_cast<const uint16_t*>(tile);
  for (int d = 0; d < hd; ++d) out[d] = decode16(c, t[d * kKVTile + lane]);
}

void float_tile_decode(KVCodec c, int hd, const uint8_t* tile, float* kt) {
  float_rows_decode(c, tile, kt, static_cast<size_t>(hd) * kKVTile);
}

void float_row_encode(KVCodec c, int hd, const float* x, uint8_t* dst) {
  if (c == KVCodec::F32) {
    std::memcpy(dst, x, hd * sizeof(float));
    return;
  }
  encode16_n(c, x, reinterpret_cast<uint16_t*>(dst), static_cast<size_t>(hd));
}

void float_rows_decode(KVCodec c, const uint8_t* src, float* out, size_t n) {
  if (c == KVCodec::F32) {
    std::memcpy(out, src, n * sizeof(float));
  } else if (c == KVCodec::F16) {
    f16_to_f32_n(reinterpret_cast<const uint16_t*>(src), out, n);
  } else {
    bf16_to_f32_n(reinterpret_cast<const uint16_t*>(src), out, n);
  }
}

}  // namespace kvslim::kv
