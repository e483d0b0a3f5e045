#pragma once
// A growable byte buffer for the KV stores' key tiles and value rows, grown with realloc.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

namespace kvslim::kv {

/// Bytes [0, size()) of a buffer that grows by realloc (capacity x 1.5 or the size asked), new
/// bytes zeroed as std::vector<uint8_t> would. Why not std::vector: KVCache keeps every block of
/// 256 KiB or more in its own mapping (M_MMAP_THRESHOLD), and glibc's realloc grows such a block
/// with mremap, moving its pages instead of copying them. With std::vector a 16,384-entry f16
/// segment (2 MiB of keys) was copied into freshly faulted pages when the first decode step
/// outgrew it: 88 segments at once, 1.5 s for that token on a Zen 5 VM.
/// Throws std::bad_alloc when memory runs out.
class ByteBuffer {
 public:
  ByteBuffer() = default;
  ByteBuffer(const ByteBuffer& o) { *this = o; }
  ByteBuffer(ByteBuffer&& o) noexcept : p_(o.p_), n_(o.n_), cap_(o.cap_) { o.p_ = nullptr, o.n_ = o.cap_ = 0; }
  ByteBuffer& operator=(const ByteBuffer& o) {
    if (this != &o) {
      release();
      resize(o.n_);
      if (o.n_) std::memcpy(p_, o.p_, o.n_);
    }
    return *this;
  }
  ByteBuffer& operator=(ByteBuffer&& o) noexcept {
    if (this != &o) {
      std::free(p_);
      p_ = o.p_, n_ = o.n_, cap_ = o.cap_;
      o.p_ = nullptr, o.n_ = o.cap_ = 0;
    }
    return *this;
  }
  ~ByteBuffer() { std::free(p_); }

  uint8_t* data() { return p_; }
  const uint8_t* data() const { return p_; }
  size_t size() const { return n_; }
  size_t capacity() const { return cap_; }

  /// Sets the size to n bytes; bytes past the old size are zero.
  void resize(size_t n) {
    if (n > cap_) reserve_exact(std::max(n, cap_ + cap_ / 2));
    if (n > n_) std::memset(p_ + n_, 0, n - n_);
    n_ = n;
  }
  /// Gives the capacity past size() back to the allocator (a mapped block shrinks in place).
  void shrink_to_fit() {
    if (n_ == 0) return release();
    if (cap_ > n_) reserve_exact(n_);
  }
  /// Frees everything (size and capacity 0).
  void release() {
    std::free(p_);
    p_ = nullptr, n_ = cap_ = 0;
  }

 private:
  void reserve_exact(size_t cap) {
    void* q = std::realloc(p_, cap);
    if (!q) throw std::bad_alloc();
    p_ = static_cast<uint8_t*>(q), cap_ = cap;
  }
  uint8_t* p_ = nullptr;
  size_t n_ = 0, cap_ = 0;
};

}  // namespace kvslim::kv
