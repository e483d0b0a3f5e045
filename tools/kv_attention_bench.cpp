// Attention speed over one KV segment per codec, on a TinyLlama-1.1B shape (head_dim 64, GQA
// group of 8 query heads per KV head, 22 layers x 4 KV heads): decode (8 query rows, every entry
// visible) and prefill (a tile of 8 tokens x 8 heads = 64 rows with causal prefixes) at several
// context depths. Also times the previous kernel's scheme (decode rows to f32, one dot product per
// row and entry, then axpy) on the f16 cache as a baseline. Single thread, CPU time of the thread (best of 5); the forward pass runs
// KV heads in parallel.
//
// Build and run: tools/build_kv_tools.sh && build-kvquant/kv_attention_bench [depth ...]
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "attention/attention.h"
#include "kernels/quant_dot.h"
#include "kv/cache.h"
#include "run/decode_floor.h"

using namespace kvslim;
using Clock = std::chrono::steady_clock;

namespace {

struct Cfg {
  std::string name;
  KVCodec k, v;
  KVQuantOptions q;
};

// CPU time of this thread: on a shared, oversubscribed machine wall time mostly measures waiting.
double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Best of 5 timings of batches lasting at least min_time.
double seconds_per_call(const std::function<void()>& f, double min_time = 0.05) {
  f();
  int reps = 1;
  double best = 1e30;
  for (int round = 0; round < 5;) {
    const double t0 = thread_seconds();
    for (int i = 0; i < reps; ++i) f();
    const double el = thread_seconds() - t0;
    if (el < min_time) {
      reps *= 2;
      continue;
    }
    best = std::min(best, el / reps);
    ++round;
  }
  return best;
}

// The previous kernel: f32 blocks of 64 entries, dot_f32 per (row, entry), two passes.
void baseline(const Segment& seg, const float* q, int rows, float scale, float* out) {
  const int hd = seg.head_dim();
  const size_t n = seg.size();
  std::vector<float> s(rows * n), buf(64 * hd);
  for (size_t b0 = 0; b0 < n; b0 += 64) {
    const size_t b1 = std::min(n, b0 + 64);
    seg.keys(b0, b1, buf.data());
    for (int r = 0; r < rows; ++r)
      for (size_t j = b0; j < b1; ++j) s[r * n + j] = dot_f32(q + r * hd, buf.data() + (j - b0) * hd, hd) * scale;
  }
  for (int r = 0; r < rows; ++r) {
    float mx = -INFINITY;
    for (size_t j = 0; j < n; ++j) mx = std::max(mx, s[r * n + j]);
    double sum = 0;
    for (size_t j = 0; j < n; ++j) sum += (s[r * n + j] = std::exp(s[r * n + j] - mx));
    for (size_t j = 0; j < n; ++j) s[r * n + j] /= sum;
    std::fill(out + r * hd, out + (r + 1) * hd, 0.0f);
  }
  for (size_t b0 = 0; b0 < n; b0 += 64) {
    const size_t b1 = std::min(n, b0 + 64);
    seg.values(b0, b1, buf.data());
    for (int r = 0; r < rows; ++r)
      for (size_t j = b0; j < b1; ++j) axpy_f32(s[r * n + j], buf.data() + (j - b0) * hd, out + r * hd, hd);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> depths;
  for (int i = 1; i < argc; ++i) {
    char* end = nullptr;
    const long d = std::strtol(argv[i], &end, 10);
    if (end == argv[i] || *end != '\0' || d < 1 || d > (1 << 24)) {
      std::fprintf(stderr,
                   "usage: %s [depth ...]  (entries per segment, 1 .. 16777216; default 512 4096 16384)\n"
                   "Times attention over one KV segment per cache type, one thread; KVSLIM_SIMD forces a\n"
                   "lower SIMD level. Got '%s'.\n",
                   argv[0], argv[i]);
      return 2;
    }
    depths.push_back(static_cast<int>(d));
  }
  if (depths.empty()) depths = {512, 4096, 16384};
  std::printf("simd %s; \"f16, previous kernel\": the kernel before the tiled one (decode rows to f32, one dot "
              "product per row and entry, then axpy), kept as a baseline\n\n",
              qdot::level_name(qdot::level()));
  const int hd = 64, G = 8, layers = 22, kv_heads = 4;
  std::vector<Cfg> cfgs = {{"f32", KVCodec::F32, KVCodec::F32, {}},   {"f16", KVCodec::F16, KVCodec::F16, {}},
                           {"bf16", KVCodec::BF16, KVCodec::BF16, {}}, {"q8_0", KVCodec::Q8_0, KVCodec::Q8_0, {}},
                           {"q4_0", KVCodec::Q4_0, KVCodec::Q4_0, {}}};
  KVQuantOptions k4;
  k4.kivi_bits = 4;
  cfgs.push_back({"kivi4", KVCodec::F16, KVCodec::F16, k4});
  KVQuantOptions k2 = k4;
  k2.kivi_bits = 2;
  cfgs.push_back({"kivi2", KVCodec::F16, KVCodec::F16, k2});
  KVQuantOptions h;
  h.hadamard = true;
  cfgs.push_back({"q4_0+hadamard", KVCodec::Q4_0, KVCodec::Q4_0, h});

  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::printf("| cache | depth | decode us/head | decode ms/token (22x4 heads, 1 thread) | GB/s read | prefill us/64 rows |\n");
  std::printf("|---|---:|---:|---:|---:|---:|\n");
  for (int n : depths) {
    std::vector<float> k(static_cast<size_t>(n) * hd), v(k.size()), q(64 * hd), out(64 * hd);
    for (float& x : k) x = nd(rng);
    for (float& x : v) x = nd(rng);
    for (float& x : q) x = nd(rng);
    for (const Cfg& c : cfgs) {
      Segment seg(hd, c.k, c.v, c.q);
      for (int i = 0; i < n; ++i) seg.append(&k[i * hd], &v[i * hd], i);
      std::vector<int32_t> vis(64, n);
      const double dec = seconds_per_call([&] { attend_segment(seg, q.data(), G, vis.data(), 0.125f, out.data(), hd); });
      for (int r = 0; r < 64; ++r) vis[r] = n - 8 + r / G + 1;
      const double pre = seconds_per_call([&] { attend_segment(seg, q.data(), 64, vis.data(), 0.125f, out.data(), hd); });
      std::printf("| %s | %d | %.1f | %.2f | %.1f | %.1f |\n", c.name.c_str(), n, dec * 1e6, dec * layers * kv_heads * 1e3,
                  seg.kv_bytes() / dec / 1e9, pre * 1e6);
      if (c.name == "f16") {
        const double base = seconds_per_call([&] { baseline(seg, q.data(), G, 0.125f, out.data()); });
        std::printf("| f16, previous kernel | %d | %.1f | %.2f | %.1f | |\n", n, base * 1e6,
                    base * layers * kv_heads * 1e3, seg.kv_bytes() / base / 1e9);
      }
    }
  }
  // Cold: one decode token over a whole model's cache (22 x 4 segments; from 4,096 entries on larger
  // than the processor's caches), as the forward pass reads it; the segments above were read warm.
  std::printf("\n| cache | depth | cold decode ms/token (22x4 heads, 1 thread) | GB/s read | after evicting the caches, ms/token (best of 7) |\n|---|---:|---:|---:|---:|\n");
  for (int n : depths)
    for (const Cfg& c : cfgs) {
      if (c.name != "f16" && c.name != "q8_0" && c.name != "kivi4") continue;
      std::vector<Segment> segs;
      std::vector<float> k(hd), v(hd), q(G * hd), out(G * hd);
      for (float& x : q) x = nd(rng);
      size_t bytes = 0;
      for (int s = 0; s < layers * kv_heads; ++s) {
        segs.emplace_back(hd, c.k, c.v, c.q);
        for (int i = 0; i < n; ++i) {
          for (int d = 0; d < hd; ++d) k[d] = nd(rng), v[d] = nd(rng);
          segs.back().append(k.data(), v.data(), i);
        }
        bytes += segs.back().kv_bytes();
      }
      std::vector<int32_t> vis(G, n);
      const double t = seconds_per_call(
          [&] {
            for (const Segment& sg : segs) attend_segment(sg, q.data(), G, vis.data(), 0.125f, out.data(), hd);
          },
          0.2);
      // After evicting the caches: each sweep follows a plain read of 256 MiB (bench --floor's read
      // probe), as in a decode step, where all the layers' weights stream through the caches between
      // one token's attention over a segment and the next token's. "Cold" above still finds a
      // 512-entry cache (11 MiB) in L3.
      static ReadProbe flush(size_t{256} << 20);
      double evicted = 1e30;
      for (int r = 0; r < 7; ++r) {
        flush.pass();
        const double t0 = thread_seconds();
        for (const Segment& sg : segs) attend_segment(sg, q.data(), G, vis.data(), 0.125f, out.data(), hd);
        evicted = std::min(evicted, thread_seconds() - t0);
      }
      std::printf("| %s | %d | %.2f | %.1f | %.2f |\n", c.name.c_str(), n, t * 1e3, bytes / t / 1e9, evicted * 1e3);
    }
  return 0;
}
