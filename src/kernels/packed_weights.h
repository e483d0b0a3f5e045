#pragma once
// Weight matrices repacked at load time for the SIMD decode kernels: rows interleaved in blocks of
// n = 8 or 16, so that one vector holds the same four columns' bytes of all the block's rows and the
// matrix-vector product needs no horizontal sums (rows sit in the vector lanes, as in the prefill
// tiles).
//
// Layout: [row block b = rows / n, rounded up][super-block s = cols / 256][block_bytes], rows past
// the end zero (their scales are zero; their results are never stored).
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
//   slower from 16-row blocks when streamed from memory (decode -9%), so they keep 8, as q6_K does
//   at every level (bench/results/zen5_s16/notes.txt).
//
// q6_K, 1,696 bytes (212 per row; the file has 210):
//   [0, 16)      d of rows 0..7 (f16)
//   [16, 144)    int8 scale of group g (16 columns) and row r at 16 + 8 g + r; [144, 160) zero
//   [160, 1696)  48 vectors of 32 bytes: ql vector v (byte 4 r + i = ql byte 4 v + i of row r) and
//                qh vector w (qh byte 4 w + i), in the order the AVX-512 and AVX2 decode kernels
//                read them (AVX-VNNI and the prefill tile packer move back and forth within 384
//                bytes): unit (n, j) (ql vectors 16 n + j and 16 n + 8 + j, qh vector 8 n + j) at
//                q6k_unit(n, j).
//                Units j and j + 1 (j even) lie side by side in each of the three 64-byte runs,
//                and the 192-byte pair blocks follow the AVX-512 kernel's visiting order. (With
//                ql then qh each in file order the kernels jumped between three regions of the
//                block: streamed from memory they ran at about half their in-cache rate, Zen 5,
//                bench/results/zen5_s16/notes.txt.)
//   (ggml's order: ql byte 64 n + l holds columns 128 n + l and 128 n + 64 + l, byte 64 n + 32 + l
//   columns 128 n + 32 + l and 128 n + 96 + l; qh byte 32 n + l the top 2 bits of all four)
//
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

#include "kernels/matmul.h"

namespace kvslim::qdot {

/// Byte offset in a packed q6_K block of unit (n, j) (n = 0, 1: 128-column half; j = 0..7): its ql
/// vector 16 n + j, with ql vector 16 n + 8 + j 64 bytes and qh vector 8 n + j 128 bytes after it.
/// Pair blocks (j / 2) in the order 0, 2, 1, 3: the AVX-512 kernel takes j = {0,1}, {4,5}, {2,3}, {6,7}.
constexpr int q6k_unit(int n, int j) { return 160 + (4 * n + (((j >> 1) & 1) << 1 | (j >> 2))) * 192 + 32 * (j & 1); }

/// Bytes of one packed super-block of type t (block rows x 256 columns); 0 if t is not packed.
size_t packed_block_bytes(GGMLType t);
/// Rows of one packed block of type t: 16 for q4_K and q8_0 at the AVX-512 level (qdot::level()
/// now), else 8.
int packed_block_rows(GGMLType t);

/// A repacked weight matrix (see the file comment). Owns its bytes (64-byte aligned).
struct PackedRows {
  GGMLType type = GGMLType::F32;
  int64_t rows = 0, cols = 0;
  int block_rows = 8;       ///< rows per block: packed_block_rows(type) at packing time
  int64_t row_blocks = 0;  ///< ceil(rows / block_rows)
  size_t block_bytes = 0;  ///< bytes of one block of block_rows rows
  std::unique_ptr<uint8_t[], void (*)(void*)> bytes{nullptr, nullptr};
  /// Packed super-block s of row block b.
  const uint8_t* block(int64_t b, int64_t s) const {
    return bytes.get() + (b * (cols / 256) + s) * static_cast<int64_t>(block_bytes);
  }
};

/// Whether W can be packed: q4_K, q6_K or q8_0 and cols a multiple of 256.
bool packable(const WeightView& W);

/// Repacks W (packable(W) must hold, else kvslim::Error). Reads every byte of W once.
std::shared_ptr<const PackedRows> pack_rows(const WeightView& W);

/// Whether large packed matrices are offered to the kernel as transparent huge pages
/// (madvise(MADV_HUGEPAGE) on their 2 MiB spans): yes unless KVSLIM_HUGEPAGES is "0" (set it to 0
/// to time the difference).
bool huge_pages_enabled();

/// Whether the model loader packs weights: a SIMD level is in use (qdot::level() >= AVX2) and
/// KVSLIM_PACK is not "0" (set it to 0 to time the in-place kernels).
bool packing_enabled();

}  // namespace kvslim::qdot
