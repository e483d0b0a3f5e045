#include "kernels/threads.h"

#include <cblas.h>
#include <immintrin.h>
#include <malloc.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <semaphore>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "kvslim/error.h"

namespace kvslim {

namespace {

// A decode step runs about a hundred short parallel regions back to back (four products per layer
// plus attention). Waking a sleeping thread costs tens of microseconds, more in a virtual machine,
// which adds up to several milliseconds per token; so both sides first spin for a while on atomics
// and only then sleep on a condition variable (between tokens, or when the machine is idle).
// With more threads than cores a spinning thread takes the core from the one holding the work,
// so an oversubscribed pool (or one told the machine is busy) does not spin at all.
constexpr std::chrono::microseconds kSpin{250};

// Spins until done() or `spin` has passed; returns done().
template <class F>
bool spin_until(F done, std::chrono::microseconds spin) {
  if (spin.count() == 0) return done();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0;; ++i) {
    if (done()) return true;
    _mm_pause();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() - t0 > spin) return done();
  }
}

// Publication: run() writes the region (fn_, total_, parts_) and then bumps generation_; a worker
// that sees the new generation (acquire) sees the region. A sleeper is woken only if it announced
// itself (sleepers_ / main_waiting_) before re-checking the condition under the mutex; both sides
// use sequentially consistent operations, so one of them always sees the other (no lost wake-up).
class Pool {
 public:
  Pool() {
    openblas_set_num_threads(1);  // see set_num_threads
    // Under an address-space limit each thread's malloc arena (64 MiB reserved) left too little
    // for OpenBLAS's buffer, and OpenBLAS retries a failed allocation forever.
    rlimit lim{};
    if (getrlimit(RLIMIT_AS, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) mallopt(M_ARENA_MAX, 1);
  }
  ~Pool() { stop(); }
  void resize(int n) {
    stop();
    n_ = std::max(1, n);
    spin_ = n_ <= available_cores() ? kSpin : std::chrono::microseconds{0};
    quit_ = false;
    // New workers start from the current generation so they never replay a finished region.
    const uint64_t g = generation_.load();
    for (int i = 1; i < n_; ++i) workers_.emplace_back([this, i, g] { loop(i, g); });
  }
  int size() const { return n_; }
  void run(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    int parts = static_cast<int>(std::min<int64_t>(n_, n));
    if (parts <= 1 || in_region_) {  // nested regions run inline rather than deadlock
      fn(0, n);
      return;
    }
    std::unique_lock<std::mutex> run_lock(run_mu_);  // one parallel region at a time
    fn_ = &fn;
    total_ = n;
    parts_ = parts;
    // Every worker acknowledges every region, even one with no part of it, so that none can
    // still be reading fn_ / total_ / parts_ when the next region overwrites them.
    pending_.store(n_ - 1);
    generation_.fetch_add(1);
    if (sleepers_.load() > 0) {
      std::lock_guard<std::mutex> g(mu_);
      cv_.notify_all();
    }
    in_region_ = true;
    try {
      fn(0, n / parts);
    } catch (...) {
      keep_first_error(std::current_exception());
    }
    in_region_ = false;
    // Always wait for every worker, even after an error: they still read fn_ (and fn's captures).
    if (!spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; }, spin_)) {
      std::unique_lock<std::mutex> l(mu_);
      main_waiting_.store(true);
      done_cv_.wait(l, [this] { return pending_.load() == 0; });
      main_waiting_.store(false);
    }
    fn_ = nullptr;
    // An exception thrown by any part (the caller's or a worker's; the first one recorded wins)
    // is rethrown here, on the calling thread, once the region has finished: escaping a worker's
    // loop it would have called std::terminate.
    std::exception_ptr err;
    {
      std::lock_guard<std::mutex> g(err_mu_);
      err.swap(error_);
    }
    if (err) std::rethrow_exception(err);
  }

 private:
  void loop(int idx, uint64_t seen) {
    for (;;) {
      auto ready = [&] { return quit_.load() || generation_.load(std::memory_order_acquire) != seen; };
      if (!spin_until(ready, spin_)) {
        std::unique_lock<std::mutex> l(mu_);
        sleepers_.fetch_add(1);
        cv_.wait(l, ready);
        sleepers_.fetch_sub(1);
      }
      if (quit_.load()) return;
      seen = generation_.load(std::memory_order_acquire);
      if (idx < parts_) {
        const int64_t b = total_ * idx / parts_, e = total_ * (idx + 1) / parts_;
        in_region_ = true;
        try {
          (*fn_)(b, e);
        } catch (...) {
          keep_first_error(std::current_exception());
        }
        in_region_ = false;
      }
      if (pending_.fetch_sub(1) == 1 && main_waiting_.load()) {
        std::lock_guard<std::mutex> g(mu_);
        done_cv_.notify_one();
      }
    }
  }
  void keep_first_error(std::exception_ptr e) {
    std::lock_guard<std::mutex> g(err_mu_);
    if (!error_) error_ = std::move(e);
  }
  void stop() {
    {
      std::lock_guard<std::mutex> g(mu_);
      quit_.store(true);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }
  static thread_local bool in_region_;
  int n_ = 1;
  std::chrono::microseconds spin_{kSpin};  // set by resize() while no worker runs
  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_, done_cv_;
  // Written by run() before generation_ is bumped; read by workers after they see it.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t total_ = 0;
  int parts_ = 0;
  std::atomic<int> pending_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> main_waiting_{false}, quit_{false};
  std::mutex err_mu_;
  std::exception_ptr error_;  // first exception of the current region (guarded by err_mu_)
};

thread_local bool Pool::in_region_ = false;

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

namespace {

// nullptr when the address space is unlimited.
std::counting_semaphore<>* blas_slots() {
  static std::counting_semaphore<>* slots = []() -> std::counting_semaphore<>* {
    const size_t lim = address_space_limit();
    if (lim == 0) return nullptr;
    const auto k = static_cast<std::ptrdiff_t>(std::max<size_t>(1, lim >> 30));
    return new std::counting_semaphore<>(std::min<std::ptrdiff_t>(k, 1 << 20));
  }();
  return slots;
}

// What OpenBLAS 0.3.x maps for one thread's work buffer on x86-64 (BUFFER_SIZE, 32 << 22), plus
// a page of slack. It retries a failed mmap of it in an endless loop.
constexpr size_t kOpenBlasBuffer = (size_t{32} << 22) + (size_t{1} << 20);

// Threads inside OpenBLAS now, and the most there have been: OpenBLAS maps a buffer for each
// concurrent caller the first time that many call at once and keeps it, so only a caller that
// raises the maximum may need new address space.
std::mutex blas_mu;
int blas_inside = 0, blas_most = 0;

}  // namespace

size_t address_space_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_AS, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return 0;
  return static_cast<size_t>(lim.rlim_cur);
}

bool blas_single_threaded() { return openblas_get_parallel() == 0 || openblas_get_num_threads() == 1; }

std::string blas_description() {
  std::string s = openblas_get_config();
  while (!s.empty() && s.back() == ' ') s.pop_back();
  if (blas_single_threaded()) return s + " (one thread: none of its own)";
  return fmt::format("{} ({} threads of its own)", s, openblas_get_num_threads());
}

// Slots held by this thread: a thread that holds one already (a second guard in the same scope)
// does not wait for another, which with one slot would never come.
thread_local int blas_slots_held = 0;

BlasSlot::BlasSlot() {
  auto* s = blas_slots();
  if (!s) return;
  if (blas_slots_held++ > 0) {  // already inside with a buffer of its own
    held_ = true;
    return;
  }
  s->acquire();
  std::lock_guard<std::mutex> g(blas_mu);
  if (blas_inside + 1 > blas_most) {
    // Checked, not reserved: the space is handed back for OpenBLAS to map. Other threads may take
    // some meanwhile, but only the first calls at a new level of concurrency come here.
    void* p = mmap(nullptr, kOpenBlasBuffer, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      --blas_slots_held;
      s->release();
      throw Error(fmt::format("out of memory: OpenBLAS needs {} MiB of address space for its work buffer, which "
                              "the address-space limit of {} MiB (ulimit -v) does not leave free",
                              kOpenBlasBuffer >> 20, address_space_limit() >> 20));
    }
    munmap(p, kOpenBlasBuffer);
    blas_most = blas_inside + 1;
  }
  ++blas_inside;
  held_ = true;
}

BlasSlot::~BlasSlot() {
  if (!held_ || --blas_slots_held > 0) return;
  {
    std::lock_guard<std::mutex> g(blas_mu);
    --blas_inside;
  }
  blas_slots()->release();
}

void set_num_threads(int n) {
  n = std::max(1, n);
  if (n != pool().size()) pool().resize(n);
  // Every BLAS call runs single-threaded on whichever thread of our pool calls it: OpenBLAS's own
  // workers nested under ours oversubscribed the cores, and each new one allocates a large buffer
  // as it starts, which under a memory limit (ulimit -v) never returned, so the process hung.
  openblas_set_num_threads(1);
}

int num_threads() { return pool().size(); }

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) { pool().run(n, fn); }

void parallel_for(int64_t n, int64_t macs, const std::function<void(int64_t, int64_t)>& fn) {
  if (macs < kMinParallelMacs) {
    if (n > 0) fn(0, n);
    return;
  }
  pool().run(n, fn);
}

void RangeClaim::reset(int64_t n) {
  if (n < 0 || n >= (int64_t{1} << 32)) throw Error(fmt::format("RangeClaim: {} units, not in [0, 2^32)", n));
  fb_.store(static_cast<uint64_t>(n) << 32, std::memory_order_relaxed);
}

std::pair<int64_t, int64_t> RangeClaim::take(int64_t k, bool from_front) {
  uint64_t v = fb_.load(std::memory_order_relaxed);
  for (;;) {
    const int64_t f = static_cast<int64_t>(v & 0xffffffffu), b = static_cast<int64_t>(v >> 32);
    const int64_t n = std::min(std::max<int64_t>(k, 0), b - f);
    if (n <= 0) return from_front ? std::make_pair(f, f) : std::make_pair(b, b);
    const uint64_t next = from_front ? v + static_cast<uint64_t>(n) : v - (static_cast<uint64_t>(n) << 32);
    if (fb_.compare_exchange_weak(v, next, std::memory_order_relaxed))
      return from_front ? std::make_pair(f, f + n) : std::make_pair(b - n, b);
  }
}

int64_t RangeClaim::left() const {
  const uint64_t v = fb_.load(std::memory_order_relaxed);
  return std::max<int64_t>(0, static_cast<int64_t>(v >> 32) - static_cast<int64_t>(v & 0xffffffffu));
}

}  // namespace kvslim
