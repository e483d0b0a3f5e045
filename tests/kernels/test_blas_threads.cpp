// The OpenBLAS the build links is safe to call from several threads at once, as the engine's pool
// does (one single-threaded sgemm per tile on every thread). Regression: Debian's single-threaded
// OpenBLAS 0.3.21 (libopenblas-serial-dev) returned wrong products for a few hundred of 24000
// concurrent calls of mixed shapes from 4 to 8 threads; the pthread build returned none.
#include <gtest/gtest.h>

#include <cblas.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

TEST(BlasThreads, ConcurrentProductsEqualTheSameProductsMadeAlone) {
  openblas_set_num_threads(1);  // as the engine calls it (kernels/threads.cpp)
  struct Shape {
    int m, n, k;
  };
  std::vector<Shape> shapes;
  for (int m : {4, 5, 43, 97, 141})
    for (int n : {44, 64, 128, 172})
      for (int k : {64, 172, 256}) shapes.push_back({m, n, k});
  std::mt19937 g(7);
  std::normal_distribution<float> d;
  std::vector<float> A(141 * 256), B(172 * 256);
  for (float& x : A) x = d(g);
  for (float& x : B) x = d(g);
  // Reference: each shape made alone, on this thread.
  std::vector<std::vector<float>> ref(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape s = shapes[i];
    ref[i].resize(static_cast<size_t>(s.m) * s.n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.m, s.n, s.k, 1.0f, A.data(), s.k, B.data(), s.k, 0.0f,
                ref[i].data(), s.n);
  }
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 r(static_cast<unsigned>(t));
      std::vector<float> C(141 * 172);
      for (int i = 0; i < 1500; ++i) {
        const size_t j = r() % shapes.size();
        const Shape s = shapes[j];
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s.m, s.n, s.k, 1.0f, A.data(), s.k, B.data(), s.k, 0.0f,
                    C.data(), s.n);
        if (std::memcmp(C.data(), ref[j].data(), ref[j].size() * sizeof(float)) != 0) ++wrong;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0) << "of 12000 concurrent sgemm calls (" << openblas_get_config() << ")";
}
