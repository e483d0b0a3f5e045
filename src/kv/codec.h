#pragma once
// Internal codec primitives of the KV cache (src/kv/). Keys are stored in tiles of kKVTile
// entries, transposed ([channel][entry]); values as rows. Quantized formats keep ggml's values:
// for a block of qb values, q8_0 stores an f16 scale d = amax/127 and codes round(x/d); q4_0 an
// f16 scale d = max/-8 (max: the value of largest magnitude) and codes min(15, trunc(x/d + 8.5)).
#include <cstddef>
#include <cstdint>

#include "kv/store.h"
#include "kv/cache.h"

namespace kvslim::kv {

// ---- ggml block quantization, any even block length ----

/// q8_0 block of qb values: returns the f16 scale, writes qb codes.
uint16_t q8_0_block(const float* x, int qb, int8_t* codes);
/// q4_0 block of qb values: returns the f16 scale, writes qb codes in [0, 15] (one per value).
uint16_t q4_0_block(const float* x, int qb, uint8_t* codes);

// ---- key tiles ----

/// Bytes of one key tile (kKVTile entries) in codec c.
inline size_t tile_bytes(KVCodec c, int hd) { return kKVTile * codec_row_bytes(c, hd); }
/// Encodes key k[hd] into lane `lane` of a tile.
void tile_put(KVCodec c, int hd, uint8_t* tile, int lane, const float* k);
/// Decodes lane `lane` of a tile into out[hd].
void tile_get(KVCodec c, int hd, const uint8_t* tile, int lane, float* out);
/// Decodes all lanes: kt[d * kKVTile + j]. SIMD where the processor has it.
void tile_decode(KVCodec c, int hd, const uint8_t* tile, float* kt);
/// Copies the encoded key of (stile, slane) to (dtile, dlane) without re-encoding.
void tile_move(KVCodec c, int hd, uint8_t* dtile, int dlane, const uint8_t* stile, int slane);

// ---- value rows (ggml's own block layout for q8_0 / q4_0) ----

void row_encode(KVCodec c, int hd, const float* x, uint8_t* dst);
/// Decodes n consecutive rows.
void rows_decode(KVCodec c, int hd, const uint8_t* src, float* out, size_t n);

// ---- per-codec implementations (codec_float.cpp, codec_q8_0.cpp, codec_q4_0.cpp) ----

void float_tile_put(KVCodec c, int hd, uint8_t* tile, int lane, const float* k);
void float_tile_get(KVCodec c, int hd, const uint8_t* tile, int lane, float* out);
void float_tile_decode(KVCodec c, int hd, const uint8_t* tile, float* kt);
void float_row_encode(KVCodec c, int hd, const float* x, uint8_t* dst);
void float_rows_decode(KVCodec c, const uint8_t* src, float* out, size_t n_values);
/// n f16 values to f32 (F16C / AVX-512 when present).
void f16_to_f32_n(const uint16_t* src, float* dst, size_t n);
/// n f32 values to f16, rounding to nearest even: fp32_to_fp16's bits for every input (F16C /
/// AVX-512 when present).
void f32_to_f16_n(const float* src, uint16_t* dst, size_t n);

void q8_0_tile_put(int hd, uint8_t* tile, int lane, const float* k);
void q8_0_tile_get(int hd, const uint8_t* tile, int lane, float* out);
void q8_0_tile_decode(int hd, const uint8_t* tile, float* kt);
void q8_0_tile_move(int hd, uint8_t* dtile, int dlane, const uint8_t* stile, int slane);
void q8_0_row_encode(int hd, const float* x, uint8_t* dst);
void q8_0_rows_decode(int hd, const uint8_t* src, float* out, size_t n);

void q4_0_tile_put(int hd, uint8_t* tile, int lane, const float* k);
void q4_0_tile_get(int hd, const uint8_t* tile, int lane, float* out);
void q4_0_tile_decode(int hd, const uint8_t* tile, float* kt);
void q4_0_tile_move(int hd, uint8_t* dtile, int dlane, const uint8_t* stile, int slane);
void q4_0_row_encode(int hd, const float* x, uint8_t* dst);
void q4_0_rows_decode(int hd, const uint8_t* src, float* out, size_t n);

/// q2_1 block of qb values: f16 step and minimum, qb codes in [0, 3] (codec_q2_1.cpp).
void q2_1_block(const float* x, int qb, uint16_t& d, uint16_t& m, uint8_t* codes);
void q2_1_tile_put(int hd, uint8_t* tile, int lane, const float* k);
void q2_1_tile_get(int hd, const uint8_t* tile, int lane, float* out);
void q2_1_tile_decode(int hd, const uint8_t* tile, float* kt);
void q2_1_tile_move(int hd, uint8_t* dtile, int dlane, const uint8_t* stile, int slane);
void q2_1_row_encode(int hd, const float* x, uint8_t* dst);
void q2_1_rows_decode(int hd, const uint8_t* src, float* out, size_t n);

// ---- KIVI (kivi.cpp) ----

/// Asymmetric b-bit parameters of values x[0], x[stride], ... (n of them): the f16 zero point
/// (the minimum, rounded down) and the f16 step (rounded up), so every value lies within the
/// representable range and round-trips within step / 2.
void kivi_params(const float* x, int n, int stride, int bits, uint16_t& zero, uint16_t& step);
/// Code of x for (zero, step), in [0, 2^bits - 1].
int kivi_code(float x, float zero, float step, int bits);

// ---- Hadamard rotation (hadamard.cpp) ----

/// Channels per Hadamard block: the largest power of two dividing hd.
int hadamard_block(int hd);
/// x <- H x, H block-diagonal with normalized Walsh-Hadamard blocks (orthogonal and symmetric,
/// so it is its own inverse).
void hadamard_rotate(float* x, int hd);

}  // namespace kvslim::kv
