// LeanKV-style precision tiers: the inner scorer's scores split each (layer, KV head)'s entries
// into high precision (the cache's codecs), low precision (cheaper row codecs, keys allowed more
// bits than values) and evicted. Zhang et al., "Unifying KV Cache Compression for Large Language
// Models with LeanKV", arXiv 2412.03131 (Hetero-KV: keys above values; per-head precision by
// significance).
#include <cmath>

#include <fmt/format.h>

#include "kernels/threads.h"
#include "kvslim/press.h"

namespace kvslim {
namespace {

class PrecisionTiersPress : public Press {
 public:
  PrecisionTiersPress(std::unique_ptr<Press> inner, double low, KVCodec k_low, KVCodec v_low)
      : inner_(std::move(inner)), low_(low), k_low_(k_low), v_low_(v_low) {
    scorer_ = dynamic_cast<ScorerPress*>(inner_.get());
    if (!scorer_)
      throw Error(fmt::format("press leankv: '{}' is not a scorer press (use e.g. leankv(snapkv))", inner_->describe()));
  }
  std::string describe() const override {
    return fmt::format("leankv({}):low={},k_low={},v_low={}", inner_->describe(), low_, codec_name(k_low_),
                       codec_name(v_low_));
  }
  ObservationRequest request() const override { return inner_->request(); }
  ObservationRequest decode_request() const override { return inner_->decode_request(); }
  void observe(const KVCache& c, const Model& m, const Observation& o) override { inner_->observe(c, m, o); }
  void reset() override { inner_->reset(); }
  double ratio() const override { return inner_->ratio(); }
  void set_ratio(double r) override { inner_->set_ratio(r); }
  size_t kept_after(const Target& t) const override { return inner_->kept_after(t); }

  void apply(KVCache& cache, const Model& model, const Observation& obs, const Target& target) override {
    if (low_ <= 0.0) return inner_->apply(cache, model, obs, target);
    const int L = cache.n_layer(), H = cache.n_head_kv();
    std::vector<double> stat;
    Scores scores = scorer_->score_all(cache, model, obs, target, &stat);
    const BudgetPolicy& policy = scorer_->policy();
    policy.prepare(scores, cache, target);
    KeepCounts keep;
    if (policy.uses_ratio() && target.ratio <= 0.0) {
      keep.assign(L, std::vector<int>(H));
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h) keep[l][h] = static_cast<int>(cache.seg(l, h).size());
    } else {
      keep = policy.keep_counts(BudgetInput{scores, cache, target, std::move(stat)});
    }
    parallel_for(static_cast<int64_t>(L) * H, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const int l = static_cast<int>(i / H), h = static_cast<int>(i % H);
        const int k = std::min<int>(keep[l][h], static_cast<int>(cache.seg(l, h).size()));
        const int n_low = static_cast<int>(std::floor(k * low_ + 1e-9));
        apply_precision_tiers(cache.seg(l, h), scores[l][h], k - n_low, n_low, k_low_, v_low_, kProtected);
      }
    });
  }

 private:
  std::unique_ptr<Press> inner_;
  ScorerPress* scorer_ = nullptr;
  double low_;
  KVCodec k_low_, v_low_;
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "leankv";
  i.summary = "wrapper: of the entries a scorer keeps, the lowest-scored fraction `low` is re-encoded in cheaper "
              "codecs (k_low / v_low); the rest keep the cache's precision";
  i.source = "Zhang et al. 2024, Unifying KV Cache Compression for Large Language Models with LeanKV, arXiv 2412.03131";
  i.params = {{"low", "0.5"}, {"k_low", "q8_0"}, {"v_low", "q4_0"}};
  i.kind = PressKind::Wrapper;
  i.default_inner = "snapkv";
  i.make_wrapper = [](const PressParams& p, std::unique_ptr<Press> inner) -> std::unique_ptr<Press> {
    const double low = param_double(p, "leankv", "low");
    if (!(low >= 0.0 && low <= 1.0)) throw Error(fmt::format("press leankv: low={} must be in [0, 1]", low));
    KVCodec k, v;
    try {
      k = parse_codec(param_str(p, "leankv", "k_low"));
      v = parse_codec(param_str(p, "leankv", "v_low"));
    } catch (const Error& e) {
      throw Error(fmt::format("press leankv: {}", e.what()));
    }
    return std::make_unique<PrecisionTiersPress>(std::move(inner), low, k, v);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
