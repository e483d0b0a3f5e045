#pragma once
// Whether the decode kernels request weight lines ahead of their reads (software prefetch).
//
// The packed decode kernels read each thread's weights as one stream. Whether software requests
// ahead of that stream help depends on the core: on AMD Zen 5 requesting every block
// 4 blocks ahead read 0.87-0.91 of the plain read rate against 0.66-0.72 without; on AMD Zen 4
// the same requests halved the stream instead (one thread, q4_K: 34 GMAC/s
// against 59 without; Q4_K_M decode at 512 at 65-70 GB/s: 50% of the paired read floor against
// 72-77%), and the hardware prefetchers alone read at the plain rate. Results are the same bits
// either way: requests only move lines earlier.
#include <string>

namespace kvslim::qdot {

enum class Prefetch : int {
  None = 0,   ///< no software requests: the hardware prefetchers follow the stream
  Ahead = 1,  ///< the packed rows requested a fixed distance ahead of the reads (StreamPrefetch)
};

/// The setting measured best on this CPU: None on AMD family 19h (Zen 3 and Zen 4; measured on
/// Zen 4 only), Ahead elsewhere (measured on Zen 5; Intel untimed).
Prefetch default_prefetch();
/// The setting the kernels use: KVSLIM_PREFETCH (none|ahead) when set, else default_prefetch(),
/// or the last set_prefetch(). An unknown KVSLIM_PREFETCH value is reported once on stderr and the
/// default is used (as KVSLIM_SIMD).
Prefetch prefetch();
/// Selects the setting (tests, benchmarks).
void set_prefetch(Prefetch p);
/// "none" or "ahead".
const char* prefetch_name(Prefetch p);
/// The setting named `name`; throws kvslim::Error naming it otherwise.
Prefetch parse_prefetch(const std::string& name);

}  // namespace kvslim::qdot
