// Prefill at the compute limit: how fast one core can run the instructions prefill's kernels are
// made of, and what share of that a prefill reaches.
//
//   kvslim_peak_probe [-m MODEL.gguf] [-t THREADS] [-p TOKENS] [--reps N] [--scalar]
//
// 1. The clock: a chain of dependent integer adds (one cycle each on every x86 core of the last
//    decade) timed in this thread's CPU seconds, before and beside each probe.
// 2. Per SIMD level this CPU runs: the instruction sequences of the weight kernels (src/kernels/
//    quant_dot_simd.inc) and attention, each with 12 independent accumulators so that throughput,
//    not latency, bounds them: int8 multiply-accumulates by vpdpbusd (256-bit, and 512-bit where
//    AVX-512 VNNI is present), the AVX2 sequence vpmaddubsw + vpmaddwd + vpaddd, and f32 FMA
//    (256- and 512-bit). Each prints operations per cycle at the measured clock. Two more rows
//    give the mixes the tiles really run, below those peaks: int16 products (AVX2 q8_0) and
//    vpdpbusd zmm with the float step of q8_0's per-group scales (AVX-512).
// 3. With -m: a prefill of -p tokens at each SIMD level (KVSLIM_SIMD's levels, forced with
//    qdot::set_level) on -t threads, its multiply-accumulates per token counted from the model's
//    weight matrices, and its rate per CPU-second as a share of one core's best int8 rate.
// GCC 12's avx512fintrin.h builds some broadcasts and conversions from an undefined register and
// warns about it.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <chrono>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/quant_dot.h"
#include "kvslim/model.h"
#include "model/session.h"
#include "kvslim/threads.h"

using namespace kvslim;
using Clock = std::chrono::steady_clock;

namespace {

/// This thread's CPU seconds: time other processes take from the core is not counted (the
/// machine may be shared; there are no cycle counters in a VM).
double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// CPU seconds of every thread of this process.
double process_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

double seconds_of(const std::function<void(int64_t)>& body, int64_t iters) {
  body(iters / 16);  // warm the unit up (AVX-512 clocks, page-ins)
  const double t0 = thread_seconds();
  body(iters);
  return thread_seconds() - t0;
}

/// Cycles per second from 8 dependent adds per iteration (the loop's own add and branch run
/// beside the chain).
double measure_clock() {
  auto chain = [](int64_t n) {
    uint64_t x = 1;
    for (int64_t i = 0; i < n; ++i) {
      asm volatile(
          "add %0, %0\n\tadd %0, %0\n\tadd %0, %0\n\tadd %0, %0\n\t"
          "add %0, %0\n\tadd %0, %0\n\tadd %0, %0\n\tadd %0, %0\n\t"
          : "+r"(x));
    }
    asm volatile("" ::"r"(x));
  };
  int64_t n = 1 << 22;
  double s = seconds_of(chain, n);
  while (s < 0.2) {
    n *= 2;
    s = seconds_of(chain, n);
  }
  return 8.0 * static_cast<double>(n) / s;
}

// Each kernel runs 12 independent accumulators (named, so they stay in registers) for n
// iterations. Inputs come from a volatile the compiler cannot see through, and empty asm
// statements keep every accumulator live in its register and stop the compiler from hoisting or
// sharing the work of the sequence between accumulators.
#define KV_REP12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

__attribute__((target("avx2,fma"))) void fma256(int64_t n) {
  volatile float seed = 1.0001f;
  __m256 a = _mm256_set1_ps(seed), b = _mm256_set1_ps(seed * 0.5f);
#define KV_INIT(i) __m256 c##i = _mm256_set1_ps(seed);
  KV_REP12(KV_INIT)
#undef KV_INIT
  for (int64_t it = 0; it < n; ++it) {
    asm volatile("" : "+x"(a), "+x"(b));
#define KV_STEP(i) c##i = _mm256_fmadd_ps(a, c##i, b); asm volatile("" : "+x"(c##i));
    KV_REP12(KV_STEP)
#undef KV_STEP
  }
  float out = 0;
#define KV_OUT(i) out += _mm256_cvtss_f32(c##i);
  KV_REP12(KV_OUT)
#undef KV_OUT
  asm volatile("" ::"m"(out));
}

__attribute__((target("avx512f"))) void fma512(int64_t n) {
  volatile float seed = 1.0001f;
  __m512 a = _mm512_set1_ps(seed), b = _mm512_set1_ps(seed * 0.5f);
#define KV_INIT(i) __m512 c##i = _mm512_set1_ps(seed);
  KV_REP12(KV_INIT)
#undef KV_INIT
  for (int64_t it = 0; it < n; ++it) {
    asm volatile("" : "+v"(a), "+v"(b));
#define KV_STEP(i) c##i = _mm512_fmadd_ps(a, c##i, b); asm volatile("" : "+v"(c##i));
    KV_REP12(KV_STEP)
#undef KV_STEP
  }
  float out = 0;
#define KV_OUT(i) out += _mm512_cvtss_f32(c##i);
  KV_REP12(KV_OUT)
#undef KV_OUT
  asm volatile("" ::"m"(out));
}

// The AVX2 q8_0 tiles' step (micro_q8x2w): codes widened to int16, one vpmaddwd and one vpaddd a
// 16 products, where q8_0's signed codes leave vpmaddubsw no room (pairs of 127 x 127 fill int16).
__attribute__((target("avx2"))) void maddwd256(int64_t n) {
  volatile int seed = 3;
  __m256i w = _mm256_set1_epi16(static_cast<short>(seed)), x = _mm256_set1_epi16(static_cast<short>(seed + 1));
#define KV_INIT(i) __m256i c##i = _mm256_set1_epi32(seed);
  KV_REP12(KV_INIT)
#undef KV_INIT
  for (int64_t it = 0; it < n; ++it) {
    asm volatile("" : "+x"(w), "+x"(x));
#define KV_STEP(i) asm volatile("" : "+x"(x)); c##i = _mm256_add_epi32(c##i, _mm256_madd_epi16(w, x)); asm volatile("" : "+x"(c##i));
    KV_REP12(KV_STEP)
#undef KV_STEP
  }
  int out = 0;
#define KV_OUT(i) out += _mm256_cvtsi256_si32(c##i);
  KV_REP12(KV_OUT)
#undef KV_OUT
  asm volatile("" ::"m"(out));
}

__attribute__((target("avx2"))) void madd256(int64_t n) {
  volatile int seed = 3;
  __m256i u = _mm256_set1_epi8(static_cast<char>(seed)), x = _mm256_set1_epi8(static_cast<char>(seed + 1));
  const __m256i ones = _mm256_set1_epi16(1);
#define KV_INIT(i) __m256i c##i = _mm256_set1_epi32(seed);
  KV_REP12(KV_INIT)
#undef KV_INIT
  for (int64_t it = 0; it < n; ++it) {
    asm volatile("" : "+x"(u), "+x"(x));
#define KV_STEP(i) asm volatile("" : "+x"(x)); c##i = _mm256_add_epi32(c##i, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), ones)); asm volatile("" : "+x"(c##i));
    KV_REP12(KV_STEP)
#undef KV_STEP
  }
  int out = 0;
#define KV_OUT(i) out += _mm256_cvtsi256_si32(c##i);
  KV_REP12(KV_OUT)
#undef KV_OUT
  asm volatile("" ::"m"(out));
}

__attribute__((target("avx512f,avx512vl,avx512vnni"))) void dpbusd256_evex(int64_t n) {
  volatile int seed = 3;
  __m256i u = _mm256_set1_epi8(static_cast<char>(seed)), x = _mm256_set1_epi8(static_cast<char>(seed + 1));
#define KV_INIT(i) __m256i c##i = _mm256_set1_epi32(seed);
  KV_REP12(KV_INIT)
#undef KV_INIT
  for (int64_t it = 0; it < n; ++it) {
    asm volatile("" : "+v"(u), "+v"(x));
#define KV_STEP(i) c##i = _mm256_dpbusd_epi32(c##i, u, x); asm volatile("" : "+v"(c##i));
    KV_REP12(KV_STEP)
#undef KV_STEP
  }
  int out = 0;
#define KV_OUT(i) out += _mm256_cvtsi256_si32(c##i);
  KV_REP12(KV_OUT)
#undef KV_OUT
  asm volatile("" ::"m"(out));
}

__attribute__((target("avx2,avxvnni"))) void dpbusd256_vex(int64_t n) {
  volatile int seed = 3;
  __m256i u = _mm256_set1_epi8(static_cast<char>(seed)), x = _mm256_set1_epi8(static_cast<char>(seed + 1));
#define KV_INIT(i) __m256i c##i = _mm256_set1_epi32(seed);
  KV_REP12(KV_INIT)
#undef KV_INIT
  for (int64_t it = 0; it < n; ++it) {
    asm volatile("" : "+x"(u), "+x"(x));
#define KV_STEP(i) c##i = _mm256_dpbusd_avx_epi32(c##i, u, x); asm volatile("" : "+x"(c##i));
    KV_REP12(KV_STEP)
#undef KV_STEP
  }
  int out = 0;
#define KV_OUT(i) out += _mm256_cvtsi256_si32(c##i);
  KV_REP12(KV_OUT)
#undef KV_OUT
  asm volatile("" ::"m"(out));
}

__attribute__((target("avx512f,avx512vnni"))) void dpbusd512(int64_t n) {
  volatile int seed = 3;
  __m512i u = _mm512_set1_epi8(static_cast<char>(seed)), x = _mm512_set1_epi8(static_cast<char>(seed + 1));
#define KV_INIT(i) __m512i c##i = _mm512_set1_epi32(seed);
  KV_REP12(KV_INIT)
#undef KV_INIT
  for (int64_t it = 0; it < n; ++it) {
    asm volatile("" : "+v"(u), "+v"(x));
#define KV_STEP(i) c##i = _mm512_dpbusd_epi32(c##i, u, x); asm volatile("" : "+v"(c##i));
    KV_REP12(KV_STEP)
#undef KV_STEP
  }
  int out = 0;
#define KV_OUT(i) out += _mm_cvtsi128_si32(_mm512_castsi512_si128(c##i));
  KV_REP12(KV_OUT)
#undef KV_OUT
  asm volatile("" ::"m"(out));
}

// The AVX-512 prefill tile's group (src/kernels/quant_dot_simd.inc, micro2): per activation row and
// 16 weight rows, 8 vpdpbusd zmm over a group of 32 columns from an accumulator set to the group's
// offset term (a broadcast load), then the float step of q8_0's per-group scales (vcvtdq2ps,
// vmulps, vfmadd231ps). The float step is part of every group, so this is the ceiling of the
// weight kernels at this level, below vpdpbusd's own rate where the two share pipes.
__attribute__((target("avx512f,avx512vnni"))) void dpbusd512_group(int64_t n) {
  volatile int seed = 3;
  __m512i u = _mm512_set1_epi8(static_cast<char>(seed)), x = _mm512_set1_epi8(static_cast<char>(seed + 1));
  __m512 ws = _mm512_set1_ps(0.5f * static_cast<float>(seed)), xd = _mm512_set1_ps(0.25f);
  alignas(64) int32_t ic[16];
  for (int i = 0; i < 16; ++i) ic[i] = seed * i;
#define KV_INIT(i) __m512 f##i = _mm512_setzero_ps();
  KV_REP12(KV_INIT)
#undef KV_INIT
#define KV_DOT c = _mm512_dpbusd_epi32(c, u, x); asm volatile("" : "+v"(c));
  for (int64_t it = 0; it < n; ++it) {
    asm volatile("" : "+v"(u), "+v"(x), "+v"(xd) : "m"(ic));
#define KV_STEP(i)                                                            \
  {                                                                           \
    __m512i c = _mm512_set1_epi32(ic[i]);                                     \
    KV_DOT KV_DOT KV_DOT KV_DOT KV_DOT KV_DOT KV_DOT KV_DOT                   \
    asm volatile("" : "+v"(ws));                                              \
    f##i = _mm512_fmadd_ps(_mm512_mul_ps(ws, xd), _mm512_cvtepi32_ps(c), f##i); \
    asm volatile("" : "+v"(f##i));                                            \
  }
    KV_REP12(KV_STEP)
#undef KV_STEP
  }
#undef KV_DOT
  float out = 0;
#define KV_OUT(i) out += _mm512_cvtss_f32(f##i);
  KV_REP12(KV_OUT)
#undef KV_OUT
  asm volatile("" ::"m"(out));
}

struct Probe {
  const char* name;
  int level;               // the qdot::Level whose weight kernels use this sequence, -1 for none
  const char* unit;        // what `per_instr` counts
  double per_instr;        // operations per accumulator update
  int instrs;              // instructions per accumulator update
  bool (*available)();
  void (*run)(int64_t);
};

bool has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
bool has_avx512() { return __builtin_cpu_supports("avx512f"); }
bool has_avx512vnni() { return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl"); }
bool has_avxvnni() { return qdot::cpu_has(qdot::Level::AVXVNNI); }

double peak_int8_macs_per_cycle = 0;
// int8 MACs per cycle of the sequence each SIMD level's weight kernels use (0: not measured).
double level_macs_per_cycle[4] = {0, 0, 0, 0};

void probe_instructions(double& hz) {
  const Probe probes[] = {
      {"f32 FMA, 256-bit (vfmadd231ps ymm)", -1, "FLOP", 16, 1, has_avx2, fma256},
      {"f32 FMA, 512-bit (vfmadd231ps zmm)", -1, "FLOP", 32, 1, has_avx512, fma512},
      {"int8 MAC, AVX2 (vpmaddubsw + vpmaddwd + vpaddd, ymm)", 1, "MAC", 32, 3, has_avx2, madd256},
      {"  int16 (vpmaddwd + vpaddd, ymm: the q8_0 tiles)", -1, "MAC", 16, 2, has_avx2, maddwd256},
      {"int8 MAC, AVX-VNNI (vpdpbusd ymm, VEX)", 2, "MAC", 32, 1, has_avxvnni, dpbusd256_vex},
      {"int8 MAC, AVX-512 VNNI (vpdpbusd ymm, EVEX)", -1, "MAC", 32, 1, has_avx512vnni, dpbusd256_evex},
      {"int8 MAC, AVX-512 VNNI (vpdpbusd zmm)", 3, "MAC", 64, 1, has_avx512vnni, dpbusd512},
      {"  with q8_0's float step every 8 (the tiles' ceiling)", -1, "MAC", 512, 12, has_avx512vnni, dpbusd512_group},
  };
  std::printf("%-52s %14s %14s %16s\n", "instruction sequence", "instr/cycle", "ops/cycle", "Gops/s per core");
  for (const Probe& p : probes) {
    if (!p.available()) {
      std::printf("%-52s %14s\n", p.name, "(not on this CPU)");
      continue;
    }
    int64_t n = 1 << 18;
    double s = seconds_of(p.run, n);
    while (s < 0.3) {
      n *= 2;
      s = seconds_of(p.run, n);
    }
    hz = 0.5 * (hz + measure_clock());  // the clock beside each probe: it may move with the load
    const double updates = 12.0 * static_cast<double>(n);
    const double cycles = s * hz;
    const double ops = updates * p.per_instr;
    std::printf("%-52s %14.2f %10.1f %-3s %16.1f\n", p.name, updates * p.instrs / cycles, ops / cycles, p.unit,
                ops / s * 1e-9);
    if (std::strcmp(p.unit, "MAC") == 0) peak_int8_macs_per_cycle = std::max(peak_int8_macs_per_cycle, ops / cycles);
    if (p.level >= 0) level_macs_per_cycle[p.level] = ops / cycles;
  }
}

/// Multiply-accumulates of one token through every weight matrix (the output head included).
double macs_per_token(const Model& m) {
  const HParams& hp = m.hparams();
  double macs = static_cast<double>(m.output().rows) * m.output().cols;
  for (int l = 0; l < hp.n_layer; ++l) {
    const LayerWeights& L = m.layer(l);
    for (const WeightView* w : {L.wq.get(), L.wk.get(), L.wv.get(), L.wo.get(), L.w_gate.get(), L.w_up.get(),
                                L.w_down.get()})
      macs += static_cast<double>(w->rows) * w->cols;
  }
  return macs;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model;
  int threads = 1, tokens = 512, reps = 2;
  bool scalar = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kvslim_peak_probe: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "-m") model = next();
    else if (a == "-t") threads = std::atoi(next().c_str());
    else if (a == "-p") tokens = std::atoi(next().c_str());
    else if (a == "--reps") reps = std::atoi(next().c_str());
    else if (a == "--scalar") scalar = true;
    else {
      std::fprintf(stderr, "usage: kvslim_peak_probe [-m MODEL.gguf] [-t THREADS] [-p TOKENS] [--reps N] [--scalar]\n");
      return 2;
    }
  }
  if (threads < 1 || tokens < 1 || reps < 1) {
    std::fprintf(stderr, "kvslim_peak_probe: -t, -p and --reps must be at least 1\n");
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines as they come when piped
  double hz = measure_clock();
  std::printf("clock (dependent adds): %.3f GHz\n\n", hz * 1e-9);
  probe_instructions(hz);
  if (model.empty()) return 0;

  std::unique_ptr<Model> m = Model::load(model);
  set_num_threads(threads);
  const double macs = macs_per_token(*m);
  std::vector<Token> prompt(static_cast<size_t>(tokens));
  for (int i = 0; i < tokens; ++i) prompt[static_cast<size_t>(i)] = static_cast<Token>(1 + (i * 37) % (m->hparams().n_vocab - 1));
  std::printf("\nprefill of %d tokens, %d threads, %s (%s): %.3f GMAC per token in the weight matrices\n", tokens,
              threads, model.c_str(), m->weight_type().c_str(), macs * 1e-9);
  std::printf("%-10s %14s %20s %18s %18s\n", "SIMD level", "tokens/s wall", "GMAC per CPU-second",
              "of its own peak", "of the best peak");
  for (qdot::Level lv : qdot::supported_levels()) {
    if (lv == qdot::Level::Scalar && !scalar) continue;  // minutes on a 1B model; --scalar to include it
    qdot::set_level(lv);
    double best_wall = 1e30, best_cpu = 1e30;
    for (int r = 0; r < reps; ++r) {
      SessionOptions so;
      so.n_ctx = tokens + 8;
      Session s(*m, so);
      const auto t0 = Clock::now();
      const double c0 = process_seconds();
      s.forward(prompt);
      best_cpu = std::min(best_cpu, process_seconds() - c0);
      best_wall = std::min(best_wall, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    // Per CPU-second, so cores taken by other processes do not count against the prefill; the share
    // is of this CPU's best int8 sequence per core (a level's own instructions may be slower).
    const double rate = macs * tokens / best_cpu;
    const double own = level_macs_per_cycle[static_cast<int>(lv)];
    std::printf("%-10s %14.1f %20.1f %17.1f%% %17.1f%%\n", qdot::level_name(lv), tokens / best_wall, rate * 1e-9,
                own > 0 ? 100.0 * rate / (own * hz) : 0.0, 100.0 * rate / (peak_int8_macs_per_cycle * hz));
  }
  return 0;
}
