#pragma once
// AVX2 + F16C decoders of the quantized KV formats (q8_0, q4_0, q2_1 tiles and rows; KIVI groups),
// written with intrinsics on 8-float registers: the generic 16-lane versions (kv/simd.h) are
// lowered by GCC 12 for x86-64-v3 with broadcasts through the stack and scalar f16 conversions.
// q8_0 and q4_0 values are computed with the generic decoders' operations (a product, or an exact
// difference then a product), so every level decodes the same floats; KIVI's code * step + zero
// is one fused multiply-add (the baseline build's separate product and sum may differ in the
// last bit). Only called when qdot::level() is AVX2 (or higher), i.e. on CPUs that have AVX2+FMA+F16C.
#include <cstddef>
#include <cstdint>

namespace kvslim::kv::avx2 {

/// q8_0 key tile -> kt[d * 16 + j] (layout: kv/codec_q8_0.cpp). qb: values per scale block.
void q8_0_tile_decode(int hd, int qb, const uint8_t* tile, float* kt);
/// n q8_0 value rows (ggml block_q8_0 runs of qb codes) -> out[n][hd]. qb a multiple of 8.
void q8_0_rows_decode(int hd, int qb, const uint8_t* src, float* out, size_t n);
/// q4_0 key tile -> kt[d * 16 + j] (layout: kv/codec_q4_0.cpp).
void q4_0_tile_decode(int hd, int qb, const uint8_t* tile, float* kt);
/// n q4_0 value rows -> out[n][hd]. qb a multiple of 32.
void q4_0_rows_decode(int hd, int qb, const uint8_t* src, float* out, size_t n);
/// q2_1 key tile -> kt[d * 16 + j] (layout: kv/codec_q2_1.cpp): min + code * step, exact products.
void q2_1_tile_decode(int hd, int qb, const uint8_t* tile, float* kt);
/// n q2_1 value rows -> out[n][hd]. qb a multiple of 16.
void q2_1_rows_decode(int hd, int qb, const uint8_t* src, float* out, size_t n);
/// KIVI keys of block [t0, t0 + 16) of a group, transposed (kv/kivi.cpp, group_keys_t).
void kivi_group_keys_t(const uint8_t* grp, int hd, int bits, size_t cs, int t0, float* kt);
/// KIVI values of nb consecutive records (kv/kivi.cpp, group_values); gv a multiple of 16.
void kivi_group_values(const uint8_t* rec, size_t vrec, int hd, int gv, int bits, int nb, float* out);

}  // namespace kvslim::kv::avx2
