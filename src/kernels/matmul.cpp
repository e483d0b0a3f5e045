#include "kernels/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <vector>

#include "kernels/threads.h"

namespace kvslim {

namespace {

float dot_f32(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void matmul(const WeightView& W, const float* X, int64_t n_tokens, float* Y, bool exact) {
  if (W.type == GGMLType::F32) {
    if (n_tokens == 1) {
      parallel_for(W.rows, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) Y[r] = dot_f32(X, reinterpret_cast<const float*>(W.row(r)), W.cols);
      });
      return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_tokens, W.rows, W.cols, 1.0f, X, W.cols,
                static_cast<const float*>(W.data), W.row_stride / sizeof(float), 0.0f, Y, W.rows);
    return;
  }
  if (n_tokens < 4) {
    parallel_for(W.rows, [&](int64_t b, int64_t e) {
      std::vector<float> buf(W.cols);
      for (int64_t r = b; r < e; ++r) {
        dequantize_row(W.type, W.row(r), buf.data(), W.cols);
        for (int64_t t = 0; t < n_tokens; ++t) Y[t * W.rows + r] = dot_f32(X + t * W.cols, buf.data(), W.cols);
      }
    });
    return;
  }
  // Batched: dequantize a tile of rows to f32, then one BLAS product per tile.
  const int64_t tile = 128;
  std::vector<float> wf(static_cast<size_t>(tile * W.cols));
  for (int64_t r0 = 0; r0 < W.rows; r0 += tile) {
    int64_t nr = std::min(tile, W.rows - r0);
    parallel_for(nr, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) dequantize_row(W.type, W.row(r0 + r), wf.data() + r * W.cols, W.cols);
    });
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_tokens, nr, W.cols, 1.0f, X, W.cols, wf.data(), W.cols,
                0.0f, Y + r0, W.rows);
  }
}

}  // namespace kvslim
