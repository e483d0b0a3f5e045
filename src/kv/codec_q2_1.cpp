// q2_1 keys and values: 2-bit asymmetric codes in blocks of codec_block(Q2_1, head_dim) values
// (32 when head_dim allows), an f16 step d = (max - min) / 3 and an f16 minimum m per block;
// codes min(3, trunc((x - min) / d + 0.5)), decoded as m + code * d (ggml's q4_1 rule at 2 bits;
// KIVI's per-token value quantization with groups of 32 channels). It is the 2-bit row codec of
// LeanKV's K4V2 low tier (Zhang et al., arXiv 2412.03131: keys q4_0, values q2_1).
// Value row: [n_blocks] x (f16 d, f16 m), then ceil(head_dim / 4) bytes of codes, value j in bits
// 2 (j % 4) of byte j / 4. Key tile: f16 d [n_blocks][kKVTile], f16 m [n_blocks][kKVTile], then
// codes [head_dim][kKVTile / 4] bytes, lane l in bits 2 (l % 4) of byte l / 4. The block decoders
// that attention reads (key tiles, value rows) have a path per SIMD level (KV_SIMD_LEVELS, and a
// hand-written AVX2 one in kv/decode_avx2.cpp); code * step is exact in float (a 2-bit code times an
// f16 value needs at most 13 significant bits), so a fused multiply-add and a product then a sum
// give the same float: every level decodes bit for bit what the scalar per-entry decoder does.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "kv/codec.h"
#include "kv/decode_avx2.h"
#include "kv/simd.h"
#include "kvslim/quant.h"

namespace kvslim::kv {

void q2_1_block(const float* x, int qb, uint16_t& d16, uint16_t& m16, uint8_t* codes) {
  float mn = x[0], mx = x[0];
  for (int j = 1; j < qb; ++j) {
    mn = std::min(mn, x[j]);
    mx = std::max(mx, x[j]);
  }
  const float d = (mx - mn) / 3.0f;
  // A step so small that its inverse overflows (keys of a near-zero block) is stored as an f16 0, so
  // its codes are never read: give them 0 instead of converting 0 x inf = NaN to an integer.
  const float id = d != 0 && std::fabs(d) >= FLT_MIN ? 1.0f / d : 0.0f;
  for (int j = 0; j < qb; ++j)
    codes[j] = static_cast<uint8_t>(std::min(3, static_cast<int>((x[j] - mn) * id + 0.5f)));
  d16 = fp32_to_fp16(d);
  m16 = fp32_to_fp16(mn);
}

namespace {
constexpr int kQuarter = kKVTile / 4;
inline int get2(const uint8_t* row, int i) { return (row[i / 4] >> (2 * (i & 3))) & 3; }
inline void set2(uint8_t* row, int i, int v) {
  const int sh = 2 * (i & 3);
  row[i / 4] = static_cast<uint8_t>((row[i / 4] & ~(3 << sh)) | (v << sh));
}
inline uint16_t* steps(uint8_t* t) { return reinterpret_cast<uint16_t*>(t); }
inline const uint16_t* steps(const uint8_t* t) { return reinterpret_cast<const uint16_t*>(t); }
inline uint16_t* mins(uint8_t* t, int nb) { return steps(t) + nb * kKVTile; }
inline const uint16_t* mins(const uint8_t* t, int nb) { return steps(t) + nb * kKVTile; }
inline uint8_t* codes(uint8_t* t, int nb) { return t + nb * kKVTile * 4; }
inline const uint8_t* codes(const uint8_t* t, int nb) { return t + nb * kKVTile * 4; }
}  // namespace

void q2_1_tile_put(int hd, uint8_t* tile, int lane, const float* k) {
  const int qb = codec_block(KVCodec::Q2_1, hd), nb = hd / qb;
  uint8_t q[32];
  for (int b = 0; b < nb; ++b) {
    q2_1_block(k + b * qb, qb, steps(tile)[b * kKVTile + lane], mins(tile, nb)[b * kKVTile + lane], q);
    for (int j = 0; j < qb; ++j) set2(codes(tile, nb) + (b * qb + j) * kQuarter, lane, q[j]);
  }
}

void q2_1_tile_get(int hd, const uint8_t* tile, int lane, float* out) {
  const int qb = codec_block(KVCodec::Q2_1, hd), nb = hd / qb;
  for (int b = 0; b < nb; ++b) {
    const float d = fp16_to_fp32(steps(tile)[b * kKVTile + lane]), m = fp16_to_fp32(mins(tile, nb)[b * kKVTile + lane]);
    for (int j = 0; j < qb; ++j) out[b * qb + j] = m + get2(codes(tile, nb) + (b * qb + j) * kQuarter, lane) * d;
  }
}

namespace {
KV_SIMD_INLINE void tile_decode_body(int hd, const uint8_t* tile, float* kt) {
  const int qb = codec_block(KVCodec::Q2_1, hd), nb = hd / qb;
  const uint8_t* c = codes(tile, nb);
  for (int b = 0; b < nb; ++b) {
    const simd::v16 d = simd::from_f16(steps(tile) + b * kKVTile), m = simd::from_f16(mins(tile, nb) + b * kKVTile);
    for (int ch = b * qb; ch < (b + 1) * qb; ++ch) simd::store(kt + ch * kKVTile, m + simd::crumbs(c + ch * kQuarter) * d);
  }
}
}  // namespace

KV_SIMD_LEVELS_AVX2(void, q2_1_tile_decode, (int hd, const uint8_t* tile, float* kt), (hd, tile, kt), tile_decode_body, true,
                    avx2::q2_1_tile_decode(hd, codec_block(KVCodec::Q2_1, hd), tile, kt))

void q2_1_tile_move(int hd, uint8_t* dt, int dl, const uint8_t* st, int sl) {
  const int nb = hd / codec_block(KVCodec::Q2_1, hd);
  for (int b = 0; b < nb; ++b) {
    steps(dt)[b * kKVTile + dl] = steps(st)[b * kKVTile + sl];
    mins(dt, nb)[b * kKVTile + dl] = mins(st, nb)[b * kKVTile + sl];
  }
  for (int c = 0; c < hd; ++c) set2(codes(dt, nb) + c * kQuarter, dl, get2(codes(st, nb) + c * kQuarter, sl));
}

void q2_1_row_encode(int hd, const float* x, uint8_t* dst) {
  const int qb = codec_block(KVCodec::Q2_1, hd), nb = hd / qb;
  uint8_t* c = dst + nb * 4;
  std::memset(c, 0, (hd + 3) / 4);
  uint8_t q[32];
  for (int b = 0; b < nb; ++b) {
    uint16_t d, m;
    q2_1_block(x + b * qb, qb, d, m, q);
    std::memcpy(dst + b * 4, &d, 2);
    std::memcpy(dst + b * 4 + 2, &m, 2);
    for (int j = 0; j < qb; ++j) set2(c, b * qb + j, q[j]);
  }
}

namespace {
KV_SIMD_INLINE void rows_decode_body(int hd, const uint8_t* src, float* out, size_t n) {
  const int qb = codec_block(KVCodec::Q2_1, hd), nb = hd / qb;
  const size_t row = codec_row_bytes(KVCodec::Q2_1, hd);
  for (size_t r = 0; r < n; ++r, src += row, out += hd) {
    const uint8_t* c = src + nb * 4;
    for (int b = 0; b < nb; ++b) {
      uint16_t d16, m16;
      std::memcpy(&d16, src + b * 4, 2);
      std::memcpy(&m16, src + b * 4 + 2, 2);
      const float d = simd::half(d16), m = simd::half(m16);
      if (qb % 16 == 0) {
        for (int j = b * qb; j < (b + 1) * qb; j += 16) simd::store(out + j, m + simd::crumbs(c + j / 4) * d);
      } else {
        for (int j = b * qb; j < (b + 1) * qb; ++j) out[j] = m + get2(c, j) * d;
      }
    }
  }
}
}  // namespace

KV_SIMD_LEVELS_AVX2(void, q2_1_rows_decode, (int hd, const uint8_t* src, float* out, size_t n), (hd, src, out, n),
                    rows_decode_body, codec_block(KVCodec::Q2_1, hd) % 16 == 0,
                    avx2::q2_1_rows_decode(hd, codec_block(KVCodec::Q2_1, hd), src, out, n))

}  // namespace kvslim::kv
