#pragma once
// Tensor element types and block formats (ggml's numbering and layouts), and conversion to/from f32.
#include <cstddef>
#include <cstdint>

namespace kvslim {

/// ggml tensor types, numbered as in the GGUF specification.
enum class GGMLType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, BF16 = 30,
};

/// Size facts of a type: `block_size` elements take `type_size` bytes. `supported` is false for
/// types this build cannot dequantize. Unknown numeric values give nullptr.
struct TypeTraits {
  const char* name;
  int64_t block_size;
  size_t type_size;
  bool supported;
};

/// Traits of `t`, or nullptr when `t` is not a known ggml type number.
const TypeTraits* type_traits(GGMLType t);
/// Name as ggml prints it ("q4_K", "f16", ...), or "type#N" for unknown numbers.
const char* type_name(GGMLType t);
/// Bytes of a row of `n` elements. Throws kvslim::Error when n is not a multiple of the block size
/// or the type is unknown.
size_t row_bytes(GGMLType t, int64_t n);

/// Dequantizes `n` elements (a multiple of the block size) from `src` to `dst`.
/// Bit-exact with ggml's dequantize_row_* functions. Throws kvslim::Error for unsupported types.
void dequantize_row(GGMLType t, const void* src, float* dst, int64_t n);

/// Quantizes `n` f32 values into `dst` (row_bytes(t, n) bytes), ggml's reference rounding.
/// Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_K, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
/// Throws kvslim::Error for others.
void quantize_row(GGMLType t, const float* src, void* dst, int64_t n);

/// IEEE half <-> float, round-to-nearest-even (F16C when built for it).
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
/// bfloat16 <-> float; to-bf16 rounds to nearest even, NaN kept quiet (ggml semantics).
float bf16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f);

}  // namespace kvslim
