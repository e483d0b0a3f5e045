// LU-KV (arXiv 2602.08585): the budget-curve file, kvpress's per-head budget rule
// (kvpress/presses/lukv_press.py) as a budget policy over any scorer (the offline profiling that
// computes a curve: train/lukv_profile.h).
#include "press/policies/lukv.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <numeric>
#include <regex>

#include <fmt/format.h>

#include "kvslim/gguf.h"
#include "press/authoring.h"
#include "press/param_file.h"

namespace kvslim {

void LUKVCurve::save(const std::string& path, const std::string& desc) const {
  GGUFWriter w;
  w.set("general.architecture", GGUFValue::str("lukv"));
  w.set("lukv.description", GGUFValue::str(desc));
  w.set("lukv.n_layer", GGUFValue::u32(n_layer));
  w.set("lukv.n_head_kv", GGUFValue::u32(n_head_kv));
  w.add_tensor_f32("lukv.curve", GGMLType::F32, {n_head_kv, n_layer, 99}, prune);
  w.write(path);
}

namespace {

/// A NumPy .npy file of shape (99, layers, heads), little-endian float32 or float64, C order: the
/// format of the curves kvpress downloads (np.load) and LU-KV's scripts write.
LUKVCurve load_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("{}: cannot open the LU-KV curve", path));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0)
    throw Error(fmt::format("{}: not a NumPy .npy file", path));
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t hlen = 0, off = 0;
  if (major == 1) {
    hlen = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
    off = 10;
  } else if (bytes.size() >= 12) {
    for (int i = 0; i < 4; ++i) hlen |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    off = 12;
  }
  if (!off || off + hlen > bytes.size()) throw Error(fmt::format("{}: truncated .npy header", path));
  const std::string header = bytes.substr(off, hlen);
  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'descr'\\s*:\\s*'([<|]f[48])'")))
    throw Error(fmt::format("{}: .npy dtype must be little-endian float32 or float64 (header {})", path, header));
  const size_t width = m[1].str().back() == '8' ? 8 : 4;
  if (std::regex_search(header, std::regex("'fortran_order'\\s*:\\s*True")))
    throw Error(fmt::format("{}: .npy in Fortran order is not supported", path));
  if (!std::regex_search(header, m, std::regex("'shape'\\s*:\\s*\\(\\s*(\\d+)\\s*,\\s*(\\d+)\\s*,\\s*(\\d+)\\s*\\)")) ||
      m[1].str() != "99")
    throw Error(fmt::format("{}: .npy curve must have shape (99, layers, KV heads) (header {})", path, header));
  LUKVCurve c;
  c.n_layer = std::stoi(m[2].str());
  c.n_head_kv = std::stoi(m[3].str());
  const size_t n = static_cast<size_t>(99) * c.n_layer * c.n_head_kv, data = off + hlen;
  if (c.n_layer < 1 || c.n_head_kv < 1 || bytes.size() < data + n * width)
    throw Error(fmt::format("{}: .npy data shorter than its shape", path));
  c.prune.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (width == 4) {
      std::memcpy(&c.prune[i], bytes.data() + data + 4 * i, 4);
    } else {
      double v;
      std::memcpy(&v, bytes.data() + data + 8 * i, 8);
      c.prune[i] = static_cast<float>(v);
    }
  }
  return c;
}

}  // namespace

LUKVCurve LUKVCurve::load(const std::string& path) {
  if (path.size() > 4 && path.compare(path.size() - 4, 4, ".npy") == 0) return load_npy(path);
  auto f = GGUFFile::open(path);
  std::string arch;
  try {
    arch = f->get_string("general.architecture");
  } catch (const Error&) {
  }
  if (arch != "lukv")
    throw Error(fmt::format("{}: not a LU-KV curve file (general.architecture is not 'lukv'; make one with `kvslim "
                            "lukv-curve`)",
                            path));
  LUKVCurve c;
  c.n_layer = static_cast<int>(f->get_int("lukv.n_layer"));
  c.n_head_kv = static_cast<int>(f->get_int("lukv.n_head_kv"));
  if (c.n_layer < 1 || c.n_head_kv < 1) throw Error(fmt::format("{}: bad LU-KV curve shape", path));
  const TensorInfo& t = f->tensor("lukv.curve");
  if (t.nelements() != int64_t(99) * c.n_layer * c.n_head_kv)
    throw Error(fmt::format("{}: lukv.curve has {} values, expected 99 x {} x {}", path, t.nelements(), c.n_layer,
                            c.n_head_kv));
  c.prune = f->tensor_f32(t);
  return c;
}

int lukv_row(double ratio) {
  const int r = static_cast<int>(std::nearbyint(ratio * 100)) - 1;  // Python round: half to even
  return std::clamp(r, 0, 98);
}

std::vector<int> lukv_layer_keep(const std::vector<float>& prune, int n) {
  const int H = static_cast<int>(prune.size());
  std::vector<double> ideal(H);
  double sum = 0;
  for (int h = 0; h < H; ++h) {
    // kvpress computes in float32: (1 - prune).clamp(0, 1) * seq_len.
    ideal[h] = static_cast<double>(std::clamp(1.0f - prune[h], 0.0f, 1.0f) * static_cast<float>(n));
    sum += ideal[h];
  }
  int64_t total = static_cast<int64_t>(std::nearbyint(sum));
  total = std::max<int64_t>(H, std::min<int64_t>(static_cast<int64_t>(H) * n, total));
  std::vector<int> keep(H);
  int64_t base = 0;
  for (int h = 0; h < H; ++h) {
    keep[h] = static_cast<int>(std::floor(ideal[h]));
    base += keep[h];
  }
  const int64_t rem = total - base;
  if (rem > 0) {
    std::vector<int> order(H);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return ideal[a] - std::floor(ideal[a]) > ideal[b] - std::floor(ideal[b]); });
    for (int64_t i = 0; i < std::min<int64_t>(rem, H); ++i) keep[order[i]] += 1;
  }
  for (int& k : keep) k = std::clamp(k, 1, std::max(1, n));
  return keep;
}

namespace {

/// kvpress's LUKVPress budget: per layer, keep-counts from the curve row of the ratio
/// (lukv_layer_keep over n = the context's entries); the first `sink` and last `window` entries
/// of each head chosen first (kvpress: the largest score + 1).
class LUKVBudget : public BudgetPolicy {
 public:
  LUKVBudget(std::shared_ptr<const LUKVCurve> c, std::string path, int sink, int window)
      : curve_(std::move(c)), path_(std::move(path)), sink_(sink), window_(window) {}
  std::string describe() const override { return fmt::format("lukv:curve={},sink={},window={}", path_, sink_, window_); }
  void prepare(Scores& scores, const KVCache& cache, const Target& target) const override {
    for (auto& layer : scores)
      for (auto& seg : layer) {
        const int n = static_cast<int>(seg.size());
        for (int i = 0; i < n; ++i)
          if ((i < sink_ || i >= n - window_) && seg[i] != kProtected) seg[i] = kPreferred;
      }
  }
  KeepCounts keep_counts(const BudgetInput& in) const override {
    const KVCache& cache = in.cache;
    if (curve_->n_layer != cache.n_layer() || curve_->n_head_kv != cache.n_head_kv())
      throw Error(fmt::format("{}: LU-KV curve for {} layers x {} KV heads does not fit the model ({} x {})", path_,
                              curve_->n_layer, curve_->n_head_kv, cache.n_layer(), cache.n_head_kv()));
    KeepCounts keep(cache.n_layer(), std::vector<int>(cache.n_head_kv()));
    const int row = lukv_row(in.target.ratio);
    for (int l = 0; l < cache.n_layer(); ++l) {
      std::vector<float> prune(cache.n_head_kv());
      for (int h = 0; h < cache.n_head_kv(); ++h) prune[h] = curve_->at(row, l, h);
      const int n = static_cast<int>(in.target.n_for(cache.seg(l, 0)));
      const std::vector<int> k = lukv_layer_keep(prune, n);
      for (int h = 0; h < cache.n_head_kv(); ++h) {
        const int size = static_cast<int>(cache.seg(l, h).size());
        keep[l][h] = std::min(size, std::max(k[h], count_protected(in.scores[l][h])));
      }
    }
    return keep;
  }

 private:
  std::shared_ptr<const LUKVCurve> curve_;
  std::string path_;
  int sink_, window_;
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "lukv";
  i.kvpress = {"LUKVPress"};
  i.summary = "budget policy: per-(layer, KV head) keep rates from a LU-KV budget curve (`kvslim lukv-curve`), "
              "first `sink` and last `window` entries chosen first";
  i.source = "Tang et al. 2026, Predicting Future Utility: Global Combinatorial Optimization for Task-Agnostic KV "
             "Cache Eviction, arXiv 2602.08585; kvpress lukv_press.py";
  i.params = {{"sink", "4", {}, {.help = "the first entries, chosen first"}},
              {"window", "1", {}, {.help = "the last entries, chosen first"}},
              {"curve", "", {}, {.type = ParamType::Str, .help = "the budget curve file (`kvslim lukv-curve`)"}}};
  i.kind = PressKind::Policy;
  i.default_inner = "expected_attention:epsilon=0.02";
  i.make_policy = [](const PressParams& p) -> std::unique_ptr<BudgetPolicy> {
    const std::string path = param_file(p, "lukv", "curve");
    if (path.empty()) throw Error("press lukv: give curve=FILE (compute one with `kvslim lukv-curve`)");
    const int sink = param_int(p, "lukv", "sink"), window = param_int(p, "lukv", "window");
    if (sink < 0 || window < 0) throw Error("press lukv: sink and window must be >= 0");
    return std::make_unique<LUKVBudget>(std::make_shared<const LUKVCurve>(LUKVCurve::load(path)), path, sink, window);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
