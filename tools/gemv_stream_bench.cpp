// How close the decode products come to the machine's read bandwidth. Builds the weight matrices
// of a TinyLlama-1.1B-shaped Q4_K_M model (22 layers: q, k, o, gate, up in q4_K; v and down in
// q6_K on 10 layers as llama.cpp's Q4_K_M mix does, q4_K elsewhere; output 32000 x 2048 q6_K),
// packed as the model loader packs them, about 650 MB, far more than any cache. One pass is one
// decode step's products in the engine's order (matmul_group for q/k/v and gate/up, matmul for o,
// down and output) with the pool's threads; each pass is followed by a plain read of a 1 GiB
// buffer with the same threads (ReadProbe, as `bench --floor`), so every line compares the two in one run on
// whatever else the host is doing. Prints GB/s of packed weight bytes, the read GB/s, and their
// ratio: the fraction of the bandwidth floor the products reach. Each pass also reads the same packed
// bytes plainly in the same parallel regions as the products, each thread its static share of each
// matrix ("regions" columns: what the decode step's shape of work, about 110 regions and short
// streams a token, allows a read that does no arithmetic; the products themselves take guided
// dynamic chunks of rows), and then a thread-major copy of those shares in the same regions ("tmajor"
// column: each thread's shares of every matrix back to back in execution order, so that a thread
// reads one contiguous stream per token). Two more product columns: "static", the products with
// each thread computing its static share of every matrix (thread_rows) from the matrices packed one
// by one, and "tm-gemv", the engine's products (matmul, matmul_group) over the same matrices packed
// thread-major (pack_thread_major, as the model loader packs them; these take the static shares).
//
// Weights are copies of 64 rows quantized from random normals (contents do not change the speed).
//
// Build and run: tools/build_kv_tools.sh build && build/gemv_stream_bench [threads] [passes]
// (defaults 2 and 8; KVSLIM_SIMD forces a lower SIMD level, KVSLIM_HUGEPAGES=0 small pages).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include <sys/mman.h>

#include "kernels/matmul.h"
#include "kernels/packed_weights.h"
#include "kernels/quant_dot.h"
#include "kernels/threads.h"
#include "kernels/weight_prefetch.h"
#include "kvslim/quant.h"
#include "run/decode_floor.h"

using namespace kvslim;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The file rows of every matrix, kept until both packings are made.
std::vector<std::vector<uint8_t>> file_rows;

// A packed rows x cols matrix of type t (its unpacked rows kept in file_rows).
WeightView make_matrix(GGMLType t, int64_t rows, int64_t cols) {
  static std::map<std::pair<int, int64_t>, std::vector<uint8_t>> seed_rows;
  const size_t rb = row_bytes(t, cols);
  auto& seed = seed_rows[{static_cast<int>(t), cols}];
  if (seed.empty()) {
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    seed.resize(rb * 64);
    std::vector<float> w(cols);
    for (int r = 0; r < 64; ++r) {
      for (auto& v : w) v = nd(rng) * 0.02f;
      quantize_row(t, w.data(), seed.data() + r * rb, cols);
    }
  }
  std::vector<uint8_t> bytes(rb * rows);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(bytes.data() + r * rb, seed.data() + (r % 64) * rb, rb);
  WeightView W{t, bytes.data(), cols, rows, rb, {}};
  W.packed = qdot::pack_rows(W);
  file_rows.push_back(std::move(bytes));
  return W;
}

double packed_bytes(const WeightView& W) {
  return static_cast<double>(W.packed->row_blocks) * (W.cols / 256) * W.packed->block_bytes;
}

// 64-bit words of thread i's static share of W's packed bytes (a multiple of 4).
size_t share_words(const WeightView& W) { return static_cast<size_t>(packed_bytes(W)) / 8 / num_threads() / 4 * 4; }

uint64_t sum_words(const uint64_t* p, size_t words) {
  uint64_t a[4] = {0, 0, 0, 0};
  for (size_t k = 0; k < words; k += 4)
    for (int u = 0; u < 4; ++u) a[u] += p[k + u];
  return a[0] + a[1] + a[2] + a[3];
}

// Reads the matrices of one product's region, each thread its static share of each, in one parallel
// region. With `tmajor`, thread i reads the copies of its shares at its cursor in tmajor[i] instead
// and moves the cursor on. The sums keep the loads.
uint64_t plain_read(const std::vector<const WeightView*>& Ws, std::vector<const uint64_t*>* tmajor = nullptr) {
  std::vector<uint64_t> sums(static_cast<size_t>(num_threads()), 0);
  parallel_for(num_threads(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      for (const WeightView* W : Ws) {
        const size_t words = share_words(*W);
        if (tmajor) {
          sums[i] += sum_words((*tmajor)[i], words);
          (*tmajor)[i] += words;
        } else {
          sums[i] += sum_words(reinterpret_cast<const uint64_t*>(W->packed->bytes.get()) + words * i, words);
        }
      }
  });
  uint64_t t = 0;
  for (uint64_t v : sums) t += v;
  return t;
}

// The products of one region with static shares of the matrices packed one by one: the
// activations quantized once per format on the calling thread (as matmul_group does), then thread
// i computes rows thread_rows(i) of every matrix.
void static_products(const std::vector<const WeightView*>& Ws, const float* x, float* y) {
  std::map<int, qdot::Acts> acts;
  for (const WeightView* W : Ws)
    if (!acts.count(static_cast<int>(W->type)))
      qdot::quantize_acts(x, 1, W->cols, qdot::format_of(W->type), acts[static_cast<int>(W->type)]);
  const int n = num_threads();
  parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      for (const WeightView* W : Ws) {
        const auto [r0, r1] = qdot::thread_rows(W->rows, static_cast<int>(i), n);
        if (r0 < r1) qdot::dot_rows_q(qdot::level(), *W, r0, r1, acts.at(static_cast<int>(W->type)), y, W->rows);
      }
  });
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2, passes = argc > 2 ? std::atoi(argv[2]) : 8;
  if (threads <= 0 || passes <= 0) {
    std::fprintf(stderr, "gemv_stream_bench: threads and passes must be positive\n");
    return 2;
  }
  if (!qdot::packing_enabled()) {
    std::fprintf(stderr, "gemv_stream_bench: needs packed weights (a SIMD level and KVSLIM_PACK unset)\n");
    return 2;
  }
  set_num_threads(threads);
  const GGMLType Q4 = GGMLType::Q4_K, Q6 = GGMLType::Q6_K;
  struct Layer {
    WeightView q, k, v, o, gate, up, down;
  };
  std::vector<Layer> layers;
  double bytes = 0;
  for (int l = 0; l < 22; ++l) {
    const bool more = l < 3 || l >= 19 || l % 3 == 2;  // 10 of 22 layers
    layers.push_back({make_matrix(Q4, 2048, 2048), make_matrix(Q4, 256, 2048), make_matrix(more ? Q6 : Q4, 256, 2048),
                      make_matrix(Q4, 2048, 2048), make_matrix(Q4, 5632, 2048), make_matrix(Q4, 5632, 2048),
                      make_matrix(more ? Q6 : Q4, 2048, 5632)});
    for (const WeightView* W : {&layers.back().q, &layers.back().k, &layers.back().v, &layers.back().o,
                                &layers.back().gate, &layers.back().up, &layers.back().down})
      bytes += packed_bytes(*W);
  }
  WeightView out = make_matrix(Q6, 32000, 2048);
  bytes += packed_bytes(out);
  // The same matrices packed thread-major, in the order a decode step reads them.
  std::vector<Layer> tm_layers = layers;
  WeightView tm_out = out;
  {
    std::vector<WeightView*> order;
    for (Layer& L : tm_layers)
      for (WeightView* W : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) order.push_back(W);
    order.push_back(&tm_out);
    qdot::pack_thread_major(order, threads);
    for (WeightView* W : order) W->data = nullptr;
  }
  for (Layer& L : layers)
    for (WeightView* W : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) W->data = nullptr;
  out.data = nullptr;  // only the packed copies are read at SIMD levels
  file_rows.clear();
  file_rows.shrink_to_fit();
  std::vector<float> x(5632), y0(32000), y1(5632), y2(5632);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i));

  // A plain read of 1 GiB after each pass (src/run/decode_floor.h, as `bench --floor` reads).
  std::unique_ptr<ReadProbe> probe;
  try {
    probe = std::make_unique<ReadProbe>(size_t{1} << 30);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gemv_stream_bench: %s\n", e.what());
    return 1;
  }

  std::printf("packed weights %.1f MB, simd %s, weight prefetch %s, %d threads\n", bytes / 1e6, qdot::level_name(qdot::level()),
              qdot::prefetch_name(qdot::prefetch()), threads);
  // The matrices of each parallel region of a pass, in the order the products below run them.
  std::vector<std::vector<const WeightView*>> regions;
  for (const Layer& L : layers) {
    regions.push_back({&L.q, &L.k, &L.v});
    regions.push_back({&L.o});
    regions.push_back({&L.gate, &L.up});
    regions.push_back({&L.down});
  }
  regions.push_back({&out});
  // The thread-major copy: per thread, its shares of the matrices in that order, on 2 MiB pages
  // where the packed weights are (packed_weights.h), so that only the order differs.
  size_t tm_words = 0;
  for (const auto& R : regions)
    for (const WeightView* W : R) tm_words += share_words(*W);
  std::vector<std::unique_ptr<uint64_t[], void (*)(void*)>> tm;
  for (int i = 0; i < num_threads(); ++i) {
    void* mem = nullptr;
    const size_t huge = size_t{1} << 21, n = (tm_words * 8 + huge - 1) / huge * huge;
    if (posix_memalign(&mem, huge, n) != 0) {
      std::fprintf(stderr, "gemv_stream_bench: cannot allocate the thread-major copy (%zu MiB)\n", n >> 20);
      return 1;
    }
    if (qdot::huge_pages_enabled()) madvise(mem, n, MADV_HUGEPAGE);
    tm.emplace_back(static_cast<uint64_t*>(mem), std::free);
    uint64_t* dst = tm.back().get();
    for (const auto& R : regions)
      for (const WeightView* W : R) {
        const auto* src = reinterpret_cast<const uint64_t*>(W->packed->bytes.get()) + share_words(*W) * i;
        dst = std::copy(src, src + share_words(*W), dst);
      }
  }

  std::printf("%5s %10s %12s %12s %12s %8s %14s %13s %13s %13s\n", "pass", "ms", "gemv GB/s", "regions GB/s", "read GB/s",
              "ratio", "regions/read", "tmajor/read", "static/read", "tm-gemv/read");
  // One decode step's products in the engine's order.
  auto decode_products = [&](const std::vector<Layer>& ls, const WeightView& output) {
    for (const Layer& L : ls) {
      matmul_group({&L.q, &L.k, &L.v}, x.data(), 1, {y0.data(), y1.data(), y2.data()});
      matmul(L.o, x.data(), 1, y0.data());
      matmul_group({&L.gate, &L.up}, x.data(), 1, {y1.data(), y2.data()});
      matmul(L.down, x.data(), 1, y0.data());
    }
    matmul(output, x.data(), 1, y0.data());
  };
  uint64_t sink = 0;
  for (int p = 0; p < passes; ++p) {
    const double t0 = now();
    decode_products(layers, out);
    const double t1 = now();
    for (const auto& R : regions) sink += plain_read(R);
    const double t2 = now();
    std::vector<const uint64_t*> cur;
    for (const auto& v : tm) cur.push_back(v.get());
    for (const auto& R : regions) sink += plain_read(R, &cur);
    const double t3 = now();
    for (const auto& R : regions) static_products(R, x.data(), y0.data());
    const double t4 = now();
    decode_products(tm_layers, tm_out);
    const double t5 = now();
    const double gemv = bytes / (t1 - t0) / 1e9, plain = bytes / (t2 - t1) / 1e9, tmaj = bytes / (t3 - t2) / 1e9,
                 stat = bytes / (t4 - t3) / 1e9, tmg = bytes / (t5 - t4) / 1e9, read = probe->pass();
    std::printf("%5d %10.2f %12.1f %12.1f %12.1f %8.2f %14.2f %13.2f %13.2f %13.2f\n", p, (t1 - t0) * 1e3, gemv, plain,
                read, gemv / read, plain / read, tmaj / read, stat / read, tmg / read);
  }
  std::printf("checksum of the plain reads %016llx\n", static_cast<unsigned long long>(sink));
  return 0;
}
