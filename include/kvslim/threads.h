#pragma once
// How many threads the engine's loops use (one pool per process; see src/kernels/threads.h).
#include <cstddef>
#include <string>

namespace kvslim {

/// Sets the number of threads the engine uses (>= 1) and keeps OpenBLAS single-threaded.
/// Waiting threads spin briefly only while n is at most available_cores(); above it they sleep
/// at once, so more threads than cores costs wake-ups, never a machine spinning on itself.
void set_num_threads(int n);
/// The number of threads set (1 until set_num_threads is called).
int num_threads();
/// CPUs this process may run on (its affinity mask), at least 1.
int available_cores();
/// Whether the OpenBLAS loaded at run time has no threads of its own (one thread, as the kvslim
/// executable starts it; see CMakeLists.txt).
bool blas_single_threaded();
/// The OpenBLAS loaded at run time, e.g. "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH NO_AFFINITY
/// Haswell MAX_THREADS=64 (one thread: none of its own)"; "(N threads of its own)" otherwise.
std::string blas_description();
/// The address-space limit (RLIMIT_AS, `ulimit -v`) in bytes; 0 when unlimited.
size_t address_space_limit();

}  // namespace kvslim
