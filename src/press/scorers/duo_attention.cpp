// DuoAttention: the press that keeps every entry in retrieval heads and only sinks + recent entries
// in streaming heads, and the labels it reads (calibrated by train/duo_calibrate.h).
// Xiao et al., "DuoAttention: Efficient Long-Context LLM Inference with Retrieval and Streaming
// Heads", arXiv 2410.10819.
#include "press/scorers/duo_attention.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>

#include <fmt/format.h>

#include "attention/attention.h"
#include "kernels/threads.h"
#include "kvslim/gguf.h"
#include "press/authoring.h"
#include "press/param_file.h"

namespace kvslim {

void DuoLabels::save(const std::string& path) const {
  GGUFWriter w;
  w.set("general.architecture", GGUFValue::str("duo_attention"));
  w.set("duo.base_model", GGUFValue::str(base_model));
  w.set("duo.sink", GGUFValue::u32(sink));
  w.set("duo.recent", GGUFValue::u32(recent));
  w.set("duo.method", GGUFValue::str(method));
  if (method == "gates") w.set("duo.reg", GGUFValue::f32(static_cast<float>(reg)));
  const int L = static_cast<int>(score.size()), H = L ? static_cast<int>(score[0].size()) : 0;
  w.set("duo.n_layer", GGUFValue::u32(L));
  w.set("duo.n_head_kv", GGUFValue::u32(H));
  std::vector<float> flat;
  for (const auto& row : score) flat.insert(flat.end(), row.begin(), row.end());
  w.add_tensor_f32("duo.head_scores", GGMLType::F32, {H, L}, flat);
  if (!cost.empty()) {
    if (cost.size() != score.size()) throw Error(fmt::format("{}: {} cost rows for {} layers", path, cost.size(), L));
    std::vector<float> c;
    for (const auto& row : cost) c.insert(c.end(), row.begin(), row.end());
    if (c.size() != flat.size()) throw Error(fmt::format("{}: {} costs for {} heads", path, c.size(), flat.size()));
    w.add_tensor_f32("duo.head_costs", GGMLType::F32, {H, L}, c);
  }
  w.write(path);
}

DuoLabels DuoLabels::load(const std::string& path) {
  auto f = GGUFFile::open(path);
  DuoLabels d;
  d.base_model = f->has("duo.base_model") ? f->get_string("duo.base_model") : "";
  d.sink = static_cast<int>(f->get_int("duo.sink"));
  d.recent = static_cast<int>(f->get_int("duo.recent"));
  // Files from before gate training hold deviation scores.
  d.method = f->has("duo.method") ? f->get_string("duo.method") : "deviation";
  if (d.method != "gates" && d.method != "deviation")
    throw Error(fmt::format("{}: duo.method '{}' is neither 'gates' nor 'deviation'", path, d.method));
  if (f->has("duo.reg")) d.reg = f->get_float("duo.reg");
  const int64_t L = f->get_int("duo.n_layer"), H = f->get_int("duo.n_head_kv");
  if (L < 1 || H < 1 || d.sink < 0 || d.recent < 0)
    throw Error(fmt::format("{}: bad labels shape (duo.n_layer {}, duo.n_head_kv {}, duo.sink {}, duo.recent {})", path,
                            L, H, d.sink, d.recent));
  // One [layer][KV head] table of the file, its size checked against the shape.
  auto per_head = [&](const TensorInfo& t) {
    if (t.nelements() != L * H)
      throw Error(fmt::format("{}: {} has {} values, expected {} x {}", path, t.name, t.nelements(), L, H));
    const std::vector<float> flat = f->tensor_f32(t);
    std::vector<std::vector<float>> out(L, std::vector<float>(H));
    for (int64_t l = 0; l < L; ++l)
      for (int64_t h = 0; h < H; ++h) out[l][h] = flat[l * H + h];
    return out;
  };
  d.score = per_head(f->tensor("duo.head_scores"));
  if (const TensorInfo* costs = f->find_tensor("duo.head_costs")) d.cost = per_head(*costs);
  return d;
}

void DuoLabels::check(const HParams& hp, const std::string& what) const {
  if (static_cast<int>(score.size()) != hp.n_layer || (hp.n_layer > 0 && static_cast<int>(score[0].size()) != hp.n_head_kv))
    throw Error(fmt::format("{}: labels for {} layers x {} KV heads do not fit the model ({} x {})", what, score.size(),
                            score.empty() ? 0 : score[0].size(), hp.n_layer, hp.n_head_kv));
}

std::vector<std::vector<uint8_t>> DuoLabels::streaming(double head_ratio) const {
  if (!(head_ratio >= 0.0 && head_ratio <= 1.0))
    throw Error(fmt::format("duo_attention: head_ratio {} is outside [0, 1]", head_ratio));
  std::vector<std::pair<int, int>> heads;
  for (size_t l = 0; l < score.size(); ++l)
    for (size_t h = 0; h < score[l].size(); ++h) heads.emplace_back(static_cast<int>(l), static_cast<int>(h));
  const bool costs = cost.size() == score.size();
  std::stable_sort(heads.begin(), heads.end(), [&](auto a, auto b) {
    const float sa = score[a.first][a.second], sb = score[b.first][b.second];
    if (sa != sb || !costs) return sa < sb;
    return cost[a.first][a.second] < cost[b.first][b.second];
  });
  const size_t n = static_cast<size_t>(std::llround(head_ratio * heads.size()));
  std::vector<std::vector<uint8_t>> m(score.size());
  for (size_t l = 0; l < score.size(); ++l) m[l].assign(score[l].size(), 0);
  for (size_t i = 0; i < n && i < heads.size(); ++i) m[heads[i].first][heads[i].second] = 1;
  return m;
}

namespace {
// Set at start-up by the calibration module (train/duo_calibrate.cpp), which comes after the press
// in the module order: the press calls it, never includes it.
DuoAutoCalibration auto_calibration = nullptr;
}  // namespace

void set_duo_auto_calibration(DuoAutoCalibration f) { auto_calibration = f; }

namespace {

/// Streaming heads keep their first `sink` entries and the entries of the `recent` newest
/// positions, in prefill and after every decode step; retrieval heads keep everything.
class DuoAttentionPress : public PressImpl {
 public:
  DuoAttentionPress(std::shared_ptr<const DuoLabels> labels, std::string path, double head_ratio, int sink, int recent)
      : labels_(std::move(labels)), path_(std::move(path)), head_ratio_(head_ratio), sink_(sink), recent_(recent) {}
  std::string describe() const override {
    return fmt::format("duo_attention:labels={},head_ratio={},sink={},recent={}", path_, head_ratio_, sink_, recent_);
  }
  void apply(KVCache& cache, const Model& model, const Observation& obs, const Target& target) override {
    trim(cache, model);
  }
  void after_decode(KVCache& cache, const Model& model, const Observation& obs) override { trim(cache, model); }
  bool evicts_in_decode() const override { return true; }
  std::string report() const override {
    if (streaming_.empty()) return {};
    size_t n = 0, all = 0;
    for (const auto& row : streaming_)
      for (auto x : row) n += x, ++all;
    return fmt::format("duo_attention: {} of {} (layer, KV head) pairs streaming (sinks {} + recent {}), {} evicted",
                       n, all, sink_, recent_, evicted_);
  }
  void reset() override { evicted_ = 0; }
  /// Streaming heads chosen for the current model (empty before the first compression).
  const std::vector<std::vector<uint8_t>>& streaming() const { return streaming_; }

 private:
  void prepare(const Model& model) {
    if (prepared_ == &model) return;
    if (!labels_ && head_ratio_ == 0.0) {
      // No head streams (kvpress's default head_compression_ratio 0): nothing to calibrate.
      const HParams& hp = model.hparams();
      streaming_.assign(hp.n_layer, std::vector<uint8_t>(hp.n_head_kv, 0));
      prepared_ = &model;
      return;
    }
    if (!labels_) {
      // No labels file: calibrate once, with the defaults shortened to what the model can hold.
      std::lock_guard<std::mutex> lock(calibration_mutex());
      // Keyed by file, not by address: a later model may reuse a freed one's address.
      auto& cached = calibrated()[model.file().path()];
      if (!cached) {
        if (!auto_calibration)
          throw Error("duo_attention: no labels file (labels=FILE, from `kvslim duo-calibrate`) and no calibration "
                      "linked in to make them");
        cached = std::make_shared<const DuoLabels>(auto_calibration(model));
      }
      labels_ = cached;
    }
    labels_->check(model.hparams(), path_.empty() ? "duo_attention" : path_);
    streaming_ = labels_->streaming(head_ratio_);
    if (sink_ == 0 && recent_ == 0) {
      sink_ = labels_->sink;
      recent_ = labels_->recent;
    }
    prepared_ = &model;
  }
  void trim(KVCache& cache, const Model& model) {
    prepare(model);
    for (int l = 0; l < cache.n_layer(); ++l)
      for (int h = 0; h < cache.n_head_kv(); ++h) {
        if (!streaming_[l][h]) continue;
        Segment& s = cache.seg(l, h);
        if (s.size() == 0) continue;
        const int32_t first_recent = s.positions().back() + 1 - recent_;
        std::vector<int32_t> keep;
        for (size_t i = 0; i < s.size(); ++i)
          if (i < static_cast<size_t>(sink_) || s.positions()[i] >= first_recent) keep.push_back(static_cast<int32_t>(i));
        evicted_ += s.size() - keep.size();
        if (keep.size() < s.size()) s.retain(keep);
      }
  }
  static std::mutex& calibration_mutex() {
    static std::mutex m;
    return m;
  }
  static std::map<std::string, std::shared_ptr<const DuoLabels>>& calibrated() {
    static std::map<std::string, std::shared_ptr<const DuoLabels>> c;
    return c;
  }

  std::shared_ptr<const DuoLabels> labels_;
  std::string path_;
  double head_ratio_;
  int sink_, recent_;
  const Model* prepared_ = nullptr;
  std::vector<std::vector<uint8_t>> streaming_;
  size_t evicted_ = 0;
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "duo_attention";
  i.kvpress = {"DuoAttentionPress"};
  i.summary = "retrieval heads keep every entry, streaming heads keep sinks + recent; the head_ratio lowest "
              "gates stream (gates fitted by `kvslim duo-calibrate` to the paper's objective, linearised; or "
              "fitted on first use)";
  i.source = "Xiao et al. 2024, DuoAttention: Efficient Long-Context LLM Inference with Retrieval and Streaming "
             "Heads, arXiv 2410.10819; reference: github.com/mit-han-lab/duo-attention (duo_attn/train.py for the "
             "gates) and kvpress/presses/duo_attention_press.py (128 sinks + 256 recent)";
  // head_ratio 0 by default: kvpress's head_compression_ratio default (no head streams).
  i.params = {{"head_ratio", "0", "head_compression_ratio",
               {.type = ParamType::Float,
                .help = "the fraction of heads made streaming (those with the lowest gates)"}},
              {"labels", "", {},
               {.type = ParamType::Str, .help = "a gates file (`kvslim duo-calibrate`); '': fitted on first use"}},
              {"sink", "0", {}, kKvslimOnly},
              {"recent", "0", {}, kKvslimOnly}};
  i.make = [](const PressParams& p) -> std::unique_ptr<PressImpl> {
    std::string path = param_file(p, "duo_attention", "labels");
    double r = param_double(p, "duo_attention", "head_ratio");
    int sink = param_int(p, "duo_attention", "sink"), recent = param_int(p, "duo_attention", "recent");
    if (!(r >= 0.0 && r <= 1.0)) throw Error(fmt::format("press duo_attention: head_ratio={} must be in [0, 1]", r));
    if (sink < 0 || recent < 0)
      throw Error(fmt::format("press duo_attention: sink={} and recent={} must be >= 0", sink, recent));
    if ((sink == 0) != (recent == 0) && recent == 0)
      throw Error("press duo_attention: give recent (> 0) with sink, or neither to use the labels' values");
    std::shared_ptr<const DuoLabels> labels;
    if (!path.empty()) labels = std::make_shared<const DuoLabels>(DuoLabels::load(path));
    return std::make_unique<DuoAttentionPress>(labels, path, r, sink, recent);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
