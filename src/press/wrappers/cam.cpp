// CaM: cache merging during decode (see press/cam.h). kvslim runs the merge on the decoded values
// in float64 and rebuilds each segment in its own codecs (exact for f32/f16 caches; LeanKV tiers
// are not kept), as the merging wrapper does. The Bernoulli masks use a per-request generator
// seeded by `seed` (kvpress: torch's global generator). The layer's KV heads must hold the same
// entries (as in kvpress); a prefill press that evicts per head is refused when it left them unequal.
#include "press/wrappers/cam.h"

#include <algorithm>
#include <cmath>
#include <random>

#include <fmt/format.h>

#include "press/authoring.h"
#include "press/attention_acc.h"
#include "press/decode_window.h"
#include "press/ranking.h"

namespace kvslim {

std::vector<int32_t> cam_merge_layer(const std::vector<float>& mean_score, const std::vector<std::vector<double>>& attn,
                                     int keep, int k, int merge_budget, std::vector<std::vector<float>>& values, int hd,
                                     const std::function<double()>& uniform) {
  const int n = static_cast<int>(mean_score.size()), H = static_cast<int>(attn.size());
  if (keep >= n) {
    std::vector<int32_t> all(n);
    for (int i = 0; i < n; ++i) all[i] = i;
    return all;
  }
  const std::vector<int32_t> order = rank_entries(mean_score);  // best first, later first among ties
  std::vector<int32_t> kept(order.begin(), order.begin() + keep);
  std::sort(kept.begin(), kept.end());
  // Merge candidates: the best-scored evicted entries, in increasing entry order.
  std::vector<int32_t> merge(order.begin() + keep, order.begin() + keep + std::clamp(k, 0, n - keep));
  std::sort(merge.begin(), merge.end());
  // All contributions come from the original values (the candidates are evicted, never targets).
  std::vector<std::vector<double>> add(H, std::vector<double>(static_cast<size_t>(keep) * hd, 0.0));
  for (int32_t i : merge) {
    const int start = static_cast<int>(std::upper_bound(kept.begin(), kept.end(), i) - kept.begin());
    const int m = std::min(merge_budget, keep - start);  // valid window targets kept[start, start + m)
    for (int h = 0; h < H; ++h) {
      const double u = uniform();
      if (m <= 0) continue;
      double mean = 0;
      for (int t = start; t < start + m; ++t) mean += attn[h][kept[t]];
      mean /= m;
      double p = attn[h][i] / mean;
      if (std::isnan(p)) p = 0.0;
      if (std::isinf(p)) p = 1.0;
      p = std::clamp(p, 0.0, 1.0);
      if (!(u < p)) continue;
      for (int t = start; t < start + m; ++t)
        for (int c = 0; c < hd; ++c)
          add[h][static_cast<size_t>(t) * hd + c] += double(values[h][static_cast<size_t>(i) * hd + c]) / m;
    }
  }
  for (int h = 0; h < H; ++h)
    for (int t = 0; t < keep; ++t)
      for (int c = 0; c < hd; ++c) {
        float& v = values[h][static_cast<size_t>(kept[t]) * hd + c];
        v = static_cast<float>(double(v) + add[h][static_cast<size_t>(t) * hd + c]);
      }
  return kept;
}

namespace {

class CAMPress : public DecodeTimeWrapper<ScorerPress> {
 public:
  CAMPress(std::unique_ptr<ScorerPress> inner, int interval, int size, int merge_budget, uint64_t seed)
      : DecodeTimeWrapper(std::move(inner)), interval_(interval), size_(size), budget_(merge_budget), seed_(seed), rng_(seed) {}
  std::string describe() const override {
    return fmt::format("cam({}):interval={},size={},merge_budget={},seed={}", inner_->describe(), interval_, size_,
                       budget_, seed_);
  }
  ObservationNeeds decode_needs() const override {
    ObservationNeeds r = DecodeTimeWrapper::decode_needs();
    r.attention_mass = true;
    return r;
  }
  void after_decode(KVCache& cache, const Model& model, const Observation& obs) override {
    observe_step(cache, model, obs);
    acc_.observe(cache, obs, model.hparams().n_group());
    if (++since_ < interval_) return;
    const int L = cache.n_layer(), H = cache.n_head_kv(), G = model.hparams().n_group(), hd = cache.head_dim();
    bool any = false;
    for (int l = 0; l < L; ++l) any = any || cache.seg(l, 0).size() > static_cast<size_t>(size_);
    if (!any) return;
    const size_t n_all = static_cast<size_t>(cache_next_position(cache));
    Scores sc = inner_->score_all(cache, model, window_, Target{1.0 - double(size_) / double(n_all), n_all});
    for (int l = 0; l < L; ++l) {
      const size_t n = cache.seg(l, 0).size();
      for (int h = 1; h < H; ++h)
        if (cache.seg(l, h).positions() != cache.seg(l, 0).positions())
          throw Error(fmt::format("press cam: layer {} KV heads hold different entries (a per-head prefill press?); "
                                  "cam merges per layer as kvpress does",
                                  l));
      if (n <= static_cast<size_t>(size_)) continue;
      std::vector<float> mean(n, 0.0f);
      for (int h = 0; h < H; ++h)
        for (size_t j = 0; j < n; ++j) mean[j] += sc[l][h][j] / H;
      std::vector<std::vector<double>> attn(H);
      std::vector<std::vector<float>> vals(H, std::vector<float>(n * hd)), keys(H, std::vector<float>(n * hd));
      std::vector<double> mass, count;
      for (int h = 0; h < H; ++h) {
        const Segment& s = cache.seg(l, h);
        acc_.lookup(s, l, h, mass, count);
        attn[h].resize(n);
        for (size_t j = 0; j < n; ++j) attn[h][j] = mass[j] / G;  // the GQA group's mean
        s.values(0, n, vals[h].data());
        s.keys(0, n, keys[h].data());
      }
      std::uniform_real_distribution<double> u01(0.0, 1.0);
      const std::vector<int32_t> kept =
          cam_merge_layer(mean, attn, size_, since_, budget_, vals, hd, [&] { return u01(rng_); });
      for (int h = 0; h < H; ++h) {
        Segment& s = cache.seg(l, h);
        Segment out(hd, s.key_codec(), s.value_codec(), s.quant());
        for (int32_t j : kept)
          out.append(keys[h].data() + static_cast<size_t>(j) * hd, vals[h].data() + static_cast<size_t>(j) * hd,
                     s.positions()[j]);
        s = std::move(out);
      }
    }
    since_ = 0;
  }
  void reset() override {
    DecodeTimeWrapper::reset();
    acc_.reset();
    since_ = 0;
    rng_.seed(seed_);
  }
  void remap_positions(int l, int h, const std::vector<int32_t>& o, const std::vector<int32_t>& n) override {
    DecodeTimeWrapper::remap_positions(l, h, o, n);
    acc_.remap(l, h, o, n);
  }

 private:
  int interval_, size_, budget_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  AttentionAccumulator acc_;
  int since_ = 0;  // decode steps since the last compression (kvpress's layer_step_counts)
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "cam";
  i.kvpress = {"CAMPress"};
  i.summary = "wrapper: during decode, every `interval` tokens, keep `size` entries per layer by the inner scores "
              "(mean over KV heads) and merge the best evicted values into the next kept ones (CaM)";
  i.source = "Zhang et al. 2024, CaM: Cache Merging for Memory-efficient LLMs Inference, ICML 2024 "
             "(openreview.net/forum?id=LCTmppB165); reference: kvpress/presses/cam_press.py (CAMPress)";
  i.params = {{"interval", "512", "compression_interval", {.help = "decode steps between two compressions"}},
              {"size", "2048", "target_size", {.help = "entries per layer after each compression"}},
              {"merge_budget", "32", {},
               {.help = "the kept entries after an evicted one that its value is merged into"}},
              {"seed", "42", {}, kKvslimOnly}};
  i.kind = PressKind::Wrapper;
  i.default_inner = "knorm";
  i.python = {.inner = "base_press"};
  i.make_wrapper = [](const PressParams& p, std::unique_ptr<PressImpl> inner) -> std::unique_ptr<PressImpl> {
    const int iv = param_int(p, "cam", "interval"), sz = param_int(p, "cam", "size"), mb = param_int(p, "cam", "merge_budget");
    const int seed = param_int(p, "cam", "seed");
    if (iv < 1) throw Error(fmt::format("press cam: interval={} must be >= 1", iv));
    if (sz < 1) throw Error(fmt::format("press cam: size={} must be >= 1", sz));
    if (mb < 1) throw Error(fmt::format("press cam: merge_budget={} must be >= 1", mb));
    if (seed < 0) throw Error(fmt::format("press cam: seed={} must be >= 0", seed));
    auto* sp = inner->scorer();
    if (!sp) throw Error(fmt::format("press cam: the inner press {} is not a scorer press", inner->describe()));
    if (sp->needs().tokens)
      throw Error(fmt::format("press cam: the inner press {} scores by replaying the context, which decode-time "
                              "compression cannot do",
                              inner->describe()));
    inner.release();
    return std::make_unique<CAMPress>(std::unique_ptr<ScorerPress>(sp), iv, sz, mb, static_cast<uint64_t>(seed));
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
