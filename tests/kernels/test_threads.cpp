#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/threads.h"
#include "kvslim/error.h"

using namespace kvslim;

// Regression: a pool grown after earlier parallel regions replayed the last finished region in
// its new workers and hung.
TEST(Threads, ResizingBetweenRegionsCoversEachIndexOnce) {
  for (int n : {1, 2, 1, 3, 2, 4, 2}) {
    set_num_threads(n);
    for (int rep = 0; rep < 3; ++rep) {
      std::vector<std::atomic<int>> hits(1000);
      parallel_for(1000, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1) << "threads " << n;
    }
  }
  set_num_threads(2);
}

TEST(Threads, NestedRegionRunsInline) {
  set_num_threads(2);
  std::atomic<int> total{0};
  parallel_for(4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      parallel_for(10, [&](int64_t b2, int64_t e2) { total += static_cast<int>(e2 - b2); });
  });
  EXPECT_EQ(total.load(), 40);
}

// Many short regions back to back (as in decode), with fewer indices than threads in some: each
// index exactly once, and a region's work is finished when parallel_for returns. Also regions
// after a pause long enough for the workers to stop spinning and sleep.
TEST(Threads, RapidAndSparseRegionsCoverEachIndexOnce) {
  for (int threads : {2, 3}) {
    set_num_threads(threads);
    int64_t sum = 0, expect = 0;
    for (int rep = 0; rep < 3000; ++rep) {
      const int n = 1 + rep % 5;
      std::vector<int> hits(n, 0);
      parallel_for(n, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int i = 0; i < n; ++i) {
        ASSERT_EQ(hits[i], 1) << "threads " << threads << " region " << rep;
        sum += hits[i] * i;
        expect += i;
      }
      if (rep % 1000 == 999) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(sum, expect);
  }
  set_num_threads(2);
}

// Regression: an exception thrown in a worker's range escaped the worker thread and called
// std::terminate (a Q-filters file that did not fit the model aborted `generate -t 2` and killed
// `kvslim serve`). It is rethrown on the calling thread once every range has finished, and the
// pool keeps working afterwards.
TEST(Threads, ExceptionInWorkerIsRethrownOnCaller) {
  set_num_threads(3);
  const auto caller = std::this_thread::get_id();
  for (int rep = 0; rep < 50; ++rep) {
    std::atomic<int> done{0};
    std::string what;
    try {
      parallel_for(300, [&](int64_t b, int64_t e) {
        // Only the last range (never the caller's: it runs [0, n / parts)) throws.
        if (e == 300 && std::this_thread::get_id() != caller) throw std::runtime_error("worker failed");
        done += static_cast<int>(e - b);
      });
    } catch (const std::runtime_error& err) {
      what = err.what();
    }
    ASSERT_EQ(what, "worker failed") << "rep " << rep;
    EXPECT_EQ(done.load(), 200);  // the two other ranges (0-100, 100-200) ran to the end
  }
  // The caller's own range throwing is rethrown the same way, after the workers finished.
  std::atomic<int> done{0};
  EXPECT_THROW(parallel_for(300,
                            [&](int64_t b, int64_t e) {
                              if (b == 0) throw std::invalid_argument("caller failed");
                              done += static_cast<int>(e - b);
                            }),
               std::invalid_argument);
  EXPECT_EQ(done.load(), 200);
  // Still usable: every index once, no stale error rethrown.
  std::vector<std::atomic<int>> hits(1000);
  parallel_for(1000, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[i]++;
  });
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  set_num_threads(2);
}

// Hand-worked: the front and back runs meet without overlap, and an empty range claims nothing.
TEST(Threads, RangeClaimTakesFromBothEnds) {
  RangeClaim c(10);
  EXPECT_EQ(c.front(4), (std::pair<int64_t, int64_t>{0, 4}));
  EXPECT_EQ(c.back(3), (std::pair<int64_t, int64_t>{7, 10}));
  EXPECT_EQ(c.left(), 3);
  EXPECT_EQ(c.back(5), (std::pair<int64_t, int64_t>{4, 7}));
  EXPECT_EQ(c.left(), 0);
  auto f = c.front(2), b = c.back(2);
  EXPECT_EQ(f.first, f.second);
  EXPECT_EQ(b.first, b.second);
  c.reset(0);
  f = c.front(1);
  EXPECT_EQ(f.first, f.second);
  EXPECT_THROW(c.reset(int64_t{1} << 32), Error);
  EXPECT_THROW(c.reset(-1), Error);
}

// One owner claiming from the front while three threads claim from the back: each unit once.
TEST(Threads, RangeClaimHandsOutEachUnitOnceUnderContention) {
  constexpr int64_t n = 200000;
  std::vector<std::atomic<int>> hits(n);
  RangeClaim c(n);
  auto take = [&](bool from_front, int64_t k) {
    for (;;) {
      const auto u = from_front ? c.front(k) : c.back(k);
      if (u.first >= u.second) return;
      ASSERT_GE(u.first, 0);
      ASSERT_LE(u.second, n);
      for (int64_t i = u.first; i < u.second; ++i) hits[static_cast<size_t>(i)]++;
    }
  };
  std::vector<std::thread> th;
  th.emplace_back(take, true, 5);
  for (int k : {1, 3, 7}) th.emplace_back(take, false, k);
  for (auto& t : th) t.join();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "unit " << i;
}
