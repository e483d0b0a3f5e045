#pragma once
// The KV cache: one segment per (layer, KV head), each a variable-length list of entries that
// keep their original positions, so head- and layer-adaptive presses free real memory.
//
// Storage codecs (see ../shared/design/ARCHITECTURE.md section 3):
// - row codecs f32, f16, bf16, q8_0, q4_0 (llama.cpp's --cache-type names and ggml's block
//   semantics): every entry's key and value are encoded on their own;
// - KIVI (Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache",
//   arXiv 2402.02750): b-bit asymmetric codes, keys per channel over groups of G tokens, values
//   per token over groups of G channels, the newest R entries kept in a full-precision row codec;
// - an optional orthogonal (Hadamard) rotation of keys, undone for queries inside attention;
// - two precision tiers per segment (LeanKV, Zhang et al., "Unifying KV Cache Compression for
//   Large Language Models with LeanKV", arXiv 2412.03131): a high tier with the cache's codecs
//   and a low tier with cheaper row codecs, keys and values chosen independently.
// Attention reads segments block by block (kKVTile entries at a time), never a full-precision
// copy of the whole segment.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvslim/error.h"
#include "kvslim/kv_options.h"
#include "kv/latent.h"

namespace kvslim {

/// One storage tier of a segment (its codecs' bytes, KIVI groups, key tiles): internal, in
/// src/kv/store.h.
class KVStore;
namespace kv {
/// Writes and reads caches byte for byte (stored contexts): internal, in src/kv/serialize.h.
struct CacheIO;
}  // namespace kv

/// A read-only part of a segment's entries that several caches read in place (Segment::share):
/// `id` tells parts apart (the same id in two caches is the same memory), `bytes` its key and value
/// payload (Segment::kv_bytes's measure), `allocated_bytes` the memory it holds.
struct SharedEntries {
  const void* id = nullptr;
  size_t bytes = 0;
  size_t allocated_bytes = 0;
};

/// Entries of one (layer, KV head): keys (RoPE applied) and values, head_dim each, plus the
/// original token position of every entry. Entry order is insertion order. Entries live in tier 0
/// (the cache's codecs) unless a LeanKV-style split moved them to tier 1 (cheaper row codecs).
class Segment {
 public:
  /// Throws kvslim::Error for a configuration validate_cache_config rejects.
  Segment(int head_dim, KVCodec key_codec, KVCodec value_codec, const KVQuantOptions& q = {});
  // Out of line: KVStore is complete only in src/.
  ~Segment();
  Segment(const Segment&);
  Segment(Segment&&) noexcept;
  Segment& operator=(const Segment&);
  Segment& operator=(Segment&&) noexcept;

  int head_dim() const { return head_dim_; }
  size_t size() const { return pos_.size(); }
  KVCodec key_codec() const;
  KVCodec value_codec() const;
  const KVQuantOptions& quant() const { return q_; }

  /// Appends one entry to tier 0; k and v hold head_dim floats (k is rotated here when the
  /// cache rotates keys).
  void append(const float* k, const float* v, int32_t position);
  /// Whether k and v (head_dim floats each, as append takes them) fit this segment's codecs: every
  /// value finite and, where a codec keeps f16 or bf16 values, steps, zero points or block scales,
  /// small enough that none of them overflows (|x| <= 65504 for f16 rows, KIVI and q2_1; 65504 * 127
  /// for q8_0 and 65504 * 8 for q4_0, whose f16 scale is amax / 127 and max / -8). Keys are tested as
  /// stored (after the Hadamard rotation when on). Returns nullptr when both fit, else "key" or
  /// "value"; `largest` receives that row's largest |x|. Latent segments (codes of projections)
  /// always pass here: the forward pass's hidden-state check covers them.
  const char* check_fit(const float* k, const float* v, float* largest) const;
  /// Keeps only the entries at `indices` (strictly increasing, each < size()), compacts them in
  /// order and releases the freed memory. Entries keep their tier. Throws kvslim::Error on bad
  /// indices.
  void retain(const std::vector<int32_t>& indices);
  /// LeanKV-style precision tiers: keeps `indices` (as retain) and puts entry indices[j] in the low
  /// tier when low[j] != 0, else in the high tier. Entries that change tier are decoded and
  /// re-encoded (a low-tier entry moved up keeps its quantization error). The low tier uses
  /// row codecs `low_key` / `low_value`; existing low-tier entries are re-encoded if these differ
  /// from the current ones. Throws kvslim::Error for bad indices, sizes that differ, or a KIVI
  /// cache (its token groups cannot be split by tier).
  void retain_tiered(const std::vector<int32_t>& indices, const std::vector<uint8_t>& low, KVCodec low_key,
                     KVCodec low_value);
  /// Entries in the low tier, and whether entry i is there.
  size_t low_tier_size() const;
  bool is_low(size_t i) const { return !low_.empty() && (low_[i / 64] >> (i % 64) & 1); }
  void clear();

  /// Decodes entry i's key/value into out[head_dim] (keys un-rotated: the key as appended, up to
  /// the codec's error).
  void key(size_t i, float* out) const;
  void value(size_t i, float* out) const;
  /// Decodes keys [begin, end) into out[(end-begin) * head_dim] (row-major).
  void keys(size_t begin, size_t end, float* out) const;
  void values(size_t begin, size_t end, float* out) const;
  /// Keys are stored in transposed tiles, never as plain rows: always nullptr (kept for callers
  /// that fall back to keys()).
  const float* keys_f32() const { return nullptr; }
  /// Direct value rows when every entry is in one f32 row part, else nullptr.
  const float* values_f32() const;

  const std::vector<int32_t>& positions() const { return pos_; }
  std::vector<int32_t>& positions_mut() { return pos_; }
  /// Overwrites entry i's key, re-encoding it in its codec (key re-rotation: dequantize, rotate,
  /// requantize). For many keys prefer set_keys: a KIVI group set in one call is quantized once.
  void set_key(size_t i, const float* k);
  /// Overwrites keys [begin, end) from rows[(end-begin) * head_dim].
  void set_keys(size_t begin, size_t end, const float* rows);

  /// Payload bytes: keys and values (scales and zero points included), positions, and the
  /// bookkeeping of tiers (1.5 bits per entry) and of the KIVI residual window.
  size_t bytes() const;
  /// Key and value bytes only (scales and zero points included): bits per value = 8 * kv_bytes()
  /// / (2 * head_dim * size()).
  size_t kv_bytes() const;
  /// What keeping the segment costs: the heap bytes it holds (capacities, whole key tiles and
  /// growth room included, where bytes() counts the entries) plus the object itself, the shared
  /// parts it reads included (shared_parts: what it holds alone is the difference).
  size_t allocated_bytes() const;
  /// Gives the capacity past the entries back to the allocator (before a segment is kept long).
  void shrink_to_fit();

  /// Latent mode (Palu / xKV / ThinK; see kv/latent.h): from now on every entry's key is stored as
  /// codes in `key_basis` and its value in `value_basis` (bits: 0 = f16 codes, 2, 4, 8, 32 = f32), replacing
  /// the row codecs and KIVI groups. Existing entries are decoded and re-encoded; later appends
  /// are encoded on arrival. Keys are projected as stored: after RoPE, not Hadamard-rotated.
  /// clear() returns the segment to its codecs. `scales`: how 2/4/8-bit codes are scaled (per
  /// channel: fitted on the entries present now). Throws kvslim::Error for a basis whose head_dim
  /// differs, bad bits, or a segment with precision tiers.
  void to_latent(std::shared_ptr<const LatentBasis> key_basis, int key_bits,
                 std::shared_ptr<const LatentBasis> value_basis, int value_bits,
                 LatentScales scales = LatentScales::Token);
  bool latent() const { return latent_; }
  /// The codes of a latent segment (empty LatentCodes otherwise).
  const LatentCodes& latent_keys() const { return lk_; }
  const LatentCodes& latent_values() const { return lv_; }

  // ---- Read access for attention kernels (KVStore is declared in src/kv/store.h) ----
  bool rotated() const { return q_.hadamard; }
  /// Applies the key rotation to x[head_dim] (its own inverse); no-op without rotation.
  void rotate(float* x) const;
  int n_stores() const;
  const KVStore& store(int s) const;
  /// Logical index of every entry of store s, in store order; empty when store s holds
  /// consecutive entries from store_first(s) (a single tier).
  std::vector<int32_t> store_entries(int s) const;
  /// Store and store index of entry i.
  void locate(size_t i, int& s, size_t& j) const;
  /// Logical index of store s's first entry when store_entries(s) is empty (the store holds the
  /// consecutive entries [store_first(s), store_first(s) + store(s).size())); 0 otherwise.
  size_t store_first(int s) const;

  // ---- Sharing entries between caches (stored contexts answering several requests) ----
  /// Makes the entries that appending never changes read-only and shared: copies of this segment
  /// made afterwards (a copy of the cache: one per request answering from a stored context) read
  /// them in place instead of copying them, and each copy appends to a private tail of its own.
  /// The tail holds what appending would change: the last, partly filled key tile, or with KIVI
  /// the residual window and its serials; attention reads the same blocks in the same order as
  /// from an unshared segment (bit-identical results). Every operation that would change shared
  /// entries (retain, retain_tiered, set_key(s), to_latent) first gives this segment its own copy
  /// (unshare); clear() drops the reference. A latent segment is left as it is (not shared). May be
  /// called again later (a request's cache stored as a new context): the tail's fixed part joins
  /// the shared parts.
  void share();
  /// True when some entries are read from shared parts.
  bool shares() const { return !shared_.empty() || shared_low_ != nullptr; }
  /// Copies the shared parts into this segment's own storage (copy on write); no-op when none.
  void unshare();
  /// Appends the shared parts this segment reads to `out`.
  void shared_parts(std::vector<SharedEntries>& out) const;

 private:
  void check_indices(const std::vector<int32_t>& idx, const char* what) const;
  int head_dim_;
  KVQuantOptions q_;
  std::vector<KVStore> stores_;
  std::vector<int32_t> pos_;
  // Only with two tiers: a bit per entry (1 = low tier) in 64-bit words, and per word the number
  // of low-tier entries before it, so an entry's store index is a rank query (1.5 bits/entry).
  std::vector<uint64_t> low_;
  std::vector<uint32_t> low_rank_;
  // Latent mode: codes replace stores_ (which stay empty).
  bool latent_ = false;
  LatentCodes lk_, lv_;
  // Shared, read-only parts (share()): the high tier's oldest entries, part after part, then
  // stores_[0] (the private tail: the only store while shared); the low tier as a whole. The store
  // order attention reads is shared_..., stores_[0], shared_low_.
  std::vector<std::shared_ptr<const KVStore>> shared_;
  std::shared_ptr<const KVStore> shared_low_;
  std::vector<size_t> shared_start_;  ///< high-tier index of each shared part's first entry, and the total
  size_t tier_size(int t) const;
  void set_tiers(const std::vector<uint8_t>& low);
  void drop_tiers();
  friend struct kv::CacheIO;
};

/// All segments of a model: n_layer x n_head_kv. The first cache constructed fixes glibc's mmap
/// threshold at 256 KiB for the process (mallopt), so that buffers a segment outgrows or a press
/// shrinks go back to the system instead of staying resident in the heap.
class KVCache {
 public:
  /// Throws kvslim::Error when the configuration is invalid (see validate_cache_config).
  KVCache(int n_layer, int n_head_kv, int head_dim, KVCodec key_codec = KVCodec::F16,
          KVCodec value_codec = KVCodec::F16, const KVQuantOptions& q = {});

  int n_layer() const { return n_layer_; }
  int n_head_kv() const { return n_head_kv_; }
  int head_dim() const { return head_dim_; }
  Segment& seg(int layer, int head) { return segs_[layer * n_head_kv_ + head]; }
  const Segment& seg(int layer, int head) const { return segs_[layer * n_head_kv_ + head]; }

  /// Total entries over all segments.
  size_t entries() const;
  size_t entries(int layer) const;
  /// Payload bytes over all segments (see Segment::bytes), plus the latent bases of this cache
  /// in use, each distinct basis counted once however many segments share it. Shared bases
  /// (LatentBasis::shared: loaded once per process) are not this cache's: see shared_bytes().
  size_t bytes() const;
  /// Segment::allocated_bytes over all segments plus the segment table: the memory the cache holds.
  size_t allocated_bytes() const;
  /// Segment::shrink_to_fit on every segment.
  void shrink_to_fit();
  /// Bytes of the distinct non-shared latent bases in use (0 without latent segments).
  size_t basis_bytes() const;
  /// Bytes of the distinct shared latent bases in use: memory held once per process for every
  /// cache that uses them (0 without).
  size_t shared_bytes() const;
  /// Segment bytes of one layer plus the distinct non-shared bases its segments use.
  size_t bytes(int layer) const;
  /// Key and value bytes over all segments (see Segment::kv_bytes).
  size_t kv_bytes() const;
  /// Bytes of a full (uncompressed) f16 cache holding `n_tokens` entries in every segment,
  /// positions included: the reference of the memory ratio.
  size_t full_f16_bytes(size_t n_tokens) const;
  /// Largest position stored + 1 (0 when empty): where the next token continues.
  int32_t next_position() const;
  /// Empties every segment and ends every cross-layer sharing (source(l) == l again).
  void clear();

  /// Segment::share on every segment: copies of this cache made afterwards read the entries in
  /// place (one per request answering from a stored context) and own only their tails.
  void share();
  /// The shared parts the segments read (Segment::shared_parts), appended to `out`.
  void shared_parts(std::vector<SharedEntries>& out) const;
  /// Allocated bytes of the shared parts (included in allocated_bytes()): the memory this cache
  /// reads but shares with others. allocated_bytes() - shared_allocated_bytes() is what it alone holds.
  size_t shared_allocated_bytes() const;
  /// Key and value bytes of the shared parts (included in bytes() and kv_bytes()).
  size_t shared_kv_bytes() const;

  /// Cross-layer entry sharing, after training (CLA: Brandon et al., "Reducing Transformer
  /// Key-Value Cache Size with Cross-Layer Attention", arXiv 2405.12981; MiniCache, arXiv
  /// 2405.14366, merges adjacent layers' entries): the layer whose segments `layer`'s attention
  /// reads and whose segments receive the new entries; `layer` itself unless shared.
  int source(int layer) const { return source_.empty() ? layer : source_[static_cast<size_t>(layer)]; }
  /// True when some layer reads another layer's entries.
  bool shares_layers() const { return !source_.empty(); }
  /// From now on layer `layer` attends to the entries of layer `src` (of src's own source when src
  /// shares itself), and its own segments are emptied with their memory freed, so bytes() drops by
  /// their bytes. Throws kvslim::Error unless 0 <= src < layer < n_layer.
  void share_layer(int layer, int src);

 private:
  int n_layer_, n_head_kv_, head_dim_;
  std::vector<Segment> segs_;
  std::vector<int> source_;  ///< [n_layer] source layer of each layer; empty when none shares
  friend struct kv::CacheIO;
};

}  // namespace kvslim
