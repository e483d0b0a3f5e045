#pragma once
// A small persistent worker pool for the engine's own loops (attention heads, matrix rows).
// The only pool: dense f32 products call OpenBLAS single-threaded from the pool's threads.
#include <cstdint>
#include <functional>

#include "kvslim/threads.h"  // set_num_threads, num_threads, available_cores

namespace kvslim {

/// Held around every OpenBLAS call. Each thread inside an OpenBLAS call takes a work buffer of
/// about 128 MiB of address space, and OpenBLAS retries a failed allocation forever, so under an
/// address-space limit (ulimit -v) many threads calling at once hung the process. With such a
/// limit at most max(1, limit / 1 GiB) threads are inside OpenBLAS at a time (the others wait);
/// without one the guard costs nothing.
class BlasSlot {
 public:
  BlasSlot();
  ~BlasSlot();
  BlasSlot(const BlasSlot&) = delete;
  BlasSlot& operator=(const BlasSlot&) = delete;

 private:
  bool held_ = false;
};

/// Runs fn(begin, end) over [0, n) split into contiguous ranges, one per thread, and waits.
/// Results must not depend on the split (each index is handled by exactly one call).
/// An exception thrown by fn on any thread is rethrown on the calling thread after every range has
/// returned or thrown (the first one thrown wins; the others are dropped); the pool stays usable.
void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

/// Multiply-adds below which a parallel region costs more than it saves: waking the pool takes
/// about 10 us, more in a virtual machine.
constexpr int64_t kMinParallelMacs = int64_t{1} << 18;

/// parallel_for(n, fn) when the region's work, `macs` multiply-adds, reaches kMinParallelMacs;
/// else fn(0, n) on the calling thread. Results are the same either way (as for parallel_for,
/// fn must not depend on the split).
void parallel_for(int64_t n, int64_t macs, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace kvslim
