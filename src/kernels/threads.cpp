#include "kernels/threads.h"

#include <cblas.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace kvslim {

namespace {

class Pool {
 public:
  ~Pool() { stop(); }
  void resize(int n) {
    stop();
    n_ = std::max(1, n);
    quit_ = false;
    // New workers start from the current generation so they never replay a finished region.
    for (int i = 1; i < n_; ++i) workers_.emplace_back([this, i, g = generation_] { loop(i, g); });
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
    {
      std::lock_guard<std::mutex> g(mu_);
      fn_ = &fn;
      total_ = n;
      parts_ = parts;
      pending_ = parts - 1;
      ++generation_;
    }
    cv_.notify_all();
    in_region_ = true;
    fn(0, n / parts);
    in_region_ = false;
    std::unique_lock<std::mutex> l(mu_);
    done_cv_.wait(l, [this] { return pending_ == 0; });
    fn_ = nullptr;
  }

 private:
  void loop(int idx, uint64_t seen) {
    for (;;) {
      const std::function<void(int64_t, int64_t)>* fn;
      int64_t b = 0, e = 0;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return quit_ || generation_ != seen; });
        if (quit_) return;
        seen = generation_;
        if (idx >= parts_) continue;
        fn = fn_;
        b = total_ * idx / parts_;
        e = total_ * (idx + 1) / parts_;
      }
      in_region_ = true;
      (*fn)(b, e);
      in_region_ = false;
      std::lock_guard<std::mutex> g(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
  void stop() {
    {
      std::lock_guard<std::mutex> g(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }
  static thread_local bool in_region_;
  int n_ = 1;
  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t total_ = 0;
  int parts_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool quit_ = false;
};

thread_local bool Pool::in_region_ = false;

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

void set_num_threads(int n) {
  n = std::max(1, n);
  if (n != pool().size()) pool().resize(n);
  openblas_set_num_threads(n);
}

int num_threads() { return pool().size(); }

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) { pool().run(n, fn); }

}  // namespace kvslim
