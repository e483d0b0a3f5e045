#pragma once
// XXH64 (Yann Collet's xxHash, 64-bit variant): a fast non-cryptographic digest for checksums of
// stored files and fingerprints of model data. Written out here (a page of code) rather than
// linked, with the reference's test vectors in tests/context/test_context.cpp.
#include <cstddef>
#include <cstdint>

namespace kvslim {

/// Streaming XXH64: update() any number of times, digest() at any point (does not finish the state).
class Hash64 {
 public:
  explicit Hash64(uint64_t seed = 0);
  void update(const void* data, size_t n);
  uint64_t digest() const;

 private:
  uint64_t v_[4];
  uint64_t seed_;
  uint64_t total_ = 0;
  unsigned char buf_[32];
  size_t nbuf_ = 0;
};

/// XXH64 of `n` bytes at `data` with `seed`.
uint64_t hash64(const void* data, size_t n, uint64_t seed = 0);

}  // namespace kvslim
