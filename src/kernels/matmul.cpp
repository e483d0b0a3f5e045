#include "kernels/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "kernels/packed_weights.h"
#include "kernels/quant_dot.h"
#include "kernels/threads.h"
#include "kvslim/error.h"

namespace kvslim {

namespace {

float dot_f32(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Rows are handed out in units of 16 (one AVX-512 tile), so no tile is split. Threads take runs
// of units from a shared counter rather than fixed halves: when another process shares a core,
// the thread that runs faster takes more rows instead of the whole product waiting for the slow
// one. Each row is computed the same way whoever takes it, so results do not depend on this.
// Runs shrink as the rows run out (half the rest divided by the threads, at least 1/32 of a
// thread's share): long runs keep each thread's memory stream going, short last ones leave the
// threads finishing together (fixed runs of 1/8 of a share left one waiting for up to a run:
// Zen 5, Q4_K_M decode 5 of 6 rounds 2-10% slower). Runs are an even number of units where they
// can be: the AVX-512 prefill kernel takes tiles in pairs (32 rows), and a lone tile runs slower.
constexpr int64_t kRowUnit = 16;

void parallel_units(int64_t units, int64_t macs, const std::function<void(int64_t, int64_t)>& fn) {
  const int nt = num_threads();
  if (nt <= 1 || units < 2 || macs < kMinParallelMacs) {
    fn(0, units);
    return;
  }
  const int64_t min_grab = std::max<int64_t>(1, units / (int64_t(nt) * 32));
  RangeClaim claim(units);  // every thread claims from the front
  auto next = [&] {
    const int64_t n = std::max(min_grab, claim.left() / (int64_t(nt) * 2));
    return claim.front(n + (n & 1));
  };
  parallel_for(nt, [&](int64_t, int64_t) {
    for (auto u = next(); u.first < u.second; u = next()) fn(u.first, u.second);
  });
}

void parallel_rows(int64_t rows, int64_t macs, const std::function<void(int64_t, int64_t)>& fn) {
  parallel_units((rows + kRowUnit - 1) / kRowUnit, macs,
                 [&](int64_t b, int64_t e) { fn(b * kRowUnit, std::min(rows, e * kRowUnit)); });
}

// Decode products (the gemv kernels: at most qdot::kDecodeMaxRows tokens) over matrices packed
// thread-major with one part per thread (pack_thread_major) take static shares: thread i computes part i of each, so each
// thread reads its own arena front to back. Rows are computed the same way whichever thread takes
// them, so results do not change; with any other thread count the parts are split as rows come.
bool static_parts(const WeightView* const* w, size_t m, int64_t n_tokens) {
  const int nt = num_threads();
  if (n_tokens > qdot::kDecodeMaxRows || nt < 2) return false;
  for (size_t i = 0; i < m; ++i)
    if (!w[i]->packed || w[i]->packed->parts.size() != static_cast<size_t>(nt)) return false;
  return true;
}

// A thread that finishes its own part early takes the other parts' last rows. Fixed halves left
// one thread waiting at the end of most regions: the two vCPUs of a VM do not run at the same
// speed (Zen 5, Q4_K_M decode, 2 threads: the thread finishing last took 25-54 us more than the
// other in regions of 130-180 us on average). The owner takes kLeadEighths / 8 of its part in one
// run (one unbroken stream and prefetch), then runs of kStealUnits; the others take runs of
// kStealUnits from the back. Q4_K_M decode at 512, paired read floor, three alternating rounds: 82-86% ->
// 90-93% at the AVX-512 level, 71-73% -> 72-76% at AVX2 (taking 3/4 first: 87-91%; 1/2: 83-85%).
constexpr int64_t kStealUnits = 8, kLeadEighths = 7;

// The parts of the m matrices, part p of each on thread p (and stolen tails, above). prologue runs
// once on every thread of the region before it takes any rows.
void run_static_parts(const WeightView* const* w, size_t m, int64_t macs, const std::function<void()>& prologue,
                      const std::function<void(size_t, int64_t, int64_t)>& rows) {
  const int nt = num_threads();
  // Part p of matrix i is units [first[p * (m + 1) + i], first[p * (m + 1) + i + 1]) of part p's range.
  std::vector<int64_t> first(static_cast<size_t>(nt) * (m + 1), 0);
  std::unique_ptr<RangeClaim[]> claim(new RangeClaim[static_cast<size_t>(nt)]);
  for (int p = 0; p < nt; ++p) {
    int64_t* f = first.data() + static_cast<size_t>(p) * (m + 1);
    for (size_t i = 0; i < m; ++i) {
      const qdot::PackedRows::Part& part = w[i]->packed->parts[static_cast<size_t>(p)];
      f[i + 1] = f[i] + (part.row1 - part.row0 + kRowUnit - 1) / kRowUnit;
    }
    claim[static_cast<size_t>(p)].reset(f[m]);
  }
  auto run_units = [&](int p, std::pair<int64_t, int64_t> u) {
    const int64_t* f = first.data() + static_cast<size_t>(p) * (m + 1);
    for (size_t i = 0; i < m; ++i) {
      const int64_t a = std::max(u.first, f[i]), b = std::min(u.second, f[i + 1]);
      if (a >= b) continue;
      const qdot::PackedRows::Part& part = w[i]->packed->parts[static_cast<size_t>(p)];
      rows(i, part.row0 + (a - f[i]) * kRowUnit, std::min(part.row1, part.row0 + (b - f[i]) * kRowUnit));
    }
  };
  parallel_for(nt, macs, [&](int64_t b, int64_t e) {
    prologue();
    for (int64_t p = b; p < e; ++p) {
      RangeClaim& c = claim[static_cast<size_t>(p)];
      const int64_t lead = std::max(kStealUnits, c.left() * kLeadEighths / 8);
      for (auto u = c.front(lead); u.first < u.second; u = c.front(kStealUnits)) run_units(static_cast<int>(p), u);
    }
    for (int q = 0; q < nt; ++q) {
      if (q >= b && q < e) continue;
      RangeClaim& c = claim[static_cast<size_t>(q)];
      for (auto u = c.back(kStealUnits); u.first < u.second; u = c.back(kStealUnits)) run_units(q, u);
    }
  });
}

// OpenBLAS splits one product across its threads differently for different thread counts,
// which changes the rounding. So the batched f32 products run as fixed tiles of rows, each one
// single-threaded sgemm call (set_num_threads keeps OpenBLAS at one thread) of the same shape
// whatever the thread count, spread over our pool.

// f32 products: per-row dot for a token or three (exact path), else BLAS on tiles of rows
// (dequantized first unless already f32).
void matmul_f32(const WeightView& W, const float* X, int64_t n_tokens, float* Y) {
  if (n_tokens < 4) {
    parallel_for(W.rows, [&](int64_t b, int64_t e) {
      std::vector<float> buf(W.type == GGMLType::F32 ? 0 : W.cols);
      for (int64_t r = b; r < e; ++r) {
        const float* w = reinterpret_cast<const float*>(W.row(r));
        if (W.type != GGMLType::F32) {
          dequantize_row(W.type, W.row(r), buf.data(), W.cols);
          w = buf.data();
        }
        for (int64_t t = 0; t < n_tokens; ++t) Y[t * W.rows + r] = dot_f32(X + t * W.cols, w, W.cols);
      }
    });
    return;
  }
  constexpr int64_t tile = 128;
  parallel_units((W.rows + tile - 1) / tile, W.rows * W.cols * n_tokens, [&](int64_t b, int64_t e) {
    std::vector<float> wf(W.type == GGMLType::F32 ? 0 : static_cast<size_t>(tile * W.cols));
    for (int64_t ti = b; ti < e; ++ti) {
      const int64_t r0 = ti * tile, nr = std::min(tile, W.rows - r0);
      const float* w = reinterpret_cast<const float*>(W.row(r0));
      int64_t ldw = static_cast<int64_t>(W.row_stride / sizeof(float));
      if (W.type != GGMLType::F32) {
        for (int64_t r = 0; r < nr; ++r) dequantize_row(W.type, W.row(r0 + r), wf.data() + r * W.cols, W.cols);
        w = wf.data();
        ldw = W.cols;
      }
      BlasSlot slot;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_tokens, nr, W.cols, 1.0f, X, W.cols, w, ldw, 0.0f, Y + r0,
                  W.rows);
    }
  });
}

// Each thread's own quantized input for the decode products over thread-major parts (one per
// distinct format of a group). Each thread quantizes the input itself at the start of the region,
// into buffers no other thread touches: handed over from the calling thread instead, every
// product's buffers were written by one thread after the other had read them, which on cores
// without a shared last-level cache (a VM's vCPUs on two AMD chiplets) took 537 us a token
// against 145 on shared ones (Q4_K_M decode, AMD Zen 4). Every thread
// quantizes the same rows the same way, so a row's result does not depend on which thread takes it.
std::vector<qdot::Acts>& thread_acts() {
  static thread_local std::vector<qdot::Acts> own;
  return own;
}

void quantize_input(const float* X, int64_t n_tokens, int64_t cols, const qdot::Format& f, qdot::Acts& a) {
  qdot::prepare_acts(n_tokens, cols, f, a);
  qdot::quantize_acts_rows(X, 0, n_tokens, f, a);
}

}  // namespace

void matmul_group(std::initializer_list<const WeightView*> Ws, const float* X, int64_t n_tokens,
                  std::initializer_list<float*> Ys, bool exact) {
  if (Ws.size() != Ys.size()) throw Error("matmul_group: as many outputs as weight matrices are needed");
  const WeightView* const* w = Ws.begin();
  float* const* y = Ys.begin();
  const size_t m = Ws.size();
  for (size_t i = 1; i < m; ++i)
    if (w[i]->cols != w[0]->cols)
      throw Error(fmt::format("matmul_group: weight matrices have {} and {} columns", w[0]->cols, w[i]->cols));
  bool all_int = !exact && n_tokens > 0;
  for (size_t i = 0; i < m && all_int; ++i) all_int = qdot::format_of(w[i]->type).group > 0;
  if (!all_int) {
    for (size_t i = 0; i < m; ++i) matmul(*w[i], X, n_tokens, y[i], exact);
    return;
  }
  // One quantization of X per distinct format, then one parallel region over the row units of
  // all matrices (unit u of matrix i covers rows [16 u, 16 u + 16)).
  // Reused between calls to keep their memory; workers must see the caller's objects, so they get
  // a reference (a thread_local named inside the lambdas would be their own).
  static thread_local std::vector<qdot::Acts> caller_acts;
  std::vector<qdot::Acts>& acts = caller_acts;
  acts.resize(m);
  std::vector<size_t> which(m);
  std::vector<int64_t> first_unit(m + 1, 0);
  for (size_t i = 0; i < m; ++i) {
    const qdot::Format f = qdot::format_of(w[i]->type);
    which[i] = i;
    for (size_t j = 0; j < i; ++j) {
      const qdot::Format g = qdot::format_of(w[j]->type);
      if (g.group == f.group && g.offset == f.offset && g.has_min == f.has_min) {
        which[i] = which[j];
        break;
      }
    }
    first_unit[i + 1] = first_unit[i] + (w[i]->rows + kRowUnit - 1) / kRowUnit;
  }
  const qdot::Level lv = qdot::level();
  int64_t macs = 0;
  for (size_t i = 0; i < m; ++i) macs += w[i]->rows * w[i]->cols * n_tokens;
  if (static_parts(w, m, n_tokens)) {
    run_static_parts(
        w, m, macs,
        [&] {
          std::vector<qdot::Acts>& own = thread_acts();
          own.resize(std::max(own.size(), m));
          for (size_t i = 0; i < m; ++i)
            if (which[i] == i) quantize_input(X, n_tokens, w[i]->cols, qdot::format_of(w[i]->type), own[i]);
        },
        [&](size_t i, int64_t r0, int64_t r1) {
          qdot::dot_rows_q(lv, *w[i], r0, r1, thread_acts()[which[i]], y[i], w[i]->rows);
        });
    return;
  }
  for (size_t i = 0; i < m; ++i) {
    if (which[i] != i) continue;
    const qdot::Format f = qdot::format_of(w[i]->type);
    qdot::Acts& a = acts[i];
    qdot::prepare_acts(n_tokens, w[i]->cols, f, a);
    parallel_for(n_tokens, [&](int64_t b, int64_t e) { qdot::quantize_acts_rows(X, b, e, f, a); });
  }
  parallel_units(first_unit[m], macs, [&](int64_t b, int64_t e) {
    for (size_t i = 0; i < m; ++i) {
      const int64_t u0 = std::max(b, first_unit[i]), u1 = std::min(e, first_unit[i + 1]);
      if (u0 >= u1) continue;
      const int64_t r0 = (u0 - first_unit[i]) * kRowUnit, r1 = std::min(w[i]->rows, (u1 - first_unit[i]) * kRowUnit);
      qdot::dot_rows_q(lv, *w[i], r0, r1, acts[which[i]], y[i], w[i]->rows);
    }
  });
}

void matmul(const WeightView& W, const float* X, int64_t n_tokens, float* Y, bool exact) {
  if (n_tokens <= 0 || W.rows <= 0) return;
  if (!exact) {
    const qdot::Level lv = qdot::level();
    const qdot::Format f = qdot::format_of(W.type);
    if (f.group > 0) {  // one matrix is a group of one: the same quantization, shares and kernels
      matmul_group({&W}, X, n_tokens, {Y}, exact);
      return;
    }
    const bool float_type = W.type == GGMLType::F32 || W.type == GGMLType::F16 || W.type == GGMLType::BF16;
    if (float_type && n_tokens < 4) {
      parallel_rows(W.rows, W.rows * W.cols * n_tokens,
                    [&](int64_t b, int64_t e) { qdot::dot_rows_f(lv, W, b, e, X, n_tokens, Y, W.rows); });
      return;
    }
  }
  matmul_f32(W, X, n_tokens, Y);
}

}  // namespace kvslim
