// Latent press: every (layer, KV head) stores its keys and values as codes in a low-rank basis
// (Palu, Chang et al., arXiv 2407.21118), the bases either computed per request from the
// context's own keys and values (xKV, Chang et al., arXiv 2503.18893: SVD of the prefill KV) or
// loaded from a calibration file (kvslim latent-calibrate). Keys are projected after RoPE, so
// attention absorbs the key basis into the query (kv_latent.h). Codes may be quantized (k_bits,
// v_bits), and any eviction press composes with it: "snapkv+latent" evicts, then projects what
// is left.
#include "press/latent.h"

#include <filesystem>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "kernels/threads.h"
#include "kvslim/gguf.h"
#include "press/authoring.h"
#include "press/param_file.h"
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

class LatentPress : public Press {
 public:
  LatentPress(int k_rank, int v_rank, double energy, int k_bits, int v_bits, LatentScales scales, std::string file,
              double share, int share_max)
      : k_rank_(k_rank), v_rank_(v_rank), energy_(energy), k_bits_(k_bits), v_bits_(v_bits), scales_(scales),
        file_(std::move(file)), share_(share), share_max_(share_max) {
    if (!file_.empty()) bases_ = LatentBases::load_shared(file_);
  }
  std::string describe() const override {
    const char* sc = scales_ == LatentScales::Channel ? "channel" : "token";
    if (!file_.empty()) return fmt::format("latent:file={},scales={}", file_, sc);
    std::string d = fmt::format("latent:k_rank={},v_rank={},energy={},k_bits={},v_bits={},scales={}", k_rank_,
                                v_rank_, energy_, k_bits_, v_bits_, sc);
    if (share_ >= 0.0) d += fmt::format(",share={},share_max={}", share_, share_max_);
    return d;
  }
  // Dimensions, not entries: the entry count is unchanged.
  double ratio() const override { return 0.0; }
  size_t kept_after(const Target& t) const override { return t.n_context; }

  void apply(KVCache& cache, const Model& model, const Observation&, const Target&) override {
    const int L = cache.n_layer(), H = cache.n_head_kv(), hd = cache.head_dim();
    if (bases_) bases_->check(model.hparams(), "press latent: " + file_);
    if (!bases_ && share_ >= 0.0) apply_shared(cache);
    parallel_for(static_cast<int64_t>(L) * H, [&](int64_t b, int64_t e) {
      std::vector<float> ks, vs;
      for (int64_t u = b; u < e; ++u) {
        Segment& seg = cache.seg(static_cast<int>(u / H), static_cast<int>(u % H));
        // With chunked prefill the first chunk fixes the bases; later entries are encoded in them.
        if (seg.size() == 0 || seg.latent()) continue;
        if (bases_) {
          seg.to_latent(bases_->key[u], bases_->key_bits[u], bases_->value[u], bases_->value_bits[u], scales_);
          continue;
        }
        const size_t n = seg.size();
        ks.resize(n * hd);
        vs.resize(n * hd);
        seg.keys(0, n, ks.data());
        seg.values(0, n, vs.data());
        seg.to_latent(pca_basis(ks.data(), n, hd, k_rank_, energy_), k_bits_, pca_basis(vs.data(), n, hd, v_rank_, energy_),
                      v_bits_, scales_);
      }
    });
  }

 private:
  // Per-request bases shared across adjacent layers (latent_share.h), per KV head: the layers'
  // keys (and values) are grouped by measured similarity and each group gets one pooled basis,
  // which KVCache::bytes() counts once. Heads whose segments are not all fresh (non-empty, not
  // yet latent) are left to the per-segment path.
  void apply_shared(KVCache& cache) const {
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
        const LatentShare sk = share_adjacent_layers(kr, hd, std::vector<int>(L, k_rank_), energy_, share_, share_max_);
        const LatentShare sv = share_adjacent_layers(vr, hd, std::vector<int>(L, v_rank_), energy_, share_, share_max_);
        for (int l = 0; l < L; ++l)
          cache.seg(l, static_cast<int>(h)).to_latent(sk.basis[l], k_bits_, sv.basis[l], v_bits_, scales_);
      }
    });
  }

  int k_rank_, v_rank_;
  double energy_;
  int k_bits_, v_bits_;
  LatentScales scales_;
  std::string file_;
  double share_;
  int share_max_;
  std::shared_ptr<const LatentBases> bases_;
};

int checked_bits(const PressParams& p, const std::string& key) {
  const int b = param_int(p, "latent", key);
  if (b != 0 && b != 2 && b != 4 && b != 8 && b != 32)
    throw Error(fmt::format("press latent: {}={} must be 0 (f16 codes), 2, 4, 8 or 32 (f32 codes)", key, b));
  return b;
}

PressRegistrar reg([] {
  PressInfo i;
  i.name = "latent";
  i.summary = "stores keys (after RoPE) and values as low-rank codes per (layer, KV head): bases from the context's "
              "own PCA (rank by k_rank/v_rank, or by the kept variance `energy` when 0) or from a calibration file; "
              "codes in f16 (bits 0), 2/4/8-bit or f32 (32); quantized codes scaled per channel (fitted on the "
              "context) or per token (`scales`); `share`=TOL: adjacent layers whose pooled basis keeps within TOL of "
              "the variance their own keeps share one basis, counted once (xKV)";
  i.source = "Chang et al. 2024, Palu: Compressing KV-Cache with Low-Rank Projection, arXiv 2407.21118; xKV "
             "(cross-layer bases), arXiv 2503.18893";
  i.params = {{"k_rank", "0"}, {"v_rank", "0"}, {"energy", "0.99"}, {"k_bits", "0"}, {"v_bits", "0"},
              {"scales", "channel"}, {"file", ""}, {"share", "off"}, {"share_max", "0"}};
  i.make = [](const PressParams& p) -> std::unique_ptr<Press> {
    const int kr = param_int(p, "latent", "k_rank"), vr = param_int(p, "latent", "v_rank");
    const double en = param_double(p, "latent", "energy");
    if (kr < 0 || vr < 0) throw Error(fmt::format("press latent: k_rank={} and v_rank={} must be >= 0", kr, vr));
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
    return std::make_unique<LatentPress>(kr, vr, en, checked_bits(p, "k_bits"), checked_bits(p, "v_bits"),
                                         sc == "channel" ? LatentScales::Channel : LatentScales::Token,
                                         param_file(p, "latent", "file"), share, share_max);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
