#pragma once
// Products of activations with weight matrices kept in their GGUF type.
#include <cstdint>
#include <initializer_list>
#include <memory>

#include "kvslim/quant.h"

namespace kvslim {

namespace qdot {
struct PackedRows;
}

/// A weight matrix view: `rows` output rows of `cols` inputs each, row-major, every row encoded
/// in `type` (GGUF tensor with ne = [cols, rows]). Points into the model file mapping.
struct WeightView {
  GGMLType type = GGMLType::F32;
  const void* data = nullptr;
  int64_t cols = 0;
  int64_t rows = 0;
  size_t row_stride = 0;  ///< bytes per row
  /// The same rows repacked for the SIMD decode kernels (kernels/packed_weights.h), or null. The
  /// SIMD levels read these instead of `data` (same results, bit for bit); the scalar level and
  /// the exact path read `data`.
  std::shared_ptr<const qdot::PackedRows> packed;
  const uint8_t* row(int64_t r) const { return static_cast<const uint8_t*>(data) + r * row_stride; }
};

/// Y[t][r] = sum_c X[t][c] * W[r][c] for t < n_tokens. X is [n_tokens][W.cols] f32, Y is
/// [n_tokens][W.rows] f32. Threads over output rows.
///
/// Fast path (exact = false): quantized weights (q4_0 ... q8_0, q2_K ... q6_K) use integer dot
/// products with activations quantized to 8 bits per 32 values (see kernels/quant_dot.h for the
/// canonical computation and its error); f32/f16/bf16 weights use f32 fma for fewer than 4
/// tokens and OpenBLAS sgemm on dequantized tiles above. The result does not depend on the
/// thread count, the SIMD level or, for quantized weights, the number of tokens.
/// Exact path (exact = true): weights dequantized to f32 and f32 products only (reference-logit
/// tests).
void matmul(const WeightView& W, const float* X, int64_t n_tokens, float* Y, bool exact = false);

/// matmul of several weight matrices with the same input (Q/K/V, gate/up): Ys[i] =
/// X * Ws[i]^T, each [n_tokens][Ws[i]->rows]. All Ws[i]->cols must be equal (kvslim::Error
/// otherwise). Results are bit-identical to separate matmul calls; the input is quantized once
/// per weight format and the rows of all matrices share one parallel region.
void matmul_group(std::initializer_list<const WeightView*> Ws, const float* X, int64_t n_tokens,
                  std::initializer_list<float*> Ys, bool exact = false);

}  // namespace kvslim
