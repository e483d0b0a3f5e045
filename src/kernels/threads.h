#pragma once
// A small persistent worker pool for the engine's own loops (attention heads, matrix rows).
// The only pool: dense f32 products call OpenBLAS single-threaded from the pool's threads.
#include <atomic>
#include <cstdint>
#include <functional>
#include <utility>

#include "kvslim/threads.h"  // set_num_threads, num_threads, available_cores

namespace kvslim {

/// Held around every OpenBLAS call. Each thread inside an OpenBLAS call takes a work buffer of
/// about 128 MiB of address space, and OpenBLAS retries a failed allocation forever, so under an
/// address-space limit (ulimit -v) many threads calling at once hung the process. With such a
/// limit at most max(1, limit / 1 GiB) threads are inside OpenBLAS at a time (the others wait);
/// without one the guard costs nothing. OpenBLAS keeps a buffer once mapped, so under a limit the
/// first thread to need a new one checks that the buffer's address space is free before calling
/// in; where it is not, the constructor throws kvslim::Error naming the limit (rather than
/// OpenBLAS spinning forever on its failed mmap).
class BlasSlot {
 public:
  /// Throws kvslim::Error when an address-space limit leaves no room for OpenBLAS's buffer.
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

/// A range of work units [0, n) (n < 2^32) claimed from both ends without a lock: its owner takes
/// runs from the front, other threads take runs from the back once their own work is done. Every
/// unit is handed out exactly once, whichever threads claim and in whatever order.
class alignas(64) RangeClaim {
 public:
  explicit RangeClaim(int64_t n = 0) { reset(n); }
  /// Sets the range to [0, n) (no thread may be claiming meanwhile). Throws kvslim::Error unless
  /// 0 <= n < 2^32.
  void reset(int64_t n);
  /// Claims up to k units from the front: returns [b, e) with e - b = min(k, left), or b == e when
  /// none are left.
  std::pair<int64_t, int64_t> front(int64_t k) { return take(k, true); }
  /// Claims up to k units from the back (same contract).
  std::pair<int64_t, int64_t> back(int64_t k) { return take(k, false); }
  /// Units not yet claimed.
  int64_t left() const;

 private:
  std::pair<int64_t, int64_t> take(int64_t k, bool from_front);
  std::atomic<uint64_t> fb_{0};  // next front unit in the low 32 bits, the end of the rest in the high 32
};

}  // namespace kvslim
