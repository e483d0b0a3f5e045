// Hadamard rotation of keys before quantization (as QuaRot, arXiv 2404.00456, and SpinQuant do for
// KV caches): an orthogonal rotation spreads outlier channels over the whole block, so per-block
// scales fit the bulk of the values. Queries get the same rotation inside attention, so q.k is
// unchanged. Where head_dim is not a power of two the rotation is block-diagonal.
#include <cmath>

#include "kv/codec.h"

namespace kvslim::kv {

int hadamard_block(int hd) { return hd & -hd; }

void hadamard_rotate(float* x, int hd) {
  const int hb = hadamard_block(hd);
  const float norm = 1.0f / std::sqrt(static_cast<float>(hb));
  for (int b0 = 0; b0 < hd; b0 += hb) {
    float* v = x + b0;
    // Fast Walsh-Hadamard transform (Sylvester order), then 1/sqrt(n) makes it orthonormal.
    for (int len = 1; len < hb; len <<= 1)
      for (int i = 0; i < hb; i += 2 * len)
        for (int j = i; j < i + len; ++j) {
          const float a = v[j], b = v[j + len];
          v[j] = a + b;
          v[j + len] = a - b;
        }
    for (int i = 0; i < hb; ++i) v[i] *= norm;
  }
}

}  // namespace kvslim::kv
