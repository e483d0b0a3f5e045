// Byte-exact cache storage: see serialize.h. The layout follows the in-memory one field by field
// (buffers with their SIMD slack included), so a cache read back is the same bytes as the one written.
#include "kv/serialize.h"

#include <algorithm>
#include <map>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "kv/codec.h"
#include "kv/store.h"
#include "kv/latent.h"

namespace kvslim::kv {

void ByteReader::fail(const std::string& what) const { throw Error(fmt::format("{}: {}", label_, what)); }

void ByteReader::need(size_t n, const char* field) const {
  if (n > n_ - at_)
    fail(fmt::format("truncated: {} bytes needed at offset {} reading {}, {} left", n, at_, field, n_ - at_));
}

uint64_t ByteReader::count(const char* field, size_t elem) {
  const uint64_t n = u64(field);
  if (n > left() / elem)
    fail(fmt::format("truncated: {} holds {} elements of {} bytes at offset {}, only {} bytes left", field, n, elem,
                     at_, left()));
  return n;
}

namespace {

constexpr int kMaxCodec = static_cast<int>(KVCodec::Q2_1);
constexpr uint64_t kMaxEntries = uint64_t{1} << 31;  // positions are int32

void write_buffer(ByteWriter& w, const ByteBuffer& b) {
  w.u64(b.size());
  w.raw(b.data(), b.size());
}

void read_buffer(ByteReader& r, ByteBuffer& b, size_t expected, const std::string& where, const char* field) {
  const uint64_t n = r.u64(field);
  if (n != expected) r.fail(fmt::format("{}: {} holds {} bytes, its entries need {}", where, field, n, expected));
  b.resize(n);
  r.raw(b.data(), n, field);
}

KVCodec read_codec(ByteReader& r, const char* field, const std::string& where) {
  const uint8_t c = r.u8(field);
  if (c > kMaxCodec) r.fail(fmt::format("{}: {} {} is not a KV codec", where, field, c));
  return static_cast<KVCodec>(c);
}

}  // namespace

void CacheIO::write(ByteWriter& w, const KVCache& cache) {
  w.u32(static_cast<uint32_t>(cache.n_layer_));
  w.u32(static_cast<uint32_t>(cache.n_head_kv_));
  w.u32(static_cast<uint32_t>(cache.head_dim_));
  const Segment& s0 = cache.segs_[0];
  w.u8(static_cast<uint8_t>(s0.stores_[0].key_codec()));
  w.u8(static_cast<uint8_t>(s0.stores_[0].value_codec()));
  w.i32(s0.q_.kivi_bits);
  w.i32(s0.q_.kivi_group);
  w.i32(s0.q_.kivi_residual);
  w.u8(s0.q_.hadamard ? 1 : 0);
  std::vector<int32_t> src(cache.source_.begin(), cache.source_.end());
  w.vec(src);
  // Latent bases, each once however many segments share it.
  std::map<const LatentBasis*, uint32_t> index;
  std::vector<const LatentBasis*> bases;
  for (const Segment& s : cache.segs_)
    if (s.latent_)
      for (const LatentCodes* c : {&s.lk_, &s.lv_})
        if (index.emplace(c->basis_.get(), static_cast<uint32_t>(bases.size())).second) bases.push_back(c->basis_.get());
  w.u32(static_cast<uint32_t>(bases.size()));
  for (const LatentBasis* b : bases) {
    w.i32(b->head_dim);
    w.vec(b->proj);
    w.vec(b->channels);
    w.vec(b->mean);
    w.vec(b->scale);
    w.u8(b->shared ? 1 : 0);
  }
  for (const Segment& seg : cache.segs_) {
    // A segment that reads shared parts is written as one that owns its entries (the same bytes).
    std::optional<Segment> own;
    if (seg.shares()) {
      own.emplace(seg);
      own->unshare();
    }
    const Segment& s = own ? *own : seg;
    w.vec(s.pos_);
    w.u8(s.latent_ ? 1 : 0);
    if (s.latent_) {
      for (const LatentCodes* c : {&s.lk_, &s.lv_}) {
        w.u32(index.at(c->basis_.get()));
        w.i32(c->bits_);
        w.u8(static_cast<uint8_t>(c->scales_));
        w.vec(c->center_);
        w.vec(c->step_);
        w.u64(c->n_);
        w.vec(c->data_);
      }
      continue;
    }
    w.u8(static_cast<uint8_t>(s.stores_.size()));
    for (const KVStore& st : s.stores_) {
      w.u8(static_cast<uint8_t>(st.kc_));
      w.u8(static_cast<uint8_t>(st.vc_));
      w.i32(st.bits_);
      w.i32(st.G_);
      w.i32(st.R_);
      w.u64(st.n_row_);
      write_buffer(w, st.kt_);
      write_buffer(w, st.v_);
      w.vec(st.serial_);
      w.u64(st.appended_);
      std::vector<int32_t> gn(st.gn_.begin(), st.gn_.end());
      w.vec(gn);
      w.vec(st.g_);
    }
    if (s.stores_.size() > 1) w.vec(s.low_);
  }
}

KVCache CacheIO::read(ByteReader& r, int n_layer, int n_head_kv, int head_dim, int32_t max_position) {
  const uint32_t L = r.u32("cache n_layer"), H = r.u32("cache n_head_kv"), D = r.u32("cache head_dim");
  if (L != static_cast<uint32_t>(n_layer) || H != static_cast<uint32_t>(n_head_kv) ||
      D != static_cast<uint32_t>(head_dim))
    r.fail(fmt::format("cache shape {} layers x {} KV heads x head_dim {} differs from the model's {} x {} x {}", L, H,
                       D, n_layer, n_head_kv, head_dim));
  // Every segment takes at least 10 bytes (position count, latent flag, tier count): a corrupt
  // shape cannot make the cache allocate more segments than the input could describe.
  if (static_cast<uint64_t>(n_layer) * static_cast<uint64_t>(n_head_kv) > r.left() / 10)
    r.fail(fmt::format("truncated: {} x {} segments cannot fit in the {} bytes left", n_layer, n_head_kv, r.left()));
  const KVCodec kc = read_codec(r, "cache key codec", "cache"), vc = read_codec(r, "cache value codec", "cache");
  KVQuantOptions q;
  q.kivi_bits = r.i32("cache kivi_bits");
  q.kivi_group = r.i32("cache kivi_group");
  q.kivi_residual = r.i32("cache kivi_residual");
  const uint8_t had = r.u8("cache hadamard");
  if (had > 1) r.fail(fmt::format("cache: hadamard flag {} is not 0 or 1", had));
  q.hadamard = had == 1;
  try {
    validate_cache_config(kc, vc, q, head_dim);
  } catch (const Error& e) {
    r.fail(fmt::format("cache configuration: {}", e.what()));
  }
  KVCache cache(n_layer, n_head_kv, head_dim, kc, vc, q);
  const std::vector<int32_t> src = r.vec<int32_t>("cache layer sources");
  if (!src.empty()) {
    if (src.size() != static_cast<size_t>(n_layer))
      r.fail(fmt::format("cache: {} layer sources for {} layers", src.size(), n_layer));
    for (int l = 0; l < n_layer; ++l)
      if (src[l] < 0 || src[l] > l || src[src[l]] != src[l])
        r.fail(fmt::format("cache: layer {} reads layer {}, which is not an earlier unshared layer", l, src[l]));
    cache.source_.assign(src.begin(), src.end());
  }
  const uint32_t n_bases = r.u32("latent basis count");
  if (n_bases > r.left()) r.fail(fmt::format("truncated: {} latent bases announced, {} bytes left", n_bases, r.left()));
  std::vector<std::shared_ptr<const LatentBasis>> bases;
  for (uint32_t i = 0; i < n_bases; ++i) {
    auto b = std::make_shared<LatentBasis>();
    b->head_dim = r.i32("latent basis head_dim");
    b->proj = r.vec<float>("latent basis projection");
    b->channels = r.vec<int32_t>("latent basis channels");
    b->mean = r.vec<float>("latent basis mean");
    b->scale = r.vec<float>("latent basis scale");
    const uint8_t shared = r.u8("latent basis shared flag");
    if (shared > 1) r.fail(fmt::format("latent basis {}: shared flag {} is not 0 or 1", i, shared));
    b->shared = shared == 1;
    if (b->head_dim != head_dim)
      r.fail(fmt::format("latent basis {}: head_dim {} differs from the model's {}", i, b->head_dim, head_dim));
    if (b->proj.empty() && b->channels.empty()) r.fail(fmt::format("latent basis {}: no projection and no channels", i));
    if (!b->proj.empty() && !b->channels.empty())
      r.fail(fmt::format("latent basis {}: both a projection and a channel selection", i));
    if (b->proj.size() % static_cast<size_t>(head_dim) != 0 || b->proj.size() / head_dim > static_cast<size_t>(head_dim) ||
        b->channels.size() > static_cast<size_t>(head_dim))
      r.fail(fmt::format("latent basis {}: rank larger than head_dim {} or a partial row", i, head_dim));
    try {
      b->validate();
    } catch (const Error& e) {
      r.fail(fmt::format("latent basis {}: {}", i, e.what()));
    }
    bases.push_back(std::move(b));
  }
  auto read_codes = [&](LatentCodes& c, const std::string& where) {
    const uint32_t bi = r.u32("latent basis index");
    if (bi >= bases.size()) r.fail(fmt::format("{}: latent basis {} of {}", where, bi, bases.size()));
    const int bits = r.i32("latent bits");
    const uint8_t sc = r.u8("latent scales");
    if (sc > 1) r.fail(fmt::format("{}: latent scales {} is not 0 (token) or 1 (channel)", where, sc));
    if (bits != 0 && bits != 2 && bits != 4 && bits != 8 && bits != 32)
      r.fail(fmt::format("{}: latent bits {} is not 0, 2, 4, 8 or 32", where, bits));
    c = LatentCodes(bases[bi], bits, static_cast<LatentScales>(sc));
    c.center_ = r.vec<float>("latent centers");
    c.step_ = r.vec<float>("latent steps");
    if (c.center_.size() != c.step_.size() ||
        (!c.center_.empty() && (!c.per_channel() || c.center_.size() != static_cast<size_t>(c.rank_))))
      r.fail(fmt::format("{}: {} latent centers and {} steps for rank {}", where, c.center_.size(), c.step_.size(),
                         c.rank_));
    const uint64_t n = r.u64("latent entry count");
    c.data_ = r.vec<uint8_t>("latent codes");
    if (n > kMaxEntries || c.data_.size() != n * c.row_)
      r.fail(fmt::format("{}: {} bytes of latent codes for {} entries of {} bytes", where, c.data_.size(), n, c.row_));
    c.n_ = n;
  };
  for (int l = 0; l < n_layer; ++l)
    for (int h = 0; h < n_head_kv; ++h) {
      const std::string where = fmt::format("segment (layer {}, KV head {})", l, h);
      Segment& s = cache.seg(l, h);
      s.pos_ = r.vec<int32_t>("entry positions");
      const size_t n = s.pos_.size();
      for (size_t i = 0; i < n; ++i)
        if (s.pos_[i] < 0 || s.pos_[i] >= max_position)
          r.fail(fmt::format("{}: entry {} at position {}, outside [0, {})", where, i, s.pos_[i], max_position));
      if (cache.source(l) != l && n)
        r.fail(fmt::format("{}: holds {} entries although layer {} reads layer {}'s", where, n, l, cache.source(l)));
      const uint8_t latent = r.u8("latent flag");
      if (latent > 1) r.fail(fmt::format("{}: latent flag {} is not 0 or 1", where, latent));
      if (latent) {
        s.latent_ = true;
        read_codes(s.lk_, where + " keys");
        read_codes(s.lv_, where + " values");
        if (s.lk_.size() != n || s.lv_.size() != n)
          r.fail(fmt::format("{}: {} key and {} value codes for {} entries", where, s.lk_.size(), s.lv_.size(), n));
        continue;
      }
      const uint8_t n_stores = r.u8("tier count");
      if (n_stores < 1 || n_stores > 2) r.fail(fmt::format("{}: {} precision tiers (1 or 2)", where, n_stores));
      s.stores_.clear();
      size_t total = 0;
      for (int t = 0; t < n_stores; ++t) {
        const std::string tw = fmt::format("{} tier {}", where, t);
        const KVCodec skc = read_codec(r, "tier key codec", tw), svc = read_codec(r, "tier value codec", tw);
        KVQuantOptions sq;
        sq.kivi_bits = r.i32("tier kivi_bits");
        sq.kivi_group = r.i32("tier kivi_group");
        sq.kivi_residual = r.i32("tier kivi_residual");
        try {
          validate_cache_config(skc, svc, sq, head_dim);
        } catch (const Error& e) {
          r.fail(fmt::format("{}: {}", tw, e.what()));
        }
        if (t == 0 && (skc != kc || svc != vc))
          r.fail(fmt::format("{}: codecs k={} v={} differ from the cache's k={} v={}", tw, codec_name(skc),
                             codec_name(svc), codec_name(kc), codec_name(vc)));
        if (sq.kivi_bits && (n_stores > 1 || sq.kivi_bits != q.kivi_bits || sq.kivi_group != q.kivi_group ||
                             sq.kivi_residual != q.kivi_residual))
          r.fail(fmt::format("{}: KIVI {} bits G={} R={} unlike the cache's", tw, sq.kivi_bits, sq.kivi_group,
                             sq.kivi_residual));
        KVStore st(head_dim, skc, svc, sq);
        const uint64_t n_row = r.u64("row entry count");
        if (n_row > kMaxEntries) r.fail(fmt::format("{}: {} row entries", tw, n_row));
        st.n_row_ = n_row;
        read_buffer(r, st.kt_, n_row ? (n_row + kKVTile - 1) / kKVTile * st.tile_bytes_ + KVStore::kPad : 0, tw,
                    "key tiles");
        read_buffer(r, st.v_, n_row ? n_row * st.vrow_ + KVStore::kPad : 0, tw, "value rows");
        st.serial_ = r.vec<uint32_t>("residual serial numbers");
        if (st.serial_.size() != (st.bits_ ? n_row : 0))
          r.fail(fmt::format("{}: {} residual serial numbers for {} row entries", tw, st.serial_.size(), n_row));
        st.appended_ = r.u64("appended count");
        const std::vector<int32_t> gn = r.vec<int32_t>("KIVI group sizes");
        if (!st.bits_ && !gn.empty()) r.fail(fmt::format("{}: KIVI groups without KIVI", tw));
        st.gn_.clear();
        st.gofs_.clear();
        size_t bytes = 0, in_groups = 0;
        for (int32_t m : gn) {
          if (m < 1 || m > st.G_) r.fail(fmt::format("{}: a KIVI group of {} tokens (G = {})", tw, m, st.G_));
          st.gofs_.push_back(bytes);
          st.gn_.push_back(m);
          bytes += st.group_bytes(m);
          in_groups += static_cast<size_t>(m);
        }
        st.g_ = r.vec<uint8_t>("KIVI group bytes");
        if (st.g_.size() != (bytes ? bytes + KVStore::kPad : 0))
          r.fail(fmt::format("{}: {} bytes of KIVI groups, their sizes need {}", tw, st.g_.size(), bytes));
        st.gbytes_ = bytes;
        st.n_group_ = in_groups;
        st.rebuild_group_starts();
        if (in_groups > kMaxEntries) r.fail(fmt::format("{}: {} entries in KIVI groups", tw, in_groups));
        total += st.size();
        s.stores_.push_back(std::move(st));
      }
      if (total != n) r.fail(fmt::format("{}: {} entries in its tiers for {} positions", where, total, n));
      if (n_stores > 1) {
        s.low_ = r.vec<uint64_t>("tier bits");
        if (s.low_.size() != (n + 63) / 64)
          r.fail(fmt::format("{}: {} words of tier bits for {} entries", where, s.low_.size(), n));
        if (n % 64 && (s.low_.back() >> (n % 64)) != 0) r.fail(fmt::format("{}: tier bits past the last entry", where));
        size_t low = 0;
        s.low_rank_.assign(s.low_.size(), 0);
        for (size_t w = 0; w < s.low_.size(); ++w) {
          s.low_rank_[w] = static_cast<uint32_t>(low);
          low += static_cast<size_t>(__builtin_popcountll(s.low_[w]));
        }
        if (low != s.stores_[1].size())
          r.fail(fmt::format("{}: {} entries marked low tier, the low tier holds {}", where, low, s.stores_[1].size()));
      }
    }
  return cache;
}

}  // namespace kvslim::kv
