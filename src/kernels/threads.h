#pragma once
// A small persistent worker pool for the engine's own loops (attention heads, matrix rows).
// OpenBLAS keeps its own threads for the dense f32 products.
#include <cstdint>
#include <functional>

namespace kvslim {

/// Sets the number of threads used by parallel_for and by OpenBLAS (>= 1).
void set_num_threads(int n);
int num_threads();

/// Runs fn(begin, end) over [0, n) split into contiguous ranges, one per thread, and waits.
/// Results must not depend on the split (each index is handled by exactly one call).
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace kvslim
