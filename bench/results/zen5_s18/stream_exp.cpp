// Session 18 experiment (not a tool): how close does a plain read of the packed weights come to the
// read probe when it is cut into the decode step's parallel regions? Per pass, in one process:
//   gemv   the decode step's products (as tools/gemv_stream_bench),
//   stream the same bytes read plainly, one parallel region per product as the products run (each
//          thread a static half of each matrix),
//   dyn    the same regions with guided dynamic chunks (>= 64 KiB) from an atomic counter,
//   one    every matrix's halves in a single region (no barriers, the same stream switches),
//   probe  ReadProbe's 1 GiB pass (bench --floor).
// Build like tools/gemv_stream_bench (tools/build_kv_tools.sh shows the command), run
// `stream_exp 2 30`. Results: notes.txt item 3.
#include <atomic>
#include <immintrin.h>
// How close the decode products come to the machine's read bandwidth. Builds the weight matrices
// of a TinyLlama-1.1B-shaped Q4_K_M model (22 layers: q, k, o, gate, up in q4_K; v and down in
// q6_K on 10 layers as llama.cpp's Q4_K_M mix does, q4_K elsewhere; output 32000 x 2048 q6_K),
// packed as the model loader packs them, about 650 MB, far more than any cache. One pass is one
// decode step's products in the engine's order (matmul_group for q/k/v and gate/up, matmul for o,
// down and output) with the pool's threads; each pass is followed by a plain read of a 1 GiB
// buffer with the same threads (ReadProbe, as `bench --floor`), so every line compares the two in one run on
// whatever else the host is doing. Prints GB/s of packed weight bytes, the read GB/s, and their
// ratio: the fraction of the bandwidth floor the products reach.
//
// Weights are copies of 64 rows quantized from random normals (contents do not change the speed).
//
// Build and run: tools/build_kv_tools.sh build && build/gemv_stream_bench [threads] [passes]
// (defaults 2 and 8; KVSLIM_SIMD forces a lower SIMD level, KVSLIM_HUGEPAGES=0 small pages).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/packed_weights.h"
#include "kernels/quant_dot.h"
#include "kernels/threads.h"
#include "kvslim/quant.h"
#include "run/decode_floor.h"

using namespace kvslim;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// A packed rows x cols matrix of type t (the unpacked bytes are dropped once packed).
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
  W.data = nullptr;  // only the packed copy is read at SIMD levels
  return W;
}

double packed_bytes(const WeightView& W) {
  return static_cast<double>(W.packed->row_blocks) * (W.cols / 256) * W.packed->block_bytes;
}


__attribute__((target("avx512f"))) uint64_t rsum(const uint8_t* p, size_t n) {
  __m512i a = _mm512_setzero_si512(), b = a;
  for (size_t i = 0; i + 128 <= n; i += 128) {
    a = _mm512_add_epi64(a, _mm512_load_si512(p + i));
    b = _mm512_add_epi64(b, _mm512_load_si512(p + i + 64));
  }
  a = _mm512_add_epi64(a, b);
  return _mm512_reduce_add_epi64(a);
}
std::vector<uint64_t> sinkv(16);
// Stream the packed bytes of the matrices of one product region, split evenly over the threads.
void stream(std::initializer_list<const WeightView*> Ws) {
  parallel_for(num_threads(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      for (const WeightView* W : Ws) {
        const size_t n = static_cast<size_t>(packed_bytes(*W)) / 128 * 128;
        const size_t sh = n / num_threads() / 128 * 128;
        sinkv[i] += rsum(W->packed->bytes.get() + sh * i, sh);
      }
  });
}
// Guided dynamic chunks over the concatenated bytes of the region's matrices.
void stream_dyn(std::initializer_list<const WeightView*> Ws) {
  std::vector<std::pair<const uint8_t*, size_t>> parts;
  size_t total = 0;
  for (const WeightView* W : Ws) { size_t n = static_cast<size_t>(packed_bytes(*W)) / 128 * 128; parts.push_back({W->packed->bytes.get(), n}); total += n; }
  std::atomic<size_t> next{0};
  const int nt = num_threads();
  parallel_for(nt, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      uint64_t acc = 0;
      for (;;) {
        size_t cur = next.load(std::memory_order_relaxed), len;
        do {
          if (cur >= total) break;
          len = std::max<size_t>((total - cur) / (2 * nt) / 128 * 128, 65536);
          len = std::min(len, total - cur);
        } while (!next.compare_exchange_weak(cur, cur + len));
        if (cur >= total) break;
        // map [cur, cur+len) onto parts
        size_t off = cur, left = len;
        for (auto& [p, n] : parts) {
          if (off >= n) { off -= n; continue; }
          size_t take = std::min(left, n - off);
          acc += rsum(p + off, take);
          left -= take; off = 0;
          if (!left) break;
        }
      }
      sinkv[i] += acc;
    }
  });
}
void stream_all(const std::vector<const WeightView*>& Ws) {
  parallel_for(num_threads(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      for (const WeightView* W : Ws) {
        const size_t n = static_cast<size_t>(packed_bytes(*W)) / 128 * 128;
        const size_t sh = n / num_threads() / 128 * 128;
        sinkv[i] += rsum(W->packed->bytes.get() + sh * i, sh);
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
  const WeightView out = make_matrix(Q6, 32000, 2048);
  bytes += packed_bytes(out);
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

  std::printf("packed weights %.1f MB, simd %s, %d threads\n", bytes / 1e6, qdot::level_name(qdot::level()), threads);
  std::printf("%5s %10s %12s %12s %8s\n", "pass", "ms", "gemv GB/s", "read GB/s", "ratio");
  double sd=0, so=0, sr=0, ss=0, sp=0; int cnt=0;
  for (int p = 0; p < passes; ++p) {
    const double t0 = now();
    for (const Layer& L : layers) {
      matmul_group({&L.q, &L.k, &L.v}, x.data(), 1, {y0.data(), y1.data(), y2.data()});
      matmul(L.o, x.data(), 1, y0.data());
      matmul_group({&L.gate, &L.up}, x.data(), 1, {y1.data(), y2.data()});
      matmul(L.down, x.data(), 1, y0.data());
    }
    matmul(out, x.data(), 1, y0.data());
    const double t1 = now();
    for (const Layer& L : layers) {
      stream({&L.q, &L.k, &L.v}); stream({&L.o}); stream({&L.gate, &L.up}); stream({&L.down});
    }
    stream({&out});
    const double t2 = now();
    std::vector<const WeightView*> all;
    for (const Layer& L : layers) for (auto* W : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down}) all.push_back(W);
    all.push_back(&out);
    const double td0 = now();
    for (const Layer& L : layers) {
      stream_dyn({&L.q, &L.k, &L.v}); stream_dyn({&L.o}); stream_dyn({&L.gate, &L.up}); stream_dyn({&L.down});
    }
    stream_dyn({&out});
    const double td1 = now(); const double dyn = bytes / (td1 - td0) / 1e9;
    const double t3 = now();
    stream_all(all);
    const double t4 = now();
    const double one = bytes / (t4 - t3) / 1e9;
    const double gemv = bytes / (t1 - t0) / 1e9, st = bytes / (t2 - t1) / 1e9, read = probe->pass();
    std::printf("%5d gemv %6.1f  stream %6.1f  probe %6.1f   gemv/probe %.2f stream/probe %.2f one/probe %.2f dyn/probe %.2f\n", p, gemv, st, read, gemv / read, st/read, one/read, dyn/read); so+=one/read; sd+=dyn/read;
    if (p>0) {sr+=gemv/read; ss+=st/read; ++cnt;}
  }
  std::printf("mean gemv/probe %.3f stream/probe %.3f one/probe %.3f dyn/probe %.3f\n", sr/cnt, ss/cnt, so/passes, sd/passes);
  return 0;
}
