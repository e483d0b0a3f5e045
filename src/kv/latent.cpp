// Latent bases and latent codes of a segment (see src/kv/latent.h).
#include "kv/latent.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "kernels/clones.h"
#include "kernels/threads.h"
#include "kvslim/error.h"
#include "kvslim/quant.h"
#include "kv/latent_widen.h"

// LAPACK's symmetric eigensolver, exported by Debian's OpenBLAS (Fortran calling convention).
extern "C" void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w,
                        double* work, const int* lwork, int* iwork, const int* liwork, int* info);

namespace kvslim {

namespace {

// out[i] = P_i . x for the `rank` rows of P (hd floats each), eight partial sums per row so the
// compiler vectorizes them (one copy per SIMD level): a plain loop is a chain of hd dependent
// additions per coordinate, which made encoding each decode-time entry (rank 64 x head_dim 192,
// keys and values) 4.6% of a latent decode profile.
KVSLIM_TARGET_CLONES void project_rows(const float* __restrict P, const float* __restrict x, int rank, int hd,
                                       float* __restrict out) {
  for (int i = 0; i < rank; ++i) {
    const float* p = P + static_cast<size_t>(i) * hd;
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int d = 0;
    for (; d + 8 <= hd; d += 8)
      for (int k = 0; k < 8; ++k) s[k] += p[d + k] * x[d + k];
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; d < hd; ++d) r += p[d] * x[d];
    out[i] = r;
  }
}

thread_local std::vector<float> tls_centred;  // x - mean for encode, reused across calls

}  // namespace

void LatentBasis::encode(const float* x, float* code) const {
  const int r = rank();
  if (is_selection()) {
    for (int i = 0; i < r; ++i) code[i] = x[channels[i]] - (mean.empty() ? 0.0f : mean[channels[i]]);
    return;
  }
  if (mean.empty()) return project_rows(proj.data(), x, r, head_dim, code);
  std::vector<float>& xc = tls_centred;
  xc.resize(head_dim);
  for (int d = 0; d < head_dim; ++d) xc[d] = x[d] - mean[d];
  project_rows(proj.data(), xc.data(), r, head_dim, code);
}

void LatentBasis::decode(const float* code, float* x) const {
  if (mean.empty())
    std::fill(x, x + head_dim, 0.0f);
  else
    std::copy(mean.begin(), mean.end(), x);
  const int r = rank();
  if (is_selection()) {
    for (int i = 0; i < r; ++i) x[channels[i]] += code[i];
    return;
  }
  for (int i = 0; i < r; ++i) {
    const float* p = proj.data() + static_cast<size_t>(i) * head_dim;
    const float c = code[i];
    for (int d = 0; d < head_dim; ++d) x[d] += c * p[d];
  }
}

void LatentBasis::project(const float* q, float* out) const {
  const int r = rank();
  if (is_selection()) {
    for (int i = 0; i < r; ++i) out[i] = q[channels[i]];
    return;
  }
  project_rows(proj.data(), q, r, head_dim, out);
}

size_t LatentBasis::bytes() const {
  return proj.size() * sizeof(float) + channels.size() * sizeof(int32_t) + mean.size() * sizeof(float) +
         scale.size() * sizeof(float);
}

void LatentBasis::validate() const {
  if (head_dim < 1) throw Error(fmt::format("latent basis: head_dim {} must be positive", head_dim));
  if (proj.empty() == channels.empty())
    throw Error("latent basis: exactly one of a projection matrix and a channel list must be given");
  if (!proj.empty() && proj.size() % head_dim)
    throw Error(fmt::format("latent basis: projection has {} values, not a multiple of head_dim {}", proj.size(),
                            head_dim));
  const int r = rank();
  if (r < 1 || r > head_dim) throw Error(fmt::format("latent basis: rank {} is outside [1, {}]", r, head_dim));
  for (size_t i = 0; i < channels.size(); ++i)
    if (channels[i] < 0 || channels[i] >= head_dim || (i && channels[i] <= channels[i - 1]))
      throw Error(fmt::format("latent basis: channel {} at {} is out of range or not increasing", channels[i], i));
  if (!mean.empty() && static_cast<int>(mean.size()) != head_dim)
    throw Error(fmt::format("latent basis: mean has {} values, expected head_dim {}", mean.size(), head_dim));
  if (!scale.empty() && static_cast<int>(scale.size()) != r)
    throw Error(fmt::format("latent basis: {} scales for rank {}", scale.size(), r));
  for (const auto* v : {&proj, &mean, &scale})
    for (float x : *v)
      if (!std::isfinite(x)) throw Error("latent basis: a value is not finite");
  for (float s : scale)
    if (!(s > 0.0f)) throw Error(fmt::format("latent basis: scale {} must be positive", s));
}

std::shared_ptr<const LatentBasis> identity_basis(int head_dim) {
  auto b = std::make_shared<LatentBasis>();
  b->head_dim = head_dim;
  b->channels.resize(head_dim);
  for (int d = 0; d < head_dim; ++d) b->channels[d] = d;
  return b;
}

Pca pca(const float* rows, size_t n, int hd) {
  if (n == 0) throw Error("pca: no rows");
  Pca out;
  out.head_dim = hd;
  out.mean.assign(hd, 0.0);
  std::vector<double> cov(static_cast<size_t>(hd) * hd, 0.0);
  for (size_t j = 0; j < n; ++j)
    for (int d = 0; d < hd; ++d) out.mean[d] += rows[j * hd + d];
  for (double& m : out.mean) m /= static_cast<double>(n);
  std::vector<double> x(hd);
  for (size_t j = 0; j < n; ++j) {
    for (int d = 0; d < hd; ++d) x[d] = rows[j * hd + d] - out.mean[d];
    for (int a = 0; a < hd; ++a) {
      const double xa = x[a];
      double* c = cov.data() + static_cast<size_t>(a) * hd;
      for (int b = a; b < hd; ++b) c[b] += xa * x[b];  // upper triangle in row-major = lower in LAPACK's
    }
  }
  for (double& c : cov) c /= static_cast<double>(n);
  // Eigenvalues ascending; eigenvectors as columns of the column-major result = rows here.
  std::vector<double> w(hd);
  int info = 0, lwork = -1, liwork = -1, iwq = 0;
  double wq = 0;
  const char jobz = 'V', uplo = 'L';
  BlasSlot slot;  // see kernels/threads.h
  dsyevd_(&jobz, &uplo, &hd, cov.data(), &hd, w.data(), &wq, &lwork, &iwq, &liwork, &info);
  lwork = static_cast<int>(wq);
  liwork = iwq;
  std::vector<double> work(std::max(1, lwork));
  std::vector<int> iwork(std::max(1, liwork));
  dsyevd_(&jobz, &uplo, &hd, cov.data(), &hd, w.data(), work.data(), &lwork, iwork.data(), &liwork, &info);
  if (info != 0) throw Error(fmt::format("pca: LAPACK dsyevd failed (info {})", info));
  out.axes.resize(static_cast<size_t>(hd) * hd);
  out.var.resize(hd);
  for (int i = 0; i < hd; ++i) {
    const int src = hd - 1 - i;  // largest eigenvalue first
    out.var[i] = std::max(w[src], 0.0);
    std::copy(cov.begin() + static_cast<size_t>(src) * hd, cov.begin() + static_cast<size_t>(src + 1) * hd,
              out.axes.begin() + static_cast<size_t>(i) * hd);
  }
  return out;
}

int Pca::rank_for_energy(double energy) const {
  double total = 0, acc = 0;
  for (double v : var) total += v;
  for (int i = 0; i < head_dim; ++i) {
    acc += var[i];
    if (acc >= energy * total) return i + 1;
  }
  return head_dim;
}

std::shared_ptr<const LatentBasis> Pca::basis(int rank) const {
  rank = std::clamp(rank, 1, head_dim);
  auto b = std::make_shared<LatentBasis>();
  b->head_dim = head_dim;
  b->proj.assign(axes.begin(), axes.begin() + static_cast<size_t>(rank) * head_dim);
  b->mean.assign(mean.begin(), mean.end());
  b->scale.resize(rank);
  // Floor relative to the leading axis: an axis without variance in the rows may still carry
  // later entries, whose codes divided by the scale must stay in f16 range.
  const double floor = std::max(1e-3 * std::sqrt(var[0]), 1e-6);
  for (int i = 0; i < rank; ++i) b->scale[i] = static_cast<float>(std::max(std::sqrt(var[i]), floor));
  return b;
}

std::shared_ptr<const LatentBasis> pca_basis(const float* rows, size_t n, int hd, int rank, double energy) {
  const Pca p = pca(rows, n, hd);
  if (rank <= 0 && energy > 0.0 && energy < 1.0) rank = p.rank_for_energy(energy);
  return p.basis(rank);
}

// ---- LatentCodes ----

namespace {

// Step of the MSE-optimal uniform quantizer of a unit Gaussian with 2^bits levels (Max, "Quantizing
// for minimum distortion", IRE Trans. Inf. Theory 6(1), 1960, table II): the per-channel fallback
// when no codes are there to fit.
double gaussian_step(int bits) { return bits == 2 ? 0.9957 : bits == 4 ? 0.3352 : 0.0308; }

// Per-entry widening of the per-channel steps: 2^(e/4) for the entry's exponent byte e.
float channel_widen(int e) { return latent_widen_table()[e]; }

}  // namespace

const float* latent_widen_table() {
  static const auto table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = std::exp2(0.25f * static_cast<float>(i));
    return t;
  }();
  return table.data();
}

LatentCodes::LatentCodes(std::shared_ptr<const LatentBasis> basis, int bits, LatentScales scales)
    : basis_(std::move(basis)), bits_(bits), scales_(scales) {
  if (!basis_) throw Error("latent codes: no basis");
  if (bits != 0 && bits != 2 && bits != 4 && bits != 8 && bits != 32)
    throw Error(fmt::format("latent codes: bits {} is not supported (expected 0 = f16, 2, 4, 8 or 32 = f32)", bits));
  rank_ = basis_->rank();
  if (bits == 32)
    row_ = rank_ * sizeof(float);
  else if (bits == 0)
    row_ = rank_ * sizeof(uint16_t);
  else
    row_ = (static_cast<size_t>(rank_) * bits + 7) / 8 + (per_channel() ? 1 : sizeof(uint16_t));
}

namespace {
// Highest code of a quantized side (2, 4 or 8 bits); 0 for the float formats (0 = f16, 32 = f32),
// whose rows hold coordinates, not codes: 1 << 32 would overflow an int (undefined behaviour,
// found by UBSan in coords() on f32 codes).
int code_levels(int bits) { return bits > 0 && bits <= 8 ? (1 << bits) - 1 : 0; }
}  // namespace

void LatentCodes::fit(const float* codes, size_t n) {
  const int levels = code_levels(bits_);
  const double qmax = 0.5 * levels;
  center_.assign(rank_, 0.0f);
  step_.assign(rank_, 0.0f);
  const std::vector<float>& sc = basis_->scale;
  if (n == 0) {
    for (int i = 0; i < rank_; ++i) step_[i] = static_cast<float>(gaussian_step(bits_) * (sc.empty() ? 1.0 : sc[i]));
    return;
  }
  std::vector<float> c(n);
  for (int i = 0; i < rank_; ++i) {
    double mean = 0, lo = INFINITY, hi = -INFINITY;
    for (size_t j = 0; j < n; ++j) {
      c[j] = codes[j * rank_ + i];
      mean += c[j];
      lo = std::min<double>(lo, c[j]);
      hi = std::max<double>(hi, c[j]);
    }
    mean /= static_cast<double>(n);
    double best = INFINITY;
    // Candidates: centered on the mean or on the middle of the range, the outermost levels at a
    // fraction 1, 0.95, ..., 0.05 of the farthest code (clipping the tails).
    for (double m : {mean, 0.5 * (lo + hi)}) {
      const double amax = std::max(hi - m, m - lo);
      if (!(amax > 0.0)) {
        center_[i] = static_cast<float>(m);
        step_[i] = 0.0f;
        best = 0.0;
        break;
      }
      for (int k = 0; k < 20; ++k) {
        const double step = (1.0 - 0.05 * k) * amax / qmax;
        const float mf = static_cast<float>(m), sf = static_cast<float>(step);
        double err = 0;
        for (size_t j = 0; j < n && err < best; ++j) {
          // As put_code rounds it.
          const int q = std::clamp(static_cast<int>(std::lround((c[j] - mf) / sf + static_cast<float>(qmax))), 0, levels);
          const double d = c[j] - (mf + sf * (static_cast<float>(q) - static_cast<float>(qmax)));
          err += d * d;
        }
        if (err < best) {
          best = err;
          center_[i] = mf;
          step_[i] = sf;
        }
      }
    }
  }
  // A coordinate that did not vary in the fitted codes (e.g. axes beyond the span of a few kept
  // entries) still gets a step, 1% of the largest, so later entries can use it (widened as needed).
  const float smax = *std::max_element(step_.begin(), step_.end());
  for (float& st : step_) st = std::max(st, 0.01f * smax);
}

void LatentCodes::put(uint8_t* dst, const float* x) const {
  float c[1024];
  std::vector<float> big;
  float* code = c;
  if (rank_ > 1024) {
    big.resize(rank_);
    code = big.data();
  }
  basis_->encode(x, code);
  put_code(dst, code);
}

void LatentCodes::put_code(uint8_t* dst, float* code) const {
  if (bits_ == 32) {
    std::memcpy(dst, code, rank_ * sizeof(float));
    return;
  }
  if (bits_ == 0) {
    uint16_t* h = reinterpret_cast<uint16_t*>(dst);
    for (int i = 0; i < rank_; ++i) {
      const uint16_t v = fp32_to_fp16(code[i]);
      std::memcpy(h + i, &v, sizeof v);
    }
    return;
  }
  const int levels = code_levels(bits_);
  const float qmax = 0.5f * levels;
  if (per_channel()) {
    // The widening exponent e with the least squared error: 0 for entries like those fitted
    // (their clipped tails included); later entries that drift out of the fitted range (post-RoPE
    // keys in slowly rotating pairs) take the smallest e that still fits them.
    int best_e = 0;
    float best = INFINITY;
    for (int e = 0; e < 256; ++e) {
      const float m = channel_widen(e);
      float err = 0.0f;
      for (int i = 0; i < rank_ && err < best; ++i) {
        const float st = step_[i] * m;
        const int v = st > 0.0f ? std::clamp(static_cast<int>(std::lround((code[i] - center_[i]) / st + qmax)), 0, levels)
                                : 0;
        const float d = code[i] - (center_[i] + st * (static_cast<float>(v) - qmax));
        err += d * d;
      }
      if (err < best) {
        best = err;
        best_e = e;
      } else if (e > best_e + 4) {
        break;
      }
      if (best == 0.0f) break;
    }
    std::memset(dst, 0, row_);
    dst[0] = static_cast<uint8_t>(best_e);
    uint8_t* q = dst + 1;
    const float m = channel_widen(best_e);
    for (int i = 0; i < rank_; ++i) {
      const float st = step_[i] * m;
      int v = 0;
      if (st > 0.0f) v = std::clamp(static_cast<int>(std::lround((code[i] - center_[i]) / st + qmax)), 0, levels);
      const size_t bit = static_cast<size_t>(i) * bits_;
      q[bit / 8] |= static_cast<uint8_t>(v << (bit % 8));
    }
    return;
  }
  const std::vector<float>& sc = basis_->scale;
  float amax = 0.0f;
  for (int i = 0; i < rank_; ++i) {
    if (!sc.empty()) code[i] /= sc[i];
    amax = std::max(amax, std::fabs(code[i]));
  }
  // The largest finite f16 bounds the scale (a coordinate far beyond its basis scale is clipped).
  const uint16_t sh = fp32_to_fp16(std::min(amax / qmax, 65504.0f));
  const float s = fp16_to_fp32(sh);
  const float inv = s > 0.0f ? 1.0f / s : 0.0f;
  uint8_t* q = dst + sizeof(uint16_t);
  std::memcpy(dst, &sh, sizeof sh);
  std::memset(q, 0, row_ - sizeof(uint16_t));
  for (int i = 0; i < rank_; ++i) {
    // Levels sit at half-integers (q - qmax), so the nearest one is q = round(c / s + qmax).
    int v = static_cast<int>(std::lround(code[i] * inv + qmax));
    v = std::clamp(v, 0, levels);
    const size_t bit = static_cast<size_t>(i) * bits_;
    q[bit / 8] |= static_cast<uint8_t>(v << (bit % 8));
  }
}

void LatentCodes::append_rows(const float* xs, size_t n) {
  const int hd = basis_->head_dim;
  std::vector<float> codes(n * rank_);
  for (size_t j = 0; j < n; ++j) basis_->encode(xs + j * hd, codes.data() + j * rank_);
  if (per_channel() && step_.empty()) fit(codes.data(), n);
  data_.resize((n_ + n) * row_);
  for (size_t j = 0; j < n; ++j) put_code(data_.data() + (n_ + j) * row_, codes.data() + j * rank_);
  n_ += n;
}

void LatentCodes::append(const float* x) {
  if (per_channel() && step_.empty()) fit(nullptr, 0);
  data_.resize((n_ + 1) * row_);
  put(data_.data() + n_ * row_, x);
  ++n_;
}

void LatentCodes::set(size_t i, const float* x) { put(data_.data() + i * row_, x); }

void LatentCodes::retain(const std::vector<int32_t>& idx) {
  for (size_t j = 0; j < idx.size(); ++j)
    if (static_cast<size_t>(idx[j]) != j) std::memcpy(data_.data() + j * row_, data_.data() + idx[j] * row_, row_);
  n_ = idx.size();
  data_.resize(n_ * row_);
  data_.shrink_to_fit();
}

void LatentCodes::clear() {
  std::vector<uint8_t>().swap(data_);
  center_.clear();
  step_.clear();
  n_ = 0;
}

namespace {

// o[i] = center[i] + step[i] * m * (q[i] - qmax) for 8-bit per-channel codes; eight lanes at a
// time so the compiler vectorizes it (one copy per SIMD level), as attention decodes every entry.
KVSLIM_TARGET_CLONES void dequant_channel8(const uint8_t* __restrict q, const float* __restrict center,
                                           const float* __restrict step, float m, float qmax, float* __restrict o,
                                           int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) o[i + k] = center[i + k] + step[i + k] * m * (static_cast<float>(q[i + k]) - qmax);
  for (; i < n; ++i) o[i] = center[i] + step[i] * m * (static_cast<float>(q[i]) - qmax);
}

}  // namespace

void LatentCodes::coords(size_t b, size_t e, float* out) const {
  const std::vector<float>& sc = basis_->scale;
  const int levels = code_levels(bits_);
  const float qmax = 0.5f * levels;
  for (size_t j = b; j < e; ++j) {
    const uint8_t* src = data_.data() + j * row_;
    float* o = out + (j - b) * rank_;
    if (bits_ == 32) {
      std::memcpy(o, src, rank_ * sizeof(float));
      continue;
    }
    if (bits_ == 0) {
      for (int i = 0; i < rank_; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, sizeof h);
        o[i] = fp16_to_fp32(h);
      }
      continue;
    }
    const int mask = levels;
    if (per_channel()) {
      const float m = channel_widen(src[0]);
      const uint8_t* q = src + 1;
      if (bits_ == 8) {
        dequant_channel8(q, center_.data(), step_.data(), m, qmax, o, rank_);
        continue;
      }
      for (int i = 0; i < rank_; ++i) {
        const size_t bit = static_cast<size_t>(i) * bits_;
        const int v = (q[bit / 8] >> (bit % 8)) & mask;
        o[i] = center_[i] + step_[i] * m * (static_cast<float>(v) - qmax);
      }
      continue;
    }
    uint16_t sh;
    std::memcpy(&sh, src, sizeof sh);
    const float s = fp16_to_fp32(sh);
    const uint8_t* q = src + sizeof(uint16_t);
    // Codes never straddle a byte: bits is 2, 4 or 8.
    for (int i = 0; i < rank_; ++i) {
      const size_t bit = static_cast<size_t>(i) * bits_;
      const int v = (q[bit / 8] >> (bit % 8)) & mask;
      o[i] = s * (static_cast<float>(v) - qmax);
      if (!sc.empty()) o[i] *= sc[i];
    }
  }
}

void LatentCodes::decode(size_t i, float* x) const {
  std::vector<float> c(rank_);
  coords(i, i + 1, c.data());
  basis_->decode(c.data(), x);
}

}  // namespace kvslim
