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

/// Multiply-adds below which a parallel region costs more than it saves: waking the pool takes
/// about 10 us, more in a virtual machine.
constexpr int64_t kMinParallelMacs = int64_t{1} << 18;

/// parallel_for(n, fn) when the region's work, `macs` multiply-adds, reaches kMinParallelMacs;
/// else fn(0, n) on the calling thread. Results are the same either way (as for parallel_for,
/// fn must not depend on the split).
void parallel_for(int64_t n, int64_t macs, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace kvslim
