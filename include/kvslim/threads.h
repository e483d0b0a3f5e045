#pragma once
// How many threads the engine's loops use (one pool per process; see src/kernels/threads.h).

namespace kvslim {

/// Sets the number of threads the engine uses (>= 1) and keeps OpenBLAS single-threaded.
/// Waiting threads spin briefly only while n is at most available_cores(); above it they sleep
/// at once, so more threads than cores costs wake-ups, never a machine spinning on itself.
void set_num_threads(int n);
/// The number of threads set (1 until set_num_threads is called).
int num_threads();
/// CPUs this process may run on (its affinity mask), at least 1.
int available_cores();

}  // namespace kvslim
