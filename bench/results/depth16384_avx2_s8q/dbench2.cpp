// Attention kernel timing used for kernel-ab-*.txt (not part of the build): f16 segments of n entries, one thread,
// thread CPU time. Build against a build directory's library, optionally with another attention object first:
//   g++ -std=gnu++20 -O2 -Iinclude -Isrc dbench.cpp [attention_other.o] -o dbench BUILD/libkvslim.a $(pkg-config --libs
//     openblas libpcre2-8 cpp-httplib libcrypto) -lfmt -lpthread
// Usage: dbench N NSEG MODES [REPS]; MODES: w = decode on one segment, c = decode over NSEG segments (scaled to
// 88 = 22 layers x 4 KV heads), p = a prefill tile of 64 rows.
#include <time.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>
#include "kernels/attention.h"
#include "kvslim/kv_cache.h"
using namespace kvslim;
static double ts() { timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void stats(const char* name, const std::function<void()>& f, int reps, double scale) {
  f(); std::vector<double> v;
  for (int i = 0; i < reps; ++i) { double t0 = ts(); f(); v.push_back(ts() - t0); }
  std::sort(v.begin(), v.end());
  std::printf("%-28s min %9.1f  med %9.1f\n", name, v[0] * scale, v[v.size() / 2] * scale);
}
int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 4096; const int nseg = argc > 2 ? atoi(argv[2]) : 88;
  const std::string what = argc > 3 ? argv[3] : "dwcp";
  const int hd = 64, G = 8;
  std::mt19937 rng(1); std::normal_distribution<float> nd;
  const float kvs = getenv("KVSCALE") ? atof(getenv("KVSCALE")) : 1.0f;
  std::vector<Segment> segs; std::vector<float> k(hd), v(hd), q(512 * hd), out(512 * hd);
  const float qs = getenv("QSCALE") ? atof(getenv("QSCALE")) : 1.0f; for (float& x : q) x = nd(rng) * qs;
  for (int s = 0; s < nseg; ++s) { segs.emplace_back(hd, KVCodec::F16, KVCodec::F16, KVQuantOptions{});
    for (int i = 0; i < n; ++i) { for (int d = 0; d < hd; ++d) k[d] = nd(rng) * kvs, v[d] = nd(rng) * kvs; segs.back().append(k.data(), v.data(), i); } }
  std::vector<int32_t> vis(512, n);
  if (what.find('w') != std::string::npos)
    stats("decode warm us/head", [&] { attend_segment(segs[0], q.data(), G, vis.data(), 0.125f, out.data(), hd); }, argc > 4 ? atoi(argv[4]) : 200, 1e6);
  if (what.find('c') != std::string::npos)
    stats("decode cold ms/88 heads", [&] { for (int s = 0; s < nseg; ++s) attend_segment(segs[s], q.data(), G, vis.data(), 0.125f, out.data(), hd); }, 15, 1e3 * 88.0 / nseg);
  if (what.find('p') != std::string::npos) {
    for (int r = 0; r < 64; ++r) vis[r] = n - 8 + r / G + 1;
    stats("prefill 64 rows us", [&] { attend_segment(segs[0], q.data(), 64, vis.data(), 0.125f, out.data(), hd); }, argc > 4 ? atoi(argv[4]) : 30, 1e6);
  }
  for (int R : {128, 256}) if (what.find(R == 128 ? 'P' : 'Q') != std::string::npos) {
    for (int r = 0; r < R; ++r) vis[r] = n - R / G + r / G + 1;
    stats((std::to_string(R) + " rows us per 64").c_str(), [&] { attend_segment(segs[0], q.data(), R, vis.data(), 0.125f, out.data(), hd); }, argc > 4 ? atoi(argv[4]) : 30, 1e6 * 64 / R);
  }
  if (what.find('L') != std::string::npos) {
    // One layer's prefill attention of a 512-token batch at depth n: 4 KV heads x 64 tiles, with a
    // 64 MiB sweep before each layer (the weights passing through the caches); only attention timed.
    std::vector<char> sweep(64 << 20, 1);
    const int LR = getenv("LROWS") ? atoi(getenv("LROWS")) : 64;
    for (int r = 0; r < LR; ++r) vis[r] = n - LR / G + r / G + 1;
    std::vector<double> tl;
    for (int rep = 0; rep < (argc > 4 ? atoi(argv[4]) : 5); ++rep) {
      long acc = 0; for (size_t i = 0; i < sweep.size(); i += 64) acc += sweep[i]++;
      double t0 = ts();
      for (int s = 0; s < std::min(nseg, 4); ++s) for (int t = 0; t < 64 * 64 / LR; ++t)
        attend_segment(segs[s], q.data(), LR, vis.data(), 0.125f, out.data(), hd);
      tl.push_back((ts() - t0) * 1e6 / (64.0 * std::min(nseg, 4)));
      if (acc == 42) std::printf(".");
    }
    std::sort(tl.begin(), tl.end());
    std::printf("layer-like us per 64-row tile min %9.1f  med %9.1f\n", tl[0], tl[tl.size() / 2]);
  }
  double cs = 0; for (int i = 0; i < 64 * hd; ++i) cs += out[i] * (i % 7 + 1);
  std::printf("checksum %.9g\n", cs);
}
