#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "kvslim/kv_cache.h"
#include "kvslim/quant.h"

namespace kvslim {

KVCodec parse_codec(const std::string& name) {
  if (name == "f32") return KVCodec::F32;
  if (name == "f16") return KVCodec::F16;
  throw Error(fmt::format("unknown KV cache type '{}' (expected f32 or f16)", name));
}

const char* codec_name(KVCodec c) { return c == KVCodec::F32 ? "f32" : "f16"; }

size_t codec_row_bytes(KVCodec c, int head_dim) {
  return c == KVCodec::F32 ? head_dim * sizeof(float) : head_dim * sizeof(uint16_t);
}

namespace {

void encode_row(KVCodec c, const float* x, uint8_t* dst, int n) {
  if (c == KVCodec::F32) {
    std::memcpy(dst, x, n * sizeof(float));
    return;
  }
  auto* h = reinterpret_cast<uint16_t*>(dst);
  for (int i = 0; i < n; ++i) h[i] = fp32_to_fp16(x[i]);
}

void decode_rows(KVCodec c, const uint8_t* src, float* out, size_t n) {
  if (c == KVCodec::F32) {
    std::memcpy(out, src, n * sizeof(float));
    return;
  }
  const auto* h = reinterpret_cast<const uint16_t*>(src);
  for (size_t i = 0; i < n; ++i) out[i] = fp16_to_fp32(h[i]);
}

}  // namespace

Segment::Segment(int head_dim, KVCodec key_codec, KVCodec value_codec)
    : head_dim_(head_dim), kc_(key_codec), vc_(value_codec),
      krow_(codec_row_bytes(key_codec, head_dim)), vrow_(codec_row_bytes(value_codec, head_dim)) {}

void Segment::append(const float* k, const float* v, int32_t position) {
  size_t n = size();
  k_.resize((n + 1) * krow_);
  v_.resize((n + 1) * vrow_);
  encode_row(kc_, k, k_.data() + n * krow_, head_dim_);
  encode_row(vc_, v, v_.data() + n * vrow_, head_dim_);
  pos_.push_back(position);
}

void Segment::retain(const std::vector<int32_t>& idx) {
  for (size_t j = 0; j < idx.size(); ++j) {
    if (idx[j] < 0 || static_cast<size_t>(idx[j]) >= size() || (j > 0 && idx[j] <= idx[j - 1]))
      throw Error(fmt::format("Segment::retain: index {} at {} is out of range or not increasing (size {})",
                              idx[j], j, size()));
  }
  for (size_t j = 0; j < idx.size(); ++j) {
    size_t s = idx[j];
    if (s == j) continue;
    std::memmove(k_.data() + j * krow_, k_.data() + s * krow_, krow_);
    std::memmove(v_.data() + j * vrow_, v_.data() + s * vrow_, vrow_);
    pos_[j] = pos_[s];
  }
  size_t n = idx.size();
  // Copy-and-swap so capacity really shrinks: the freed bytes go back to the allocator.
  std::vector<uint8_t>(k_.begin(), k_.begin() + n * krow_).swap(k_);
  std::vector<uint8_t>(v_.begin(), v_.begin() + n * vrow_).swap(v_);
  std::vector<int32_t>(pos_.begin(), pos_.begin() + n).swap(pos_);
}

void Segment::clear() {
  std::vector<uint8_t>().swap(k_);
  std::vector<uint8_t>().swap(v_);
  std::vector<int32_t>().swap(pos_);
}

void Segment::key(size_t i, float* out) const { decode_rows(kc_, k_.data() + i * krow_, out, head_dim_); }
void Segment::value(size_t i, float* out) const { decode_rows(vc_, v_.data() + i * vrow_, out, head_dim_); }
void Segment::keys(size_t b, size_t e, float* out) const {
  decode_rows(kc_, k_.data() + b * krow_, out, (e - b) * head_dim_);
}
void Segment::values(size_t b, size_t e, float* out) const {
  decode_rows(vc_, v_.data() + b * vrow_, out, (e - b) * head_dim_);
}
const float* Segment::keys_f32() const {
  return kc_ == KVCodec::F32 ? reinterpret_cast<const float*>(k_.data()) : nullptr;
}
const float* Segment::values_f32() const {
  return vc_ == KVCodec::F32 ? reinterpret_cast<const float*>(v_.data()) : nullptr;
}
void Segment::set_key(size_t i, const float* k) { encode_row(kc_, k, k_.data() + i * krow_, head_dim_); }

size_t Segment::bytes() const { return size() * (krow_ + vrow_ + sizeof(int32_t)); }

KVCache::KVCache(int n_layer, int n_head_kv, int head_dim, KVCodec kc, KVCodec vc)
    : n_layer_(n_layer), n_head_kv_(n_head_kv), head_dim_(head_dim) {
  segs_.reserve(static_cast<size_t>(n_layer) * n_head_kv);
  for (int i = 0; i < n_layer * n_head_kv; ++i) segs_.emplace_back(head_dim, kc, vc);
}

size_t KVCache::entries() const {
  size_t n = 0;
  for (const Segment& s : segs_) n += s.size();
  return n;
}
size_t KVCache::entries(int layer) const {
  size_t n = 0;
  for (int h = 0; h < n_head_kv_; ++h) n += seg(layer, h).size();
  return n;
}
size_t KVCache::bytes() const {
  size_t n = 0;
  for (const Segment& s : segs_) n += s.bytes();
  return n;
}
size_t KVCache::bytes(int layer) const {
  size_t n = 0;
  for (int h = 0; h < n_head_kv_; ++h) n += seg(layer, h).bytes();
  return n;
}
size_t KVCache::full_f16_bytes(size_t n_tokens) const {
  return n_tokens * static_cast<size_t>(n_layer_) * n_head_kv_ * (head_dim_ * 2 * 2 + sizeof(int32_t));
}
int32_t KVCache::next_position() const {
  int32_t p = 0;
  for (const Segment& s : segs_)
    for (int32_t x : s.positions()) p = std::max(p, x + 1);
  return p;
}
void KVCache::clear() {
  for (Segment& s : segs_) s.clear();
}

}  // namespace kvslim
