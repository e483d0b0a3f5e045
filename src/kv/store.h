#pragma once
// One storage tier of a KV segment (internal): the row codecs' key tiles and value rows, and with
// KIVI the quantized token groups before them. Segment (src/kv/cache.h) holds one or two; the
// attention kernel reads them block by block.
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kv/byte_buffer.h"
#include "kv/cache.h"

namespace kvslim {

/// Entries per key tile: keys are stored transposed in tiles of this many entries (so attention
/// reads one channel of kKVTile entries with one vector load), values row by row.
constexpr int kKVTile = 16;

/// A block of a KIVI group as stored (KVStore::kivi_block), for kernels that read the codes in
/// place. Key channel d of the block's entry j: code at bit j * bits of codes + d * code_stride,
/// value zero[d] + step[d] * code (f16 zero points and steps of the group). Value of entry j:
/// the record values + j * value_bytes, [head_dim / gv] x (f16 zero, f16 step), then the codes of
/// channel c at bit c * bits. At least 8 bytes are readable from every channel's first code byte.
struct KiviBlock {
  const uint8_t* codes;
  size_t code_stride;
  const uint16_t* zero;
  const uint16_t* step;
  const uint8_t* values;
  size_t value_bytes;
  int bits, gv;
};

/// One storage tier of a segment: a KIVI part (quantized token groups, oldest entries) followed
/// by a row part (row codecs). Without KIVI the row part holds every entry. Internal building
/// block of Segment, read by the attention kernel (Segment::store).
class KVStore {
 public:
  KVStore(int head_dim, KVCodec key_codec, KVCodec value_codec, const KVQuantOptions& q);

  size_t size() const { return n_group_ + n_row_; }
  size_t group_entries() const { return n_group_; }  ///< entries in KIVI groups (the oldest)
  size_t row_entries() const { return n_row_; }      ///< entries in the row codec part
  KVCodec key_codec() const { return kc_; }
  KVCodec value_codec() const { return vc_; }
  int kivi_bits() const { return bits_; }
  /// Token counts of the KIVI groups, oldest first (a group shrinks when entries are retained).
  std::vector<int> group_sizes() const;

  /// Appends one entry (k may already be rotated). With KIVI, entries older than the newest R
  /// appends are quantized G at a time.
  void append(const float* k, const float* v);
  /// Keeps entries `idx` (strictly increasing, in range; checked by Segment). KIVI groups lose the
  /// dropped tokens' codes; adjacent groups left at most half full are then merged (their keys
  /// requantized over the merged group), so scattered survivors do not each keep a group's scales.
  void retain(const std::vector<int32_t>& idx);
  void clear();

  /// Splits off the part of this store that appending never changes and returns it; this store
  /// keeps the rest (its tail) with the state appends read and write. Without KIVI the returned
  /// part holds the whole key tiles (a multiple of kKVTile entries) and the tail the entries of the
  /// last, partly filled tile; with KIVI the returned part holds the KIVI groups and the tail the
  /// whole residual window (row part, append serial numbers). Reading the returned part followed
  /// by the tail gives the same attention blocks, bit for bit, as reading the store before the split.
  KVStore split_fixed();
  /// Appends the entries of `o` after this store's, byte for byte, as if they had been appended
  /// here: the inverse of split_fixed (this = the part it returned, o = its tail, or a tail's own
  /// split_fixed part). Requires that this store's row part is a multiple of kKVTile entries and,
  /// with KIVI, empty (what split_fixed returns); throws kvslim::Error otherwise.
  void append_store(const KVStore& o);

  void key(size_t i, float* out) const;
  void value(size_t i, float* out) const;
  /// Re-encodes keys [b, e) from rows[(e-b) * head_dim]; entries in a KIVI group requantize their
  /// whole group's keys (exact re-quantization when the whole group is set in one call).
  void set_keys(size_t b, size_t e, const float* rows);

  /// Bytes of keys and values with scales and zero points.
  size_t kv_bytes() const;
  /// Heap bytes held (capacities, not sizes), the object itself included.
  size_t allocated_bytes() const;
  /// Gives capacity past the size back to the allocator.
  void shrink_to_fit();
  /// Bookkeeping bytes (KIVI residual-window serial numbers).
  size_t meta_bytes() const { return serial_.size() * sizeof(uint32_t); }

  /// Start of the attention block holding store index i.
  size_t block_begin(size_t i) const;
  /// End of the attention block starting at store index b: at most kKVTile entries, never across a
  /// KIVI group or a key tile boundary.
  size_t block_end(size_t b) const;
  /// Decodes the keys of block [b, e) transposed: kt[d * kKVTile + j] = key(b + j)[d]. Lanes
  /// j >= e - b are unspecified.
  void block_keys_t(size_t b, size_t e, float* kt) const;
  /// Values of block [b, e) as rows, (e-b) x head_dim. Returns a pointer into storage when the
  /// value codec is f32 (no copy), else decodes into `buf` and returns it.
  const float* block_values(size_t b, size_t e, float* buf) const;
  /// The f16 keys of the row-part block that starts at store index b, as block_keys_t lays them
  /// out (kt[d * kKVTile + j], all kKVTile lanes readable) but not decoded; nullptr unless the
  /// key codec is f16 and b starts a row-part tile.
  const uint16_t* f16_key_tile(size_t b) const {
    if (kc_ != KVCodec::F16 || b < n_group_ || (b - n_group_) % kKVTile != 0 || b - n_group_ >= n_row_) return nullptr;
    return reinterpret_cast<const uint16_t*>(tile(b - n_group_));
  }
  /// The encoded key tile (key_codec()) of the row-part block that starts at store index b, all
  /// kKVTile lanes readable; nullptr unless b starts a row-part tile.
  const uint8_t* row_key_tile(size_t b) const {
    if (b < n_group_ || (b - n_group_) % kKVTile != 0 || b - n_group_ >= n_row_) return nullptr;
    return tile(b - n_group_);
  }
  /// The encoded value rows (value_codec(), value_row_bytes() each) of the row-part entries from
  /// store index b on; nullptr unless b is in the row part.
  const uint8_t* row_values(size_t b) const {
    if (b < n_group_ || b - n_group_ >= n_row_) return nullptr;
    return v_.data() + (b - n_group_) * vrow_;
  }
  size_t value_row_bytes() const { return vrow_; }
  /// The KIVI group block [b, e) (a block of block_end's in the KIVI part) as stored; false, with
  /// `out` left as it was, for a block of the row part or one that does not start on a key tile of
  /// its group.
  bool kivi_block(size_t b, size_t e, KiviBlock& out) const;
  /// The f16 value rows of the row-part entries from store index b on ([entry][head_dim]);
  /// nullptr unless the value codec is f16 and b is in the row part.
  const uint16_t* f16_value_rows(size_t b) const {
    if (vc_ != KVCodec::F16 || b < n_group_ || b - n_group_ >= n_row_) return nullptr;
    return reinterpret_cast<const uint16_t*>(v_.data() + (b - n_group_) * vrow_);
  }

 private:
  // Row part.
  uint8_t* tile(size_t r) { return kt_.data() + (r / kKVTile) * tile_bytes_; }
  const uint8_t* tile(size_t r) const { return kt_.data() + (r / kKVTile) * tile_bytes_; }
  void row_key(size_t r, float* out) const;
  void row_put_key(size_t r, const float* k);
  void row_move(size_t dst, size_t src);
  void row_resize(size_t n);
  /// Appends entry j of `src` (a store without KIVI) to the row part, copying its encoded bytes
  /// when the codecs match and re-encoding otherwise.
  void append_from(const KVStore& src, size_t j);
  // KIVI part.
  void flush_groups();
  void quantize_group(const float* keys, const float* vals, int n, std::vector<uint8_t>& dst) const;
  size_t group_bytes(int n) const;
  size_t group_of(size_t i) const;
  void group_key(size_t g, int t, float* out) const;
  void group_value(size_t g, int t, float* out) const;
  void group_block_keys_t(size_t g, int t0, int nb, float* kt) const;
  void group_block_values(size_t g, int t0, int nb, float* out) const;
  void set_group_keys(size_t g, const std::vector<std::pair<int, const float*>>& rows);
  void retain_groups(const std::vector<int32_t>& idx, size_t& used);
  void compact_groups();
  void rebuild_group_starts();

  int hd_;
  KVCodec kc_, vc_;
  size_t krow_, vrow_;  // bytes per entry in the row part
  size_t tile_bytes_;
  int bits_, G_, R_, gv_;
  // Row part: key tiles (kKVTile entries each, transposed) and value rows.
  kv::ByteBuffer kt_, v_;
  size_t n_row_ = 0;
  // KIVI part: groups laid out back to back; gofs_[g] is the byte offset of group g, gn_[g] its
  // token count, gstart_[g] the store index of its first token (gstart_.back() == n_group_).
  std::vector<uint8_t> g_;
  std::vector<size_t> gofs_;
  std::vector<int> gn_;
  std::vector<size_t> gstart_{0};
  size_t n_group_ = 0;
  size_t gbytes_ = 0;  // payload bytes of g_ (it also holds kPad bytes of slack)
  static constexpr size_t kPad = 32;
  // KIVI residual window: append serial of every row-part entry (only with KIVI).
  std::vector<uint32_t> serial_;
  uint64_t appended_ = 0;

  friend class Segment;
  friend struct kv::CacheIO;
};

}  // namespace kvslim
