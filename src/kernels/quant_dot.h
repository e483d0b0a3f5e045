#pragma once
// Dot products of weight rows kept in their GGUF type with activation rows (the fast, non-exact
// matmul path), for a scalar, an AVX2, an AVX-VNNI and an AVX-512 (VNNI) level chosen at run time.
//
// Quantized weights (q4_0 ... q8_0, q2_K ... q6_K) use integer dot products, as llama.cpp does,
// against activations quantized to 8 bits per block of 32 (scale = max|x| / 127, round to
// nearest even). Every level, batch size and thread count computes the same canonical result,
// bit for bit:
//
//   each weight row is read as groups of G values (G = 32; 16 for q6_K, q3_K, q2_K), value
//   j of group g being ws_g * (u_j - o) + wb_g with small unsigned integers u_j, a per-type
//   offset o and per-group float scale ws_g and min wb_g (wb_g only for types with mins);
//   per group:  isum = sum_j u_j * xq_j - o * sum_j xq_j           (exact, int32)
//               acc  = fma(ws_g * xd_g, float(isum), acc)
//               acc  = fma(wb_g, xs_g, acc)                          (types with mins)
//   where xq are the quantized activations, xd_g the scale of their 32-block and
//   xs_g = xd_g * float(sum_j xq_j). The row's result is acc after the last group.
//
// f32, f16 and bf16 weights are multiplied with f32 activations in 64 interleaved fma lanes
// (element i feeds lane i % 64), reduced pairwise at the end, again identical on every level.
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/matmul.h"

namespace kvslim::qdot {

/// SIMD levels, in order. AVX2 needs avx2+fma+f16c; AVXVNNI adds AVX-VNNI (the VEX vpdpbusd,
/// CPUID.(7,1):EAX[4]); AVX512 needs avx512f/bw/dq/vl/vnni on top of AVX2 (not AVX-VNNI: Zen 4 and
/// Ice Lake lack it). Each level's weight kernels run on the CPUs that have its features, whatever
/// higher level they also have; attention and the KV decoders use the AVX2 code at AVXVNNI.
enum class Level : int { Scalar = 0, AVX2 = 1, AVXVNNI = 2, AVX512 = 3 };

/// Whether this CPU (and OS) can run level `l`.
bool cpu_has(Level l);
/// Every level this CPU can run, lowest first (tests and benchmarks loop over them).
std::vector<Level> supported_levels();
/// The best level this CPU supports: AVX512, else AVXVNNI, else AVX2, else Scalar.
Level detected_level();
/// The level used by matmul: the detected one, or KVSLIM_SIMD (scalar|avx2|avxvnni|avx512) when
/// set and supported, or the last set_level(). An unknown or unsupported KVSLIM_SIMD value is
/// reported once on stderr and the detected level is used.
Level level();
/// Selects the level (tests, benchmarks). Throws kvslim::Error if the CPU lacks it.
void set_level(Level l);
const char* level_name(Level l);
/// The level named `name` (as level_name prints it); throws kvslim::Error naming it otherwise.
Level parse_level(const std::string& name);

/// How a quantized type is read as integer groups (see the file comment).
struct Format {
  int group = 0;         ///< values per group: 32 or 16; 0 = not an integer-dot type
  int offset = 0;        ///< o
  bool has_min = false;  ///< wb_g present
};
/// Format of `t`; group == 0 for f32/f16/bf16 and others.
Format format_of(GGMLType t);

/// Activation rows quantized for one weight format: 8-bit values per block of 32 plus per-group
/// facts. Arrays are row-major over activation rows.
struct Acts {
  int64_t rows = 0, cols = 0;
  int group = 32;
  std::vector<int8_t> q;    ///< [rows][cols]
  std::vector<float> xd;    ///< [rows][cols/group] scale of the 32-block holding the group
  std::vector<float> xs;    ///< [rows][cols/group] xd * sum of q over the group
  std::vector<int32_t> ic;  ///< [rows][cols/group] -offset * sum of q over the group
  int64_t groups() const { return cols / group; }
};

/// Quantizes `rows` rows of `cols` f32 values (cols a multiple of 32, else kvslim::Error) for
/// format `f`. Identical on every level (SSE2 code at the scalar level, AVX2 above it, same bits).
void quantize_acts(const float* X, int64_t rows, int64_t cols, const Format& f, Acts& out);
/// Sizes `out` for quantize_acts_rows (same checks as quantize_acts).
void prepare_acts(int64_t rows, int64_t cols, const Format& f, Acts& out);
/// Quantizes rows [r0, r1) of X into a prepared `out` (lets callers split rows across threads).
void quantize_acts_rows(const float* X, int64_t r0, int64_t r1, const Format& f, Acts& out);

/// Activation rows (tokens) up to which dot_rows_q runs the matrix-vector (decode) kernels, one
/// activation row at a time over each weight row; above it, the prefill tiles.
constexpr int64_t kGemvMaxRows = 3;
/// Activation rows up to which dot_rows_q reads each packed weight row once for all of them (a
/// decode step of a small batch of requests; kernels/packed_weights.h): the matrix-vector kernels,
/// run a few activation rows at a time over stripes of weight rows held in cache (q6_K up to 16
/// rows). Above it, and for rows read in place, the prefill tiles. Decode products up to it take
/// the threads' static shares of thread-major weights (kernels/matmul.cpp).
constexpr int64_t kDecodeMaxRows = 32;

/// Y[t * ldy + r] for r in [r0, r1), t in [0, a.rows): the canonical integer dot products of
/// weight rows of W (an integer-dot type) with the activation rows in `a`, at level `lv`.
/// Rows are computed independently (callers split [0, W.rows) across threads freely).
void dot_rows_q(Level lv, const WeightView& W, int64_t r0, int64_t r1, const Acts& a, float* Y, int64_t ldy);

/// Same for f32/f16/bf16 weights and f32 activations X [n_tok][W.cols].
void dot_rows_f(Level lv, const WeightView& W, int64_t r0, int64_t r1, const float* X, int64_t n_tok, float* Y,
                int64_t ldy);

/// Scalar decomposition of elements [k0, k1) of one row (k0, k1 multiples of 256 or of the
/// block size, inside the row) into u[0, k1-k0) and, per group, ws[i * stride], wb[i * stride]
/// (wb = 0 for types without mins). Used by every level, so all see the same u, ws and wb.
void unpack_row(GGMLType t, const uint8_t* row, int64_t k0, int64_t k1, uint8_t* u, float* ws, float* wb,
                int stride);

// ---- per-level entry points (defined in quant_dot_{avx2,avxvnni,avx512}.cpp) ----
namespace avx2 {
void dot_rows_q(const WeightView& W, int64_t r0, int64_t r1, const Acts& a, float* Y, int64_t ldy);
void dot_rows_f(const WeightView& W, int64_t r0, int64_t r1, const float* X, int64_t n_tok, float* Y, int64_t ldy);
}  // namespace avx2
namespace avxvnni {
void dot_rows_q(const WeightView& W, int64_t r0, int64_t r1, const Acts& a, float* Y, int64_t ldy);
void dot_rows_f(const WeightView& W, int64_t r0, int64_t r1, const float* X, int64_t n_tok, float* Y, int64_t ldy);
}  // namespace avxvnni
namespace avx512 {
void dot_rows_q(const WeightView& W, int64_t r0, int64_t r1, const Acts& a, float* Y, int64_t ldy);
void dot_rows_f(const WeightView& W, int64_t r0, int64_t r1, const float* X, int64_t n_tok, float* Y, int64_t ldy);
}  // namespace avx512

/// Pairwise sum of 64 lanes: lanes[i] += lanes[i + w] for w = 32, 16, ..., 1; returns lanes[0].
float reduce64(float* lanes);

}  // namespace kvslim::qdot
