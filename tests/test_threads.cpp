#include <gtest/gtest.h>

#include <atomic>
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
