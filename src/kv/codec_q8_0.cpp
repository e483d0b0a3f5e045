// q8_0 keys and values: ggml's q8_0 values (an f16 scale amax/127 per block, codes round(x/d)),
// in blocks of codec_block(Q8_0, head_dim) values. Key tile: scales [n_blocks][kKVTile] (f16),
// then codes [head_dim][kKVTile] (int8). Value row: ggml's block_q8_0 layout.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "kv/codec.h"
#include "kv/decode_avx2.h"
#include "kv/simd.h"
#include "kvslim/quant.h"

namespace kvslim::kv {

uint16_t q8_0_block(const float* x, int qb, int8_t* codes) {
  float amax = 0;
  for (int j = 0; j < qb; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127;
  // A step so small that its inverse overflows (keys of a near-zero block) is stored as an f16 0, so
  // its codes are never read: give them 0 instead of converting 0 x inf = NaN to an integer.
  const float id = d != 0 && std::fabs(d) >= FLT_MIN ? 1.0f / d : 0.0f;
  for (int j = 0; j < qb; ++j) codes[j] = static_cast<int8_t>(std::round(x[j] * id));
  return fp32_to_fp16(d);
}

namespace {
inline uint16_t* scales(uint8_t* tile) { return reinterpret_cast<uint16_t*>(tile); }
inline const uint16_t* scales(const uint8_t* tile) { return reinterpret_cast<const uint16_t*>(tile); }
inline int8_t* codes(uint8_t* tile, int nb) { return reinterpret_cast<int8_t*>(tile + nb * kKVTile * 2); }
inline const int8_t* codes(const uint8_t* tile, int nb) {
  return reinterpret_cast<const int8_t*>(tile + nb * kKVTile * 2);
}
}  // namespace

void q8_0_tile_put(int hd, uint8_t* tile, int lane, const float* k) {
  const int qb = codec_block(KVCodec::Q8_0, hd), nb = hd / qb;
  int8_t q[32];
  for (int b = 0; b < nb; ++b) {
    scales(tile)[b * kKVTile + lane] = q8_0_block(k + b * qb, qb, q);
    for (int j = 0; j < qb; ++j) codes(tile, nb)[(b * qb + j) * kKVTile + lane] = q[j];
  }
}

void q8_0_tile_get(int hd, const uint8_t* tile, int lane, float* out) {
  const int qb = codec_block(KVCodec::Q8_0, hd), nb = hd / qb;
  for (int b = 0; b < nb; ++b) {
    const float d = fp16_to_fp32(scales(tile)[b * kKVTile + lane]);
    for (int j = 0; j < qb; ++j) out[b * qb + j] = codes(tile, nb)[(b * qb + j) * kKVTile + lane] * d;
  }
}

namespace {
KV_SIMD_INLINE void tile_decode_body(int hd, const uint8_t* tile, float* kt) {
  const int qb = codec_block(KVCodec::Q8_0, hd), nb = hd / qb;
  const int8_t* c = codes(tile, nb);
  for (int b = 0; b < nb; ++b) {
    const simd::v16 sv = simd::from_f16(scales(tile) + b * kKVTile);
    for (int d = b * qb; d < (b + 1) * qb; d += 2) {  // qb is even: two channels per 32-byte load
      const simd::u32x8 w = simd::load32(c + d * kKVTile);
      simd::store(kt + d * kKVTile, simd::i8_lanes<0>(w) * sv);
      simd::store(kt + (d + 1) * kKVTile, simd::i8_lanes<1>(w) * sv);
    }
  }
}
}  // namespace

KV_SIMD_LEVELS_AVX2(void, q8_0_tile_decode, (int hd, const uint8_t* tile, float* kt), (hd, tile, kt), tile_decode_body, true,
                    avx2::q8_0_tile_decode(hd, codec_block(KVCodec::Q8_0, hd), tile, kt))

void q8_0_tile_move(int hd, uint8_t* dt, int dl, const uint8_t* st, int sl) {
  const int nb = hd / codec_block(KVCodec::Q8_0, hd);
  for (int b = 0; b < nb; ++b) scales(dt)[b * kKVTile + dl] = scales(st)[b * kKVTile + sl];
  for (int d = 0; d < hd; ++d) codes(dt, nb)[d * kKVTile + dl] = codes(st, nb)[d * kKVTile + sl];
}

void q8_0_row_encode(int hd, const float* x, uint8_t* dst) {
  const int qb = codec_block(KVCodec::Q8_0, hd);
  for (int b = 0; b < hd / qb; ++b, dst += 2 + qb) {
    const uint16_t d = q8_0_block(x + b * qb, qb, reinterpret_cast<int8_t*>(dst + 2));
    std::memcpy(dst, &d, 2);
  }
}

namespace {
KV_SIMD_INLINE void rows_decode_body(int hd, const uint8_t* src, float* out, size_t n) {
  const int qb = codec_block(KVCodec::Q8_0, hd);
  const size_t nblocks = n * (hd / qb);
  for (size_t b = 0; b < nblocks; ++b, src += 2 + qb, out += qb) {
    uint16_t h;
    std::memcpy(&h, src, 2);
    const float d = simd::half(h);
    const auto* q = reinterpret_cast<const int8_t*>(src + 2);
    if (qb % 16 == 0) {
      for (int j = 0; j < qb; j += 32) {
        const simd::u32x8 w = simd::load32(q + j);
        simd::store(out + j, simd::i8_lanes<0>(w) * d);
        if (j + 16 < qb) simd::store(out + j + 16, simd::i8_lanes<1>(w) * d);
      }
    } else {
      for (int j = 0; j < qb; ++j) out[j] = q[j] * d;
    }
  }
}

}  // namespace

KV_SIMD_LEVELS_AVX2(void, q8_0_rows_decode, (int hd, const uint8_t* src, float* out, size_t n), (hd, src, out, n),
                    rows_decode_body, codec_block(KVCodec::Q8_0, hd) % 8 == 0,
                    avx2::q8_0_rows_decode(hd, codec_block(KVCodec::Q8_0, hd), src, out, n))

}  // namespace kvslim::kv
