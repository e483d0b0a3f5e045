#pragma once
// The decode floor of `kvslim bench --floor`: a decode step reads every weight matrix once (and
// the KV cache), so it can run no faster than the machine's memory read rate divided by those
// bytes. decode_weight_bytes and ReadProbe give the two sides, measured in the same run as the decode.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvslim/gguf.h"

namespace kvslim {

/// Bytes of a GGUF file's tensors that one decode step reads at least: every tensor once, except
/// the token-embedding table "token_embd.weight", of which a step reads one row (the whole table
/// when the file has no "output.weight": the output product then reads it). The file's own bytes,
/// not the engine's repacked copy, so packing overhead counts against the engine.
size_t decode_weight_bytes(const GGUFFile& f);

/// Size of the CPU's last-level cache in bytes (cpu0's highest cache level in sysfs), 0 where
/// sysfs does not say.
size_t last_level_cache_bytes();

/// One-way latency (ns) of handing a cache line between the pool's first two threads: a flag
/// passed back and forth `round_trips` times, half the mean round trip. It tells how the threads
/// sit: cores sharing a last-level cache hand over in tens of ns, cores on separate ones (two
/// chiplets of an AMD EPYC, as a VM's vCPUs can be placed) in hundreds, and every hand-over of
/// data between parallel regions costs accordingly. 0 with fewer than two threads, or when the
/// other thread did not answer within a second (a busy machine). Throws kvslim::Error when
/// round_trips < 1.
double thread_handoff_ns(int round_trips = 20000);

/// A buffer of `bytes` (rounded down to whole 2 MiB spans, at least one), far larger than any
/// cache, written once (huge pages as the packed weights get them), then read whole by pass():
/// the memory side of the decode floor, for `bench --floor` and tools/gemv_stream_bench.
class ReadProbe {
 public:
  /// Throws kvslim::Error when the buffer cannot be allocated.
  explicit ReadProbe(size_t bytes);
  /// One read of the buffer with the pool's threads (each thread its own contiguous share, as
  /// the decode products read their rows): the rate in GB/s (1e9 bytes/s). Throws kvslim::Error
  /// if the bytes do not read back as written.
  double pass();
  /// n passes, the rate of each (GB/s). Throws kvslim::Error when n < 1 or a pass does.
  std::vector<double> passes(int n);
  /// Bytes one pass reads (resident while the probe lives).
  size_t bytes() const { return bytes_; }

 private:
  std::unique_ptr<uint8_t, void (*)(void*)> buf_;
  size_t bytes_;
};

}  // namespace kvslim
