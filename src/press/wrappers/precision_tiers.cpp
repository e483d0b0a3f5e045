// LeanKV-style precision tiers: the inner scorer's scores split each (layer, KV head)'s entries
// into high precision (the cache's codecs), low precision (cheaper row codecs, keys allowed more
// bits than values) and evicted. Zhang et al., "Unifying KV Cache Compression for Large Language
// Models with LeanKV", arXiv 2412.03131 (Hetero-KV: keys above values; per-head precision by
// significance).
//
// Two ways to size the tiers:
// - by ratio (default, mass=0): the inner press's budget policy decides how many entries each
//   segment keeps, and the lowest-scored fraction `low` of them goes to the low tier;
// - per-head dynamic sparsity (mass > 0, LeanKV's per-head and per-request allocation): in every
//   segment, the inner scores (attention mass: use an attention scorer such as snapkv or
//   observed_attention; negative scores count as 0) are normalised to sum 1; the fewest
//   highest-scored entries holding `mass` of it are kept and the fewest holding `mass_high` of it
//   stay in the high tier, the rest of the kept ones go to the low tier, everything else is
//   evicted (at least one entry stays). Entries the inner press chooses first (its window or sinks)
//   are kept in the high tier outside the normalisation. The compression ratio is then whatever
//   the attention distribution of each head gives; it is reported, not requested.
// K at higher precision than V (Hetero-KV): the low tier's codecs default to K q8_0 / V q4_0 (K8V4)
// under an f16 high tier; with -ctk q8_0 -ctv q4_0 the high tier is K8V4 itself. A 2-bit row codec
// (the paper's K4V2 low tier) is not in the cache yet.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "kernels/threads.h"
#include "press/authoring.h"
#include "press/wrappers/precision_tiers.h"
#include "press/ranking.h"

namespace kvslim {

void apply_precision_tiers(Segment& seg, const std::vector<float>& scores, int n_high, int n_low, KVCodec low_key,
                           KVCodec low_value, float protect) {
  const int n = static_cast<int>(seg.size());
  if (static_cast<int>(scores.size()) != n)
    throw Error(fmt::format("precision tiers: {} scores for a segment of {} entries", scores.size(), n));
  if (n_high < 0 || n_low < 0)
    throw Error(fmt::format("precision tiers: negative counts (high {}, low {})", n_high, n_low));
  int n_prot = 0;
  for (float s : scores) n_prot += s >= protect;
  n_high = std::clamp(std::max(n_high, n_prot), 0, n);
  n_low = std::clamp(n_low, 0, n - n_high);
  const std::vector<int32_t> order = rank_entries(scores);
  std::vector<uint8_t> tier(n, 2);  // 0 high, 1 low, 2 evicted
  for (int r = 0; r < n_high + n_low; ++r) tier[order[r]] = r < n_high ? 0 : 1;
  std::vector<int32_t> idx;
  std::vector<uint8_t> low;
  for (int i = 0; i < n; ++i)
    if (tier[i] < 2) {
      idx.push_back(i);
      low.push_back(tier[i]);
    }
  seg.retain_tiered(idx, low, low_key, low_value);
}

namespace {

class PrecisionTiersPress : public PressImpl {
 public:
  PrecisionTiersPress(std::unique_ptr<PressImpl> inner, double low, KVCodec k_low, KVCodec v_low, double mass,
                      double mass_high)
      : inner_(std::move(inner)), low_(low), k_low_(k_low), v_low_(v_low), mass_(mass), mass_high_(mass_high) {
    scorer_ = inner_->scorer();
    if (!scorer_)
      throw Error(fmt::format("press leankv: '{}' is not a scorer press (use e.g. leankv(snapkv))", inner_->describe()));
  }
  std::string describe() const override {
    return fmt::format("leankv({}):low={},k_low={},v_low={},mass={},mass_high={}", inner_->describe(), low_,
                       codec_name(k_low_), codec_name(v_low_), mass_, mass_high_);
  }
  ObservationNeeds needs() const override { return inner_->needs(); }
  ObservationNeeds decode_needs() const override { return inner_->decode_needs(); }
  void observe(const KVCache& c, const Model& m, const Observation& o) override { inner_->observe(c, m, o); }
  void reset() override { inner_->reset(); }
  double ratio() const override { return inner_->ratio(); }
  double key_channel_ratio() const override { return inner_->key_channel_ratio(); }
  void set_ratio(double r) override { inner_->set_ratio(r); }
  size_t kept_after(const Target& t) const override { return inner_->kept_after(t); }

  /// Per-head dynamic sparsity: how many entries stay in the high and low tiers of a segment with
  /// these scores (see the top of the file).
  static void dynamic_counts(const std::vector<float>& sc, double mass, double mass_high, int& n_high, int& n_low) {
    std::vector<double> v;
    int first = 0;
    for (float s : sc) {
      if (s >= kPreferred)
        ++first;
      else
        v.push_back(std::isnan(s) ? 0.0 : std::max(0.0, double(s)));
    }
    std::sort(v.begin(), v.end(), std::greater<double>());
    double total = 0;
    for (double x : v) total += x;
    auto fewest = [&](double m) {
      double c = 0;
      int i = 0;
      while (i < static_cast<int>(v.size()) && c < m * total * (1 - 1e-12)) c += v[i++];
      return i;
    };
    const int keep = fewest(mass), high = std::min(keep, fewest(mass_high));
    n_high = first + high;
    n_low = keep - high;
    if (n_high + n_low == 0 && !sc.empty()) n_high = 1;
  }

  void apply(KVCache& cache, const Model& model, const Observation& obs, const Target& target) override {
    if (mass_ > 0.0) {
      Scores scores = scorer_->score_all(cache, model, obs, target);
      const int L = cache.n_layer(), H = cache.n_head_kv();
      parallel_for(static_cast<int64_t>(L) * H, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const int l = static_cast<int>(i / H), h = static_cast<int>(i % H);
          int n_high = 0, n_low = 0;
          dynamic_counts(scores[l][h], mass_, mass_high_, n_high, n_low);
          apply_precision_tiers(cache.seg(l, h), scores[l][h], n_high, n_low, k_low_, v_low_, kProtected);
        }
      });
      return;
    }
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
  std::unique_ptr<PressImpl> inner_;
  ScorerPress* scorer_ = nullptr;
  double low_;
  KVCodec k_low_, v_low_;
  double mass_, mass_high_;
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "leankv";
  i.summary = "wrapper: of the entries a scorer keeps, the lowest-scored fraction `low` is re-encoded in cheaper "
              "codecs (k_low / v_low); with mass > 0, per-head dynamic sparsity: keep the entries holding `mass` "
              "of each head's attention, the top `mass_high` of it at full precision";
  i.source = "Zhang et al. 2024, Unifying KV Cache Compression for Large Language Models with LeanKV, arXiv 2412.03131";
  i.params = {{"low", "0.5"}, {"k_low", "q8_0"}, {"v_low", "q4_0"}, {"mass", "0"}, {"mass_high", "0.9"}};
  i.kind = PressKind::Wrapper;
  i.default_inner = "snapkv";
  i.make_wrapper = [](const PressParams& p, std::unique_ptr<PressImpl> inner) -> std::unique_ptr<PressImpl> {
    const double low = param_double(p, "leankv", "low");
    if (!(low >= 0.0 && low <= 1.0)) throw Error(fmt::format("press leankv: low={} must be in [0, 1]", low));
    KVCodec k, v;
    try {
      k = parse_codec(param_str(p, "leankv", "k_low"));
      v = parse_codec(param_str(p, "leankv", "v_low"));
    } catch (const Error& e) {
      throw Error(fmt::format("press leankv: {}", e.what()));
    }
    const double mass = param_double(p, "leankv", "mass"), mass_high = param_double(p, "leankv", "mass_high");
    if (!(mass >= 0.0 && mass <= 1.0)) throw Error(fmt::format("press leankv: mass={} must be in [0, 1]", mass));
    if (!(mass_high >= 0.0 && mass_high <= 1.0))
      throw Error(fmt::format("press leankv: mass_high={} must be in [0, 1]", mass_high));
    return std::make_unique<PrecisionTiersPress>(std::move(inner), low, k, v, mass, mass_high);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
