// CUR (CurDKV): scores entries by approximate leverage of their key and value rows. Per KV head,
// k2 = ||k||^2 and v2 = ||v||^2 of every entry (keys as stored: RoPE applied); with the local
// approximation (default) each is divided by its sum over consecutive windows of `window`
// entries (the last, shorter window over its own entries); the score is k2 x v2 (`leverage=
// kv_product`, default), k2, v2 or (k2 + v2) / 2, divided by its sum over the segment; the first
// n_sink entries are chosen first (kvpress sets them to 1.0, at least every other normalised
// score). With `random_projection=1` keys and values are first multiplied by a Gaussian matrix
// [head_dim][20] / sqrt(20) (seed `seed`, drawn per layer and head).
// Sengupta et al., "Value-Guided KV Compression for LLMs via Approximated CUR Decomposition"
// (CurDKV), arXiv 2509.15038; reference: kvpress/presses/cur_press.py (CURPress).
#include <cmath>
#include <random>

#include <fmt/format.h>

#include "press/authoring.h"

namespace kvslim {
namespace {

enum class Leverage { Key, Value, KVAvg, KVProduct };

const char* leverage_name(Leverage t) {
  switch (t) {
    case Leverage::Key: return "key";
    case Leverage::Value: return "value";
    case Leverage::KVAvg: return "kv_avg";
    default: return "kv_product";
  }
}

class CURPress : public ScorerPress {
 public:
  CURPress(double ratio, int n_sink, Leverage type, bool local, int window, bool random, uint32_t seed, bool protect)
      : ScorerPress(ratio), n_sink_(n_sink), type_(type), local_(local), window_(window), random_(random),
        seed_(seed), protect_(protect) {}
  std::string describe_scorer() const override {
    return fmt::format("cur:ratio={},n_sink={},leverage={},local={},window={},random_projection={},seed={},protect={}",
                       ratio_, n_sink_, leverage_name(type_), local_ ? 1 : 0, window_, random_ ? 1 : 0, seed_,
                       protect_ ? 1 : 0);
  }
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override {
    const int hd = view.hp().head_dim, H = view.hp().n_head_kv;
    constexpr int kSketch = 20;  // kvpress's r
    for (int h = 0; h < H; ++h) {
      const Segment& s = view.seg(h);
      const size_t n = s.size();
      std::vector<float> k(n * hd), v(n * hd);
      if (n > 0) {
        s.keys(0, n, k.data());
        s.values(0, n, v.data());
      }
      std::vector<double> G;
      if (random_) {
        std::mt19937 rng(seed_ + 7919u * static_cast<uint32_t>(view.layer() * H + h));
        std::normal_distribution<double> nd(0.0, 1.0);
        G.resize(static_cast<size_t>(hd) * kSketch);
        for (double& x : G) x = nd(rng) / std::sqrt(double(kSketch));
      }
      std::vector<double> k2(n), v2(n);
      for (size_t i = 0; i < n; ++i) {
        k2[i] = sq_norm(k.data() + i * hd, hd, G);
        v2[i] = sq_norm(v.data() + i * hd, hd, G);
      }
      if (local_) {
        normalise_windows(k2);
        normalise_windows(v2);
      }
      std::vector<double> sc(n);
      double sum = 0;
      for (size_t i = 0; i < n; ++i) {
        switch (type_) {
          case Leverage::Key: sc[i] = k2[i]; break;
          case Leverage::Value: sc[i] = v2[i]; break;
          case Leverage::KVAvg: sc[i] = (k2[i] + v2[i]) / 2; break;
          case Leverage::KVProduct: sc[i] = k2[i] * v2[i]; break;
        }
        sum += sc[i];
      }
      out[h].resize(n);
      for (size_t i = 0; i < n; ++i)
        out[h][i] = i < static_cast<size_t>(n_sink_) ? keep_first_score(protect_) : static_cast<float>(sc[i] / sum);
    }
  }

 private:
  /// ||x||^2, or ||x G||^2 when G [hd][20] is given.
  static double sq_norm(const float* x, int hd, const std::vector<double>& G) {
    double s = 0;
    if (G.empty()) {
      for (int c = 0; c < hd; ++c) s += double(x[c]) * x[c];
      return s;
    }
    const int r = static_cast<int>(G.size() / hd);
    for (int j = 0; j < r; ++j) {
      double y = 0;
      for (int c = 0; c < hd; ++c) y += double(x[c]) * G[static_cast<size_t>(c) * r + j];
      s += y * y;
    }
    return s;
  }
  /// Divides each run of window_ consecutive values by its sum.
  void normalise_windows(std::vector<double>& x) const {
    for (size_t b = 0; b < x.size(); b += window_) {
      const size_t e = std::min(x.size(), b + window_);
      double sum = 0;
      for (size_t i = b; i < e; ++i) sum += x[i];
      for (size_t i = b; i < e; ++i) x[i] /= sum;
    }
  }
  int n_sink_;
  Leverage type_;
  bool local_;
  int window_;
  bool random_;
  uint32_t seed_;
  bool protect_;
};

PressRegistrar reg({"cur", "approximate CUR leverage: local-window-normalised ||k||^2 x ||v||^2, sinks first",
                    "Sengupta et al. 2025, Value-Guided KV Compression for LLMs via Approximated CUR Decomposition "
                    "(CurDKV), arXiv 2509.15038; reference: kvpress/presses/cur_press.py (CURPress)",
                    {{"ratio", "0"},
                     {"n_sink", "4", "num_sinks", {.help = "the first entries, chosen first"}},
                     {"leverage", "kv_product", "leverage_type",
                      {.help = "the score: key, value, kv_avg or kv_product of the row norms"}},
                     {"random_projection", "0", "use_random_leverage",
                      {.type = ParamType::Bool, .help = "project keys and values on a Gaussian sketch first"}},
                     {"local", "1", "use_local_approximation",
                      {.type = ParamType::Bool, .help = "normalise the norms over local windows"}},
                     {"window", "16", "local_window_size", {.help = "entries per local window"}},
                     {"seed", "42", {}, kKvslimOnly},
                     {"protect", "0", {}, kKvslimOnly}},
                    [](const PressParams& p) -> std::unique_ptr<PressImpl> {
                      const int s = param_int(p, "cur", "n_sink"), w = param_int(p, "cur", "window");
                      if (s < 0) throw Error(fmt::format("press cur: n_sink={} must be >= 0", s));
                      if (w < 1) throw Error(fmt::format("press cur: window={} must be >= 1", w));
                      const std::string t = param_str(p, "cur", "leverage");
                      Leverage type = t == "key"       ? Leverage::Key
                                      : t == "value"   ? Leverage::Value
                                      : t == "kv_avg"  ? Leverage::KVAvg
                                      : t == "kv_product" ? Leverage::KVProduct
                                                          : throw Error(fmt::format(
                                                                "press cur: leverage='{}' must be key, value, kv_avg "
                                                                "or kv_product",
                                                                t));
                      const int seed = param_int(p, "cur", "seed");
                      return std::make_unique<CURPress>(param_double(p, "cur", "ratio"), s, type,
                                                        param_bool(p, "cur", "local"), w,
                                                        param_bool(p, "cur", "random_projection"),
                                                        static_cast<uint32_t>(seed), param_bool(p, "cur", "protect"));
                    }}, {"CURPress"});

}  // namespace
}  // namespace kvslim
