// KIVI groups (Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache",
// arXiv 2402.02750): keys are quantized per channel over a group of G tokens (outlier channels get
// their own range), values per token over groups of G channels; codes are b-bit asymmetric with an
// f16 zero point and step per group.
//
// Byte layout of a group of n tokens (n <= G; fewer after retain):
//   key zero points   [head_dim] f16
//   key steps         [head_dim] f16
//   key codes         [head_dim][ceil(n * b / 8)]  channel-major, token t at bit t * b
//   value records     [n] x { [head_dim / gv] x (f16 zero, f16 step), codes [head_dim * b / 8] }
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kv/codec.h"
#include "kv/decode_avx2.h"
#include "kv/simd.h"
#include "kvslim/quant.h"

namespace kvslim::kv {

namespace {

// Neighbouring f16 values toward -inf / +inf.
uint16_t half_prev(uint16_t h) {
  if ((h & 0x7FFF) == 0) return 0x8001;
  return (h & 0x8000) ? h + 1 : h - 1;
}
uint16_t half_next(uint16_t h) {
  if ((h & 0x7FFF) == 0) return 0x0001;
  return (h & 0x8000) ? h - 1 : h + 1;
}
uint16_t half_down(float x) {
  uint16_t h = fp32_to_fp16(x);
  if (fp16_to_fp32(h) > x) h = half_prev(h);
  return h;
}
uint16_t half_up(float x) {
  uint16_t h = fp32_to_fp16(x);
  if (fp16_to_fp32(h) < x) h = half_next(h);
  return h;
}

inline int get_code(const uint8_t* base, int idx, int bits) {
  const int bit = idx * bits;
  return (base[bit >> 3] >> (bit & 7)) & ((1 << bits) - 1);
}
inline void put_code(uint8_t* base, int idx, int bits, int code) {
  const int bit = idx * bits, mask = (1 << bits) - 1;
  uint8_t& b = base[bit >> 3];
  b = static_cast<uint8_t>((b & ~(mask << (bit & 7))) | (code << (bit & 7)));
}

inline size_t code_stride(int n, int bits) { return (static_cast<size_t>(n) * bits + 7) / 8; }

}  // namespace

void kivi_params(const float* x, int n, int stride, int bits, uint16_t& zero, uint16_t& step) {
  float mn = x[0], mx = x[0];
  for (int i = 1; i < n; ++i) {
    mn = std::min(mn, x[i * stride]);
    mx = std::max(mx, x[i * stride]);
  }
  const int qmax = (1 << bits) - 1;
  zero = half_down(mn);
  const float z = fp16_to_fp32(zero);
  step = half_up((mx - z) / qmax);
  // Rounding of the division can leave the top level a hair below the maximum.
  for (int guard = 0; guard < 4 && z + qmax * fp16_to_fp32(step) < mx; ++guard) step = half_next(step);
}

int kivi_code(float x, float zero, float step, int bits) {
  if (!(step > 0)) return 0;
  // Clamped as a float: a value outside every level (inf, NaN: a corrupted stored context's residual
  // window) must not reach the integer conversion, which is undefined for it.
  const float q = std::floor((x - zero) / step + 0.5f), top = static_cast<float>((1 << bits) - 1);
  if (!(q > 0)) return 0;
  return q >= top ? static_cast<int>(top) : static_cast<int>(q);
}

}  // namespace kvslim::kv

namespace kvslim {
using namespace kv;

// ---- KVStore: the KIVI part ----

size_t KVStore::group_bytes(int n) const {
  const size_t vrec = static_cast<size_t>(hd_ / gv_) * 4 + static_cast<size_t>(hd_) * bits_ / 8;
  return static_cast<size_t>(hd_) * 4 + hd_ * code_stride(n, bits_) + n * vrec;
}

namespace {

// Writes the key part (zero points, steps, codes) of a group of n tokens from keys[n][hd].
void encode_group_keys(const float* keys, int n, int hd, int bits, uint8_t* grp) {
  auto* zero = reinterpret_cast<uint16_t*>(grp);
  auto* step = zero + hd;
  uint8_t* codes = grp + static_cast<size_t>(hd) * 4;
  const size_t cs = code_stride(n, bits);
  std::memset(codes, 0, hd * cs);
  for (int c = 0; c < hd; ++c) {
    kivi_params(keys + c, n, hd, bits, zero[c], step[c]);
    const float z = fp16_to_fp32(zero[c]), s = fp16_to_fp32(step[c]);
    for (int t = 0; t < n; ++t) put_code(codes + c * cs, t, bits, kivi_code(keys[t * hd + c], z, s, bits));
  }
}

// Writes one value record (per-token groups of gv channels).
void encode_value(const float* v, int hd, int gv, int bits, uint8_t* rec) {
  auto* par = reinterpret_cast<uint16_t*>(rec);
  uint8_t* codes = rec + (hd / gv) * 4;
  std::memset(codes, 0, static_cast<size_t>(hd) * bits / 8);
  for (int g = 0; g < hd / gv; ++g) {
    kivi_params(v + g * gv, gv, 1, bits, par[2 * g], par[2 * g + 1]);
    const float z = fp16_to_fp32(par[2 * g]), s = fp16_to_fp32(par[2 * g + 1]);
    for (int c = g * gv; c < (g + 1) * gv; ++c) put_code(codes, c, bits, kivi_code(v[c], z, s, bits));
  }
}

inline __attribute__((always_inline)) void decode_value(const uint8_t* rec, int hd, int gv, int bits, float* out) {
  const auto* par = reinterpret_cast<const uint16_t*>(rec);
  const uint8_t* codes = rec + (hd / gv) * 4;
  if (gv % 16 == 0) {
    for (int g = 0; g < hd / gv; ++g) {
      const float z = simd::half(par[2 * g]), s = simd::half(par[2 * g + 1]);
      for (int c = g * gv; c < (g + 1) * gv; c += 16) {
        const simd::v16 q = bits == 4 ? simd::nib_lanes<0>(simd::load32(codes + c / 2)) : simd::crumbs(codes + c / 4);
        simd::store(out + c, q * s + z);
      }
    }
    return;
  }
  for (int g = 0; g < hd / gv; ++g) {
    const float z = fp16_to_fp32(par[2 * g]), s = fp16_to_fp32(par[2 * g + 1]);
    for (int c = g * gv; c < (g + 1) * gv; ++c) out[c] = get_code(codes, c, bits) * s + z;
  }
}

}  // namespace

void KVStore::quantize_group(const float* keys, const float* vals, int n, std::vector<uint8_t>& dst) const {
  const size_t at = dst.size();
  dst.resize(at + group_bytes(n));
  uint8_t* grp = dst.data() + at;
  encode_group_keys(keys, n, hd_, bits_, grp);
  const size_t vrec = static_cast<size_t>(hd_ / gv_) * 4 + static_cast<size_t>(hd_) * bits_ / 8;
  uint8_t* recs = grp + static_cast<size_t>(hd_) * 4 + hd_ * code_stride(n, bits_);
  for (int t = 0; t < n; ++t) encode_value(vals + static_cast<size_t>(t) * hd_, hd_, gv_, bits_, recs + t * vrec);
}

void KVStore::group_key(size_t g, int t, float* out) const {
  const uint8_t* grp = g_.data() + gofs_[g];
  const auto* zero = reinterpret_cast<const uint16_t*>(grp);
  const auto* step = zero + hd_;
  const uint8_t* codes = grp + static_cast<size_t>(hd_) * 4;
  const size_t cs = code_stride(gn_[g], bits_);
  for (int c = 0; c < hd_; ++c)
    out[c] = get_code(codes + c * cs, t, bits_) * fp16_to_fp32(step[c]) + fp16_to_fp32(zero[c]);
}

void KVStore::group_value(size_t g, int t, float* out) const {
  const uint8_t* grp = g_.data() + gofs_[g];
  const size_t vrec = static_cast<size_t>(hd_ / gv_) * 4 + static_cast<size_t>(hd_) * bits_ / 8;
  const uint8_t* rec = grp + static_cast<size_t>(hd_) * 4 + hd_ * code_stride(gn_[g], bits_) + t * vrec;
  decode_value(rec, hd_, gv_, bits_, out);
}

std::vector<int> KVStore::group_sizes() const { return gn_; }

void KVStore::flush_groups() {
  // An entry leaves the residual window once R newer entries have been appended after it; the
  // expired ones wait in full precision until they fill a group of G.
  for (;;) {
    size_t expired = 0;
    while (expired < n_row_ && static_cast<uint64_t>(serial_[expired]) + R_ < appended_) ++expired;
    if (expired < static_cast<size_t>(G_)) return;
    std::vector<float> k(static_cast<size_t>(G_) * hd_), v(k.size());
    for (int t = 0; t < G_; ++t) row_key(t, k.data() + static_cast<size_t>(t) * hd_);
    rows_decode(vc_, hd_, v_.data(), v.data(), G_);
    g_.resize(gbytes_);  // drop the slack, append, restore it
    gofs_.push_back(gbytes_);
    gn_.push_back(G_);
    quantize_group(k.data(), v.data(), G_, g_);
    gbytes_ = g_.size();
    g_.resize(gbytes_ + kPad);
    n_group_ += G_;
    gstart_.push_back(n_group_);
    for (size_t r = G_; r < n_row_; ++r) row_move(r - G_, r);
    row_resize(n_row_ - G_);
    serial_.erase(serial_.begin(), serial_.begin() + G_);
  }
}

// Keeps tokens `keep` (increasing, within group g) of group g, appending the shrunk group to dst.
namespace {
void shrink_group(const uint8_t* grp, int n, const std::vector<int>& keep, int hd, int gv, int bits,
                  std::vector<uint8_t>& dst, size_t new_bytes) {
  const size_t at = dst.size();
  dst.resize(at + new_bytes, 0);
  uint8_t* out = dst.data() + at;
  const int m = static_cast<int>(keep.size());
  std::memcpy(out, grp, static_cast<size_t>(hd) * 4);
  const size_t cs = code_stride(n, bits), ncs = code_stride(m, bits);
  const uint8_t* codes = grp + static_cast<size_t>(hd) * 4;
  uint8_t* ncodes = out + static_cast<size_t>(hd) * 4;
  for (int c = 0; c < hd; ++c)
    for (int j = 0; j < m; ++j) put_code(ncodes + c * ncs, j, bits, get_code(codes + c * cs, keep[j], bits));
  const size_t vrec = static_cast<size_t>(hd / gv) * 4 + static_cast<size_t>(hd) * bits / 8;
  const uint8_t* recs = codes + hd * cs;
  uint8_t* nrecs = ncodes + hd * ncs;
  for (int j = 0; j < m; ++j) std::memcpy(nrecs + j * vrec, recs + keep[j] * vrec, vrec);
}
}  // namespace

void KVStore::compact_groups() {
  // A group at most half full is sparse: its key zero points and steps (4 bytes a channel) cost as
  // much as many tokens' codes, and attention blocks never cross a group. Runs of adjacent sparse
  // groups are merged while the merged group stays within G, so a retain that keeps scattered
  // entries of many groups (a budget press after each prefill chunk) does not leave one group per
  // kept entry. Afterwards no two sparse groups are adjacent, so there are at most
  // 2 * n_group_ / (G / 2) + 1 groups. A merged group's keys are requantized over the run's
  // per-channel range (each key moves by at most half of the new step); values are per token
  // records and move byte for byte. Groups that are not merged keep their bytes.
  const int sparse = G_ / 2;
  bool any = false;
  for (size_t g = 0; g + 1 < gn_.size() && !any; ++g) any = gn_[g] <= sparse && gn_[g + 1] <= sparse;
  if (!any) return;
  const size_t vrec = static_cast<size_t>(hd_ / gv_) * 4 + static_cast<size_t>(hd_) * bits_ / 8;
  std::vector<uint8_t> ng;
  std::vector<size_t> nofs;
  std::vector<int> nn;
  std::vector<float> keys;
  for (size_t g = 0; g < gn_.size();) {
    size_t e = g;
    int n = 0;
    while (e < gn_.size() && gn_[e] <= sparse && n + gn_[e] <= G_) n += gn_[e++];
    if (e <= g + 1) {  // not part of a run of sparse groups: copied as it is
      e = g + 1;
      n = gn_[g];
      nofs.push_back(ng.size());
      ng.insert(ng.end(), g_.begin() + gofs_[g], g_.begin() + gofs_[g] + group_bytes(n));
    } else {
      keys.resize(static_cast<size_t>(n) * hd_);
      int t = 0;
      for (size_t h = g; h < e; ++h)
        for (int j = 0; j < gn_[h]; ++j, ++t) group_key(h, j, keys.data() + static_cast<size_t>(t) * hd_);
      const size_t at = ng.size();
      nofs.push_back(at);
      ng.resize(at + group_bytes(n));
      encode_group_keys(keys.data(), n, hd_, bits_, ng.data() + at);
      uint8_t* recs = ng.data() + at + static_cast<size_t>(hd_) * 4 + hd_ * code_stride(n, bits_);
      for (size_t h = g; h < e; ++h) {
        const uint8_t* src = g_.data() + gofs_[h] + static_cast<size_t>(hd_) * 4 + hd_ * code_stride(gn_[h], bits_);
        std::memcpy(recs, src, gn_[h] * vrec);
        recs += gn_[h] * vrec;
      }
    }
    nn.push_back(n);
    g = e;
  }
  gbytes_ = ng.size();
  if (gbytes_) ng.resize(gbytes_ + kPad);
  g_.swap(ng);
  gofs_.swap(nofs);
  gn_.swap(nn);
  rebuild_group_starts();
}

void KVStore::retain_groups(const std::vector<int32_t>& idx, size_t& used) {
  // idx[0, used) are the kept group entries (store indices < n_group_).
  std::vector<uint8_t> ng;
  std::vector<size_t> nofs;
  std::vector<int> nn;
  size_t start = 0, j = 0;
  std::vector<int> keep;
  for (size_t g = 0; g < gn_.size(); ++g) {
    keep.clear();
    while (j < idx.size() && static_cast<size_t>(idx[j]) < start + gn_[g]) keep.push_back(idx[j++] - static_cast<int>(start));
    if (!keep.empty()) {
      const int m = static_cast<int>(keep.size());
      nofs.push_back(ng.size());
      nn.push_back(m);
      if (m == gn_[g]) {
        ng.insert(ng.end(), g_.begin() + gofs_[g], g_.begin() + gofs_[g] + group_bytes(m));
      } else {
        shrink_group(g_.data() + gofs_[g], gn_[g], keep, hd_, gv_, bits_, ng, group_bytes(m));
      }
    }
    start += gn_[g];
  }
  used = j;
  size_t total = 0;
  for (int m : nn) total += m;
  gbytes_ = ng.size();
  if (gbytes_) ng.resize(gbytes_ + kPad);
  g_.swap(ng);
  gofs_.swap(nofs);
  gn_.swap(nn);
  n_group_ = total;
  rebuild_group_starts();
  compact_groups();
}

void KVStore::rebuild_group_starts() {
  gstart_.resize(gn_.size() + 1);
  gstart_[0] = 0;
  for (size_t g = 0; g < gn_.size(); ++g) gstart_[g + 1] = gstart_[g] + gn_[g];
}

void KVStore::set_group_keys(size_t g, const std::vector<std::pair<int, const float*>>& rows) {
  const int n = gn_[g];
  std::vector<float> k(static_cast<size_t>(n) * hd_);
  for (int t = 0; t < n; ++t) group_key(g, t, k.data() + static_cast<size_t>(t) * hd_);
  for (const auto& [t, src] : rows) std::memcpy(k.data() + static_cast<size_t>(t) * hd_, src, hd_ * sizeof(float));
  encode_group_keys(k.data(), n, hd_, bits_, g_.data() + gofs_[g]);
}

namespace {

// Keys of block [t0, t0 + 16) of a group, transposed: kt[c * kKVTile + j].
KV_SIMD_INLINE void group_keys_t_body(const uint8_t* grp, int hd, int bits, size_t cs, int t0, float* kt) {
  const auto* zero = reinterpret_cast<const uint16_t*>(grp);
  const auto* step = zero + hd;
  const uint8_t* codes = grp + static_cast<size_t>(hd) * 4;
  // t0 is a multiple of kKVTile, so the block's codes start on a byte boundary.
  const size_t first = static_cast<size_t>(t0) * bits / 8;
  alignas(64) float z[64], s[64];
  for (int c0 = 0; c0 < hd; c0 += 64) {
    const int cn = std::min(64, hd - c0);
    int c = 0;
    for (; c + 16 <= cn; c += 16) {
      simd::store(z + c, simd::from_f16(zero + c0 + c));
      simd::store(s + c, simd::from_f16(step + c0 + c));
    }
    for (; c < cn; ++c) {
      z[c] = simd::half(zero[c0 + c]);
      s[c] = simd::half(step[c0 + c]);
    }
    for (c = 0; c < cn; ++c) {
      // Lanes past a partial block read neighbouring bytes (or the store's slack): unspecified.
      const uint8_t* src = codes + (c0 + c) * cs + first;
      const simd::v16 q = bits == 4 ? simd::nib_lanes<0>(simd::load32(src)) : simd::crumbs(src);
      simd::store(kt + (c0 + c) * kKVTile, q * s[c] + z[c]);
    }
  }
}

KV_SIMD_LEVELS_AVX2(void, group_keys_t, (const uint8_t* grp, int hd, int bits, size_t cs, int t0, float* kt),
                    (grp, hd, bits, cs, t0, kt), group_keys_t_body, true,
                    avx2::kivi_group_keys_t(grp, hd, bits, cs, t0, kt))

KV_SIMD_INLINE void group_values_body(const uint8_t* rec, size_t vrec, int hd, int gv, int bits, int nb, float* out) {
  for (int j = 0; j < nb; ++j) decode_value(rec + j * vrec, hd, gv, bits, out + static_cast<size_t>(j) * hd);
}

KV_SIMD_LEVELS_AVX2(void, group_values,
                    (const uint8_t* rec, size_t vrec, int hd, int gv, int bits, int nb, float* out),
                    (rec, vrec, hd, gv, bits, nb, out), group_values_body, gv % 16 == 0,
                    avx2::kivi_group_values(rec, vrec, hd, gv, bits, nb, out))

}  // namespace

void KVStore::group_block_keys_t(size_t g, int t0, int, float* kt) const {
  group_keys_t(g_.data() + gofs_[g], hd_, bits_, code_stride(gn_[g], bits_), t0, kt);
}

bool KVStore::kivi_block(size_t b, size_t e, KiviBlock& out) const {
  if (b >= n_group_) return false;
  const size_t g = group_of(b);
  const size_t t0 = b - gstart_[g];
  if (t0 % kKVTile != 0 || e > gstart_[g + 1]) return false;
  const uint8_t* grp = g_.data() + gofs_[g];
  const size_t cs = code_stride(gn_[g], bits_);
  out.zero = reinterpret_cast<const uint16_t*>(grp);
  out.step = out.zero + hd_;
  out.codes = grp + static_cast<size_t>(hd_) * 4 + t0 * bits_ / 8;
  out.code_stride = cs;
  out.value_bytes = static_cast<size_t>(hd_ / gv_) * 4 + static_cast<size_t>(hd_) * bits_ / 8;
  out.values = grp + static_cast<size_t>(hd_) * 4 + hd_ * cs + t0 * out.value_bytes;
  out.bits = bits_;
  out.gv = gv_;
  return true;
}

void KVStore::group_block_values(size_t g, int t0, int nb, float* out) const {
  const uint8_t* grp = g_.data() + gofs_[g];
  const size_t vrec = static_cast<size_t>(hd_ / gv_) * 4 + static_cast<size_t>(hd_) * bits_ / 8;
  const uint8_t* rec = grp + static_cast<size_t>(hd_) * 4 + hd_ * code_stride(gn_[g], bits_) + t0 * vrec;
  group_values(rec, vrec, hd_, gv_, bits_, nb, out);
}

}  // namespace kvslim
