#pragma once
// The KV cache: one segment per (layer, KV head), each a variable-length list of entries that
// keep their original positions, so head- and layer-adaptive presses free real memory.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvslim/error.h"

namespace kvslim {

/// Storage codec of a segment's keys or values.
enum class KVCodec { F32, F16 };
/// Parses "f32" / "f16" (llama.cpp's --cache-type names). Unknown -> kvslim::Error naming it.
KVCodec parse_codec(const std::string& name);
const char* codec_name(KVCodec c);
/// Bytes one row of `head_dim` values takes in codec `c` (scales included).
size_t codec_row_bytes(KVCodec c, int head_dim);

/// Entries of one (layer, KV head): keys (RoPE applied) and values, head_dim each, plus the
/// original token position of every entry. Entry order is insertion order.
class Segment {
 public:
  Segment(int head_dim, KVCodec key_codec, KVCodec value_codec);

  int head_dim() const { return head_dim_; }
  size_t size() const { return pos_.size(); }
  KVCodec key_codec() const { return kc_; }
  KVCodec value_codec() const { return vc_; }

  /// Appends one entry; k and v hold head_dim floats.
  void append(const float* k, const float* v, int32_t position);
  /// Keeps only the entries at `indices` (strictly increasing, each < size()), compacts them in
  /// order and releases the freed memory. Throws kvslim::Error on bad indices.
  void retain(const std::vector<int32_t>& indices);
  void clear();

  /// Decodes entry i's key/value into out[head_dim].
  void key(size_t i, float* out) const;
  void value(size_t i, float* out) const;
  /// Decodes keys [begin, end) into out[(end-begin) * head_dim] (row-major). For f32 storage
  /// keys_f32() gives the rows without a copy.
  void keys(size_t begin, size_t end, float* out) const;
  void values(size_t begin, size_t end, float* out) const;
  /// Direct f32 rows when the codec is F32, else nullptr.
  const float* keys_f32() const;
  const float* values_f32() const;

  const std::vector<int32_t>& positions() const { return pos_; }
  std::vector<int32_t>& positions_mut() { return pos_; }
  /// Overwrites entry i's key (used by key re-rotation).
  void set_key(size_t i, const float* k);

  /// Payload bytes: keys, values (with any scales) and positions of the stored entries.
  size_t bytes() const;

 private:
  int head_dim_;
  KVCodec kc_, vc_;
  size_t krow_, vrow_;
  std::vector<uint8_t> k_, v_;
  std::vector<int32_t> pos_;
};

/// All segments of a model: n_layer x n_head_kv.
class KVCache {
 public:
  KVCache(int n_layer, int n_head_kv, int head_dim, KVCodec key_codec = KVCodec::F16,
          KVCodec value_codec = KVCodec::F16);

  int n_layer() const { return n_layer_; }
  int n_head_kv() const { return n_head_kv_; }
  int head_dim() const { return head_dim_; }
  Segment& seg(int layer, int head) { return segs_[layer * n_head_kv_ + head]; }
  const Segment& seg(int layer, int head) const { return segs_[layer * n_head_kv_ + head]; }

  /// Total entries over all segments.
  size_t entries() const;
  size_t entries(int layer) const;
  /// Payload bytes over all segments (see Segment::bytes).
  size_t bytes() const;
  size_t bytes(int layer) const;
  /// Bytes of a full (uncompressed) f16 cache holding `n_tokens` entries in every segment,
  /// positions included: the reference of the memory ratio.
  size_t full_f16_bytes(size_t n_tokens) const;
  /// Largest position stored + 1 (0 when empty): where the next token continues.
  int32_t next_position() const;
  void clear();

 private:
  int n_layer_, n_head_kv_, head_dim_;
  std::vector<Segment> segs_;
};

}  // namespace kvslim
