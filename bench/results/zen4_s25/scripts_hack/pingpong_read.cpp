// ping-pong latency between cpu0 and cpu1, and 2-thread / 1-thread plain read rate, repeated
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
#include <pthread.h>
#include <sched.h>
#include <cstdint>
#include <cstdlib>
#include <immintrin.h>
static void pin(int c) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(c, &s); pthread_setaffinity_np(pthread_self(), sizeof s, &s); }
alignas(64) std::atomic<int> flag{0};
double pingpong(int iters) {
  flag = 0;
  std::thread t([&] { pin(1); for (int i = 0; i < iters; ++i) { while (flag.load(std::memory_order_acquire) != 2 * i + 1) _mm_pause(); flag.store(2 * i + 2, std::memory_order_release); } });
  pin(0);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) { flag.store(2 * i + 1, std::memory_order_release); while (flag.load(std::memory_order_acquire) != 2 * i + 2) _mm_pause(); }
  double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / iters;
  t.join();
  return ns / 2;  // one-way
}
double readrate(const uint8_t* buf, size_t n, int threads) {
  std::vector<std::thread> ts; std::atomic<uint64_t> sink{0};
  auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < threads; ++k) ts.emplace_back([&, k] { pin(k); const __m256i* p = (const __m256i*)(buf + n / threads * k); __m256i a = _mm256_setzero_si256(); for (size_t i = 0; i < n / threads / 32; ++i) a = _mm256_add_epi64(a, _mm256_load_si256(p + i)); sink += _mm256_extract_epi64(a, 0); });
  for (auto& t : ts) t.join();
  return n / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9;
}
#ifndef PINGPONG_NO_MAIN  // session 27's stream_work.cpp includes pin() and pingpong() from here
int main(int argc, char** argv) {
  size_t n = size_t(1) << 30; uint8_t* buf = (uint8_t*)aligned_alloc(1 << 21, n); memset(buf, 1, n);
  int rounds = argc > 1 ? atoi(argv[1]) : 20;
  for (int r = 0; r < rounds; ++r) {
    double r2 = readrate(buf, n, 2), r1 = readrate(buf, n / 2, 1), pp = pingpong(200000);
    time_t now = time(nullptr); char ts[16]; strftime(ts, sizeof ts, "%T", gmtime(&now));
    printf("%s read 2 threads %.1f GB/s, 1 thread %.1f GB/s, one-way cpu0<->cpu1 %.0f ns\n", ts, r2, r1, pp); fflush(stdout);
  }
}
#endif
