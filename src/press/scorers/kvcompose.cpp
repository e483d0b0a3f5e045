// KVCompose: replay attention scores, composite tokens, layer budgets (see press/kvcompose.h).
#include "press/scorers/kvcompose.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include <cblas.h>
#include <fmt/format.h>

#include "kernels/threads.h"
#include "press/position_scores.h"
#include "press/recorders.h"

namespace kvslim {

namespace {

/// Indices of the k largest values of v (ties: the lower index first).
std::vector<size_t> top_k(const std::vector<double>& v, size_t k) {
  std::vector<size_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), size_t{0});
  k = std::min(k, v.size());
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](size_t a, size_t b) {
    return v[a] > v[b] || (v[a] == v[b] && a < b);
  });
  idx.resize(k);
  return idx;
}

constexpr double kLowerBoundBonus = 1e9;  // kvpress adds 1e9 to the first keep_token_lower_bound ranks

}  // namespace

KeepCounts kvcompose_counts(const Scores& scores, size_t n_total, double ratio, const KVComposeOptions& opt) {
  const int L = static_cast<int>(scores.size());
  KeepCounts keep(L);
  if (L == 0) return keep;
  const int H = static_cast<int>(scores[0].size());
  // Each head's scores in descending order (its composite tokens).
  std::vector<std::vector<std::vector<double>>> sorted(L, std::vector<std::vector<double>>(H));
  size_t width = 0;
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) {
      auto& s = sorted[l][h];
      s.assign(scores[l][h].begin(), scores[l][h].end());
      std::sort(s.begin(), s.end(), std::greater<double>());
      width = std::max(width, s.size());
    }
  const size_t bound = static_cast<size_t>(std::max(0, opt.keep_token_lower_bound));
  if (opt.structured) {
    // Composite tokens per layer: rank r aggregated over the heads that have a rank r.
    std::vector<std::vector<double>> comp(L, std::vector<double>(width, -INFINITY));
    for (int l = 0; l < L; ++l)
      for (size_t r = 0; r < width; ++r) {
        double acc = opt.agg_head == ComposeAgg::Max ? -INFINITY : 0.0;
        int cnt = 0;
        for (int h = 0; h < H; ++h) {
          if (r >= sorted[l][h].size()) continue;
          const double v = sorted[l][h][r];
          acc = opt.agg_head == ComposeAgg::Max ? std::max(acc, v) : acc + v;
          ++cnt;
        }
        if (cnt == 0) continue;
        comp[l][r] = (opt.agg_head == ComposeAgg::Max ? acc : acc / cnt) + (r < bound ? kLowerBoundBonus : 0.0);
      }
    // Layer 0 takes the largest composite token of every rank over the layers.
    for (int l = 1; l < L; ++l)
      for (size_t r = 0; r < width; ++r) comp[0][r] = std::max(comp[0][r], comp[l][r]);
    std::vector<double> flat;
    flat.reserve(static_cast<size_t>(L) * width);
    for (int l = 0; l < L; ++l) flat.insert(flat.end(), comp[l].begin(), comp[l].end());
    const size_t n_kept = static_cast<size_t>(std::floor(double(L) * double(n_total) * (1.0 - ratio) + 1e-9));
    std::vector<int> per_layer(L, 0);
    for (size_t i : top_k(flat, n_kept))
      if (std::isfinite(flat[i])) ++per_layer[i / width];
    for (int l = 0; l < L; ++l) {
      keep[l].resize(H);
      for (int h = 0; h < H; ++h)
        keep[l][h] = std::clamp(per_layer[l], 1, std::max(1, static_cast<int>(scores[l][h].size())));
    }
  } else {
    std::vector<double> flat;
    flat.reserve(static_cast<size_t>(L) * H * width);
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h)
        for (size_t r = 0; r < width; ++r)
          flat.push_back(r < sorted[l][h].size() ? sorted[l][h][r] + (r < bound ? kLowerBoundBonus : 0.0) : -INFINITY);
    const size_t n_kept =
        static_cast<size_t>(std::floor(double(L) * H * double(n_total) * (1.0 - ratio) + 1e-9));
    std::vector<int> per_head(static_cast<size_t>(L) * H, 0);
    for (size_t i : top_k(flat, n_kept))
      if (std::isfinite(flat[i])) ++per_head[i / width];
    for (int l = 0; l < L; ++l) {
      keep[l].resize(H);
      for (int h = 0; h < H; ++h)
        keep[l][h] = std::clamp(per_head[static_cast<size_t>(l) * H + h], 1,
                                std::max(1, static_cast<int>(scores[l][h].size())));
    }
  }
  return keep;
}

namespace {

const char* agg_name(ComposeAgg a) { return a == ComposeAgg::Max ? "max" : "mean"; }

class KVComposePress : public PressImpl {
 public:
  KVComposePress(double ratio, KVComposeOptions opt) : ratio_(ratio), opt_(opt) { check_ratio(ratio, "kvcompose"); }
  std::string describe() const override {
    return fmt::format(
        "kvcompose:ratio={},structured={},agg_task={},agg_group={},agg_head={},add_v_norm={},"
        "add_mean_across_heads={},keep_token_lower_bound={}",
        ratio_, opt_.structured ? 1 : 0, agg_name(opt_.agg_task), agg_name(opt_.agg_group), agg_name(opt_.agg_head),
        opt_.add_v_norm ? 1 : 0, opt_.add_mean_across_heads ? 1 : 0, opt_.keep_token_lower_bound);
  }
  ObservationNeeds needs() const override {
    ObservationNeeds r;
    r.tokens = true;
    return r;
  }
  double ratio() const override { return ratio_; }
  void set_ratio(double r) override {
    check_ratio(r, "kvcompose");
    ratio_ = r;
  }
  void reset() override { stored_.clear(); }

  /// Replays the step's tokens after the cache and stores every present entry's replay score
  /// (aggregated over the replay queries and the GQA group) by position.
  void observe(const KVCache& cache, const Model& model, const Observation& obs) override {
    if (ratio_ <= 0.0 || obs.tokens.empty()) return;  // ratio 0 leaves the cache bit-identical: no replay
    if (!obs.runner || &obs.runner->cache() != &cache)
      throw Error("press kvcompose: needs the request runner that owns the cache (it replays the context)");
    ModelRunner& run = *obs.runner;
    const HParams& hp = model.hparams();
    const int L = hp.n_layer, H = hp.n_head_kv, G = hp.n_group(), hd = hp.head_dim;
    const int R = static_cast<int>(obs.tokens.size());
    const int32_t P = run.next_position();
    if (P + R > run.n_ctx())
      throw Error(fmt::format("press kvcompose: the replay of {} tokens after position {} needs a context size of at "
                              "least {} (n_ctx is {}); raise n_ctx",
                              R, P, P + R, run.n_ctx()));
    std::vector<size_t> n0(static_cast<size_t>(L) * H);
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) n0[static_cast<size_t>(l) * H + h] = cache.seg(l, h).size();
    // acc[l*H+h][g][j]: max or sum over replay queries of query head g's probability of entry j.
    std::vector<std::vector<std::vector<double>>> acc(n0.size());
    for (size_t w = 0; w < n0.size(); ++w)
      acc[w].assign(G, std::vector<double>(n0[w], 0.0));
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (int off = 0; off < R; off += opt_.batch) {
      const int bl = std::min(opt_.batch, R - off);
      WindowQueryRecorder window(bl, P + off);
      run.run(std::vector<Token>(obs.tokens.begin() + off, obs.tokens.begin() + off + bl), &window);
      Observation q;
      window.finish(q);
      if (q.n_window() != bl) throw Error("press kvcompose: the forward pass did not record the replay queries");
      parallel_for(static_cast<int64_t>(L) * H, [&](int64_t b, int64_t e) {
        for (int64_t w = b; w < e; ++w) {
          const int l = static_cast<int>(w / H), h = static_cast<int>(w % H);
          const Segment& s = cache.seg(l, h);
          const size_t nc = n0[w], m = nc + static_cast<size_t>(off + bl);  // context + replay so far
          std::vector<float> k(m * hd), lg(m);
          s.keys(0, nc, k.data());
          s.keys(nc, nc + off + bl, k.data() + nc * hd);
          for (int g = 0; g < G; ++g) {
            const float* qg = q.queries[l].data() + static_cast<size_t>(h * G + g) * bl * hd;
            for (int r = 0; r < bl; ++r) {
              const size_t vis = nc + static_cast<size_t>(off + r + 1);  // causal within the replay
              {
                BlasSlot slot;  // see kernels/threads.h
                cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(vis), hd, scale, k.data(), hd,
                            qg + static_cast<size_t>(r) * hd, 1, 0.0f, lg.data(), 1);
              }
              float mx = -INFINITY;
              for (size_t j = 0; j < vis; ++j) mx = std::max(mx, lg[j]);
              double sum = 0;
              for (size_t j = 0; j < vis; ++j) sum += std::exp(double(lg[j]) - mx);
              auto& a = acc[w][g];
              for (size_t j = 0; j < nc; ++j) {
                const double p = std::exp(double(lg[j]) - mx) / sum;
                a[j] = opt_.agg_task == ComposeAgg::Max ? std::max(a[j], p) : a[j] + p;
              }
            }
          }
        }
      });
    }
    run.rewind(P);
    // Group aggregation, then the value norm, stored by position; the mean over heads is added in apply.
    stored_.shape(L, H);
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        const size_t w = static_cast<size_t>(l) * H + h;
        const Segment& s = cache.seg(l, h);
        std::vector<float> v(hd);
        for (size_t j = 0; j < n0[w]; ++j) {
          double agg = opt_.agg_group == ComposeAgg::Max ? -INFINITY : 0.0;
          for (int g = 0; g < G; ++g) {
            double x = acc[w][g][j];
            if (opt_.agg_task == ComposeAgg::Mean) x /= R;
            agg = opt_.agg_group == ComposeAgg::Max ? std::max(agg, x) : agg + x / G;
          }
          if (opt_.add_v_norm) {
            s.value(j, v.data());
            double ss = 0;
            for (float x : v) ss += double(x) * x;
            agg *= std::sqrt(ss);
          }
          stored_.set(l, h, s.positions()[j], agg);
        }
      }
  }

  void apply(KVCache& cache, const Model&, const Observation&, const Target& target) override {
    if (ratio_ <= 0.0 || stored_.empty()) return;
    const int L = cache.n_layer(), H = cache.n_head_kv();
    Scores sc(L, std::vector<std::vector<float>>(H));
    std::vector<std::vector<std::vector<double>>> full(L, std::vector<std::vector<double>>(H));
    for (int l = 0; l < L; ++l) {
      // The mean over the layer's heads, per position (heads holding it), added to every head.
      std::map<int32_t, std::pair<double, int>> mean;
      for (int h = 0; h < H; ++h) {
        const Segment& s = cache.seg(l, h);
        full[l][h].resize(s.size());
        for (size_t j = 0; j < s.size(); ++j) {
          const double* v = stored_.find(l, h, s.positions()[j]);
          // Entries no replay scored (e.g. a question) are kept: they rank above every score.
          full[l][h][j] = v ? *v : INFINITY;
          if (std::isfinite(full[l][h][j])) {
            auto& m = mean[s.positions()[j]];
            m.first += full[l][h][j];
            m.second += 1;
          }
        }
      }
      for (int h = 0; h < H; ++h) {
        const Segment& s = cache.seg(l, h);
        sc[l][h].resize(s.size());
        for (size_t j = 0; j < s.size(); ++j) {
          double x = full[l][h][j];
          if (opt_.add_mean_across_heads && std::isfinite(x)) {
            const auto& m = mean[s.positions()[j]];
            x += m.first / H;  // kvpress: mean over every KV head of the layer
          }
          sc[l][h][j] = std::isfinite(x) ? static_cast<float>(x) : kProtected;
        }
      }
    }
    KeepCounts keep = kvcompose_counts(sc, target.n_context, ratio_, opt_);
    parallel_for(static_cast<int64_t>(L) * H, [&](int64_t b, int64_t e) {
      for (int64_t w = b; w < e; ++w) {
        const int l = static_cast<int>(w / H), h = static_cast<int>(w % H);
        Segment& s = cache.seg(l, h);
        if (static_cast<size_t>(keep[l][h]) >= s.size()) continue;
        s.retain(select_top(sc[l][h], keep[l][h]));
      }
    });
    stored_.prune(cache);  // forget the scores of evicted entries
  }
  void remap_positions(int layer, int kv_head, const std::vector<int32_t>& old_pos,
                       const std::vector<int32_t>& new_pos) override {
    stored_.remap(layer, kv_head, old_pos, new_pos);
  }

 private:
  double ratio_;
  KVComposeOptions opt_;
  PositionScores stored_;  // replay scores of the entries still in the cache
};

ComposeAgg parse_agg(const PressParams& p, const std::string& key) {
  const std::string v = param_str(p, "kvcompose", key);
  if (v == "max") return ComposeAgg::Max;
  if (v == "mean") return ComposeAgg::Mean;
  throw Error(fmt::format("press kvcompose: {}={} must be max or mean", key, v));
}

PressRegistrar reg([] {
  PressInfo i;
  i.name = "kvcompose";
  i.kvpress = {"KVComposePress"};
  i.summary = "replay attention (the context run again after itself), composite tokens per layer, one global top-k "
              "for layer budgets; structured=1: every head of a layer keeps the same count";
  i.source = "Akulov et al. 2025, KVCompose: Efficient Structured KV Cache Compression with Composite Tokens, arXiv "
             "2509.05165; reference: kvpress/presses/kvcompose_press.py (KVComposePress)";
  i.params = {{"ratio", "0"},
              {"structured", "1", {},
               {.type = ParamType::Bool, .help = "every KV head of a layer keeps the same count"}},
              {"agg_task", "max", {}, {.help = "the reduction over the replay queries: max or mean"}},
              {"agg_group", "mean", {}, {.help = "the reduction over a GQA group's query heads: max or mean"}},
              {"agg_head", "mean", {}, {.help = "the reduction over a layer's KV heads (composite tokens)"}},
              {"add_v_norm", "0", {}, {.type = ParamType::Bool, .help = "multiply the scores by the value norms"}},
              {"add_mean_across_heads", "1", {},
               {.type = ParamType::Bool, .help = "add the mean over the layer's KV heads to every head's scores"}},
              {"keep_token_lower_bound", "0", {}, {.help = "ranks of every layer taken first"}}};
  i.python.base_press = true;  // kvpress's KVComposePress is no ScorerPress
  i.make = [](const PressParams& p) -> std::unique_ptr<PressImpl> {
    KVComposeOptions o;
    o.structured = param_bool(p, "kvcompose", "structured");
    o.agg_task = parse_agg(p, "agg_task");
    o.agg_group = parse_agg(p, "agg_group");
    o.agg_head = parse_agg(p, "agg_head");
    o.add_v_norm = param_bool(p, "kvcompose", "add_v_norm");
    o.add_mean_across_heads = param_bool(p, "kvcompose", "add_mean_across_heads");
    o.keep_token_lower_bound = param_int(p, "kvcompose", "keep_token_lower_bound");
    if (o.keep_token_lower_bound < 0)
      throw Error(fmt::format("press kvcompose: keep_token_lower_bound={} must be >= 0", o.keep_token_lower_bound));
    return std::make_unique<KVComposePress>(param_double(p, "kvcompose", "ratio"), o);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
