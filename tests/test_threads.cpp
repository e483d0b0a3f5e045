#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "kernels/threads.h"

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
