// q4_0 keys and values: ggml's q4_0 values (an f16 scale d = max/-8 per block, max being the value
// of largest magnitude; codes min(15, trunc(x/d + 8.5)), decoded as (code - 8) * d), in blocks of
// codec_block(Q4_0, head_dim) values. Key tile: scales [n_blocks][kKVTile] (f16), then codes
// [head_dim][kKVTile / 2] bytes, lane 2m in the low nibble and lane 2m+1 in the high one. Value
// row: ggml's block_q4_0 layout (value j and j + qb/2 share a byte).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "kv/codec.h"
#include "kv/decode_avx2.h"
#include "kv/simd.h"
#include "kvslim/quant.h"

namespace kvslim::kv {

uint16_t q4_0_block(const float* x, int qb, uint8_t* codes) {
  float amax = 0, max = 0;
  for (int j = 0; j < qb; ++j)
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  const float d = max / -8;
  // A step so small that its inverse overflows (keys of a near-zero block) is stored as an f16 0, so
  // its codes are never read: give them 0 instead of converting 0 x inf = NaN to an integer.
  const float id = d != 0 && std::fabs(d) >= FLT_MIN ? 1.0f / d : 0.0f;
  for (int j = 0; j < qb; ++j)
    codes[j] = static_cast<uint8_t>(std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f))));
  return fp32_to_fp16(d);
}

namespace {
constexpr int kHalf = kKVTile / 2;
inline uint16_t* scales(uint8_t* tile) { return reinterpret_cast<uint16_t*>(tile); }
inline const uint16_t* scales(const uint8_t* tile) { return reinterpret_cast<const uint16_t*>(tile); }
inline uint8_t* nibbles(uint8_t* tile, int nb) { return tile + nb * kKVTile * 2; }
inline const uint8_t* nibbles(const uint8_t* tile, int nb) { return tile + nb * kKVTile * 2; }
inline int get_nib(const uint8_t* row, int lane) { return (row[lane / 2] >> (4 * (lane & 1))) & 0xF; }
inline void set_nib(uint8_t* row, int lane, int v) {
  const int sh = 4 * (lane & 1);
  row[lane / 2] = static_cast<uint8_t>((row[lane / 2] & ~(0xF << sh)) | (v << sh));
}
}  // namespace

void q4_0_tile_put(int hd, uint8_t* tile, int lane, const float* k) {
  const int qb = codec_block(KVCodec::Q4_0, hd), nb = hd / qb;
  uint8_t q[32];
  for (int b = 0; b < nb; ++b) {
    scales(tile)[b * kKVTile + lane] = q4_0_block(k + b * qb, qb, q);
    for (int j = 0; j < qb; ++j) set_nib(nibbles(tile, nb) + (b * qb + j) * kHalf, lane, q[j]);
  }
}

void q4_0_tile_get(int hd, const uint8_t* tile, int lane, float* out) {
  const int qb = codec_block(KVCodec::Q4_0, hd), nb = hd / qb;
  for (int b = 0; b < nb; ++b) {
    const float d = fp16_to_fp32(scales(tile)[b * kKVTile + lane]);
    for (int j = 0; j < qb; ++j) out[b * qb + j] = (get_nib(nibbles(tile, nb) + (b * qb + j) * kHalf, lane) - 8) * d;
  }
}

namespace {
KV_SIMD_INLINE void tile_decode_body(int hd, const uint8_t* tile, float* kt) {
  const int qb = codec_block(KVCodec::Q4_0, hd), nb = hd / qb;
  const uint8_t* c = nibbles(tile, nb);
  for (int b = 0; b < nb; ++b) {
    const simd::v16 sv = simd::from_f16(scales(tile) + b * kKVTile);
    for (int d = b * qb; d < (b + 1) * qb; ++d)
      simd::store(kt + d * kKVTile, (simd::nib_lanes<0>(simd::load32(c + d * kHalf)) - 8.0f) * sv);
  }
}
}  // namespace

KV_SIMD_LEVELS_AVX2(void, q4_0_tile_decode, (int hd, const uint8_t* tile, float* kt), (hd, tile, kt), tile_decode_body, true,
                    avx2::q4_0_tile_decode(hd, codec_block(KVCodec::Q4_0, hd), tile, kt))

void q4_0_tile_move(int hd, uint8_t* dt, int dl, const uint8_t* st, int sl) {
  const int nb = hd / codec_block(KVCodec::Q4_0, hd);
  for (int b = 0; b < nb; ++b) scales(dt)[b * kKVTile + dl] = scales(st)[b * kKVTile + sl];
  for (int d = 0; d < hd; ++d) set_nib(nibbles(dt, nb) + d * kHalf, dl, get_nib(nibbles(st, nb) + d * kHalf, sl));
}

void q4_0_row_encode(int hd, const float* x, uint8_t* dst) {
  const int qb = codec_block(KVCodec::Q4_0, hd);
  uint8_t q[32];
  for (int b = 0; b < hd / qb; ++b, dst += 2 + qb / 2) {
    const uint16_t d = q4_0_block(x + b * qb, qb, q);
    std::memcpy(dst, &d, 2);
    for (int j = 0; j < qb / 2; ++j) dst[2 + j] = static_cast<uint8_t>(q[j] | (q[j + qb / 2] << 4));
  }
}

namespace {
KV_SIMD_INLINE void rows_decode_body(int hd, const uint8_t* src, float* out, size_t n) {
  const int qb = codec_block(KVCodec::Q4_0, hd);
  const size_t nblocks = n * (hd / qb);
  for (size_t b = 0; b < nblocks; ++b, src += 2 + qb / 2, out += qb) {
    uint16_t h;
    std::memcpy(&h, src, 2);
    const float d = simd::half(h);
    if (qb % 32 == 0) {
      for (int j = 0; j < qb / 2; j += 16) {
        simd::v16 lo, hi;
        simd::nib_split(simd::load32(src + 2 + j), lo, hi);
        simd::store(out + j, (lo - 8.0f) * d);
        simd::store(out + qb / 2 + j, (hi - 8.0f) * d);
      }
    } else {
      for (int j = 0; j < qb / 2; ++j) {
        out[j] = ((src[2 + j] & 0xF) - 8) * d;
        out[j + qb / 2] = ((src[2 + j] >> 4) - 8) * d;
      }
    }
  }
}

}  // namespace

KV_SIMD_LEVELS_AVX2(void, q4_0_rows_decode, (int hd, const uint8_t* src, float* out, size_t n), (hd, src, out, n),
                    rows_decode_body, codec_block(KVCodec::Q4_0, hd) % 32 == 0,
                    avx2::q4_0_rows_decode(hd, codec_block(KVCodec::Q4_0, hd), src, out, n))

}  // namespace kvslim::kv
