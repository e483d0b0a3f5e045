// Does work that depends on each loaded line slow a two-thread stream on two chiplets more than on one?
// g++ -O3 -march=native -std=c++17 stream_work.cpp -o stream_work -lpthread && ./stream_work ROUNDS [1: 2 MiB pages]
// (session 27: stream_work_huge.txt with ./stream_work 100 1; stream_work.txt, 4 KiB pages, before the option existed)
// pin() and pingpong() (one-way hand-off between cpu0 and cpu1) from session 25's probe:
#define PINGPONG_NO_MAIN
#include "../zen4_s25/scripts_hack/pingpong_read.cpp"
#include <sys/mman.h>
template <int K>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) uint64_t stream(const uint8_t* b, size_t n) {
  const __m512i* p = (const __m512i*)b;
  __m512i a[8]; for (auto& x : a) x = _mm512_setzero_si512();
  const __m512i c = _mm512_set1_epi8(3);
  for (size_t i = 0; i < n / 64; i += 4) {
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      __m512i x = _mm512_load_si512(p + i + u);
      if (K == 0) a[u] = _mm512_add_epi32(a[u], x);
#pragma GCC unroll 16
      for (int k = 0; k < K; ++k) a[(u * 2 + k) & 7] = _mm512_dpbusd_epi32(a[(u * 2 + k) & 7], x, c);
    }
  }
  __m512i s = a[0]; for (int i = 1; i < 8; ++i) s = _mm512_add_epi32(s, a[i]);
  return (uint64_t)_mm512_reduce_add_epi32(s);
}
template <int K>
double rate(const uint8_t* buf, size_t n, int threads) {
  std::vector<std::thread> ts; std::atomic<uint64_t> sink{0};
  auto t0 = std::chrono::steady_clock::now();
  for (int k = 0; k < threads; ++k) ts.emplace_back([&, k] { pin(k); sink += stream<K>(buf + n / threads * k, n / threads); });
  for (auto& t : ts) t.join();
  return n / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9;
}
int main(int argc, char** argv) {
  size_t n = size_t(1) << 30; uint8_t* buf = (uint8_t*)aligned_alloc(1 << 21, n);
  if (argc > 2 && atoi(argv[2])) madvise(buf, n, MADV_HUGEPAGE);  // 2 MiB pages, as the packed weights get
  memset(buf, 1, n);
  int rounds = argc > 1 ? atoi(argv[1]) : 20;
  { // in cache: one thread, 512 KiB read 2048 times
    auto inc = [&](auto f, const char* name) { auto t0 = std::chrono::steady_clock::now(); uint64_t s = 0; for (int i = 0; i < 2048; ++i) s += f(buf, 1 << 19); double gb = 2048.0 * (1 << 19) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9; printf("in cache %s %.1f GB/s (%llu)\n", name, gb, (unsigned long long)(s & 1)); };
    pin(0);
    inc(stream<0>, "K0"); inc(stream<4>, "K4"); inc(stream<5>, "K5"); inc(stream<6>, "K6"); inc(stream<7>, "K7"); inc(stream<8>, "K8"); inc(stream<1>, "K1"); inc(stream<2>, "K2"); inc(stream<3>, "K3");
  }
  for (int r = 0; r < rounds; ++r) {
    if (r) std::this_thread::sleep_for(std::chrono::seconds(3));
    double pp = pingpong(100000);
    double r0 = rate<0>(buf, n, 2), r4 = rate<1>(buf, n, 2), r5 = rate<2>(buf, n, 2), r6 = rate<3>(buf, n, 2), r7 = rate<4>(buf, n, 2);
    double pp2 = pingpong(100000);
    time_t now = time(nullptr); char ts[16]; strftime(ts, sizeof ts, "%T", gmtime(&now));
    printf("%s hand-off %3.0f/%3.0f ns | 2 threads GB/s: K0 %.1f K1 %.1f (%.2f) K2 %.1f (%.2f) K3 %.1f (%.2f) K4 %.1f (%.2f)\n", ts, pp, pp2, r0, r4, r4/r0, r5, r5/r0, r6, r6/r0, r7, r7/r0); fflush(stdout);
  }
}
