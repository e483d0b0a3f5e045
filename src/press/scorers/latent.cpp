// Latent press: every (layer, KV head) stores its keys and values as codes in a low-rank basis
// (Palu, Chang et al., arXiv 2407.21118), the bases either computed per request from the
// context's own keys and values (xKV, Chang et al., arXiv 2503.18893: SVD of the prefill KV) or
// loaded from a calibration file (kvslim latent-calibrate). Keys are projected after RoPE, so
// attention absorbs the key basis into the query (kv/latent.h). Codes may be quantized (k_bits,
// v_bits), and any eviction press composes with it: "snapkv+latent" evicts, then projects what
// is left.
#include "press/scorers/latent.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "kernels/threads.h"
#include "kvslim/gguf.h"
#include "press/authoring.h"
#include "press/param_file.h"
#include "press/knobs.h"
#include "press/latent_share.h"

namespace kvslim {

void LatentBases::save(const std::string& path, const std::string& model_desc) const {
  GGUFWriter w;
  w.set("general.architecture", GGUFValue::str("kvslim-latent"));
  w.set("latent.base_model", GGUFValue::str(model_desc));
  w.set("latent.n_layer", GGUFValue::u32(n_layer));
  w.set("latent.n_head_kv", GGUFValue::u32(n_head_kv));
  w.set("latent.head_dim", GGUFValue::u32(head_dim));
  w.set("latent.key_bits", GGUFValue::i32_array(std::vector<int32_t>(key_bits.begin(), key_bits.end())));
  w.set("latent.value_bits", GGUFValue::i32_array(std::vector<int32_t>(value_bits.begin(), value_bits.end())));
  const size_t n = key.size();
  for (int side = 0; side < 2; ++side) {
    const auto& bases = side ? value : key;
    std::vector<int32_t> src(n);
    for (size_t i = 0; i < n; ++i) {
      src[i] = static_cast<int32_t>(i);
      for (size_t j = 0; j < i; ++j)
        if (bases[j] == bases[i]) {
          src[i] = static_cast<int32_t>(j);
          break;
        }
    }
    w.set(side ? "latent.value_source" : "latent.key_source", GGUFValue::i32_array(src));
    for (size_t i = 0; i < n; ++i) {
      if (src[i] != static_cast<int32_t>(i)) continue;
      const LatentBasis& b = *bases[i];
      if (b.is_selection()) throw Error("latent bases: a channel selection cannot be saved (dense bases only)");
      const std::string pre = fmt::format("latent.{}.{}.{}.", i / n_head_kv, i % n_head_kv, side ? "v" : "k");
      w.add_tensor_f32(pre + "proj", GGMLType::F32, {head_dim, b.rank()}, b.proj);
      w.add_tensor_f32(pre + "mean", GGMLType::F32, {head_dim}, b.mean);
      w.add_tensor_f32(pre + "scale", GGMLType::F32, {b.rank()}, b.scale);
    }
  }
  w.write(path);
}

LatentBases LatentBases::load(const std::string& path) {
  auto f = GGUFFile::open(path);
  if (f->get_string("general.architecture") != "kvslim-latent")
    throw Error(fmt::format("{}: general.architecture '{}' is not kvslim-latent", path,
                            f->get_string("general.architecture")));
  LatentBases L;
  L.n_layer = static_cast<int>(f->get_int("latent.n_layer"));
  L.n_head_kv = static_cast<int>(f->get_int("latent.n_head_kv"));
  L.head_dim = static_cast<int>(f->get_int("latent.head_dim"));
  if (L.n_layer < 1 || L.n_head_kv < 1 || L.head_dim < 1 || L.head_dim > 4096 || L.n_layer > 4096 ||
      L.n_head_kv > 4096)
    throw Error(fmt::format("{}: bad latent shape (n_layer {}, n_head_kv {}, head_dim {})", path, L.n_layer,
                            L.n_head_kv, L.head_dim));
  const size_t n = static_cast<size_t>(L.n_layer) * L.n_head_kv;
  for (int side = 0; side < 2; ++side) {
    const std::string bits_key = side ? "latent.value_bits" : "latent.key_bits";
    const std::string src_key = side ? "latent.value_source" : "latent.key_source";
    std::vector<int32_t> bits = f->get_int_array(bits_key), src = f->get_int_array(src_key);
    if (bits.size() != n || src.size() != n)
      throw Error(fmt::format("{}: {} / {} must hold {} entries (layers x KV heads)", path, bits_key, src_key, n));
    auto& bases = side ? L.value : L.key;
    bases.resize(n);
    for (size_t i = 0; i < n; ++i) {
      if (bits[i] != 0 && bits[i] != 2 && bits[i] != 4 && bits[i] != 8 && bits[i] != 32)
        throw Error(fmt::format("{}: {}[{}] = {} is not 0, 2, 4, 8 or 32", path, bits_key, i, bits[i]));
      if (src[i] < 0 || static_cast<size_t>(src[i]) > i)
        throw Error(fmt::format("{}: {}[{}] = {} must name this or an earlier segment", path, src_key, i, src[i]));
      if (static_cast<size_t>(src[i]) < i) {
        bases[i] = bases[src[i]];
        continue;
      }
      const std::string pre = fmt::format("latent.{}.{}.{}.", i / L.n_head_kv, i % L.n_head_kv, side ? "v" : "k");
      auto b = std::make_shared<LatentBasis>();
      b->head_dim = L.head_dim;
      const TensorInfo& tp = f->tensor(pre + "proj");
      if (tp.ne.size() != 2 || tp.ne[0] != L.head_dim)
        throw Error(fmt::format("{}: tensor {} must be [head_dim {}, rank]", path, pre + "proj", L.head_dim));
      b->proj = f->tensor_f32(tp);
      b->mean = f->tensor_f32(f->tensor(pre + "mean"));
      b->scale = f->tensor_f32(f->tensor(pre + "scale"));
      b->shared = true;
      try {
        b->validate();
      } catch (const Error& e) {
        throw Error(fmt::format("{}: {}: {}", path, pre + "*", e.what()));
      }
      bases[i] = std::move(b);
    }
    (side ? L.value_bits : L.key_bits).assign(bits.begin(), bits.end());
  }
  return L;
}

std::shared_ptr<const LatentBases> LatentBases::load_shared(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  const auto mtime = ec ? fs::file_time_type{} : fs::last_write_time(path, ec);
  const std::string key = fmt::format("{}\n{}\n{}", path, ec ? 0 : size, mtime.time_since_epoch().count());
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<const LatentBases>> loaded;
  std::lock_guard<std::mutex> lock(mu);
  if (auto p = loaded[key].lock()) return p;
  auto p = std::make_shared<const LatentBases>(load(path));
  loaded[key] = p;
  return p;
}

void LatentBases::check(const HParams& hp, const std::string& what) const {
  if (n_layer != hp.n_layer || n_head_kv != hp.n_head_kv || head_dim != hp.head_dim)
    throw Error(fmt::format("{}: bases for {} layers, {} KV heads, head_dim {} do not fit the model ({} layers, {} KV "
                            "heads, head_dim {})",
                            what, n_layer, n_head_kv, head_dim, hp.n_layer, hp.n_head_kv, hp.head_dim));
}

namespace {

// "8" or "8/4/2" (candidates for the auto-budget).
std::string bits_text(const std::vector<int>& b) {
  std::string s;
  for (int v : b) s += (s.empty() ? "" : "/") + std::to_string(v);
  return s;
}

// Throws naming the parameter when `v` is not among the spec's candidates `list`.
void check_listed(const char* name, int v, const std::vector<int>& list) {
  if (std::find(list.begin(), list.end(), v) == list.end())
    throw Error(fmt::format("press latent: {} {} is not among {}={}", name, v, name, bits_text(list)));
}

class LatentPress : public PressImpl, public KnobControl {
 public:
  LatentPress(std::vector<int> k_ranks, std::vector<int> v_ranks, double energy, std::vector<int> k_bits,
              std::vector<int> v_bits, LatentScales scales, std::string file, double share, int share_max,
              bool per_layer)
      : k_ranks_(std::move(k_ranks)), v_ranks_(std::move(v_ranks)),
        k_rank_(*std::max_element(k_ranks_.begin(), k_ranks_.end())),
        v_rank_(*std::max_element(v_ranks_.begin(), v_ranks_.end())), energy_(energy), k_choices_(std::move(k_bits)),
        v_choices_(std::move(v_bits)), scales_(scales), file_(std::move(file)), share_(share), share_max_(share_max),
        per_layer_(per_layer) {
    if (!file_.empty()) bases_ = LatentBases::load_shared(file_);
  }
  KnobControl* knobs() override { return this; }
  std::string describe() const override {
    const char* sc = scales_ == LatentScales::Channel ? "channel" : "token";
    if (!file_.empty()) {
      std::string d = fmt::format("latent:file={},scales={}", file_, sc);
      if (!file_key_bits()) d += fmt::format(",k_bits={}", bits_text(k_choices_));
      if (!file_value_bits()) d += fmt::format(",v_bits={}", bits_text(v_choices_));
      if (per_layer_) d += ",per_layer=1";
      return d;
    }
    std::string d = fmt::format("latent:k_rank={},v_rank={},energy={},k_bits={},v_bits={},scales={}",
                                bits_text(k_ranks_), bits_text(v_ranks_), energy_, bits_text(k_choices_),
                                bits_text(v_choices_), sc);
    if (share_ >= 0.0) d += fmt::format(",share={},share_max={}", share_, share_max_);
    if (per_layer_) d += ",per_layer=1";
    return d;
  }
  std::string report() const override {
    if (!k_layer_.empty()) {
      auto list = [](const std::vector<int>& b) {
        std::string t;
        for (int v : b) t += (t.empty() ? "" : ",") + std::to_string(v);
        return t;
      };
      std::string r = fmt::format("latent code bits chosen per layer: keys {}, values {} (of k_bits={}, v_bits={})",
                                  list(k_layer_), list(v_layer_), bits_text(k_choices_), bits_text(v_choices_));
      if (!kr_layer_.empty())
        r += fmt::format("; ranks per layer: keys {}, values {} (of k_rank={}, v_rank={})", list(kr_layer_),
                         list(vr_layer_), bits_text(k_ranks_), bits_text(v_ranks_));
      return r;
    }
    if (k_set_ < 0) return {};
    return fmt::format("latent code bits chosen: keys {}, values {} (of k_bits={}, v_bits={})", k_set_, v_set_,
                       bits_text(k_choices_), bits_text(v_choices_));
  }
  // Dimensions, not entries: the entry count is unchanged.
  double ratio() const override { return 0.0; }
  size_t kept_after(const Target& t) const override { return t.n_context; }
  void reset() override { clear_knobs(); }

  // Knobs: 0 key code bits, 1 value code bits (tried in combination), 2 key rank, 3 value rank
  // (lowered per layer only, from the largest listed). f16 codes (bits 0) are 16 bits wide.
  std::vector<Knob> knob_list() const override {
    auto bit_widths = [](const std::vector<int>& b) {
      std::vector<int> w;
      for (int v : b) w.push_back(v == 0 ? 16 : v);
      return w;
    };
    return {{"k_bits", k_choices_, bit_widths(k_choices_), true},
            {"v_bits", v_choices_, bit_widths(v_choices_), true},
            {"k_rank", k_ranks_, k_ranks_, false},
            {"v_rank", v_ranks_, v_ranks_, false}};
  }
  bool knobs_per_layer() const override { return per_layer_; }
  void set_knobs(const std::vector<int>& v) override {
    if (v.size() != 4)
      throw Error(fmt::format("press latent: a setting needs 4 values (k_bits, v_bits, k_rank, v_rank), got {}", v.size()));
    check_setting(v[0], v[1], v[2], v[3]);
    clear_knobs();
    k_set_ = v[0];
    v_set_ = v[1];
    // One setting for every layer keeps the largest ranks (ranks are chosen per layer only).
  }
  void set_knobs_per_layer(const std::vector<std::vector<int>>& s) override {
    const size_t L = s.size() == 4 ? s[0].size() : 0;
    if (L == 0 || s[1].size() != L || s[2].size() != L || s[3].size() != L)
      throw Error(fmt::format("press latent: per-layer settings need one key and one value width and rank per layer "
                              "(got {} knobs)",
                              s.size()));
    for (size_t l = 0; l < L; ++l) check_setting(s[0][l], s[1][l], s[2][l], s[3][l]);
    clear_knobs();
    k_set_ = s[0].back();
    v_set_ = s[1].back();
    k_layer_ = s[0];
    v_layer_ = s[1];
    // Ranks per layer only when the spec lists several (otherwise every layer has the one rank).
    if (k_ranks_.size() > 1 || v_ranks_.size() > 1) {
      kr_layer_ = s[2];
      vr_layer_ = s[3];
    }
  }
  // Each value must be one the spec lists.
  void check_setting(int key_bits, int value_bits, int key_rank, int value_rank) const {
    check_listed("k_bits", key_bits, k_choices_);
    check_listed("v_bits", value_bits, v_choices_);
    check_listed("k_rank", key_rank, k_ranks_);
    check_listed("v_rank", value_rank, v_ranks_);
  }
  void clear_knobs() override {
    k_set_ = v_set_ = -1;
    k_layer_.clear();
    v_layer_.clear();
    kr_layer_.clear();
    vr_layer_.clear();
  }

  void apply(KVCache& cache, const Model& model, const Observation&, const Target&) override {
    const int L = cache.n_layer(), H = cache.n_head_kv(), hd = cache.head_dim();
    if (bases_) bases_->check(model.hparams(), "press latent: " + file_);
    if (k_set_ < 0 && (k_choices_.size() > 1 || v_choices_.size() > 1)) {
      std::string listed;
      if (k_choices_.size() > 1) listed = "k_bits=" + bits_text(k_choices_);
      if (v_choices_.size() > 1) listed += (listed.empty() ? "" : ", ") + ("v_bits=" + bits_text(v_choices_));
      throw Error(fmt::format("press latent: {} lists candidates for the auto-budget (--target-kl); without it give "
                              "one value each",
                              listed));
    }
    if (k_set_ < 0 && (k_ranks_.size() > 1 || v_ranks_.size() > 1))
      throw Error(fmt::format("press latent: k_rank={} / v_rank={} list candidates for the auto-budget's per-layer "
                              "search (per_layer=1 with target_kl); without it give one value each",
                              bits_text(k_ranks_), bits_text(v_ranks_)));
    // A rank above head_dim would be cut to head_dim by the PCA while the press and its report
    // still named the larger one.
    if (!bases_ && (k_rank_ > hd || v_rank_ > hd))
      throw Error(fmt::format("press latent: k_rank={} / v_rank={} must be at most the model's head_dim {}",
                              bits_text(k_ranks_), bits_text(v_ranks_), hd));
    if (!k_layer_.empty() && k_layer_.size() != static_cast<size_t>(L))
      throw Error(fmt::format("press latent: bits for {} layers set, the cache has {}", k_layer_.size(), L));
    // Bits of this compression: the auto-budget's choice (per layer, or one pair), else the spec's
    // one value (or the file's).
    std::vector<int> kb(L, k_set_ >= 0 ? k_set_ : k_choices_[0]), vb(L, v_set_ >= 0 ? v_set_ : v_choices_[0]);
    if (!k_layer_.empty()) {
      kb = k_layer_;
      vb = v_layer_;
    }
    std::vector<int> kr(L, k_rank_), vr(L, v_rank_);  // per-request bases' ranks
    if (!kr_layer_.empty()) {
      if (kr_layer_.size() != static_cast<size_t>(L))
        throw Error(fmt::format("press latent: ranks for {} layers set, the cache has {}", kr_layer_.size(), L));
      kr = kr_layer_;
      vr = vr_layer_;
    }
    // With a file, a side whose bits the spec leaves at the default 0 keeps the file's bits per
    // segment; bits given in the spec (one value, or the auto-budget's choice among candidates)
    // replace them.
    const bool file_k = file_key_bits(), file_v = file_value_bits();
    if (!bases_ && share_ >= 0.0) apply_shared(cache, kb, vb, kr, vr);
    parallel_for(static_cast<int64_t>(L) * H, [&](int64_t b, int64_t e) {
      std::vector<float> ks, vs;
      for (int64_t u = b; u < e; ++u) {
        const int l = static_cast<int>(u / H);
        Segment& seg = cache.seg(l, static_cast<int>(u % H));
        // With chunked prefill the first chunk fixes the bases; later entries are encoded in them.
        if (seg.size() == 0 || seg.latent()) continue;
        if (bases_) {
          seg.to_latent(bases_->key[u], file_k ? bases_->key_bits[u] : kb[l], bases_->value[u],
                        file_v ? bases_->value_bits[u] : vb[l], scales_);
          continue;
        }
        const size_t n = seg.size();
        ks.resize(n * hd);
        vs.resize(n * hd);
        seg.keys(0, n, ks.data());
        seg.values(0, n, vs.data());
        seg.to_latent(pca_basis(ks.data(), n, hd, kr[l], energy_), kb[l], pca_basis(vs.data(), n, hd, vr[l], energy_),
                      vb[l], scales_);
      }
    });
  }

 private:
  // k_bits / v_bits left at the default single 0: with a file, that side's bits are the file's.
  bool file_key_bits() const { return k_choices_.size() == 1 && k_choices_[0] == 0; }
  bool file_value_bits() const { return v_choices_.size() == 1 && v_choices_[0] == 0; }

  // Per-request bases shared across adjacent layers (latent_share.h), per KV head: the layers'
  // keys (and values) are grouped by measured similarity and each group gets one pooled basis,
  // which KVCache::bytes() counts once. Heads whose segments are not all fresh (non-empty, not
  // yet latent) are left to the per-segment path.
  void apply_shared(KVCache& cache, const std::vector<int>& kb, const std::vector<int>& vb, const std::vector<int>& krank,
                    const std::vector<int>& vrank) const {
    const int L = cache.n_layer(), H = cache.n_head_kv(), hd = cache.head_dim();
    parallel_for(H, [&](int64_t b, int64_t e) {
      for (int64_t h = b; h < e; ++h) {
        bool fresh = true;
        for (int l = 0; l < L && fresh; ++l) fresh = cache.seg(l, h).size() > 0 && !cache.seg(l, h).latent();
        if (!fresh) continue;
        std::vector<std::vector<float>> ks(L), vs(L);
        std::vector<LayerRows> kr(L), vr(L);
        for (int l = 0; l < L; ++l) {
          const Segment& seg = cache.seg(l, static_cast<int>(h));
          const size_t n = seg.size();
          ks[l].resize(n * hd);
          vs[l].resize(n * hd);
          seg.keys(0, n, ks[l].data());
          seg.values(0, n, vs[l].data());
          kr[l] = {ks[l].data(), n};
          vr[l] = {vs[l].data(), n};
        }
        const LatentShare sk = share_adjacent_layers(kr, hd, krank, energy_, share_, share_max_);
        const LatentShare sv = share_adjacent_layers(vr, hd, vrank, energy_, share_, share_max_);
        for (int l = 0; l < L; ++l)
          cache.seg(l, static_cast<int>(h)).to_latent(sk.basis[l], kb[l], sv.basis[l], vb[l], scales_);
      }
    });
  }

  std::vector<int> k_ranks_, v_ranks_;  ///< the spec's k_rank / v_rank (candidates when several)
  int k_rank_, v_rank_;                   ///< the largest of each (used unless set per layer)
  double energy_;
  std::vector<int> k_choices_, v_choices_;  ///< the spec's k_bits / v_bits (candidates when several)
  int k_set_ = -1, v_set_ = -1;              ///< bits set by the auto-budget (-1: none)
  std::vector<int> k_layer_, v_layer_;       ///< per-layer bits set by the auto-budget (empty: none)
  std::vector<int> kr_layer_, vr_layer_;     ///< per-layer ranks set by the auto-budget (empty: the largest)
  LatentScales scales_;
  std::string file_;
  double share_;
  int share_max_;
  bool per_layer_;  ///< per_layer=1: the auto-budget may choose bits per layer
  std::shared_ptr<const LatentBases> bases_;
};

// A spec value that is one integer or distinct integers separated by '/' (candidates for the
// auto-budget). accept(v, several) says whether v may appear (several: the value lists more than one);
// any other value is an error naming key=value, followed by `expected`.
template <class Accept>
std::vector<int> slash_list(const PressParams& p, const std::string& key, Accept accept, const char* expected) {
  const std::string s = param_str(p, "latent", key);
  std::vector<int> out;
  size_t b = 0;
  for (;;) {
    const size_t e = s.find('/', b);
    const std::string tok = s.substr(b, e == std::string::npos ? std::string::npos : e - b);
    int v = -1;
    const auto r = std::from_chars(tok.data(), tok.data() + tok.size(), v);
    const bool several = e != std::string::npos || !out.empty();
    const bool ok = !tok.empty() && r.ec == std::errc() && r.ptr == tok.data() + tok.size() && accept(v, several) &&
                    std::find(out.begin(), out.end(), v) == out.end();
    if (!ok) throw Error(fmt::format("press latent: {}={} must be {}", key, s, expected));
    out.push_back(v);
    if (e == std::string::npos) return out;
    b = e + 1;
  }
}

// k_bits / v_bits: one value, or distinct candidates separated by '/' for the auto-budget.
std::vector<int> checked_bits(const PressParams& p, const std::string& key) {
  return slash_list(
      p, key, [](int v, bool) { return v == 0 || v == 2 || v == 4 || v == 8 || v == 32; },
      "0 (f16 codes), 2, 4, 8 or 32 (f32 codes), or distinct such values separated by '/' for the auto-budget to "
      "choose from (e.g. 8/4)");
}

// k_rank / v_rank: one value >= 0 (0: by energy), or distinct candidates > 0 separated by '/' for
// the auto-budget's per-layer search.
std::vector<int> checked_ranks(const PressParams& p, const std::string& key) {
  return slash_list(
      p, key, [](int v, bool several) { return several ? v > 0 : v >= 0; },
      "a rank >= 0 (0: chosen by energy), or distinct ranks > 0 separated by '/' for the auto-budget's per-layer "
      "search (e.g. 8/6/4)");
}

PressRegistrar reg([] {
  PressInfo i;
  i.name = "latent";
  i.summary = "stores keys (after RoPE) and values as low-rank codes per (layer, KV head): bases from the context's "
              "own PCA (rank by k_rank/v_rank, or by the kept variance `energy` when 0, or candidates like 8/6/4 chosen per layer with per_layer=1) or from a calibration file; "
              "codes in f16 (bits 0), 2/4/8-bit or f32 (32), or candidates like k_bits=8/4 that the auto-budget "
              "(--target-kl) chooses from per request (per layer with per_layer=1); quantized codes scaled per channel (fitted on the "
              "context) or per token (`scales`); `share`=TOL: adjacent layers whose pooled basis keeps within TOL of "
              "the variance their own keeps share one basis, counted once (xKV)";
  i.source = "Chang et al. 2024, Palu: Compressing KV-Cache with Low-Rank Projection, arXiv 2407.21118; xKV "
             "(cross-layer bases), arXiv 2503.18893";
  i.params = {{"k_rank", "0"}, {"v_rank", "0"}, {"energy", "0.99"}, {"k_bits", "0"}, {"v_bits", "0"},
              {"scales", "channel"}, {"file", ""}, {"share", "off"}, {"share_max", "0"}, {"per_layer", "0"}};
  i.make = [](const PressParams& p) -> std::unique_ptr<PressImpl> {
    std::vector<int> kranks = checked_ranks(p, "k_rank"), vranks = checked_ranks(p, "v_rank");
    const int kr = kranks[0], vr = vranks[0];
    const double en = param_double(p, "latent", "energy");
    if ((kr == 0 || vr == 0) && !(en > 0.0 && en < 1.0))
      throw Error(fmt::format("press latent: energy={} must be in (0, 1) when a rank is 0 (chosen by energy)", en));
    const std::string sc = param_str(p, "latent", "scales");
    if (sc != "channel" && sc != "token")
      throw Error(fmt::format("press latent: scales={} must be channel or token", sc));
    // share: off, or the tolerance (a fraction of variance, >= 0) within which adjacent layers share
    // one per-request basis (latent_share.h); share_max: layers per group at most (0 = any).
    const std::string sh = param_str(p, "latent", "share");
    double share = -1.0;
    if (sh != "off") {
      share = param_double(p, "latent", "share");
      if (!(share >= 0.0 && share <= 1.0))
        throw Error(fmt::format("press latent: share={} must be off or a tolerance in [0, 1]", sh));
    }
    const int share_max = param_int(p, "latent", "share_max");
    if (share_max < 0) throw Error(fmt::format("press latent: share_max={} must be >= 0", share_max));
    // per_layer=1: with candidate bits, the auto-budget lowers single layers' bits after choosing
    // one pair for all (run/auto_budget.cpp).
    const int per_layer = param_int(p, "latent", "per_layer");
    std::vector<int> kbits = checked_bits(p, "k_bits"), vbits = checked_bits(p, "v_bits");
    if (per_layer != 0 && per_layer != 1)
      throw Error(fmt::format("press latent: per_layer={} must be 0 or 1", per_layer));
    const bool rank_candidates = kranks.size() > 1 || vranks.size() > 1;
    if (per_layer == 1 && kbits.size() < 2 && vbits.size() < 2 && !rank_candidates)
      throw Error("press latent: per_layer=1 chooses among candidate bits or ranks: list several in k_bits, v_bits, "
                  "k_rank or v_rank (e.g. k_bits=8/4)");
    if (rank_candidates && per_layer != 1)
      throw Error("press latent: k_rank / v_rank candidates (with '/') are chosen only per layer: add per_layer=1");
    // A file's bases fix the ranks and the sharing (latent-calibrate --k-rank / --energy / --share):
    // the per-request bases' parameters would be ignored, so they are errors, not silently dropped
    // (rank candidates included: each is > 0).
    const std::string file = param_file(p, "latent", "file");
    if (!file.empty()) {
      if (kr != 0 || vr != 0)
        throw Error(fmt::format("press latent: k_rank={} / v_rank={} apply to per-request bases; a file's bases fix "
                                "the ranks (latent-calibrate --k-rank / --v-rank)",
                                param_str(p, "latent", "k_rank"), param_str(p, "latent", "v_rank")));
      if (param_str(p, "latent", "energy") != "0.99")
        throw Error(fmt::format("press latent: energy={} applies to per-request bases; a file's bases fix the ranks "
                                "(latent-calibrate --energy)",
                                param_str(p, "latent", "energy")));
      if (share >= 0.0 || share_max != 0)
        throw Error("press latent: share / share_max apply to per-request bases; a file's bases are shared across "
                    "layers at calibration (latent-calibrate --share)");
    }
    return std::make_unique<LatentPress>(std::move(kranks), std::move(vranks), en, std::move(kbits), std::move(vbits),
                                         sc == "channel" ? LatentScales::Channel : LatentScales::Token,
                                         file, share, share_max, per_layer == 1);
  };
  return i;
}());

}  // namespace

}  // namespace kvslim
