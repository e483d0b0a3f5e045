#pragma once
// Weight matrices repacked at load time for the SIMD decode kernels: rows interleaved in blocks of
// n = 8 or 16, so that one vector holds the same four columns' bytes of all the block's rows and the
// matrix-vector product needs no horizontal sums (rows sit in the vector lanes, as in the prefill
// tiles).
//
// Layout: [row block b = rows / n, rounded up][super-block s = cols / 256][block_bytes], rows past
// the end zero (their scales are zero; their results are never stored).
//
// The model loader packs thread-major (pack_thread_major): a matrix's rows are cut into one part per
// thread (whole 16-row units), each part laid out as above as a matrix of its own rows, and thread
// i's parts of all matrices lie back to back in one arena in the order decode reads them. A decode
// step's thread then streams one run of memory per token instead of starting a new run at each
// matrix (and at each dynamic chunk of rows): Zen 5, 2 threads, the products came from 0.87 to 0.92
// of the read rate in gemv_stream_bench, decode at 70-76 GB/s from 80-86% to 84-88% of the read
// floor; the prefill of 512 tokens came out up to 3% slower, for a reason not found.
//
// q4_K, one n-row super-block of 256 columns, 148 n bytes (148 per row; the file has 144); n = 16
// when packed at the AVX-512 level, else 8:
//   [0, 2n)        d of rows 0..n-1 (f16)
//   [2n, 4n)       dmin of rows 0..n-1 (f16)
//   [4n, 12n)      6-bit scale of group g (32 columns) and row r at 4n + n g + r (one byte each)
//   [12n, 20n)     6-bit min of group g and row r at 12n + n g + r
//   [20n, 148n)    32 vectors of 4n bytes, vector 8 p + q (p = 0..3, q = 0..7): byte 4 r + i is byte
//                  32 p + 4 q + i of row r's 128 quant bytes, i.e. columns 64 p + 4 q + i (low
//                  nibble, group 2 p) and 64 p + 32 + 4 q + i (high nibble, group 2 p + 1).
//   With n = 16 (2,368 bytes, 37 cache lines) the AVX-512 kernel holds all 16 rows in one register:
//   with 8-row blocks it folded two packed vectors per register and ran its float part per 8 rows;
//   16 rows a register does the same steps on twice the rows (Zen 5: 102-106 -> 127-152 GMAC/s in
//   cache; Q4_K_M decode 4% and 12% faster, means of two alternating runs). The AVX2 kernels were
//   slower from 16-row blocks when streamed from memory (decode -9%), so they keep 8.
//
// q6_K, one n-row super-block, 212 n bytes (212 per row; the file has 210); n = 16 when packed at
// the AVX-512 level, else 8:
//   [0, 2n)       d of rows 0..n-1 (f16)
//   [2n, 18n)     int8 scale of group g (16 columns) and row r at 2n + n g + r; [18n, 20n) zero
//   [20n, 212n)   16 units of three 4n-byte vectors V0, V1, V2. Unit (h, j) (h = 0, 1: 128-column
//                 half; j = 0..7: 4-column step) holds row r's 6-bit values u_k (k = 0..3) of columns
//                 128 h + 32 k + 4 j + i (i = 0..3): byte 4 r + i of V_k is u_k (k < 3) in its low
//                 six bits, and the top two bits of V0, V1, V2 are bits 0-1, 2-3, 4-5 of u_3. So the
//                 first three quads are a mask each and the fourth a few shifts and selects
//                 (qdot's q6k_quads); ggml's split into 4-bit ql and 2-bit qh planes (ql byte 64 h +
//                 l: columns 128 h + l and 128 h + 64 + l; byte 64 h + 32 + l: 128 h + 32 + l and
//                 128 h + 96 + l; qh byte 32 h + l: the top bits of all four) took twice the
//                 instructions to put the values together. Units lie in the order the kernels read
//                 them, j and j + 4 side by side (q6k_unit).
//   With n = 16 the AVX-512 kernel holds all 16 rows in one register, as for q4_K.
// q8_0, one n-row super-block of 8 blocks of 32, 272 n bytes (272 per row, as in the file); n = 16
// when packed at the AVX-512 level, else 8:
//   [0, 16n)       d of block g (32 columns) and row r at 2n g + 2r (f16)
//   [16n, 272n)    64 vectors of 4n bytes, vector 8 g + q byte 4 r + i = code of column 32 g + 4 q + i
//                  of row r
//   (n = 16: the AVX-512 kernel takes all 16 rows a register; in cache 64 -> 80 GMAC/s, Zen 5; Q8_0
//   decode, bound by the memory there, did not change measurably.)
//
// The packed values are the file's own (no rounding): every kernel computes the canonical result
// of kernels/quant_dot.h from them, bit for bit the same as from the file's rows.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/matmul.h"

namespace kvslim::qdot {

/// Byte offset in a packed q6_K block of n rows of unit (h, j) (h = 0, 1: 128-column half; j = 0..7:
/// 4-column step): its vectors V0, V1, V2 at 4n-byte steps from there. Units in the order 0, 4, 1,
/// 5, 2, 6, 3, 7 within a half, as the AVX-512 and AVX-VNNI decode kernels take them (AVX2 takes
/// 0, 1, 4, 5, ...: two units a 16-bit sum).
constexpr int q6k_unit(int n, int h, int j) { return 20 * n + (8 * h + 2 * (j & 3) + (j >> 2)) * 12 * n; }

/// Bytes per row of a packed block: q4_K 2 + 2 + 8 + 8 + 128 (scale, min scale, group scales, group
/// mins, codes); q8_0 8 blocks x 34; q6_K 2 + 16 + 192 and 2 of padding.
constexpr size_t kQ4KRowBytes = 148, kQ8RowBytes = 272, kQ6KRowBytes = 212;

/// Bytes of one packed super-block of type t (block rows x 256 columns); 0 if t is not packed.
size_t packed_block_bytes(GGMLType t);
/// Rows of one packed block of type t: 16 at the AVX-512 level (qdot::level() now), else 8.
int packed_block_rows(GGMLType t);

/// A repacked weight matrix (see the file comment): either one run of bytes that it owns (64-byte
/// aligned), or, packed by pack_thread_major, `parts`: row ranges whose bytes lie in arenas shared
/// with other matrices (then `bytes` is null and `arena` keeps the arenas alive).
struct PackedRows {
  GGMLType type = GGMLType::F32;
  int64_t rows = 0, cols = 0;
  int block_rows = 8;       ///< rows per block: packed_block_rows(type) at packing time
  int64_t row_blocks = 0;  ///< ceil(rows / block_rows)
  size_t block_bytes = 0;  ///< bytes of one block of block_rows rows
  std::unique_ptr<uint8_t[], void (*)(void*)> bytes{nullptr, nullptr};
  /// Rows [row0, row1) (row0 a multiple of 16) packed at `at`, as a matrix of those rows alone.
  struct Part {
    int64_t row0 = 0, row1 = 0;
    const uint8_t* at = nullptr;
  };
  std::vector<Part> parts;
  std::shared_ptr<const void> arena;
  /// Packed super-block s of row block b (a matrix without parts).
  const uint8_t* block(int64_t b, int64_t s) const {
    return bytes.get() + (b * (cols / 256) + s) * static_cast<int64_t>(block_bytes);
  }
  /// Part p as a matrix of its own (rows p.row1 - p.row0; its bytes not owned).
  PackedRows view(const Part& p) const;
};

/// Whether W can be packed: q4_K, q6_K or q8_0 and cols a multiple of 256.
bool packable(const WeightView& W);

/// Repacks W (packable(W) must hold, else kvslim::Error). Reads every byte of W once.
std::shared_ptr<const PackedRows> pack_rows(const WeightView& W);

/// The decode step's row share of thread i of n in a matrix of `rows` rows: whole 16-row units,
/// [16 floor(U i / n), 16 floor(U (i + 1) / n)) clipped to the rows, U = ceil(rows / 16).
std::pair<int64_t, int64_t> thread_rows(int64_t rows, int i, int n);

/// Packs the matrices `ws` (in the order a decode step reads them; each packable, else
/// kvslim::Error) thread-major for n threads (n >= 1): arena i holds thread i's share of every
/// matrix (thread_rows) in that order, each from a 4 KiB boundary, so that each thread of a decode step reads
/// one run of memory from the first layer to the output matrix instead of a short run per matrix
/// (gemv_stream_bench's "tm-gemv" column). Sets each matrix's
/// `packed` to a PackedRows with n parts. Arenas of 2 MiB and more are offered as huge pages.
void pack_thread_major(const std::vector<WeightView*>& ws, int n);

/// Whether the model loader packs thread-major (pack_thread_major): yes unless KVSLIM_THREAD_MAJOR
/// is "0" (set it to 0 to time one matrix after the other).
bool thread_major_enabled();

/// Whether large packed matrices are offered to the kernel as transparent huge pages
/// (madvise(MADV_HUGEPAGE) on their 2 MiB spans): yes unless KVSLIM_HUGEPAGES is "0" (set it to 0
/// to time the difference).
bool huge_pages_enabled();

/// Whether the model loader packs weights: a SIMD level is in use (qdot::level() >= AVX2) and
/// KVSLIM_PACK is not "0" (set it to 0 to time the in-place kernels).
bool packing_enabled();

}  // namespace kvslim::qdot
