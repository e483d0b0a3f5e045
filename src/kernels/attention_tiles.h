#pragma once
// Internal to the attention kernels (attention.cpp, attention_avx512.cpp): the blocks of a segment
// as the group kernels consume them, two at a time.
#include <climits>
#include <cstddef>
#include <cstdint>

#include "kv/store.h"

namespace kvslim::attn {

/// One block of kKVTile (16) entries: store entries [b, e), lane j attended by row r iff lg[j] <
/// vis[r] (lg[j] = INT_MAX for lanes not attended at all).
struct BlockRef {
  const KVStore* st;
  size_t b, e;
  alignas(64) int32_t lg[16];
};

/// Keys and values of the (one or two) blocks of a pair as the group kernels read them: f16
/// straight from the cache (k16: a transposed tile [head_dim][16]; v16: rows [16][head_dim]), or
/// decoded f32 in the same layouts (kt, v). nb[t]: entries in block t.
struct PairData {
  int nt;
  int nb[2];
  const uint16_t* k16[2];
  const float* kt[2];
  const uint16_t* v16[2];
  const float* v[2];
};

/// All `rows` query rows (Q: [rows][hd], scaled and rotated) against one pair, 8 rows at a time,
/// with 512-bit registers (AVX-512F/DQ; hd % 16 == 0): scores, the online softmax (m, l: running
/// max and sum per row, room for rows rounded up to 8; O: [rows][hd] unnormalised outputs) and
/// values. raw (when non-null): [rows][n] raw scores of the visible entries. Each row's result
/// depends only on that row (not on the rows beside it in its group of 8).
void pair_groups_avx512(const PairData& pd, const BlockRef* blk, const float* Q, int rows, int hd,
                        const int32_t* vis, float* m, float* l, float* O, float* raw, size_t n);

}  // namespace kvslim::attn
