// Segments (one per (layer, KV head)) and the cache. A segment is one or two KVStores (precision
// tiers); its logical entry order is insertion order across both.
#include <malloc.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <numeric>

#include <fmt/format.h>

#include "kv/codec.h"
#include "kv/store.h"
#include "kv/cache.h"

namespace kvslim {

Segment::Segment(int head_dim, KVCodec key_codec, KVCodec value_codec, const KVQuantOptions& q)
    : head_dim_(head_dim), q_(q) {
  validate_cache_config(key_codec, value_codec, q, head_dim);
  stores_.emplace_back(head_dim, key_codec, value_codec, q);
}

Segment::~Segment() = default;
Segment::Segment(const Segment&) = default;
Segment::Segment(Segment&&) noexcept = default;
Segment& Segment::operator=(const Segment&) = default;
Segment& Segment::operator=(Segment&&) noexcept = default;

KVCodec Segment::key_codec() const { return stores_[0].key_codec(); }
KVCodec Segment::value_codec() const { return stores_[0].value_codec(); }
size_t Segment::low_tier_size() const { return tier_size(1); }

size_t Segment::tier_size(int t) const {
  if (t == 0) return (shared_start_.empty() ? 0 : shared_start_.back()) + stores_[0].size();
  if (shared_low_) return shared_low_->size();
  return stores_.size() > 1 ? stores_[1].size() : 0;
}

int Segment::n_stores() const {
  if (!shares()) return static_cast<int>(stores_.size());
  return static_cast<int>(shared_.size()) + 1 + (shared_low_ ? 1 : 0);
}

const KVStore& Segment::store(int s) const {
  if (!shares()) return stores_[s];
  const int k = static_cast<int>(shared_.size());
  if (s < k) return *shared_[s];
  if (s == k) return stores_[0];
  return *shared_low_;
}

size_t Segment::store_first(int s) const {
  if (!low_.empty() || !shares() || shared_start_.empty()) return 0;
  return shared_start_[std::min<size_t>(static_cast<size_t>(s), shared_.size())];
}

void Segment::rotate(float* x) const {
  if (q_.hadamard) kv::hadamard_rotate(x, head_dim_);
}

void Segment::append(const float* k, const float* v, int32_t position) {
  if (latent_) {
    lk_.append(k);
    lv_.append(v);
    pos_.push_back(position);
    return;
  }
  if (q_.hadamard) {
    float buf[512];
    std::vector<float> big;
    float* r = buf;
    if (head_dim_ > 512) {
      big.resize(head_dim_);
      r = big.data();
    }
    std::memcpy(r, k, head_dim_ * sizeof(float));
    kv::hadamard_rotate(r, head_dim_);
    stores_[0].append(r, v);
  } else {
    stores_[0].append(k, v);
  }
  if (!low_.empty() && pos_.size() % 64 == 0) {  // a new word of tier bits (the entry is high: 0)
    low_.push_back(0);
    low_rank_.push_back(static_cast<uint32_t>(tier_size(1)));
  }
  // A fork's positions start as an exact copy of the context's: grown by an eighth, not doubled.
  if (shares() && pos_.size() == pos_.capacity()) pos_.reserve(pos_.size() + pos_.size() / 8 + 16);
  pos_.push_back(position);
}

namespace {

// The largest |x| codec c (optionally under KIVI codes) keeps without an f16 or bf16 field of its
// own overflowing.
float codec_limit(KVCodec c, int kivi_bits) {
  constexpr float f16_max = 65504.0f;
  float lim = FLT_MAX;
  switch (c) {
    case KVCodec::F32: lim = FLT_MAX; break;
    case KVCodec::BF16: lim = 3.38953139e38f; break;  // 0x7f7f: larger values round to inf
    case KVCodec::F16: lim = f16_max; break;
    case KVCodec::Q8_0: lim = f16_max * 127.0f; break;
    case KVCodec::Q4_0: lim = f16_max * 8.0f; break;
    case KVCodec::Q2_1: lim = f16_max; break;
  }
  // KIVI's f16 zero point is a group's minimum.
  return kivi_bits > 0 ? std::min(lim, f16_max) : lim;
}

// Largest |x| of x[0, n), or +inf when one is not finite (NaN fails every comparison).
float row_max_abs(const float* x, int n) {
  float m = 0;
  for (int i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    m = a > m ? a : m;
    if (!(a <= FLT_MAX)) return INFINITY;
  }
  return m;
}

}  // namespace

const char* Segment::check_fit(const float* k, const float* v, float* largest) const {
  if (latent_) return nullptr;
  float mk;
  if (q_.hadamard) {
    std::vector<float> r(k, k + head_dim_);
    kv::hadamard_rotate(r.data(), head_dim_);
    mk = row_max_abs(r.data(), head_dim_);
  } else {
    mk = row_max_abs(k, head_dim_);
  }
  if (!(mk <= codec_limit(key_codec(), q_.kivi_bits))) {
    if (largest) *largest = mk;
    return "key";
  }
  const float mv = row_max_abs(v, head_dim_);
  if (!(mv <= codec_limit(value_codec(), q_.kivi_bits))) {
    if (largest) *largest = mv;
    return "value";
  }
  return nullptr;
}

void Segment::check_indices(const std::vector<int32_t>& idx, const char* what) const {
  for (size_t j = 0; j < idx.size(); ++j) {
    if (idx[j] < 0 || static_cast<size_t>(idx[j]) >= size() || (j > 0 && idx[j] <= idx[j - 1]))
      throw Error(fmt::format("Segment::{}: index {} at {} is out of range or not increasing (size {})", what, idx[j],
                              j, size()));
  }
}

void Segment::locate(size_t i, int& s, size_t& j) const {
  int t = 0;
  size_t ti = i;  // tier and index within the tier
  if (!low_.empty()) {
    const uint64_t w = low_[i / 64], below = w & ((uint64_t{1} << (i % 64)) - 1);
    const size_t low_before = low_rank_[i / 64] + static_cast<size_t>(__builtin_popcountll(below));
    t = static_cast<int>(w >> (i % 64) & 1);
    ti = t ? low_before : i - low_before;
  }
  if (!shares()) {
    s = t;
    j = ti;
    return;
  }
  const int k = static_cast<int>(shared_.size());
  const size_t n_shared = shared_start_.empty() ? 0 : shared_start_.back();
  if (t == 1) {
    s = k + 1;
    j = ti;
  } else if (ti >= n_shared) {
    s = k;
    j = ti - n_shared;
  } else {
    const size_t p = std::upper_bound(shared_start_.begin(), shared_start_.end(), ti) - shared_start_.begin() - 1;
    s = static_cast<int>(p);
    j = ti - shared_start_[p];
  }
}

void Segment::set_tiers(const std::vector<uint8_t>& low) {
  low_.assign((low.size() + 63) / 64, 0);
  low_rank_.assign(low_.size(), 0);
  uint32_t count = 0;
  for (size_t i = 0; i < low.size(); ++i) {
    if (i % 64 == 0) low_rank_[i / 64] = count;
    if (low[i]) {
      low_[i / 64] |= uint64_t{1} << (i % 64);
      ++count;
    }
  }
}

void Segment::drop_tiers() {
  std::vector<uint64_t>().swap(low_);
  std::vector<uint32_t>().swap(low_rank_);
}

void Segment::retain(const std::vector<int32_t>& idx) {
  check_indices(idx, "retain");
  if (shares() && idx.size() == size()) return;  // keeps every entry: nothing to copy
  unshare();  // other caches read the shared entries: this segment drops its own copy's
  if (latent_) {
    lk_.retain(idx);
    lv_.retain(idx);
  } else if (low_.empty()) {
    stores_[0].retain(idx);
  } else {
    std::vector<int32_t> per[2];
    std::vector<uint8_t> nt;
    nt.reserve(idx.size());
    for (int32_t i : idx) {
      int s;
      size_t j;
      locate(i, s, j);
      per[s].push_back(static_cast<int32_t>(j));
      nt.push_back(static_cast<uint8_t>(s));
    }
    stores_[0].retain(per[0]);
    stores_[1].retain(per[1]);
    if (stores_[1].size() == 0) {
      stores_.pop_back();
      drop_tiers();
    } else {
      set_tiers(nt);
    }
  }
  std::vector<int32_t> np(idx.size());
  for (size_t j = 0; j < idx.size(); ++j) np[j] = pos_[idx[j]];
  pos_.swap(np);
}

void Segment::retain_tiered(const std::vector<int32_t>& idx, const std::vector<uint8_t>& low, KVCodec low_key,
                            KVCodec low_value) {
  check_indices(idx, "retain_tiered");
  if (low.size() != idx.size())
    throw Error(fmt::format("Segment::retain_tiered: {} tier flags for {} indices", low.size(), idx.size()));
  const bool any_low = std::any_of(low.begin(), low.end(), [](uint8_t x) { return x != 0; });
  if (q_.kivi_bits && any_low)
    throw Error("precision tiers need row codecs (f32, f16, bf16, q8_0, q4_0, q2_1): KIVI's token groups cannot be "
                "split by tier");
  if (!any_low && low_.empty()) return retain(idx);
  if (latent_) throw Error("precision tiers need row codecs: a latent segment stores codes in its bases");
  unshare();
  const KVQuantOptions plain{};  // tiers hold row codecs only
  KVStore hi(head_dim_, stores_[0].key_codec(), stores_[0].value_codec(), plain);
  KVStore lo(head_dim_, low_key, low_value, plain);
  std::vector<uint8_t> nt;
  for (size_t j = 0; j < idx.size(); ++j) {
    int s;
    size_t si;
    locate(idx[j], s, si);
    nt.push_back(low[j] ? 1 : 0);
    (low[j] ? lo : hi).append_from(stores_[s], si);
  }
  stores_.clear();
  stores_.push_back(std::move(hi));
  if (lo.size() > 0) {
    stores_.push_back(std::move(lo));
    set_tiers(nt);
  } else {
    drop_tiers();
  }
  std::vector<int32_t> np(idx.size());
  for (size_t j = 0; j < idx.size(); ++j) np[j] = pos_[idx[j]];
  pos_.swap(np);
}

void Segment::clear() {
  shared_.clear();
  shared_low_.reset();
  shared_start_.clear();
  latent_ = false;
  lk_ = LatentCodes();
  lv_ = LatentCodes();
  stores_.erase(stores_.begin() + 1, stores_.end());
  stores_[0].clear();
  std::vector<int32_t>().swap(pos_);
  drop_tiers();
}

void Segment::key(size_t i, float* out) const {
  if (latent_) return lk_.decode(i, out);
  int s;
  size_t j;
  locate(i, s, j);
  store(s).key(j, out);
  rotate(out);  // the rotation is its own inverse
}

void Segment::value(size_t i, float* out) const {
  if (latent_) return lv_.decode(i, out);
  int s;
  size_t j;
  locate(i, s, j);
  store(s).value(j, out);
}

void Segment::keys(size_t b, size_t e, float* out) const {
  for (size_t i = b; i < e; ++i) key(i, out + (i - b) * head_dim_);
}

void Segment::values(size_t b, size_t e, float* out) const {
  if (b >= e) return;  // nothing to decode (`out` may be null)
  if (!latent_ && low_.empty() && !shares() && stores_[0].group_entries() <= b) {
    const KVStore& st = stores_[0];
    kv::rows_decode(st.vc_, head_dim_, st.v_.data() + (b - st.n_group_) * st.vrow_, out, e - b);
    return;
  }
  for (size_t i = b; i < e; ++i) value(i, out + (i - b) * head_dim_);
}

const float* Segment::values_f32() const {
  const KVStore& st = stores_[0];
  if (latent_ || shares() || stores_.size() > 1 || st.group_entries() > 0 || st.value_codec() != KVCodec::F32)
    return nullptr;
  return reinterpret_cast<const float*>(st.v_.data());
}

void Segment::set_key(size_t i, const float* k) { set_keys(i, i + 1, k); }

void Segment::set_keys(size_t b, size_t e, const float* rows) {
  if (b > e || e > size())
    throw Error(fmt::format("Segment::set_keys: range [{}, {}) is outside the segment (size {})", b, e, size()));
  if (latent_) {
    for (size_t i = b; i < e; ++i) lk_.set(i, rows + (i - b) * head_dim_);
    return;
  }
  // Keys in shared parts are other caches' too: re-encoding one needs this segment's own copy.
  for (size_t i = b; i < e && shares(); ++i) {
    int s;
    size_t j;
    locate(i, s, j);
    if (&store(s) != &stores_[0]) unshare();
  }
  std::vector<float> r;
  if (q_.hadamard) {
    r.assign(rows, rows + (e - b) * head_dim_);
    for (size_t i = 0; i < e - b; ++i) kv::hadamard_rotate(r.data() + i * head_dim_, head_dim_);
    rows = r.data();
  }
  // Still sharing: every key set is in the private tail, stores_[0], after the shared parts.
  const size_t n_shared = shares() && !shared_start_.empty() ? shared_start_.back() : 0;
  if (low_.empty()) return stores_[0].set_keys(b - n_shared, e - n_shared, rows);
  for (size_t i = b; i < e; ++i) {
    int s;
    size_t j;
    locate(i, s, j);
    (shares() ? stores_[0] : stores_[s]).set_keys(j, j + 1, rows + (i - b) * head_dim_);
  }
}

size_t Segment::kv_bytes() const {
  size_t n = lk_.bytes() + lv_.bytes();
  for (int s = 0; s < n_stores(); ++s) n += store(s).kv_bytes();
  return n;
}

size_t Segment::allocated_bytes() const {
  size_t n = sizeof(Segment) + pos_.capacity() * sizeof(int32_t) + low_.capacity() * sizeof(uint64_t) +
             low_rank_.capacity() * sizeof(uint32_t) + lk_.allocated_bytes() + lv_.allocated_bytes() +
             shared_.capacity() * sizeof(shared_[0]) + shared_start_.capacity() * sizeof(size_t);
  for (int s = 0; s < n_stores(); ++s) n += store(s).allocated_bytes();
  return n;
}

void Segment::shrink_to_fit() {
  pos_.shrink_to_fit();
  low_.shrink_to_fit();
  low_rank_.shrink_to_fit();
  lk_.shrink_to_fit();
  lv_.shrink_to_fit();
  for (KVStore& s : stores_) s.shrink_to_fit();
}

size_t Segment::bytes() const {
  size_t n = pos_.size() * sizeof(int32_t) + low_.size() * sizeof(uint64_t) + low_rank_.size() * sizeof(uint32_t) +
             lk_.bytes() + lv_.bytes();
  for (int s = 0; s < n_stores(); ++s) n += store(s).kv_bytes() + store(s).meta_bytes();
  return n;
}

void Segment::to_latent(std::shared_ptr<const LatentBasis> kb, int key_bits, std::shared_ptr<const LatentBasis> vb,
                        int value_bits, LatentScales scales) {
  for (const auto* b : {&kb, &vb}) {
    if (!*b) throw Error("Segment::to_latent: missing basis");
    if ((*b)->head_dim != head_dim_)
      throw Error(fmt::format("Segment::to_latent: basis head_dim {} differs from the segment's {}", (*b)->head_dim,
                              head_dim_));
  }
  LatentCodes nk(std::move(kb), key_bits, scales), nv(std::move(vb), value_bits, scales);
  std::vector<float> k(size() * head_dim_), v(size() * head_dim_);
  keys(0, size(), k.data());
  values(0, size(), v.data());
  nk.append_rows(k.data(), size());
  nv.append_rows(v.data(), size());
  lk_ = std::move(nk);
  lv_ = std::move(nv);
  latent_ = true;
  shared_.clear();  // the codes replace the entries: nothing is read from shared parts any more
  shared_low_.reset();
  shared_start_.clear();
  stores_.erase(stores_.begin() + 1, stores_.end());
  stores_[0].clear();
  drop_tiers();
}

std::vector<int32_t> Segment::store_entries(int s) const {
  std::vector<int32_t> out;
  if (low_.empty()) return out;
  out.reserve(store(s).size());
  if (!shares()) {
    for (size_t i = 0; i < size(); ++i)
      if (static_cast<int>(is_low(i)) == s) out.push_back(static_cast<int32_t>(i));
    return out;
  }
  for (size_t i = 0; i < size(); ++i) {
    int si;
    size_t j;
    locate(i, si, j);
    if (si == s) out.push_back(static_cast<int32_t>(i));
  }
  return out;
}

void Segment::share() {
  if (latent_) return;
  KVStore fixed = stores_[0].split_fixed();
  if (fixed.size() > 0) {
    if (shared_start_.empty()) shared_start_.push_back(0);
    shared_start_.push_back(shared_start_.back() + fixed.size());
    shared_.push_back(std::make_shared<const KVStore>(std::move(fixed)));
  }
  if (stores_.size() > 1) {
    // Appends never reach the low tier: all of it is shared.
    shared_low_ = std::make_shared<const KVStore>(std::move(stores_[1]));
    stores_.pop_back();
  }
  pos_.shrink_to_fit();
}

void Segment::unshare() {
  if (!shares()) return;
  std::vector<KVStore> own;
  if (shared_.empty()) {
    own.push_back(std::move(stores_[0]));
  } else {
    KVStore hi(*shared_[0]);
    for (size_t p = 1; p < shared_.size(); ++p) hi.append_store(*shared_[p]);
    hi.append_store(stores_[0]);
    hi.shrink_to_fit();  // the parts' sizes are final: no growth room beyond the next append's
    own.push_back(std::move(hi));
  }
  if (shared_low_) own.push_back(*shared_low_);
  stores_.swap(own);
  shared_.clear();
  shared_low_.reset();
  shared_start_.clear();
}

void Segment::shared_parts(std::vector<SharedEntries>& out) const {
  for (const auto& p : shared_) out.push_back({p.get(), p->kv_bytes(), p->allocated_bytes()});
  if (shared_low_) out.push_back({shared_low_.get(), shared_low_->kv_bytes(), shared_low_->allocated_bytes()});
}

// ---- KVCache ----

namespace {

// Each (layer, KV head) grows by reallocating its buffers. glibc raises its mmap threshold each
// time a mapped block is freed (up to 32 MiB), after which the next buffers come from the heap,
// where a freed one stays resident: measured +46% of the KV bytes in resident memory after 16K
// tokens of decode. A fixed threshold keeps every buffer of 256 KiB or more in its own mapping,
// handed back to the system when it is freed or shrunk by a press. Set once, for the process.
void fix_mmap_threshold() {
  static const bool done = [] { return mallopt(M_MMAP_THRESHOLD, 256 * 1024) == 1; }();
  (void)done;
}

}  // namespace

KVCache::KVCache(int n_layer, int n_head_kv, int head_dim, KVCodec kc, KVCodec vc, const KVQuantOptions& q)
    : n_layer_(n_layer), n_head_kv_(n_head_kv), head_dim_(head_dim) {
  fix_mmap_threshold();
  validate_cache_config(kc, vc, q, head_dim);
  segs_.reserve(static_cast<size_t>(n_layer) * n_head_kv);
  for (int i = 0; i < n_layer * n_head_kv; ++i) segs_.emplace_back(head_dim, kc, vc, q);
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
namespace {
// Adds the bytes of every basis of `s` (shared ones or the others) not yet in `seen`.
size_t new_basis_bytes(const Segment& s, std::vector<const LatentBasis*>& seen, bool shared = false) {
  size_t n = 0;
  if (!s.latent()) return 0;
  for (const LatentBasis* b : {&s.latent_keys().basis(), &s.latent_values().basis()}) {
    if (b->shared != shared || std::find(seen.begin(), seen.end(), b) != seen.end()) continue;
    seen.push_back(b);
    n += b->bytes();
  }
  return n;
}
}  // namespace

size_t KVCache::basis_bytes() const {
  std::vector<const LatentBasis*> seen;
  size_t n = 0;
  for (const Segment& s : segs_) n += new_basis_bytes(s, seen);
  return n;
}
size_t KVCache::shared_bytes() const {
  std::vector<const LatentBasis*> seen;
  size_t n = 0;
  for (const Segment& s : segs_) n += new_basis_bytes(s, seen, true);
  return n;
}
size_t KVCache::bytes() const {
  size_t n = basis_bytes();
  for (const Segment& s : segs_) n += s.bytes();
  return n;
}
size_t KVCache::allocated_bytes() const {
  size_t n = basis_bytes() + segs_.capacity() * sizeof(Segment) - segs_.size() * sizeof(Segment);
  for (const Segment& s : segs_) n += s.allocated_bytes();
  return n;
}
void KVCache::shrink_to_fit() {
  for (Segment& s : segs_) s.shrink_to_fit();
}
size_t KVCache::bytes(int layer) const {
  std::vector<const LatentBasis*> seen;
  size_t n = 0;
  for (int h = 0; h < n_head_kv_; ++h) n += seg(layer, h).bytes() + new_basis_bytes(seg(layer, h), seen);
  return n;
}
size_t KVCache::kv_bytes() const {
  size_t n = 0;
  for (const Segment& s : segs_) n += s.kv_bytes();
  return n;
}
size_t KVCache::full_f16_bytes(size_t n_tokens) const {
  return n_tokens * static_cast<size_t>(n_layer_) * n_head_kv_ * (head_dim_ * 2 * 2 + sizeof(int32_t));
}
int32_t KVCache::next_position() const {
  // The one "next position" of a cache (press code calls it through cache_next_position).
  // Positions increase within a segment (appends are causal; retain and key re-rotation keep the
  // order), so each segment's last entry holds its largest.
  int32_t p = 0;
  for (const Segment& s : segs_)
    if (!s.positions().empty()) p = std::max(p, s.positions().back() + 1);
  return p;
}
void KVCache::clear() {
  for (Segment& s : segs_) s.clear();
  source_.clear();
}

void KVCache::share() {
  for (Segment& s : segs_) s.share();
}

void KVCache::shared_parts(std::vector<SharedEntries>& out) const {
  for (const Segment& s : segs_) s.shared_parts(out);
}

namespace {
// One field of every shared part of `c`, summed.
size_t sum_shared(const KVCache& c, size_t SharedEntries::*field) {
  std::vector<SharedEntries> parts;
  c.shared_parts(parts);
  size_t n = 0;
  for (const SharedEntries& p : parts) n += p.*field;
  return n;
}
}  // namespace

size_t KVCache::shared_allocated_bytes() const { return sum_shared(*this, &SharedEntries::allocated_bytes); }

size_t KVCache::shared_kv_bytes() const { return sum_shared(*this, &SharedEntries::bytes); }

void KVCache::share_layer(int layer, int src) {
  if (!(src >= 0 && src < layer && layer < n_layer_))
    throw Error(fmt::format("KVCache::share_layer: layer {} cannot read layer {}'s entries (need 0 <= source < layer "
                            "< {} layers)",
                            layer, src, n_layer_));
  if (source_.empty()) {
    source_.resize(static_cast<size_t>(n_layer_));
    for (int l = 0; l < n_layer_; ++l) source_[static_cast<size_t>(l)] = l;
  }
  const int root = source_[static_cast<size_t>(src)];
  source_[static_cast<size_t>(layer)] = root;
  // Layers that read `layer` now read its root too (sharing is never chained).
  for (int l = layer + 1; l < n_layer_; ++l)
    if (source_[static_cast<size_t>(l)] == layer) source_[static_cast<size_t>(l)] = root;
  for (int h = 0; h < n_head_kv_; ++h) seg(layer, h).clear();
}

}  // namespace kvslim
