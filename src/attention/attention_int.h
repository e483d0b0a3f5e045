#pragma once
// Attention over q8_0 and q4_0 caches with integer products (internal to attention.cpp).
//
// Decode attention over a float cache is bound by its multiply-adds, not by its bytes: a GQA group
// of 8 query heads does 8 x 2 x head_dim of them per entry read (on AVX2 about 10 GB/s per core
// for f16). With 8-bit or 4-bit codes, the products can be exact integer sums instead: the query
// rows are rounded to int16 (one scale per row), the probabilities of a pair of tiles to int16
// (one scale per row and value block), and vpmaddwd (or AVX-VNNI's vpdpwssd) does 16
// multiply-adds per 256-bit instruction where an fma does 8. The codes' own scales are applied per
// block in f32, in one fixed order, so the AVX2 and AVX-VNNI levels give the same bits. The
// AVX-512 level keeps its float kernels (faster there; see attention.cpp), so for these two codecs
// its results differ from the AVX2 levels' within the bounds below.
//
// Measured (AMD Zen 5 forced to each level, one thread, 16,384 entries, head_dim 64, a group of
// 8 query rows, against the float kernels over decoded tiles, alternating): AVX2 q8_0 558-561 ->
// 455-463 us a head, q4_0 597-601 -> 481-495; AVX-VNNI q8_0 556-564 -> 444-446, q4_0 595-609 ->
// 458-463. f16 (float products straight from the cache) takes 424-432: what is left is the
// expansion of the codes into int16 pairs and the rounding of the weights (about a third of the
// time), which 8-bit queries against a pair-interleaved tile layout would remove.
//
// The added error is that of 16-bit operands: a score moves by at most
// (max_d |q_d| / 65534) * sum_d |k_d| (k: the dequantized key), an output by at most
// (max_j |p_j dv_j| / 65534) * sum_j |code_j| per value block and pair of tiles, far below what
// the 8-bit (or 4-bit) codes of the cache already change (tests/kv/test_kv_attention.cpp bounds both).
#include <cstddef>
#include <cstdint>

#include "attention/attention_tiles.h"

namespace kvslim::attn {

/// Whether integer products apply to a codec (q8_0, q4_0: symmetric codes times a scale).
bool int_codec(KVCodec c);

/// Qs[r][d] = round(Q[r][d] / sq[r]) with sq[r] = max_d |Q[r][d]| / 32767 (0 for a zero row, NaN
/// for a row with a NaN or an infinity, whose scores then come out NaN as the float path's would),
/// for rows [0, rows); rows [rows, rows8) are zero. Q: [rows][hd]; Qs: [rows8][hd].
void quantize_queries(const float* Q, int rows, int rows8, int hd, int16_t* Qs, float* sq);

/// The keys of the row-part block [b, e) of st (a q8_0 or q4_0 key tile, int_codec) as
/// PairData::kp and dk lay them out: kp [hd / 2][16][2] int16, dk [hd / qb][16]. Lanes past e - b
/// hold whatever the tile holds (their scores are never used).
void expand_keys(const KVStore& st, size_t b, int hd, int16_t* kp, float* dk);

/// The values of the row-part block [b, e) of st (q8_0 or q4_0) as entries e0 .. e0 + 15 of
/// PairData::vp and dv (e0: 0 or 16); entries past e - b are zero.
void expand_values(const KVStore& st, size_t b, size_t e, int hd, int e0, int16_t* vp, float* dv);

/// Scores of the 8 query rows of a group (Qs: [8][hd], sq: [8]) against the pair's key tiles
/// (pd.kp, pd.dk, pd.qb) into ST[(16 t + j) * 8 + i], t < pd.nt: score = sq[i] * sum over blocks
/// of dk * (integer sum), as an fma chain over the blocks in order. hd % 16 == 0.
void scores_int(const PairData& pd, const int16_t* Qs, const float* sq, int hd, float* ST);

/// O[i][c] += sum_e ST[e * 8 + i] * value_e[c] for rows i < rows of a group (O: [rows][hd]) over
/// the pair's entries (pd.vp, pd.dv, pd.qb), per value block with the weights p * dv rounded to
/// int16 per row. hd % 16 == 0.
void values_int(const PairData& pd, const float* ST, int rows, int hd, float* O);

}  // namespace kvslim::attn
