// Speed of one quantized weight product alone (src/kernels/quant_dot*.cpp): a rows x cols matrix
// of random weights in a packable type (q8_0, q4_K, q6_K; repacked as the model loader does unless
// KVSLIM_PACK=0) times `tokens` activation rows, at the SIMD level in use (KVSLIM_SIMD forces a
// lower one). One thread, CPU time of the thread, best of `reps` calls (after one warm-up), so that
// the figure does not depend on other processes sharing the cores. Prints the time per call and per
// token and an FNV-1a hash of the output bits: two builds computing the same result print the same
// hash, which is how a kernel change is checked to keep the bits while it is being timed.
//
// Build and run: tools/build_kv_tools.sh build && build/qdot_bench [type] [rows] [cols] [tokens] [reps]
// (defaults: q8_0 2048 2048 512 7, the q8_0 product of a 512-token prefill batch).
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/packed_weights.h"
#include "kernels/weight_prefetch.h"
#include "kernels/quant_dot.h"
#include "kvslim/quant.h"

using namespace kvslim;

namespace {

double thread_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

uint64_t fnv1a(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

GGMLType parse_type(const std::string& s) {
  if (s == "q8_0") return GGMLType::Q8_0;
  if (s == "q4_K" || s == "q4_k") return GGMLType::Q4_K;
  if (s == "q6_K" || s == "q6_k") return GGMLType::Q6_K;
  std::fprintf(stderr, "qdot_bench: type must be q8_0, q4_K or q6_K, not %s\n", s.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  const GGMLType t = parse_type(argc > 1 ? argv[1] : "q8_0");
  const int64_t rows = argc > 2 ? std::atoll(argv[2]) : 2048, cols = argc > 3 ? std::atoll(argv[3]) : 2048;
  const int64_t tokens = argc > 4 ? std::atoll(argv[4]) : 512;
  const int reps = argc > 5 ? std::atoi(argv[5]) : 7;
  if (rows <= 0 || cols <= 0 || cols % 256 || tokens <= 0 || reps <= 0) {
    std::fprintf(stderr, "qdot_bench: rows, tokens and reps > 0, cols a multiple of 256\n");
    return 2;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  const size_t rb = row_bytes(t, cols);
  std::vector<uint8_t> bytes(rb * rows);
  std::vector<float> w(cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& v : w) v = nd(rng) * 0.02f;
    quantize_row(t, w.data(), bytes.data() + r * rb, cols);
  }
  std::vector<float> x(static_cast<size_t>(tokens * cols));
  for (auto& v : x) v = nd(rng);
  WeightView W{t, bytes.data(), cols, rows, rb, {}};
  if (qdot::packing_enabled()) W.packed = qdot::pack_rows(W);
  qdot::Acts a;
  qdot::quantize_acts(x.data(), tokens, cols, qdot::format_of(t), a);
  std::vector<float> y(static_cast<size_t>(tokens * rows));
  const qdot::Level lv = qdot::level();
  qdot::dot_rows_q(lv, W, 0, rows, a, y.data(), rows);  // warm-up
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const double t0 = thread_seconds();
    qdot::dot_rows_q(lv, W, 0, rows, a, y.data(), rows);
    best = std::min(best, thread_seconds() - t0);
  }
  std::printf("%s %lldx%lld x %lld tokens, simd %s, weight prefetch %s, %s: best of %d %.3f ms, %.1f us/token, %.1f GMAC/s, hash %016llx\n",
              argc > 1 ? argv[1] : "q8_0", static_cast<long long>(rows), static_cast<long long>(cols),
              static_cast<long long>(tokens), qdot::level_name(lv), qdot::prefetch_name(qdot::prefetch()), W.packed ? "packed" : "in place", reps, best * 1e3,
              best * 1e6 / tokens, rows * cols * tokens / best * 1e-9,
              static_cast<unsigned long long>(fnv1a(y.data(), y.size() * sizeof(float))));
  return 0;
}
