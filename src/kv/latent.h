#pragma once
// Latent (dimension-reduced) storage of a KV segment: each entry's key and value are stored as
// codes in a lower-dimensional basis instead of head_dim values, so the bytes per entry drop.
//
// Used after training, as in Palu (Chang et al., "Palu: Compressing KV-Cache with Low-Rank
// Projection", arXiv 2407.21118: cache the low-rank latent of K and V), xKV (Chang et al.,
// arXiv 2503.18893: bases from an SVD of the prefill's own keys/values) and ThinK (Xu et al.,
// "ThinK: Thinner Key Cache by Query-Driven Pruning", arXiv 2407.21018: a basis that selects key
// channels). Together with token eviction and low-bit codes this is the post-training form of
// CLLA (arXiv 2410.15252).
//
// RoPE: kvslim projects keys AFTER RoPE (the cache holds rotated keys, and so do the bases), so
// a query absorbs the key basis exactly: q . k ~= q . mean + (P q) . code, and the first term is
// the same for every entry of a segment, which softmax ignores. No rotary dimension needs to be
// kept apart and no key is reconstructed during attention.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace kvslim {

namespace kv {
struct CacheIO;  // src/kv/serialize.h: stored contexts read and write the codes byte for byte
}  // namespace kv

/// A linear map of head_dim values (one key or one value) to `rank` latent coordinates:
/// code = P (x - mean), reconstruction x ~= mean + P^T code, P with orthonormal rows.
/// Either dense (`proj`, rank x head_dim, row-major) or a channel selection (`channels`: P's rows
/// are unit vectors; ThinK). `scale[i]` is the typical size of coordinate i (for quantized codes:
/// coordinates are divided by it before a token's codes share one scale); empty means 1.
/// Immutable once built; segments share it through shared_ptr and the cache counts it once.
struct LatentBasis {
  int head_dim = 0;
  std::vector<float> proj;        ///< [rank][head_dim] for a dense basis, else empty
  std::vector<int32_t> channels;  ///< [rank] increasing channel indices for a selection, else empty
  std::vector<float> mean;        ///< [head_dim], or empty for zero
  std::vector<float> scale;       ///< [rank], or empty for all ones
  /// True for a basis loaded once per process from a calibration file and used by every
  /// request (like the model's weights): KVCache::bytes() leaves it out and
  /// KVCache::shared_bytes() counts it, once however many segments and caches use it.
  bool shared = false;

  int rank() const { return static_cast<int>(proj.empty() ? channels.size() : proj.size() / head_dim); }
  bool is_selection() const { return proj.empty(); }
  /// code[rank] = P (x - mean).
  void encode(const float* x, float* code) const;
  /// x[head_dim] = mean + P^T code.
  void decode(const float* code, float* x) const;
  /// out[rank] = P q (no mean): the query absorbed into the key basis.
  void project(const float* q, float* out) const;
  /// Bytes this basis occupies (f32 matrix / int32 channels, mean, scales).
  size_t bytes() const;
  /// Throws kvslim::Error when sizes disagree, a channel is out of range or not increasing, or a
  /// value is not finite.
  void validate() const;
};

/// The identity selection of head_dim channels (a side kept as it is, e.g. ThinK's values).
std::shared_ptr<const LatentBasis> identity_basis(int head_dim);

/// Principal component analysis of rows of head_dim values.
struct Pca {
  int head_dim = 0;
  std::vector<double> mean;  ///< [head_dim]
  std::vector<double> axes;  ///< [head_dim][head_dim], row i = axis i, variance descending
  std::vector<double> var;   ///< [head_dim] variance along each axis, descending
  /// Smallest rank whose axes keep `energy` of the total variance (head_dim at most).
  int rank_for_energy(double energy) const;
  /// Dense basis of the leading `rank` axes (clamped to [1, head_dim]); scale[i] = sqrt(var[i])
  /// (at least 1e-6).
  std::shared_ptr<const LatentBasis> basis(int rank) const;
};

/// PCA of `n` rows of `head_dim` values (row-major), from the covariance in float64 (LAPACK
/// dsyevd through OpenBLAS). Throws kvslim::Error for n == 0 or a LAPACK failure.
Pca pca(const float* rows, size_t n, int head_dim);

/// Principal axes of `n` rows of `head_dim` values (row-major), from the covariance in float64
/// (LAPACK dsyevd through OpenBLAS): a dense basis of the `rank` leading axes with the rows' mean
/// and scale[i] = sqrt(eigenvalue i) (at least 1e-6). rank is clamped to [1, head_dim].
/// When `energy` is in (0, 1) and rank <= 0, the rank is the smallest that keeps that fraction of
/// the variance. Throws kvslim::Error for n == 0 or a LAPACK failure.
std::shared_ptr<const LatentBasis> pca_basis(const float* rows, size_t n, int head_dim, int rank, double energy = 0.0);

/// How quantized latent codes (bits 2, 4, 8) are scaled.
enum class LatentScales {
  /// One f16 scale per entry over its coordinates (each divided by the basis' scale first):
  /// adapts to every token, costs 2 bytes per entry, and a large coordinate coarsens the others.
  Token,
  /// One (center, step) pair per coordinate, fitted once on the codes present when the segment
  /// becomes latent (the step minimizing the squared error over a grid of clipping ranges, as in
  /// KIVI's per-channel keys, Liu et al., arXiv 2402.02750) and kept for later entries. Each
  /// entry has one exponent byte e widening every step by 2^(e/4), chosen for the least squared
  /// error: 0 for entries like the fitted ones (their tails stay clipped), larger for entries
  /// that drift out of the fitted range (post-RoPE keys in slowly rotating pairs, decoded later).
  /// rank * bits / 8 + 1 bytes per entry plus 8 bytes per coordinate per segment.
  Channel,
};

/// Codes of one side (keys or values) of a latent segment, one row per entry.
/// bits = 0: f16 coordinates (2 bytes each); bits = 32: f32 coordinates. bits = 2, 4, 8 store
/// unsigned codes q in [0, 2^bits - 1] on half-integer levels (q - qmax, qmax = (2^bits - 1) / 2,
/// symmetric, no zero level, packed little-end first), scaled per LatentScales:
/// - Token: c_i = scale_i * s * (q - qmax) with s = max|c_i / scale_i| / qmax an f16 per entry;
///   bytes per entry ceil(rank * bits / 8) + 2.
/// - Channel: c_i = center_i + step_i * 2^(e/4) * (q - qmax) with e a byte per entry; bytes per
///   entry ceil(rank * bits / 8) + 1, plus 2 * rank f32 per segment (counted in bytes()).
class LatentCodes {
 public:
  LatentCodes() = default;
  /// Throws kvslim::Error for bits other than 0, 2, 4, 8, 32 or a null basis.
  LatentCodes(std::shared_ptr<const LatentBasis> basis, int bits, LatentScales scales = LatentScales::Token);

  const LatentBasis& basis() const { return *basis_; }
  const std::shared_ptr<const LatentBasis>& basis_ptr() const { return basis_; }
  int rank() const { return rank_; }
  int bits() const { return bits_; }
  LatentScales scales() const { return scales_; }
  /// True when codes are quantized with per-coordinate (center, step) pairs.
  bool per_channel() const { return scales_ == LatentScales::Channel && bits_ != 0 && bits_ != 32; }
  size_t size() const { return n_; }
  /// Bytes of one entry's row.
  size_t row_bytes() const { return row_; }
  /// Bytes of every row (codes and per-entry scales) and of the per-channel centers and steps.
  size_t bytes() const { return n_ * row_ + (center_.size() + step_.size()) * sizeof(float); }
  /// Heap bytes held (capacities, not sizes).
  size_t allocated_bytes() const { return data_.capacity() + (center_.capacity() + step_.capacity()) * sizeof(float); }
  /// Gives capacity past the size back to the allocator.
  void shrink_to_fit() {
    data_.shrink_to_fit();
    center_.shrink_to_fit();
    step_.shrink_to_fit();
  }
  /// Per-channel centers and steps ([rank] each; empty unless per_channel() and fitted).
  const std::vector<float>& centers() const { return center_; }
  const std::vector<float>& steps() const { return step_; }
  /// Row i's bytes as stored (row_bytes() of them, i < size()), for kernels that read codes
  /// without dequantizing them (src/attention/latent_code_dot.h). Quantized per channel: the
  /// widening exponent byte e, then the packed codes; per token: the f16 scale, then the packed
  /// codes; f16 / f32 codes: the coordinates.
  const uint8_t* row(size_t i) const { return data_.data() + i * row_; }

  /// Encodes x[head_dim] and appends it. The first append of a per-channel side without a fit
  /// fits the steps to the basis' scale (a Gaussian of that deviation).
  void append(const float* x);
  /// Appends `n` rows xs[n][head_dim]; a per-channel side not yet fitted is fitted on their codes
  /// first (see LatentScales::Channel).
  void append_rows(const float* xs, size_t n);
  /// Keeps rows `idx` (increasing, in range; checked by the caller) and frees the rest.
  void retain(const std::vector<int32_t>& idx);
  void clear();
  /// Re-encodes row i from x[head_dim].
  void set(size_t i, const float* x);
  /// Latent coordinates of rows [b, e) (dequantized, scale applied): out[(e-b) * rank].
  void coords(size_t b, size_t e, float* out) const;
  /// Reconstructs row i: x[head_dim] = mean + P^T coords.
  void decode(size_t i, float* x) const;

 private:
  void put(uint8_t* dst, const float* x) const;
  void put_code(uint8_t* dst, float* code) const;
  /// Fits center_/step_ on codes[n][rank] (n may be 0: from the basis' scale).
  void fit(const float* codes, size_t n);
  std::shared_ptr<const LatentBasis> basis_;
  int bits_ = 0, rank_ = 0;
  LatentScales scales_ = LatentScales::Token;
  std::vector<float> center_, step_;
  size_t row_ = 0, n_ = 0;
  std::vector<uint8_t> data_;
  friend struct kv::CacheIO;
};

}  // namespace kvslim
