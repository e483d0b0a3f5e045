#include "run/decode_floor.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "kernels/packed_weights.h"
#include "kernels/threads.h"
#include "kvslim/error.h"

namespace kvslim {

namespace {

constexpr size_t kSpan = size_t{2} << 20;

// Sum of n bytes (a multiple of 128, p 32-byte aligned) as 64-bit lanes of V, four loads in
// flight. 32-byte loads where the CPU has AVX2 (they read 5-10% faster than 16-byte ones on Zen 5,
// so the floor is not set low by the probe); SSE2, the x86-64 baseline, elsewhere. One body for
// both: the target attribute of the caller it is inlined into gives the instructions.
using U64x2 = uint64_t __attribute__((vector_size(16), may_alias));
using U64x4 = uint64_t __attribute__((vector_size(32), may_alias));

template <class V>
inline __attribute__((always_inline)) uint64_t read_sum(const uint8_t* p, size_t n) {
  V s0{}, s1{}, s2{}, s3{};
  for (size_t i = 0; i < n; i += 4 * sizeof(V)) {
    const V* v = reinterpret_cast<const V*>(p + i);
    s0 += v[0];
    s1 += v[1];
    s2 += v[2];
    s3 += v[3];
  }
  const V s = (s0 + s1) + (s2 + s3);
  uint64_t total = 0;
  for (size_t k = 0; k < sizeof(V) / 8; ++k) total += s[k];
  return total;
}

__attribute__((target("avx2"))) uint64_t read_sum_avx2(const uint8_t* p, size_t n) { return read_sum<U64x4>(p, n); }
uint64_t read_sum_sse2(const uint8_t* p, size_t n) { return read_sum<U64x2>(p, n); }

}  // namespace

size_t decode_weight_bytes(const GGUFFile& f) {
  const bool tied = f.find_tensor("output.weight") == nullptr;
  size_t total = 0;
  for (const TensorInfo& t : f.tensors()) {
    if (t.name == "token_embd.weight" && !tied) {
      const int64_t rows = t.ne.size() > 1 ? t.ne[1] : 1;
      total += t.nbytes / static_cast<size_t>(std::max<int64_t>(1, rows));
      continue;
    }
    total += t.nbytes;
  }
  return total;
}

size_t last_level_cache_bytes() {
  size_t best = 0;
  int best_level = 0;
  for (int i = 0; i < 16; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream lf(dir + "level"), sf(dir + "size");
    int level = 0;
    std::string size;
    if (!(lf >> level) || !(sf >> size) || size.empty()) continue;
    size_t v = 0;
    try {
      v = std::stoull(size);
    } catch (const std::exception&) {
      continue;
    }
    const char unit = size.back();
    if (unit == 'K') v <<= 10;
    else if (unit == 'M') v <<= 20;
    else if (unit == 'G') v <<= 30;
    if (level > best_level || (level == best_level && v > best)) best_level = level, best = v;
  }
  return best;
}

namespace {

uint8_t* allocate_probe(size_t bytes) {
  void* raw = nullptr;
  if (posix_memalign(&raw, kSpan, bytes) != 0)
    throw Error(fmt::format("cannot allocate {} MiB to time the memory's read rate", bytes >> 20));
  return static_cast<uint8_t*>(raw);
}

}  // namespace

ReadProbe::ReadProbe(size_t bytes)
    : buf_(nullptr, std::free), bytes_(std::max(kSpan, bytes / kSpan * kSpan)) {
  buf_.reset(allocate_probe(bytes_));
  // The same page size as the packed weights get (kernels/packed_weights.h).
  if (qdot::huge_pages_enabled()) madvise(buf_.get(), bytes_, MADV_HUGEPAGE);
  std::memset(buf_.get(), 1, bytes_);
}

double ReadProbe::pass() {
  const int nt = num_threads();
  const size_t share = bytes_ / nt / 128 * 128;
  static const bool avx2 = __builtin_cpu_supports("avx2");
  std::vector<uint64_t> sink(static_cast<size_t>(nt));
  const auto t0 = std::chrono::steady_clock::now();
  parallel_for(nt, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const uint8_t* p0 = buf_.get() + share * i;
      sink[i] = avx2 ? read_sum_avx2(p0, share) : read_sum_sse2(p0, share);
    }
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Every byte was written as 1: the sums keep the loads from being dropped and check the pass.
  for (uint64_t v : sink)
    if (v != uint64_t{share / 8} * 0x0101010101010101ULL)  // (mod 2^64, as the adds wrap)
      throw Error("read probe: the buffer did not read back as written");
  return static_cast<double>(share * nt) / std::max(s, 1e-9) / 1e9;
}

double thread_handoff_ns(int round_trips) {
  if (round_trips < 1) throw Error(fmt::format("thread hand-off: round trips must be >= 1, not {}", round_trips));
  if (num_threads() < 2) return 0;
  // Odd values are part 0's moves, even values part 1's answers; -1 tells both to stop.
  alignas(64) std::atomic<int64_t> flag{0};
  std::atomic<bool> timed_out{false};
  double seconds = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  // Waits until flag == want; false when the other side stopped or the deadline passed.
  auto wait_for = [&](int64_t want) {
    for (int i = 0;; ++i) {
      const int64_t v = flag.load(std::memory_order_acquire);
      if (v == want) return true;
      if (v < 0) return false;
      if ((i & 1023) == 1023) {
        if (std::chrono::steady_clock::now() > deadline) {
          timed_out = true;
          flag.store(-1, std::memory_order_release);
          return false;
        }
        std::this_thread::yield();  // the other thread may share this core (a busy machine)
      }
    }
  };
  parallel_for(2, [&](int64_t b, int64_t e) {
    if (e - b != 1) return;  // both parts on one thread (a nested region): nothing to time
    if (b == 0) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < round_trips; ++i) {
        flag.store(2 * i + 1, std::memory_order_release);
        if (!wait_for(2 * i + 2)) return;
      }
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      flag.store(-1, std::memory_order_release);
    } else {
      for (int64_t i = 0;; ++i) {
        if (!wait_for(2 * i + 1)) return;
        flag.store(2 * i + 2, std::memory_order_release);
      }
    }
  });
  if (timed_out || seconds <= 0) return 0;
  return seconds * 1e9 / round_trips / 2;
}

std::vector<double> ReadProbe::passes(int n) {
  if (n < 1) throw Error(fmt::format("read probe: passes must be >= 1, not {}", n));
  std::vector<double> rates;
  for (int p = 0; p < n; ++p) rates.push_back(pass());
  return rates;
}

}  // namespace kvslim
