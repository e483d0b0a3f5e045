// KVStore: one precision tier of a segment. Row part (keys in transposed tiles, values as rows)
// and, with KIVI, the quantized token groups that precede it.
#include <algorithm>
#include <cstring>

#include "kv/codec.h"
#include "kvslim/error.h"

namespace kvslim {
using namespace kv;

KVStore::KVStore(int head_dim, KVCodec key_codec, KVCodec value_codec, const KVQuantOptions& q)
    : hd_(head_dim), kc_(key_codec), vc_(value_codec), krow_(codec_row_bytes(key_codec, head_dim)),
      vrow_(codec_row_bytes(value_codec, head_dim)), tile_bytes_(kv::tile_bytes(key_codec, head_dim)),
      bits_(q.kivi_bits), G_(q.kivi_group), R_(q.kivi_residual), gv_(std::min(q.kivi_group, head_dim)) {}

// ---- row part ----

void KVStore::row_resize(size_t n) {
  // Slack after the payload lets the SIMD decoders load 32 bytes from any code position.
  kt_.resize(n ? (n + kKVTile - 1) / kKVTile * tile_bytes_ + kPad : 0);
  v_.resize(n ? n * vrow_ + kPad : 0);
  n_row_ = n;
}

void KVStore::row_key(size_t r, float* out) const { tile_get(kc_, hd_, tile(r), r % kKVTile, out); }

void KVStore::row_put_key(size_t r, const float* k) { tile_put(kc_, hd_, tile(r), r % kKVTile, k); }

void KVStore::row_move(size_t dst, size_t src) {
  tile_move(kc_, hd_, tile(dst), dst % kKVTile, tile(src), src % kKVTile);
  std::memcpy(v_.data() + dst * vrow_, v_.data() + src * vrow_, vrow_);
}

void KVStore::append_from(const KVStore& src, size_t j) {
  const size_t r = n_row_;
  row_resize(r + 1);
  const size_t sr = j - src.n_group_;
  if (j >= src.n_group_ && src.kc_ == kc_) {
    tile_move(kc_, hd_, tile(r), r % kKVTile, src.tile(sr), sr % kKVTile);
  } else {
    std::vector<float> k(hd_);
    src.key(j, k.data());
    row_put_key(r, k.data());
  }
  if (j >= src.n_group_ && src.vc_ == vc_) {
    std::memcpy(v_.data() + r * vrow_, src.v_.data() + sr * vrow_, vrow_);
  } else {
    std::vector<float> v(hd_);
    src.value(j, v.data());
    row_encode(vc_, hd_, v.data(), v_.data() + r * vrow_);
  }
}

// ---- store ----

void KVStore::append(const float* k, const float* v) {
  const size_t r = n_row_;
  row_resize(r + 1);
  row_put_key(r, k);
  row_encode(vc_, hd_, v, v_.data() + r * vrow_);
  if (bits_) {
    serial_.push_back(static_cast<uint32_t>(appended_++));
    flush_groups();
  }
}

void KVStore::retain(const std::vector<int32_t>& idx) {
  size_t j = 0;
  const size_t old_groups = n_group_;
  if (bits_) retain_groups(idx, j);
  size_t m = 0;
  for (; j < idx.size(); ++j, ++m) {
    const size_t src = idx[j] - old_groups;
    if (src != m) {
      row_move(m, src);
      if (bits_) serial_[m] = serial_[src];
    }
  }
  row_resize(m);
  if (bits_) serial_.resize(m);
  // Give the freed bytes back to the allocator (retain frees real memory).
  kt_.shrink_to_fit();
  v_.shrink_to_fit();
  serial_.shrink_to_fit();
  g_.shrink_to_fit();
}

void KVStore::clear() {
  kt_.release();
  v_.release();
  std::vector<uint8_t>().swap(g_);
  std::vector<size_t>().swap(gofs_);
  std::vector<int>().swap(gn_);
  std::vector<uint32_t>().swap(serial_);
  gstart_.assign(1, 0);
  n_row_ = n_group_ = gbytes_ = 0;
  appended_ = 0;
}

namespace {
KVQuantOptions options_of(int bits, int G, int R) {
  KVQuantOptions q;
  q.kivi_bits = bits;
  q.kivi_group = G;
  q.kivi_residual = R;
  return q;
}
}  // namespace

KVStore KVStore::split_fixed() {
  KVStore fixed(hd_, kc_, vc_, options_of(bits_, G_, R_));
  if (bits_) {
    // The groups are never requantized by appends; the residual window and its serials are.
    fixed.g_.swap(g_);
    fixed.gofs_.swap(gofs_);
    fixed.gn_.swap(gn_);
    fixed.gstart_.swap(gstart_);
    fixed.n_group_ = n_group_;
    fixed.gbytes_ = gbytes_;
    gstart_.assign(1, 0);
    n_group_ = gbytes_ = 0;
  } else {
    // Whole key tiles are never written again; the last, partly filled one is.
    const size_t p = n_row_ / kKVTile * kKVTile, tiles = p / kKVTile;
    if (p == 0) return fixed;
    fixed.row_resize(p);
    std::memcpy(fixed.kt_.data(), kt_.data(), tiles * tile_bytes_);
    std::memcpy(fixed.v_.data(), v_.data(), p * vrow_);
    KVStore tail(hd_, kc_, vc_, options_of(bits_, G_, R_));
    tail.row_resize(n_row_ - p);
    if (n_row_ > p) {
      std::memcpy(tail.kt_.data(), kt_.data() + tiles * tile_bytes_, tile_bytes_);
      std::memcpy(tail.v_.data(), v_.data() + p * vrow_, (n_row_ - p) * vrow_);
    }
    *this = std::move(tail);
  }
  fixed.shrink_to_fit();
  shrink_to_fit();
  return fixed;
}

void KVStore::append_store(const KVStore& o) {
  if (n_row_ % kKVTile != 0 || (bits_ && n_row_ != 0) || o.hd_ != hd_ || o.kc_ != kc_ || o.vc_ != vc_ ||
      o.bits_ != bits_)
    throw Error("KVStore::append_store: the stores differ in codecs, or this one does not end where appends begin");
  if (o.n_group_) {
    g_.resize(gbytes_);  // drop the slack, append, restore it
    g_.insert(g_.end(), o.g_.begin(), o.g_.begin() + o.gbytes_);
    for (size_t g = 0; g < o.gn_.size(); ++g) {
      gofs_.push_back(gbytes_ + o.gofs_[g]);
      gn_.push_back(o.gn_[g]);
    }
    gbytes_ += o.gbytes_;
    g_.resize(gbytes_ + kPad);
    n_group_ += o.n_group_;
    rebuild_group_starts();
  }
  if (o.n_row_) {
    const size_t r = n_row_, tiles = r / kKVTile, o_tiles = (o.n_row_ + kKVTile - 1) / kKVTile;
    row_resize(r + o.n_row_);
    std::memcpy(kt_.data() + tiles * tile_bytes_, o.kt_.data(), o_tiles * tile_bytes_);
    std::memcpy(v_.data() + r * vrow_, o.v_.data(), o.n_row_ * vrow_);
  }
  if (bits_) {
    serial_ = o.serial_;
    appended_ = o.appended_;
  }
}

size_t KVStore::group_of(size_t i) const {
  return std::upper_bound(gstart_.begin(), gstart_.end(), i) - gstart_.begin() - 1;
}

void KVStore::key(size_t i, float* out) const {
  if (i < n_group_) {
    const size_t g = group_of(i);
    group_key(g, static_cast<int>(i - gstart_[g]), out);
  } else {
    row_key(i - n_group_, out);
  }
}

void KVStore::value(size_t i, float* out) const {
  if (i < n_group_) {
    const size_t g = group_of(i);
    group_value(g, static_cast<int>(i - gstart_[g]), out);
  } else {
    rows_decode(vc_, hd_, v_.data() + (i - n_group_) * vrow_, out, 1);
  }
}

void KVStore::set_keys(size_t b, size_t e, const float* rows) {
  size_t i = b;
  while (i < e && i < n_group_) {
    const size_t g = group_of(i);
    std::vector<std::pair<int, const float*>> part;
    for (; i < e && i < gstart_[g + 1]; ++i)
      part.emplace_back(static_cast<int>(i - gstart_[g]), rows + (i - b) * hd_);
    set_group_keys(g, part);
  }
  for (; i < e; ++i) row_put_key(i - n_group_, rows + (i - b) * hd_);
}

size_t KVStore::allocated_bytes() const {
  return sizeof(KVStore) + kt_.capacity() + v_.capacity() + g_.capacity() + gofs_.capacity() * sizeof(size_t) +
         gn_.capacity() * sizeof(int) + gstart_.capacity() * sizeof(size_t) + serial_.capacity() * sizeof(uint32_t);
}

void KVStore::shrink_to_fit() {
  kt_.shrink_to_fit();
  v_.shrink_to_fit();
  g_.shrink_to_fit();
  gofs_.shrink_to_fit();
  gn_.shrink_to_fit();
  gstart_.shrink_to_fit();
  serial_.shrink_to_fit();
}

size_t KVStore::kv_bytes() const { return n_row_ * (krow_ + vrow_) + gbytes_; }

size_t KVStore::block_begin(size_t i) const {
  if (i < n_group_) {
    const size_t g = group_of(i);
    return gstart_[g] + (i - gstart_[g]) / kKVTile * kKVTile;
  }
  return n_group_ + (i - n_group_) / kKVTile * kKVTile;
}

size_t KVStore::block_end(size_t b) const {
  if (b < n_group_) {
    const size_t g = group_of(b);
    const size_t t = b - gstart_[g];
    return gstart_[g] + std::min<size_t>(gn_[g], (t / kKVTile + 1) * kKVTile);
  }
  const size_t r = b - n_group_;
  return n_group_ + std::min(n_row_, (r / kKVTile + 1) * kKVTile);
}

void KVStore::block_keys_t(size_t b, size_t e, float* kt) const {
  const int nb = static_cast<int>(e - b);
  if (b < n_group_) {
    const size_t g = group_of(b);
    const size_t t0 = b - gstart_[g];
    if (t0 % kKVTile == 0 && e <= gstart_[g + 1]) return group_block_keys_t(g, static_cast<int>(t0), nb, kt);
  } else if ((b - n_group_) % kKVTile == 0 && nb <= kKVTile) {
    return tile_decode(kc_, hd_, tile(b - n_group_), kt);
  }
  // Not a block of block_end's: entry by entry.
  std::vector<float> k(hd_);
  for (int j = 0; j < nb; ++j) {
    key(b + j, k.data());
    for (int d = 0; d < hd_; ++d) kt[d * kKVTile + j] = k[d];
  }
}

const float* KVStore::block_values(size_t b, size_t e, float* buf) const {
  if (b >= n_group_) {
    const uint8_t* src = v_.data() + (b - n_group_) * vrow_;
    if (vc_ == KVCodec::F32) return reinterpret_cast<const float*>(src);
    rows_decode(vc_, hd_, src, buf, e - b);
    return buf;
  }
  const size_t g = group_of(b);
  const size_t t0 = b - gstart_[g];
  if (e <= gstart_[g + 1]) {
    group_block_values(g, static_cast<int>(t0), static_cast<int>(e - b), buf);
  } else {
    for (size_t i = b; i < e; ++i) value(i, buf + (i - b) * hd_);
  }
  return buf;
}

}  // namespace kvslim
