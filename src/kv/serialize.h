#pragma once
// Byte-exact storage of a KV cache (stored contexts, kvslim/context.h): every segment's entries with
// their original positions and codec payloads (row-codec key tiles and value rows, KIVI groups and
// residual-window serial numbers, precision tiers, latent codes and their bases), and cross-layer
// sharing. A cache read back is bit-identical to the one written, so attention over it gives the
// same logits. The reader checks every size and index against the others before the cache is
// used, so a corrupt or hostile payload is a kvslim::Error, never a read out of bounds.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kvslim/error.h"
#include "kv/cache.h"

namespace kvslim::kv {

/// Little-endian fields appended to a byte string.
class ByteWriter {
 public:
  void u8(uint8_t v) { raw(&v, 1); }
  void u32(uint32_t v) { raw(&v, 4); }
  void i32(int32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void f64(double v) { raw(&v, 8); }
  /// Length (u64) then the bytes.
  void str(const std::string& s) {
    u64(s.size());
    raw(s.data(), s.size());
  }
  /// Count (u64) then the elements' bytes.
  template <class T>
  void vec(const std::vector<T>& v) {
    u64(v.size());
    raw(v.data(), v.size() * sizeof(T));
  }
  void raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string& out() { return out_; }

 private:
  std::string out_;
};

/// Reads what ByteWriter wrote from [data, data + size). Every read past the end, and every count
/// larger than the bytes left could hold, throws kvslim::Error "<label>: truncated ... reading
/// <field>", so a corrupt count never allocates more than the input's size.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size, std::string label) : p_(data), n_(size), label_(std::move(label)) {}
  uint8_t u8(const char* field) { return get<uint8_t>(field); }
  uint32_t u32(const char* field) { return get<uint32_t>(field); }
  int32_t i32(const char* field) { return get<int32_t>(field); }
  uint64_t u64(const char* field) { return get<uint64_t>(field); }
  double f64(const char* field) { return get<double>(field); }
  std::string str(const char* field) {
    const uint64_t n = count(field, 1);
    std::string s(reinterpret_cast<const char*>(p_ + at_), n);
    at_ += n;
    return s;
  }
  template <class T>
  std::vector<T> vec(const char* field) {
    const uint64_t n = count(field, sizeof(T));
    std::vector<T> v(n);
    if (n) std::memcpy(v.data(), p_ + at_, n * sizeof(T));
    at_ += n * sizeof(T);
    return v;
  }
  void raw(void* dst, size_t n, const char* field) {
    need(n, field);
    if (n) std::memcpy(dst, p_ + at_, n);
    at_ += n;
  }
  size_t left() const { return n_ - at_; }
  size_t offset() const { return at_; }
  const std::string& label() const { return label_; }
  /// Throws kvslim::Error "<label>: <what>".
  [[noreturn]] void fail(const std::string& what) const;

 private:
  template <class T>
  T get(const char* field) {
    T v;
    raw(&v, sizeof(T), field);
    return v;
  }
  uint64_t count(const char* field, size_t elem);
  void need(size_t n, const char* field) const;
  const uint8_t* p_;
  size_t n_, at_ = 0;
  std::string label_;
};

/// Byte-exact cache storage (a friend of KVCache, Segment, KVStore and LatentCodes).
struct CacheIO {
  /// Appends `cache` to `w`: its shape and codecs, cross-layer sharing, then every segment.
  static void write(ByteWriter& w, const KVCache& cache);
  /// Reads a cache written by write(). Its shape must be n_layer x n_head_kv x head_dim (the
  /// model's), every position in [0, max_position). Throws kvslim::Error naming the field and the
  /// (layer, KV head) for any size, codec, index or value that write() cannot have produced.
  static KVCache read(ByteReader& r, int n_layer, int n_head_kv, int head_dim, int32_t max_position);
};

}  // namespace kvslim::kv
