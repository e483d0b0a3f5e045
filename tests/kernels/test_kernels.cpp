// Tests of the matmul kernels (src/kernels/matmul.cpp, quant_dot*.cpp): every weight type against
// a float64 product of ggml's dequantized weights, every SIMD level against the scalar reference
// bit for bit, and independence from the thread count and the number of tokens.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/matmul.h"
#include "kernels/packed_weights.h"
#include "kernels/quant_dot.h"
#include "kernels/threads.h"
#include "kernels/weight_prefetch.h"
#include "kvslim/error.h"
#include "kvslim/quant.h"
#include "run/decode_floor.h"
#include "support/sanitizer.h"

using namespace kvslim;

namespace {

const GGMLType kQuantTypes[] = {GGMLType::Q8_0, GGMLType::Q4_0, GGMLType::Q4_1, GGMLType::Q5_0, GGMLType::Q5_1,
                                GGMLType::Q2_K, GGMLType::Q3_K, GGMLType::Q4_K, GGMLType::Q5_K, GGMLType::Q6_K};
const GGMLType kFloatTypes[] = {GGMLType::F32, GGMLType::F16, GGMLType::BF16};

bool is_k(GGMLType t) {
  return t == GGMLType::Q2_K || t == GGMLType::Q3_K || t == GGMLType::Q4_K || t == GGMLType::Q5_K ||
         t == GGMLType::Q6_K;
}

/// A random weight matrix stored in type t, with its ggml dequantization.
struct Matrix {
  std::vector<uint8_t> bytes;
  std::vector<float> deq;  // [rows][cols]
  WeightView view;
};

Matrix make_matrix(GGMLType t, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (auto& v : w) v = nd(rng);
  for (int i = 0; i < 5; ++i) w[rng() % w.size()] *= 20.0f;  // outliers, as in real checkpoints
  Matrix m;
  const size_t rb = row_bytes(t, cols);
  m.bytes.resize(rb * rows);
  m.deq.resize(w.size());
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(t, w.data() + r * cols, m.bytes.data() + r * rb, cols);
    dequantize_row(t, m.bytes.data() + r * rb, m.deq.data() + r * cols, cols);
  }
  m.view = WeightView{t, m.bytes.data(), cols, rows, rb, {}};
  return m;
}

std::vector<float> make_acts(int64_t n, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (auto& v : x) v = nd(rng);
  for (int i = 0; i < 3; ++i) x[rng() % x.size()] = 15.0f;  // an activation outlier
  return x;
}

std::vector<qdot::Level> levels() { return qdot::supported_levels(); }

std::vector<float> run_q(qdot::Level lv, const Matrix& m, const std::vector<float>& x, int64_t n) {
  qdot::Acts a;
  qdot::quantize_acts(x.data(), n, m.view.cols, qdot::format_of(m.view.type), a);
  std::vector<float> y(static_cast<size_t>(n * m.view.rows), -1.0f);
  qdot::dot_rows_q(lv, m.view, 0, m.view.rows, a, y.data(), m.view.rows);
  return y;
}

std::vector<float> run_f(qdot::Level lv, const Matrix& m, const std::vector<float>& x, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n * m.view.rows), -1.0f);
  qdot::dot_rows_f(lv, m.view, 0, m.view.rows, x.data(), n, y.data(), m.view.rows);
  return y;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Restores the SIMD level, weight prefetch setting and thread count a test changed.
struct Restore {
  qdot::Level lv = qdot::level();
  qdot::Prefetch pf = qdot::prefetch();
  int threads = num_threads();
  ~Restore() {
    qdot::set_level(lv);
    qdot::set_prefetch(pf);
    set_num_threads(threads);
  }
};

}  // namespace

// Activation quantization, hand-derived: with max |x| = 127 the scale is exactly 1, so the
// quantized values are x rounded to nearest, ties to even.
TEST(Kernels, ActivationQuantizationRoundsToNearestEven) {
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;
  x[1] = 2.5f;
  x[2] = 3.5f;
  x[3] = -2.5f;
  x[4] = -0.4f;
  x[5] = 0.6f;
  qdot::Acts a;
  qdot::quantize_acts(x.data(), 1, 32, qdot::format_of(GGMLType::Q4_0), a);
  EXPECT_EQ(a.xd[0], 1.0f);
  const int want[] = {127, 2, 4, -2, 0, 1};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(a.q[i], want[i]) << i;
  EXPECT_EQ(a.ic[0], -8 * (127 + 2 + 4 - 2 + 0 + 1));  // q4_0 offset 8
  EXPECT_EQ(a.xs[0], 132.0f);
}

TEST(Kernels, AllZeroActivationsGiveZeros) {
  Matrix m = make_matrix(GGMLType::Q4_K, 5, 256, 1);
  std::vector<float> x(256, 0.0f);
  for (qdot::Level lv : levels())
    for (float v : run_q(lv, m, x, 1)) EXPECT_EQ(v, 0.0f);
}

// The integer decomposition (u, o, ws, wb) of every type reproduces ggml's dequantization.
TEST(Kernels, UnpackMatchesDequantization) {
  for (GGMLType t : kQuantTypes) {
    Matrix m = make_matrix(t, 2, 512, 7);
    const qdot::Format f = qdot::format_of(t);
    std::vector<uint8_t> u(512);
    std::vector<float> ws(512 / f.group), wb(ws.size());
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t k0 = 0; k0 < 512; k0 += 256) {
        qdot::unpack_row(t, m.view.row(r), k0, k0 + 256, u.data(), ws.data(), wb.data(), 1);
        for (int j = 0; j < 256; ++j) {
          const int g = j / f.group;
          const double v = double(ws[g]) * (int(u[j]) - f.offset) + wb[g];
          const double want = m.deq[r * 512 + k0 + j];
          ASSERT_NEAR(v, want, 1e-6 * std::fabs(want) + 1e-9) << type_name(t) << " row " << r << " col " << k0 + j;
        }
      }
  }
}

// Against float64 products of the dequantized weights. Weights are exact in the integer form, so
// the error comes from the activations: each x_j is replaced by xd * xq_j with
// |x_j - xd * xq_j| <= xd / 2 (xd = max|x| / 127 of its block of 32), giving at most
// sum_j |w_j| * xd_j / 2; float rounding of the per-group terms adds a relative few 1e-7 of
// sum_j |w_j| (|x_j| + xd_j) (about 2 roundings per group, 16 to 352 groups here).
TEST(Kernels, QuantizedDotsWithinActivationQuantizationBound) {
  for (GGMLType t : kQuantTypes) {
    const int64_t cols = is_k(t) ? 768 : 352, rows = 37, n = 3;
    Matrix m = make_matrix(t, rows, cols, 11);
    std::vector<float> x = make_acts(n, cols, 12);
    std::vector<float> y = run_q(qdot::level(), m, x, n);
    double worst_ratio = 0;
    for (int64_t tk = 0; tk < n; ++tk)
      for (int64_t r = 0; r < rows; ++r) {
        double ref = 0, bound = 0, slack = 0;
        for (int64_t b = 0; b < cols / 32; ++b) {
          double amax = 0;
          for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(double(x[tk * cols + b * 32 + j])));
          const double xd = amax / 127;
          for (int j = 0; j < 32; ++j) {
            const double w = m.deq[r * cols + b * 32 + j], xv = x[tk * cols + b * 32 + j];
            ref += w * xv;
            bound += std::fabs(w) * xd / 2;
            slack += std::fabs(w) * (std::fabs(xv) + xd);
          }
        }
        const double err = std::fabs(y[tk * rows + r] - ref);
        const double limit = bound * (1 + 1e-5) + slack * 2e-5;
        ASSERT_LE(err, limit) << type_name(t) << " token " << tk << " row " << r << " ref " << ref;
        worst_ratio = std::max(worst_ratio, err / limit);
      }
    EXPECT_GT(worst_ratio, 0.0) << type_name(t);  // the path really quantizes
  }
}

// f32 / f16 / bf16 weights: 64 fma lanes over cols/64 terms each, then a 6-level pairwise sum:
// relative error below (cols/64 + 7) * 2^-24 of sum |w x|.
TEST(Kernels, FloatDotsWithinRoundingBound) {
  for (GGMLType t : kFloatTypes) {
    const int64_t cols = 172, rows = 19, n = 2;  // 172: a tail after the 64-wide main loop
    Matrix m = make_matrix(t, rows, cols, 3);
    std::vector<float> x = make_acts(n, cols, 4);
    for (qdot::Level lv : levels()) {
      std::vector<float> y = run_f(lv, m, x, n);
      for (int64_t tk = 0; tk < n; ++tk)
        for (int64_t r = 0; r < rows; ++r) {
          double ref = 0, mag = 0;
          for (int64_t c = 0; c < cols; ++c) {
            ref += double(m.deq[r * cols + c]) * x[tk * cols + c];
            mag += std::fabs(double(m.deq[r * cols + c]) * x[tk * cols + c]);
          }
          EXPECT_LE(std::fabs(y[tk * rows + r] - ref), (cols / 64.0 + 7) * 0x1p-24 * mag) << type_name(t);
        }
    }
  }
}

// Every SIMD level reproduces the scalar reference bit for bit, for decode (1-3 tokens), small
// batches (up to qdot::kDecodeMaxRows) and the tiled prefill product (more), with row counts that
// leave partial tiles and column counts that leave a partial 256-column chunk.
TEST(Kernels, SimdLevelsAreBitIdentical) {
  const std::vector<qdot::Level> lvs = levels();
  if (lvs.size() == 1) GTEST_SKIP() << "no SIMD level on this CPU";
  for (GGMLType t : kQuantTypes) {
    const int64_t cols = is_k(t) ? 512 : 352, rows = 27;
    Matrix m = make_matrix(t, rows, cols, 21);
    for (int64_t n : {1, 2, 3, 5, 9, 13, 16, 17, 22, 32, 33}) {
      std::vector<float> x = make_acts(n, cols, 22 + static_cast<uint32_t>(n));
      std::vector<float> ref = run_q(qdot::Level::Scalar, m, x, n);
      for (qdot::Level lv : lvs)
        EXPECT_TRUE(same_bits(ref, run_q(lv, m, x, n))) << type_name(t) << " " << qdot::level_name(lv) << " n " << n;
    }
  }
  for (GGMLType t : kFloatTypes) {
    Matrix m = make_matrix(t, 21, 200, 5);
    std::vector<float> x = make_acts(2, 200, 6);
    std::vector<float> ref = run_f(qdot::Level::Scalar, m, x, 2);
    for (qdot::Level lv : lvs) EXPECT_TRUE(same_bits(ref, run_f(lv, m, x, 2))) << type_name(t) << qdot::level_name(lv);
  }
}

// A token's result does not depend on the batch it is computed in (decode and prefill agree).
TEST(Kernels, QuantizedResultIndependentOfBatch) {
  for (GGMLType t : {GGMLType::Q8_0, GGMLType::Q4_K, GGMLType::Q6_K}) {
    const int64_t cols = 512, rows = 40, n = 11;
    Matrix m = make_matrix(t, rows, cols, 31);
    std::vector<float> x = make_acts(n, cols, 32);
    for (qdot::Level lv : levels()) {
      std::vector<float> batch = run_q(lv, m, x, n);
      for (int64_t tk = 0; tk < n; ++tk) {
        std::vector<float> one(x.begin() + tk * cols, x.begin() + (tk + 1) * cols);
        std::vector<float> y = run_q(lv, m, one, 1);
        EXPECT_TRUE(same_bits(y, std::vector<float>(batch.begin() + tk * rows, batch.begin() + (tk + 1) * rows)))
            << type_name(t) << " token " << tk;
      }
    }
  }
}

// matmul gives bit-identical outputs with 1, 2 and 3 threads, on the fast and exact paths.
TEST(Kernels, MatmulIndependentOfThreadCount) {
  Restore restore;
  for (GGMLType t : {GGMLType::Q8_0, GGMLType::Q4_0, GGMLType::Q4_K, GGMLType::Q5_K, GGMLType::Q6_K, GGMLType::F16,
                     GGMLType::F32}) {
    const int64_t cols = 512, rows = 100;
    Matrix m = make_matrix(t, rows, cols, 41);
    for (int64_t n : {1, 7}) {
      std::vector<float> x = make_acts(n, cols, 42);
      for (bool exact : {false, true}) {
        std::vector<float> ref;
        for (int th : {1, 2, 3}) {
          set_num_threads(th);
          std::vector<float> y(static_cast<size_t>(n * rows));
          matmul(m.view, x.data(), n, y.data(), exact);
          if (th == 1) ref = y;
          else EXPECT_TRUE(same_bits(ref, y)) << type_name(t) << " n " << n << " exact " << exact << " threads " << th;
        }
      }
    }
  }
}

// The exact path is plain f32 arithmetic on ggml's dequantized weights.
TEST(Kernels, ExactPathMatchesDequantizedProduct) {
  for (GGMLType t : {GGMLType::Q4_K, GGMLType::Q8_0, GGMLType::F16}) {
    const int64_t cols = 256, rows = 9;
    Matrix m = make_matrix(t, rows, cols, 51);
    for (int64_t n : {1, 6}) {
      std::vector<float> x = make_acts(n, cols, 52);
      std::vector<float> y(static_cast<size_t>(n * rows));
      matmul(m.view, x.data(), n, y.data(), true);
      for (int64_t tk = 0; tk < n; ++tk)
        for (int64_t r = 0; r < rows; ++r) {
          double ref = 0, mag = 0;
          for (int64_t c = 0; c < cols; ++c) {
            ref += double(m.deq[r * cols + c]) * x[tk * cols + c];
            mag += std::fabs(double(m.deq[r * cols + c]) * x[tk * cols + c]);
          }
          EXPECT_LE(std::fabs(y[tk * rows + r] - ref), cols * 0x1p-24 * mag) << type_name(t);
        }
    }
  }
}

// Several matrices with one input (mixed formats, as in Q4_K_M layers) equal separate calls.
TEST(Kernels, MatmulGroupEqualsSeparateCalls) {
  const int64_t cols = 512;
  Matrix a = make_matrix(GGMLType::Q4_K, 40, cols, 61), b = make_matrix(GGMLType::Q6_K, 24, cols, 62),
         c = make_matrix(GGMLType::Q4_K, 8, cols, 63), f = make_matrix(GGMLType::F16, 8, cols, 64);
  for (int64_t n : {1, 6}) {
    std::vector<float> x = make_acts(n, cols, 65);
    std::vector<float> ya(n * 40), yb(n * 24), yc(n * 8), yf(n * 8), ra(ya.size()), rb(yb.size()), rc(yc.size()),
        rf(yf.size());
    matmul_group({&a.view, &b.view, &c.view}, x.data(), n, {ya.data(), yb.data(), yc.data()});
    matmul(a.view, x.data(), n, ra.data());
    matmul(b.view, x.data(), n, rb.data());
    matmul(c.view, x.data(), n, rc.data());
    EXPECT_TRUE(same_bits(ya, ra) && same_bits(yb, rb) && same_bits(yc, rc)) << "n " << n;
    matmul_group({&a.view, &f.view}, x.data(), n, {ya.data(), yf.data()});
    matmul(f.view, x.data(), n, rf.data());
    EXPECT_TRUE(same_bits(ya, ra) && same_bits(yf, rf)) << "with f16, n " << n;
  }
  Matrix narrow = make_matrix(GGMLType::Q8_0, 4, 256, 66);
  std::vector<float> x = make_acts(1, cols, 67), y1(40), y2(4);
  EXPECT_THROW(matmul_group({&a.view, &narrow.view}, x.data(), 1, {y1.data(), y2.data()}), Error);
}

TEST(Kernels, SetLevelRejectsUnsupported) {
  Restore restore;
  EXPECT_NO_THROW(qdot::set_level(qdot::Level::Scalar));
  for (qdot::Level l : {qdot::Level::AVX2, qdot::Level::AVXVNNI, qdot::Level::AVX512}) {
    if (qdot::cpu_has(l)) EXPECT_NO_THROW(qdot::set_level(l)) << qdot::level_name(l);
    else EXPECT_THROW(qdot::set_level(l), Error) << qdot::level_name(l);
  }
}

// Level names round-trip (KVSLIM_SIMD takes them), an unknown name is an error naming it, and the
// supported levels are in order, start at scalar and end at the detected level.
TEST(Kernels, LevelNamesAndOrder) {
  for (qdot::Level l : {qdot::Level::Scalar, qdot::Level::AVX2, qdot::Level::AVXVNNI, qdot::Level::AVX512})
    EXPECT_EQ(qdot::parse_level(qdot::level_name(l)), l);
  try {
    qdot::parse_level("avx10");
    ADD_FAILURE() << "no error for avx10";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'avx10'"), std::string::npos) << e.what();
  }
  const std::vector<qdot::Level> s = qdot::supported_levels();
  ASSERT_FALSE(s.empty());
  EXPECT_EQ(s.front(), qdot::Level::Scalar);
  EXPECT_EQ(s.back(), qdot::detected_level());
  for (size_t i = 1; i < s.size(); ++i) EXPECT_LT(static_cast<int>(s[i - 1]), static_cast<int>(s[i]));
}

// `kvslim bench` on the bundled model: a pp row per depth, a tg row per depth and a depth-fill row per press, JSON
// with the measured fields, and bad input reported as an error (exit 1) rather than a crash.
TEST(BenchCli, RunsAndWritesJson) {
  const std::string dir = ::testing::TempDir();
  const std::string stem = dir + "/kvslim_bench_" + std::to_string(::getpid());
  const std::string json = stem + ".json", out = stem + ".out";
  const std::string model = std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf";
  const std::string cmd = std::string("'") + KVSLIM_CLI + "' bench -m '" + model +
                          "' -p 32 -n 4 --depth 0,16 -r 1 -t 1 --press none --press knorm --compression-ratio 0.5 --json '" +
                          json + "' > '" + out + "' 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(json);
  ASSERT_TRUE(f.good());
  const nlohmann::json j = nlohmann::json::parse(f);
  ASSERT_EQ(j.size(), 10u);  // 2 presses x (pp32, pp32 @ d16, tg4 @ d0, fill d16, tg4 @ d16)
  EXPECT_EQ(j[0]["test"], "pp32");
  EXPECT_EQ(j[1]["test"], "pp32 @ d16");  // 32 tokens prefilled after a 16-token context (llama-bench's -d)
  EXPECT_EQ(j[1]["n_prompt"], 32);
  EXPECT_EQ(j[1]["depth"], 16);
  EXPECT_EQ(j[2]["test"], "tg4 @ d0");
  EXPECT_EQ(j[3]["test"], "fill d16");  // the prefill of the 16-token context, timed on its own
  EXPECT_EQ(j[3]["n_prompt"], 16);
  EXPECT_EQ(j[4]["test"], "tg4 @ d16");
  EXPECT_EQ(j[5]["test"], "pp32");
  for (const auto& r : j) {
    EXPECT_GT(r["avg_ts"].get<double>(), 0.0);
    EXPECT_GT(r["peak_rss_bytes"].get<double>(), 0.0);
    EXPECT_EQ(r["threads"], 1);
    EXPECT_EQ(r["n_params"], 292800);  // stories260K's tensor elements
  }
  // The ratio only on the rows of a press that takes it (regression: press none rows said 0.5).
  EXPECT_TRUE(j[0]["compression_ratio"].is_null());
  EXPECT_EQ(j[5]["compression_ratio"], 0.5);
  EXPECT_TRUE(j[0]["weight_prefetch"] == "none" || j[0]["weight_prefetch"] == "ahead");
  // KV bytes measured from the cache: knorm at ratio 0.5 keeps 16 of the 32 prefill entries.
  EXPECT_NEAR(j[5]["kv_bytes"].get<double>() / j[0]["kv_bytes"].get<double>(), 0.5, 0.05);
  EXPECT_NEAR(j[8]["kv_bytes"].get<double>() / j[3]["kv_bytes"].get<double>(), 0.5, 0.05);  // 8 of 16
  // pp32 @ d16: the press compresses the 16-token context (8 kept), the 32 tokens after it stay: 40 of 48.
  EXPECT_NEAR(j[6]["kv_bytes"].get<double>() / j[1]["kv_bytes"].get<double>(), 40.0 / 48.0, 0.03);
  std::stringstream table;
  table << std::ifstream(out).rdbuf();
  EXPECT_NE(table.str().find("| model"), std::string::npos);
  EXPECT_NE(table.str().find("tg4 @ d16"), std::string::npos);

  const std::string bad = std::string("'") + KVSLIM_CLI + "' bench -m '" + model + "' --press nosuchpress > '" + out +
                          "' 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(bad.c_str())), 1);
  std::stringstream err;
  err << std::ifstream(out).rdbuf();
  EXPECT_NE(err.str().find("nosuchpress"), std::string::npos);

  // Regression: the warm-up prefilled n_ctx - 8 tokens, negative for a tiny context (-p 2 -n 1),
  // and failed with "cannot create std::vector larger than max_size()".
  const std::string tiny = std::string("'") + KVSLIM_CLI + "' bench -m '" + model + "' -p 2 -n 1 -r 1 -t 1 > '" + out +
                           "' 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(tiny.c_str())), 0);

  // Regression: an unwritable --json path was found only after the whole run. A run that would
  // take minutes (depth 100,000) must fail at once (the timeout turns a late failure into 124).
  const std::string late = "timeout 60 '" + std::string(KVSLIM_CLI) + "' bench -m '" + model +
                           "' -p 0 --depth 100000 -n 1 -r 1 --json /nonexistent/dir/b.json > '" + out + "' 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(late.c_str())), 1);
  std::stringstream err2;
  err2 << std::ifstream(out).rdbuf();
  EXPECT_NE(err2.str().find("--json /nonexistent/dir/b.json: cannot open for writing"), std::string::npos)
      << err2.str();
}

// --parallel: decode rows for N requests at once (step_batch), each filled to the depth; the KV
// bytes are the N caches' together, so N times one request's under the same press and depth.
TEST(BenchCli, ParallelDecodesRequestsTogether) {
  const std::string stem = ::testing::TempDir() + "/kvslim_parallel_" + std::to_string(::getpid());
  const std::string model = std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf";
  const std::string base = std::string("'") + KVSLIM_CLI + "' bench -m '" + model + "' -r 1 -t 1 --no-progress";
  const std::string cmd = base + " -p 0 -n 4 --depth 0,8 --parallel 1,3 --press none --press knorm --compression-ratio 0.5 --json '" +
                          stem + ".json' > '" + stem + ".out' 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(stem + ".json");
  const nlohmann::json j = nlohmann::json::parse(f);
  ASSERT_EQ(j.size(), 8u);  // 2 presses x (x1, x3) x (d0, d8)
  EXPECT_EQ(j[0]["test"], "tg4 x1 @ d0");
  EXPECT_EQ(j[1]["test"], "tg4 x1 @ d8");
  EXPECT_EQ(j[2]["test"], "tg4 x3 @ d0");
  EXPECT_EQ(j[3]["test"], "tg4 x3 @ d8");
  EXPECT_EQ(j[3]["n_parallel"], 3);
  EXPECT_EQ(j[3]["depth"], 8);
  for (const auto& r : j) EXPECT_GT(r["avg_ts"].get<double>(), 0.0) << r["test"];
  // 8 entries each under none, 4 (knorm at 0.5) each under knorm: the bytes of 3 caches.
  EXPECT_DOUBLE_EQ(j[3]["kv_bytes"].get<double>(), 3 * j[1]["kv_bytes"].get<double>());
  EXPECT_DOUBLE_EQ(j[7]["kv_bytes"].get<double>(), 3 * j[5]["kv_bytes"].get<double>());
  EXPECT_NEAR(j[5]["kv_bytes"].get<double>() / j[1]["kv_bytes"].get<double>(), 0.5, 0.05);

  for (const std::string& bad : {std::string(" -p 0 -n 4 --parallel 2 --floor"), std::string(" -n 4 --parallel 0"),
                                 std::string(" -p 8 -n 0 --parallel 2")}) {
    const std::string c = base + bad + " > '" + stem + ".out' 2>&1";
    EXPECT_NE(WEXITSTATUS(std::system(c.c_str())), 0) << bad;
    std::stringstream err;
    err << std::ifstream(stem + ".out").rdbuf();
    EXPECT_NE(err.str().find("--parallel"), std::string::npos) << bad << ": " << err.str();
  }
}

// --floor: each decode row carries the read passes timed around it (4 before, 4 after), the bytes
// a step reads at least (the file's weights by decode_weight_bytes, tested by hand in
// test_decode_floor.cpp, plus the KV cache at the row's start) and the rate they allow, and a
// read pass after every token with the shares of the floor paired token by token.
TEST(BenchCli, FloorReportsTheDecodeShareOfTheReadRate) {
  const std::string stem = ::testing::TempDir() + "/kvslim_floor_" + std::to_string(::getpid());
  const std::string model = std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf";
  const std::string cmd = std::string("'") + KVSLIM_CLI + "' bench -m '" + model +
                          "' -p 0 -n 4 --depth 8 -r 1 -t 1 --no-progress --floor --json '" + stem + ".json' > '" + stem +
                          ".out' 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(stem + ".json");
  const nlohmann::json j = nlohmann::json::parse(f);
  ASSERT_EQ(j.size(), 2u);  // fill d8, tg4 @ d8
  EXPECT_TRUE(j[0]["read_gbps"].empty());
  const nlohmann::json& r = j[1];
  ASSERT_EQ(r["read_gbps"].size(), 8u);
  std::vector<double> g = r["read_gbps"].get<std::vector<double>>();
  for (double v : g) EXPECT_GT(v, 0.0);
  std::sort(g.begin(), g.end());
  const double median = 0.5 * (g[3] + g[4]);  // of 8 passes (regression: it took g[4] alone)
  const auto file = GGUFFile::open(model);
  const double bytes = r["floor_bytes_per_token"].get<double>();
  EXPECT_EQ(bytes, static_cast<double>(decode_weight_bytes(*file)) + r["kv_bytes"].get<double>());
  EXPECT_NEAR(r["floor_ts"].get<double>(), median * 1e9 / bytes, 1e-6 * r["floor_ts"].get<double>());
  // A read pass right after every decode token: the paired shares, recomputed from the samples.
  const auto ms = r["samples_token_ms"].get<std::vector<double>>();
  const auto tg = r["token_read_gbps"].get<std::vector<double>>();
  ASSERT_EQ(ms.size(), 4u);
  ASSERT_EQ(tg.size(), ms.size());
  double floor_s = 0, token_s = 0;
  std::vector<double> share;
  for (size_t i = 0; i < ms.size(); ++i) {
    EXPECT_GT(tg[i], 0.0);
    const double f = bytes / (tg[i] * 1e9);
    floor_s += f;
    token_s += ms[i] / 1000;
    share.push_back(f / (ms[i] / 1000));
  }
  std::sort(share.begin(), share.end());
  EXPECT_NEAR(r["paired_floor_share_total"].get<double>(), floor_s / token_s, 1e-9 * floor_s / token_s);
  EXPECT_NEAR(r["paired_floor_share_median"].get<double>(), 0.5 * (share[1] + share[2]), 1e-9 * share[3]);
  // The passes are not decode time: the test's rate is its tokens over their own times.
  EXPECT_NEAR(r["samples_ts"][0].get<double>(), 4 / token_s, 1e-6 * 4 / token_s);
  // The probe's 256 MiB stay resident through the run; they are not the decode's memory. Under a
  // sanitizer its shadow memory counts too (580 MB under TSan), so the bound does not apply there.
  if (!kSanitized) {
    EXPECT_LT(r["peak_rss_bytes"].get<double>(), 200.0 * (1 << 20));
  }
  std::stringstream table;
  table << std::ifstream(stem + ".out").rdbuf();
  EXPECT_NE(table.str().find("read floor none tg4 @ d8: "), std::string::npos) << table.str();
  EXPECT_NE(table.str().find("paired read floor none tg4 @ d8: "), std::string::npos) << table.str();
  // stories260K's 1 MB fits in any last-level cache: the line says the floor does not apply.
  EXPECT_NE(table.str().find("fit in the CPU's caches"), std::string::npos) << table.str();

  // Regression: --floor with no decode test (-n 0) printed nothing and exited 0.
  const std::string none = std::string("'") + KVSLIM_CLI + "' bench -m '" + model + "' -p 8 -n 0 -r 1 --floor > '" + stem +
                           ".err' 2>&1";
  EXPECT_EQ(WEXITSTATUS(std::system(none.c_str())), 1);
  std::stringstream err;
  err << std::ifstream(stem + ".err").rdbuf();
  EXPECT_NE(err.str().find("--floor times the decode tests, and -n 0 runs none"), std::string::npos) << err.str();
}

// KVSLIM_SIMD names the level the bench table prints; an unknown name is reported (naming the
// value) and the detected level is used rather than silently ignoring it.
TEST(BenchCli, SimdEnvironmentVariable) {
  const std::string out = ::testing::TempDir() + "/kvslim_simd_" + std::to_string(::getpid()) + ".out";
  const std::string model = std::string(KVSLIM_SOURCE_DIR) + "/models/stories260K.gguf";
  auto run = [&](const std::string& value) {
    const std::string cmd = "KVSLIM_SIMD=" + value + " '" + std::string(KVSLIM_CLI) + "' bench -m '" + model +
                            "' -p 8 -n 2 -r 1 -t 1 --no-progress > '" + out + "' 2>&1";
    EXPECT_EQ(WEXITSTATUS(std::system(cmd.c_str())), 0) << cmd;
    std::stringstream s;
    s << std::ifstream(out).rdbuf();
    return s.str();
  };
  const std::string detected = qdot::level_name(qdot::detected_level());
  for (qdot::Level l : qdot::supported_levels()) {
    const std::string text = run(qdot::level_name(l));
    EXPECT_NE(text.find(fmt::format("simd {} (detected {})", qdot::level_name(l), detected)), std::string::npos)
        << text;
  }
  const std::string bad = run("avx10");
  EXPECT_NE(bad.find("KVSLIM_SIMD=avx10"), std::string::npos) << bad;
  EXPECT_NE(bad.find(fmt::format("simd {} (detected {})", detected, detected)), std::string::npos) << bad;
}

// The integer sums at their largest: every unpacked weight value at its maximum and every
// activation quantized to +127 (then -127), so that the AVX2 prefill kernel's 16-bit partial sums
// (maddubs pairs added over up to 8 steps of 4 columns) are at their bound. Raw blocks of 0xFF
// bytes (q8_0: codes 127) with the f16 scales set to 1.0; every level and batch size against the
// scalar reference, bit for bit.
TEST(Kernels, LargestIntegerSumsBitIdentical) {
  struct Layout {
    GGMLType t;
    int block_bytes;
    std::vector<int> f16_at;
  };
  const Layout layouts[] = {{GGMLType::Q8_0, 34, {0}},      {GGMLType::Q4_0, 18, {0}},     {GGMLType::Q4_1, 20, {0, 2}},
                            {GGMLType::Q5_0, 22, {0}},      {GGMLType::Q5_1, 24, {0, 2}},  {GGMLType::Q2_K, 84, {80, 82}},
                            {GGMLType::Q3_K, 110, {108}},   {GGMLType::Q4_K, 144, {0, 2}}, {GGMLType::Q5_K, 176, {0, 2}},
                            {GGMLType::Q6_K, 210, {208}}};
  Restore restore;
  for (const Layout& l : layouts) {
    const int64_t cols = 512, rows = 19;
    const size_t rb = row_bytes(l.t, cols);
    ASSERT_EQ(rb % l.block_bytes, 0u) << type_name(l.t);
    Matrix m;
    m.bytes.assign(rb * rows, l.t == GGMLType::Q8_0 ? 0x7F : 0xFF);
    for (size_t b = 0; b < m.bytes.size(); b += l.block_bytes)
      for (int at : l.f16_at) {
        const uint16_t one = 0x3C00;
        std::memcpy(&m.bytes[b + at], &one, 2);
      }
    m.view = WeightView{l.t, m.bytes.data(), cols, rows, rb, {}};
    for (float sign : {1.0f, -1.0f})
      for (int64_t n : {1, 9}) {
        std::vector<float> x(static_cast<size_t>(n * cols), sign);
        const std::vector<float> ref = run_q(qdot::Level::Scalar, m, x, n);
        for (float v : ref) ASSERT_TRUE(std::isfinite(v)) << type_name(l.t);
        for (qdot::Level lv : levels())
          EXPECT_TRUE(same_bits(ref, run_q(lv, m, x, n)))
              << type_name(l.t) << " " << qdot::level_name(lv) << " n " << n << " sign " << sign;
      }
  }
}

namespace {

/// The matrix's rows repacked (kernels/packed_weights.h), as the model loader does.
WeightView packed_view(const Matrix& m) {
  WeightView v = m.view;
  v.packed = qdot::pack_rows(v);
  return v;
}

std::vector<float> run_view(qdot::Level lv, const WeightView& v, const std::vector<float>& x, int64_t n) {
  qdot::Acts a;
  qdot::quantize_acts(x.data(), n, v.cols, qdot::format_of(v.type), a);
  std::vector<float> y(static_cast<size_t>(n * v.rows), -1.0f);
  qdot::dot_rows_q(lv, v, 0, v.rows, a, y.data(), v.rows);
  return y;
}

/// Whether level lv reads v's packed bytes (kernels/packed_weights.h): the scalar level never does,
/// the others when the block height is theirs (16 rows at AVX-512, else 8).
bool reads_packed(qdot::Level lv, const WeightView& v) {
  if (lv == qdot::Level::Scalar) return false;
  const int wide = lv == qdot::Level::AVX512 ? 16 : 8;
  return v.packed->block_rows == wide;
}

/// run_view, with the file's rows replaced by zeros where level lv is to read the packed bytes: a
/// call that fell back to the in-place kernels then gives zeros instead of the reference, so a test
/// comparing with the reference also checks that the packed kernels ran.
std::vector<float> run_view_packed(qdot::Level lv, WeightView v, const std::vector<float>& x, int64_t n) {
  std::vector<uint8_t> zeros;
  if (reads_packed(lv, v)) {
    zeros.assign(static_cast<size_t>(v.rows) * v.row_stride, 0);
    v.data = zeros.data();
  }
  return run_view(lv, v, x, n);
}

}  // namespace

// Packed rows (16-row interleaved blocks at the AVX-512 level, else 8-row) give the scalar
// reference's result on the file's rows, bit for bit, at every level and batch size (decode 1-3
// tokens; small batches up to qdot::kDecodeMaxRows (16 for q6_K), which split into passes of each
// kernel's largest count; prefill tiles above), with row counts that leave a partial block and a partial AVX-512 tile. The AVX2
// q8_0 and q4_K prefill take 16 rows and 4 activation rows at a time (micro_q8x2, micro_q4x2): rows
// 16, 27 (a last 16-row block with 3 rows in its second half; every type at AVX-512: 11 rows in the
// last block) and 40 (two 16-row blocks, then 8 rows alone), and 33, 34, 35 activation rows (a last
// group of 1, 2 or 3). The rows are packed at every level in turn (each level's layout) and each
// packing is read at every level: a level that does not read the layout takes the in-place kernels,
// with the same bits; one that does reads only the packed bytes (its file rows are zeros there,
// run_view_packed).
TEST(Kernels, PackedRowsBitIdentical) {
  Restore restore;
  for (GGMLType t : {GGMLType::Q4_K, GGMLType::Q6_K, GGMLType::Q8_0})
  for (int64_t rows : {1, 8, 16, 27, 40}) {
    for (int64_t cols : {256, 768}) {
      Matrix m = make_matrix(t, rows, cols, 71 + static_cast<uint32_t>(rows));
      for (qdot::Level pack_level : levels()) {
        qdot::set_level(pack_level);
        const WeightView pv = packed_view(m);
        ASSERT_TRUE(pv.packed);
        for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 18, 19, 32, 33, 34, 35}) {
          std::vector<float> x = make_acts(n, cols, 72 + static_cast<uint32_t>(n));
          const std::vector<float> ref = run_q(qdot::Level::Scalar, m, x, n);
          for (qdot::Level lv : levels())
            EXPECT_TRUE(same_bits(ref, run_view_packed(lv, pv, x, n)))
                << type_name(t) << " packed at " << qdot::level_name(pack_level) << ", read at " << qdot::level_name(lv)
                << " rows " << rows << " cols " << cols << " n " << n;
        }
      }
    }
  }
}

// Weight prefetch (weight_prefetch.h) only moves lines earlier: under both settings the packed and
// the in-place decode kernels give the scalar reference's bits at every level, over rows long enough
// for requests to run ahead of the reads and to reach the end of the call's rows (72 rows x 2,048
// columns: five 16-row AVX-512 blocks, the last holding 8 rows, or nine 8-row ones, of 8 super-blocks).
// Above kDecodeMaxRows the prefill tiles run in pairs and request the next pair's bytes while a pair
// computes, up to the call's end: two pairs and a lone tile at AVX-512, four pairs and one at AVX-VNNI.
TEST(Kernels, WeightPrefetchKeepsBits) {
  Restore restore;
  for (qdot::Prefetch p : {qdot::Prefetch::None, qdot::Prefetch::Ahead}) {
    qdot::set_prefetch(p);
    for (GGMLType t : {GGMLType::Q4_K, GGMLType::Q6_K, GGMLType::Q8_0}) {
      const int64_t rows = 72, cols = 2048;
      Matrix m = make_matrix(t, rows, cols, 131);
      for (int64_t n : {int64_t{1}, int64_t{2}, qdot::kDecodeMaxRows + 4}) {
        std::vector<float> x = make_acts(n, cols, 132 + static_cast<uint32_t>(n));
        const std::vector<float> ref = run_q(qdot::Level::Scalar, m, x, n);
        for (qdot::Level lv : levels()) {
          qdot::set_level(lv);
          const WeightView pv = packed_view(m);
          EXPECT_TRUE(same_bits(ref, run_view_packed(lv, pv, x, n)))
              << type_name(t) << " packed, " << qdot::level_name(lv) << ", prefetch " << qdot::prefetch_name(p) << ", n " << n;
          EXPECT_TRUE(same_bits(ref, run_q(lv, m, x, n)))
              << type_name(t) << " in place, " << qdot::level_name(lv) << ", prefetch " << qdot::prefetch_name(p) << ", n " << n;
        }
      }
    }
  }
}

// A small batch runs its activation rows in passes over stripes of weight rows (about 128 KiB of
// packed bytes each); the first pass requests lines ahead for the whole call, the later ones none.
// (The AVX-512 q4_K and q6_K passes enter each stripe with 2 rows, so from 5 and 4 rows on they take
// stripes below kMax too.)
// Over matrices of several stripes, ending mid-stripe and mid-block, every batch size up to
// kDecodeMaxRows gives the scalar reference's bits, under both prefetch settings.
TEST(Kernels, SmallBatchStripesKeepBits) {
  Restore restore;
  for (qdot::Prefetch p : {qdot::Prefetch::None, qdot::Prefetch::Ahead}) {
    qdot::set_prefetch(p);
    for (GGMLType t : {GGMLType::Q4_K, GGMLType::Q6_K, GGMLType::Q8_0}) {
      const int64_t rows = 1195, cols = 512;  // q8_0: 544 bytes a row, 240 rows a stripe at AVX-512
      Matrix m = make_matrix(t, rows, cols, 141);
      for (int64_t n : {int64_t{4}, int64_t{5}, int64_t{6}, int64_t{8}, int64_t{11}, int64_t{16}, int64_t{17},
                        qdot::kDecodeMaxRows}) {
        std::vector<float> x = make_acts(n, cols, 142 + static_cast<uint32_t>(n));
        const std::vector<float> ref = run_q(qdot::Level::Scalar, m, x, n);
        for (qdot::Level lv : levels()) {
          if (lv == qdot::Level::Scalar) continue;
          qdot::set_level(lv);
          const WeightView pv = packed_view(m);
          EXPECT_TRUE(same_bits(ref, run_view_packed(lv, pv, x, n)))
              << type_name(t) << " " << qdot::level_name(lv) << ", prefetch " << qdot::prefetch_name(p) << ", n " << n;
        }
      }
    }
  }
}

TEST(Kernels, WeightPrefetchNames) {
  EXPECT_EQ(qdot::parse_prefetch("none"), qdot::Prefetch::None);
  EXPECT_EQ(qdot::parse_prefetch("ahead"), qdot::Prefetch::Ahead);
  EXPECT_STREQ(qdot::prefetch_name(qdot::Prefetch::None), "none");
  EXPECT_STREQ(qdot::prefetch_name(qdot::Prefetch::Ahead), "ahead");
  try {
    qdot::parse_prefetch("later");
    ADD_FAILURE() << "no error for an unknown setting";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'later'"), std::string::npos) << e.what();
  }
}

// Every packed type takes 16 rows a block at the AVX-512 level and 8 at the others (packed_weights.h).
TEST(Kernels, PackedBlockRowsFollowTheLevel) {
  Restore restore;
  for (GGMLType t : {GGMLType::Q4_K, GGMLType::Q8_0, GGMLType::Q6_K}) {
    Matrix m = make_matrix(t, 40, 256, 97);
    const size_t row_bytes = t == GGMLType::Q4_K ? 148 : t == GGMLType::Q8_0 ? 272 : 212;
    for (qdot::Level lv : levels()) {
      qdot::set_level(lv);
      const WeightView pv = packed_view(m);
      const int n = lv == qdot::Level::AVX512 ? 16 : 8;
      EXPECT_EQ(pv.packed->block_rows, n) << type_name(t) << " " << qdot::level_name(lv);
      EXPECT_EQ(pv.packed->row_blocks, (40 + n - 1) / n) << type_name(t) << " " << qdot::level_name(lv);
      EXPECT_EQ(pv.packed->block_bytes, row_bytes * n) << type_name(t) << " " << qdot::level_name(lv);
    }
  }
}

// The packed kernels add maddubs pairs in 16 bits (q4_K: 8 steps of a group, q6_K: 2 steps; q8_0
// uses the sign trick, its pairs reach 2 * 128 * 127 with codes -128): at the largest sums still
// exact. q4_K: every nibble 15, every 6-bit scale and min 63, d = dmin = 1,
// so each column weighs 63 * 15 - 63 = 882; q6_K: every value 63 (offset 32: weight 31) with
// scales 0x7F = 127 (each column 127 * 31 = 3937); activations all +1 or all -1 (codes +-127,
// scale 1/127); q8_0: codes 127, then -128, with d = 1.
TEST(Kernels, PackedRowsLargestSumsBitIdentical) {
  Restore restore;
  struct Case {
    GGMLType t;
    int block_bytes;
    std::vector<int> f16_at;
    uint8_t fill;
    double column;
  };
  for (const Case& c : {Case{GGMLType::Q4_K, 144, {0, 2}, 0xFF, 882.0}, Case{GGMLType::Q6_K, 210, {208}, 0xFF, 0},
                        Case{GGMLType::Q8_0, 34, {0}, 0x7F, 127.0}, Case{GGMLType::Q8_0, 34, {0}, 0x80, -128.0}}) {
    const int64_t cols = 512, rows = 19;
    const size_t rb = row_bytes(c.t, cols);
    Matrix m;
    m.bytes.assign(rb * rows, c.fill);
    for (size_t b = 0; b < m.bytes.size(); b += c.block_bytes) {
      for (int at : c.f16_at) {
        const uint16_t one = 0x3C00;
        std::memcpy(&m.bytes[b + at], &one, 2);
      }
      if (c.t == GGMLType::Q6_K) std::memset(&m.bytes[b + 192], 0x7F, 16);  // int8 scales 127
    }
    const double column = c.t == GGMLType::Q6_K ? 127.0 * 31 : c.column;
    m.view = WeightView{c.t, m.bytes.data(), cols, rows, rb, {}};
    for (qdot::Level pack_level : levels()) {  // each level's block layout, read by its own kernels
      qdot::set_level(pack_level);
      const WeightView pv = packed_view(m);
      for (float sign : {1.0f, -1.0f})
        for (int64_t n : {1, 3, 8, 9, 17, 33}) {
          std::vector<float> x(static_cast<size_t>(n * cols), sign);
          const std::vector<float> ref = run_q(qdot::Level::Scalar, m, x, n);
          for (float v : ref) ASSERT_NEAR(v, sign * column * cols, 1e-5 * std::fabs(column) * cols) << type_name(c.t);
          for (qdot::Level lv : levels())
            EXPECT_TRUE(same_bits(ref, run_view_packed(lv, pv, x, n)))
                << type_name(c.t) << " packed at " << qdot::level_name(pack_level) << ", read at "
                << qdot::level_name(lv) << " n " << n << " sign " << sign;
        }
    }
  }
}

// matmul with packed rows: the same bits as without, for 1-3 threads (rows are split in 16s, so
// calls start inside the matrix), at every level with the rows packed for it.
TEST(Kernels, PackedRowsMatmulMatchesUnpacked) {
  Restore restore;
  const int64_t cols = 512, rows = 100;
  for (GGMLType t : {GGMLType::Q4_K, GGMLType::Q6_K, GGMLType::Q8_0})
    for (qdot::Level lv : levels()) {
      if (lv == qdot::Level::Scalar) continue;  // no packed kernels
      qdot::set_level(lv);
      Matrix m = make_matrix(t, rows, cols, 81);
      WeightView pv = packed_view(m);
      ASSERT_TRUE(reads_packed(lv, pv));
      const std::vector<uint8_t> zeros(m.bytes.size(), 0);
      pv.data = zeros.data();  // only the packed bytes can give the reference
      for (int64_t n : {1, 7}) {
        std::vector<float> x = make_acts(n, cols, 82);
        std::vector<float> ref(static_cast<size_t>(n * rows));
        set_num_threads(1);
        matmul(m.view, x.data(), n, ref.data());
        for (int th : {1, 2, 3}) {
          set_num_threads(th);
          std::vector<float> y(ref.size());
          matmul(pv, x.data(), n, y.data());
          EXPECT_TRUE(same_bits(ref, y)) << type_name(t) << " " << qdot::level_name(lv) << " n " << n << " threads " << th;
        }
      }
    }
}

// Thread-major packing (pack_thread_major, 1-3 parts): thread i's share of every matrix lies in
// arena i in the given order (each part from a 4 KiB boundary), each part holds the bytes pack_rows gives those rows,
// and products read from the parts give the unpacked matrix's bits at every level, with the
// static shares of a decode step (threads = parts, 1 and 3 tokens), the row runs of prefill (7
// tokens) and any other thread count (the parts split as rows come). Rows: 100 (q4_K, parts
// ending mid-block at the AVX-512 level's 16 rows), 40 (q6_K, same columns: the two go through
// matmul_group with two activation formats), 300 (q8_0), 8 (fewer 16-row units than parts: empty
// parts). The file rows are zeros where the packed kernels read, so only the parts can give the
// reference.
TEST(Kernels, ThreadMajorPackingMatchesUnpacked) {
  Restore restore;
  struct Spec {
    GGMLType t;
    int64_t rows, cols;
  };
  // The last matrix is large enough for its decode products to run in parallel (the others run on
  // the calling thread), so a thread finishing its part early takes the others' last rows.
  const std::vector<Spec> specs = {{GGMLType::Q4_K, 100, 512}, {GGMLType::Q6_K, 40, 512}, {GGMLType::Q8_0, 300, 768},
                                   {GGMLType::Q4_K, 8, 256}, {GGMLType::Q4_K, 1040, 1024}};
  std::vector<Matrix> ms;
  for (size_t i = 0; i < specs.size(); ++i) ms.push_back(make_matrix(specs[i].t, specs[i].rows, specs[i].cols, 90 + static_cast<uint32_t>(i)));
  for (qdot::Level lv : levels()) {
    if (lv == qdot::Level::Scalar) continue;  // no packed kernels
    qdot::set_level(lv);
    for (int parts : {1, 2, 3}) {
      std::vector<WeightView> vs;
      std::vector<std::vector<uint8_t>> zeros;
      for (const Matrix& m : ms) {
        vs.push_back(m.view);
        zeros.emplace_back(m.bytes.size(), 0);
      }
      std::vector<WeightView*> order;
      for (WeightView& v : vs) order.push_back(&v);
      qdot::pack_thread_major(order, parts);
      const std::string where = fmt::format("{} parts {}", qdot::level_name(lv), parts);
      for (size_t w = 0; w < vs.size(); ++w) {
        const qdot::PackedRows& P = *vs[w].packed;
        ASSERT_EQ(P.parts.size(), static_cast<size_t>(parts)) << where;
        EXPECT_FALSE(P.bytes) << where;
        const std::shared_ptr<const qdot::PackedRows> alone = qdot::pack_rows(ms[w].view);
        for (int i = 0; i < parts; ++i) {
          const qdot::PackedRows::Part& part = P.parts[static_cast<size_t>(i)];
          EXPECT_EQ(part.row0, std::min<int64_t>(specs[w].rows, 16 * (((specs[w].rows + 15) / 16) * i / parts))) << where;
          const size_t n = part.row0 < part.row1 ? static_cast<size_t>((part.row1 + P.block_rows - 1) / P.block_rows - part.row0 / P.block_rows) *
                                                        static_cast<size_t>(P.cols / 256) * P.block_bytes
                                                  : 0;
          if (n) {
            EXPECT_EQ(std::memcmp(part.at, alone->block(part.row0 / P.block_rows, 0), n), 0)
                << where << " matrix " << w << " part " << i;
          }
          // The next matrix's part follows at the next 4 KiB boundary.
          if (w + 1 < vs.size()) {
            EXPECT_EQ(vs[w + 1].packed->parts[static_cast<size_t>(i)].at, part.at + (n + 4095) / 4096 * 4096)
                << where << " matrix " << w << " part " << i;
          }
        }
        vs[w].data = zeros[w].data();
      }
      for (int64_t n : {1, 3, 7, 20, 40}) {
        std::vector<std::vector<float>> ref;
        set_num_threads(1);
        for (const Matrix& m : ms) {
          const std::vector<float> x = make_acts(n, m.view.cols, 91);
          ref.emplace_back(static_cast<size_t>(n * m.view.rows));
          matmul(m.view, x.data(), n, ref.back().data());
        }
        for (int th : {1, 2, 3}) {
          set_num_threads(th);
          for (size_t w = 0; w < vs.size(); ++w) {
            const std::vector<float> x = make_acts(n, vs[w].cols, 91);
            std::vector<float> y(ref[w].size());
            matmul(vs[w], x.data(), n, y.data());
            EXPECT_TRUE(same_bits(ref[w], y)) << where << " matrix " << w << " n " << n << " threads " << th;
          }
          const std::vector<float> x = make_acts(n, 512, 91);
          std::vector<float> y0(ref[0].size()), y1(ref[1].size());
          matmul_group({&vs[0], &vs[1]}, x.data(), n, {y0.data(), y1.data()});
          EXPECT_TRUE(same_bits(ref[0], y0) && same_bits(ref[1], y1)) << where << " group, n " << n << " threads " << th;
        }
      }
    }
  }
}

// A packed matrix of 2 MiB or more starts on a 2 MiB boundary (so that its spans can be huge
// pages) and decodes to the same bits as the file's rows, at every SIMD level with the rows packed
// for it (read from the packed bytes only).
TEST(Kernels, LargePackedMatrixIsHugePageAlignedAndExact) {
  Restore restore;
  const int64_t cols = 2048, rows = 1000;  // 125 x 8 x 2,176 bytes packed = 2.08 MiB (AVX-512: 63 x 4,352 x 8)
  Matrix m = make_matrix(GGMLType::Q8_0, rows, cols, 95);
  std::vector<float> x = make_acts(1, cols, 96);
  set_num_threads(1);
  std::vector<float> ref(static_cast<size_t>(rows));
  matmul(m.view, x.data(), 1, ref.data());
  const std::vector<uint8_t> zeros(m.bytes.size(), 0);
  for (qdot::Level lv : levels()) {
    if (lv == qdot::Level::Scalar) continue;  // the scalar level does not read packed rows
    qdot::set_level(lv);
    WeightView pv = packed_view(m);
    ASSERT_TRUE(pv.packed);
    ASSERT_GE(static_cast<size_t>(pv.packed->row_blocks * (cols / 256)) * pv.packed->block_bytes, size_t{2} << 20);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(pv.packed->bytes.get()) % (uintptr_t{2} << 20), 0u);
    ASSERT_TRUE(reads_packed(lv, pv));
    pv.data = zeros.data();
    std::vector<float> y(ref.size());
    matmul(pv, x.data(), 1, y.data());
    EXPECT_TRUE(same_bits(ref, y)) << qdot::level_name(lv);
  }
}

// Only q4_K, q6_K and q8_0 rows whose length is a multiple of 256 are packed.
TEST(Kernels, PackRowsRejectsOtherTypes) {
  Matrix q4 = make_matrix(GGMLType::Q4_0, 8, 256, 91), q8 = make_matrix(GGMLType::Q8_0, 8, 224, 94);
  EXPECT_FALSE(qdot::packable(q4.view));
  EXPECT_THROW(qdot::pack_rows(q4.view), Error);
  EXPECT_FALSE(qdot::packable(q8.view));
  Matrix k4 = make_matrix(GGMLType::Q4_K, 8, 256, 92), k6 = make_matrix(GGMLType::Q6_K, 3, 512, 93);
  EXPECT_TRUE(qdot::packable(k4.view));
  EXPECT_TRUE(qdot::packable(k6.view));
}

// The activation quantization (AVX2 code above the scalar level, SSE2 at it) gives the same bytes,
// scales and sums at every level, for groups of 32 and 16, with zero blocks, NaN, infinities, huge
// and tiny values; and holds hand-derived values.
TEST(QuantizeActs, SameAtEveryLevel) {
  const qdot::Level saved = qdot::level();
  const int64_t rows = 5, cols = 256;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (auto& v : x) v = nd(rng);
  for (int j = 32; j < 64; ++j) x[j] = 0.0f;                        // an all-zero block
  x[70] = NAN;                                                       // NaN in a block
  x[100] = INFINITY;                                                 // an infinite block
  x[cols + 5] = 3e38f, x[cols + 40] = 1e-40f, x[cols + 41] = -1e-40f;  // huge, subnormal
  for (int j = 0; j < 32; ++j) x[2 * cols + j] = (j % 2 ? -1.0f : 1.0f) * (j + 0.5f) * (127.0f / 31.5f) / 127.0f;
  for (GGMLType t : {GGMLType::Q8_0, GGMLType::Q6_K, GGMLType::Q4_K}) {
    const qdot::Format f = qdot::format_of(t);
    std::vector<qdot::Acts> out;
    for (qdot::Level lv : qdot::supported_levels()) {
      qdot::set_level(lv);
      out.emplace_back();
      qdot::quantize_acts(x.data(), rows, cols, f, out.back());
    }
    for (size_t i = 1; i < out.size(); ++i) {
      EXPECT_EQ(out[i].q, out[0].q) << type_name(t) << " level " << i;
      EXPECT_EQ(std::memcmp(out[i].xd.data(), out[0].xd.data(), out[0].xd.size() * 4), 0) << type_name(t);
      EXPECT_EQ(std::memcmp(out[i].xs.data(), out[0].xs.data(), out[0].xs.size() * 4), 0) << type_name(t);
      EXPECT_EQ(out[i].ic, out[0].ic) << type_name(t);
    }
    // Hand-derived: row 2's first block is +-(j + 0.5) / 31.5, max 1 at j = 31, so q = +-(j + 0.5)
    // * 127 / 31.5 rounded; the zero block has scale 0 and codes 0.
    const qdot::Acts& a = out.back();
    for (int j = 0; j < 32; ++j) {
      const double want = (j % 2 ? -1.0 : 1.0) * std::nearbyint((j + 0.5) * 127.0 / 31.5);
      EXPECT_EQ(a.q[2 * cols + j], want) << j;
      EXPECT_EQ(a.q[32 + j], 0);
    }
    EXPECT_EQ(a.xd[32 / f.group], 0.0f);
  }
  qdot::set_level(saved);
}
