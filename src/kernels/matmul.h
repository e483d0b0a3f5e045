#pragma once
// Products of activations with weight matrices kept in their GGUF type.
#include <cstdint>

#include "kvslim/quant.h"

namespace kvslim {

/// A weight matrix view: `rows` output rows of `cols` inputs each, row-major, every row encoded
/// in `type` (GGUF tensor with ne = [cols, rows]). Points into the model file mapping.
struct WeightView {
  GGMLType type = GGMLType::F32;
  const void* data = nullptr;
  int64_t cols = 0;
  int64_t rows = 0;
  size_t row_stride = 0;  ///< bytes per row
  const uint8_t* row(int64_t r) const { return static_cast<const uint8_t*>(data) + r * row_stride; }
};

/// Y[t][r] = sum_c X[t][c] * W[r][c] for t < n_tokens. X is [n_tokens][W.cols] f32, Y is
/// [n_tokens][W.rows] f32. `exact` forces the f32 path (dequantize, then f32 products) instead
/// of quantized-activation dot products. Threads over output rows.
void matmul(const WeightView& W, const float* X, int64_t n_tokens, float* Y, bool exact = false);

}  // namespace kvslim
