// KVzap: surrogate of KVzip+ scores (linear by ridge regression, or a GELU MLP trained with AdamW),
// applied as a threshold press with a sliding window in prefill and decode.
// Jegou et al., "KVzap: Fast, Adaptive, and Faithful KV Cache Pruning", arXiv 2601.07891.
#include "press/scorers/kvzap.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include <cblas.h>
#include <fmt/format.h>

#include "kernels/threads.h"
#include "kvslim/gguf.h"
#include "press/authoring.h"
#include "press/param_file.h"

namespace kvslim {

float kvzap_gelu(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }

void kvzap_linear(const float* X, int n, int in, const float* W, const float* b, int o, float* Y) {
  for (int t = 0; t < n; ++t) std::copy(b, b + o, Y + static_cast<size_t>(t) * o);
  BlasSlot slot1;  // see kernels/threads.h
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, o, in, 1.0f, X, in, W, in, 1.0f, Y, o);
}

void KVzapSurrogate::predict(int layer, const float* x, int n, float* out) const {
  if (n <= 0) return;
  if (kind == Kind::Linear) {
    kvzap_linear(x, n, input_dim, w1[layer].data(), b1[layer].data(), output_dim, out);
    return;
  }
  std::vector<float> h(static_cast<size_t>(n) * hidden_dim);
  kvzap_linear(x, n, input_dim, w1[layer].data(), b1[layer].data(), hidden_dim, h.data());
  for (float& v : h) v = kvzap_gelu(v);
  kvzap_linear(h.data(), n, hidden_dim, w2[layer].data(), b2[layer].data(), output_dim, out);
}

void KVzapSurrogate::save(const std::string& path, const std::string& model_desc) const {
  GGUFWriter w;
  w.set("general.architecture", GGUFValue::str("kvzap"));
  w.set("kvzap.kind", GGUFValue::str(kind_name()));
  w.set("kvzap.base_model", GGUFValue::str(model_desc));
  w.set("kvzap.n_layer", GGUFValue::u32(n_layer));
  w.set("kvzap.input_dim", GGUFValue::u32(input_dim));
  w.set("kvzap.output_dim", GGUFValue::u32(output_dim));
  w.set("kvzap.hidden_dim", GGUFValue::u32(kind == Kind::MLP ? hidden_dim : 0));
  const int mid = kind == Kind::MLP ? hidden_dim : output_dim;
  for (int l = 0; l < n_layer; ++l) {
    w.add_tensor_f32(fmt::format("kvzap.{}.w1", l), GGMLType::F32, {input_dim, mid}, w1[l]);
    w.add_tensor_f32(fmt::format("kvzap.{}.b1", l), GGMLType::F32, {mid}, b1[l]);
    if (kind == Kind::MLP) {
      w.add_tensor_f32(fmt::format("kvzap.{}.w2", l), GGMLType::F32, {hidden_dim, output_dim}, w2[l]);
      w.add_tensor_f32(fmt::format("kvzap.{}.b2", l), GGMLType::F32, {output_dim}, b2[l]);
    }
  }
  w.write(path);
}

KVzapSurrogate KVzapSurrogate::load(const std::string& path) {
  auto f = GGUFFile::open(path);
  KVzapSurrogate s;
  std::string kind = f->get_string("kvzap.kind");
  if (kind == "linear") s.kind = Kind::Linear;
  else if (kind == "mlp") s.kind = Kind::MLP;
  else throw Error(fmt::format("{}: kvzap.kind '{}' is neither linear nor mlp", path, kind));
  s.n_layer = static_cast<int>(f->get_int("kvzap.n_layer"));
  s.input_dim = static_cast<int>(f->get_int("kvzap.input_dim"));
  s.output_dim = static_cast<int>(f->get_int("kvzap.output_dim"));
  s.hidden_dim = static_cast<int>(f->get_int("kvzap.hidden_dim", 0));
  if (s.n_layer < 1 || s.input_dim < 1 || s.output_dim < 1 || (s.kind == Kind::MLP && s.hidden_dim < 1))
    throw Error(fmt::format("{}: bad kvzap shape (n_layer {}, input_dim {}, output_dim {}, hidden_dim {})", path,
                            s.n_layer, s.input_dim, s.output_dim, s.hidden_dim));
  const int mid = s.kind == Kind::MLP ? s.hidden_dim : s.output_dim;
  auto get = [&](const std::string& name, int64_t count) {
    const TensorInfo& t = f->tensor(name);
    if (t.nelements() != count)
      throw Error(fmt::format("{}: tensor {} has {} values, expected {}", path, name, t.nelements(), count));
    return f->tensor_f32(t);
  };
  for (int l = 0; l < s.n_layer; ++l) {
    s.w1.push_back(get(fmt::format("kvzap.{}.w1", l), int64_t(mid) * s.input_dim));
    s.b1.push_back(get(fmt::format("kvzap.{}.b1", l), mid));
    if (s.kind == Kind::MLP) {
      s.w2.push_back(get(fmt::format("kvzap.{}.w2", l), int64_t(s.output_dim) * s.hidden_dim));
      s.b2.push_back(get(fmt::format("kvzap.{}.b2", l), s.output_dim));
    }
  }
  return s;
}

void KVzapSurrogate::check(const HParams& hp, const std::string& what) const {
  if (n_layer != hp.n_layer || input_dim != hp.n_embd || output_dim != hp.n_head_kv)
    throw Error(fmt::format("{}: surrogate for {} layers, n_embd {}, {} KV heads does not fit the model ({} layers, "
                            "n_embd {}, {} KV heads)",
                            what, n_layer, input_dim, output_dim, hp.n_layer, hp.n_embd, hp.n_head_kv));
}

namespace {

/// Makes the `threshold` policy (DMS: sliding window, then score < tau leaves).
std::unique_ptr<BudgetPolicy> threshold_policy(double tau, int window, bool decoding) {
  const PressInfo* t = PressRegistry::instance().find("threshold");
  if (!t || !t->make_policy) throw Error("press kvzap: the threshold policy is not registered");
  return t->make_policy({{"tau", fmt::format("{}", tau)}, {"window", fmt::format("{}", window)},
                         {"decode", decoding ? "1" : "0"}});
}

/// KVzap's scorer: each entry gets the surrogate's prediction from its token's attention input
/// when it is created (prefill and decode), kept by position. By default under the threshold
/// policy (DMS), which evicts what leaves the sliding window under tau.
class KVzapPress : public ScorerPress, private LayerHook {
 public:
  KVzapPress(std::shared_ptr<const KVzapSurrogate> s, std::string path, double tau, int window, bool decoding)
      : ScorerPress(0.0, threshold_policy(tau, window, decoding)),
        sur_(std::move(s)),
        path_(std::move(path)),
        default_policy_(policy().describe()),
        tau_(tau),
        window_(window),
        decoding_(decoding) {}

  std::string describe_scorer() const override { return fmt::format("kvzap:surrogate={}", path_); }
  // The threshold policy is KVzap's own: the spec stays "kvzap:..." so that it parses back.
  std::string describe() const override {
    if (policy().describe() != default_policy_) return ScorerPress::describe();
    return fmt::format("kvzap:surrogate={},threshold={},window={},decoding={}", path_, tau_, window_, decoding_ ? 1 : 0);
  }
  ObservationNeeds scorer_needs() const override {
    ObservationNeeds r;
    // The press itself, as the hook that scores every entry from its attention input.
    r.hooks.push_back(const_cast<KVzapPress*>(this));
    return r;
  }
  // Scoring happens in the forward pass; decode steps need it whether or not the policy acts then.
  ObservationNeeds decode_needs() const override { return scorer_needs(); }
  void reset() override {
    ScorerPress::reset();
    scores_.clear();
    scored_ = 0;
  }
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override {
    const int l = view.layer();
    for (int h = 0; h < view.hp().n_head_kv; ++h) {
      const Segment& s = view.seg(h);
      out[h].resize(s.size());
      for (size_t i = 0; i < s.size(); ++i) {
        // Entries created without the surrogate watching (e.g. a question) are never evicted.
        float v = kProtected;
        if (l < static_cast<int>(scores_.size())) {
          auto it = scores_[l][h].find(s.positions()[i]);
          if (it != scores_[l][h].end()) v = it->second;
        }
        out[h][i] = v;
      }
    }
  }
  void apply(KVCache& cache, const Model& model, const Observation& obs, const Target& target) override {
    if (checked_ != &model) {
      sur_->check(model.hparams(), path_);
      checked_ = &model;
    }
    ScorerPress::apply(cache, model, obs, target);
    for (size_t l = 0; l < scores_.size(); ++l)
      for (size_t h = 0; h < scores_[l].size(); ++h) {
        const auto& pos = cache.seg(static_cast<int>(l), static_cast<int>(h)).positions();
        std::map<int32_t, float> kept;
        for (int32_t p : pos) {
          auto it = scores_[l][h].find(p);
          if (it != scores_[l][h].end()) kept.emplace_hint(kept.end(), *it);
        }
        scores_[l][h].swap(kept);
      }
  }
  /// Entries the surrogate scored in this request.
  size_t scored() const { return scored_; }
  std::string report() const override {
    size_t kept = 0;
    for (const auto& layer : scores_)
      for (const auto& m : layer) kept += m.size();
    if (!scored_) return {};
    return fmt::format("kvzap: {} entries scored by the {} surrogate, {} still cached: {:.1f}% of them evicted",
                       scored_, sur_->kind_name(), kept, 100.0 * (1.0 - double(kept) / scored_));
  }

 private:
  void after_qkv(const LayerStep& s) override { predict(s.layer, s.attn_input, s.n, s.hp->n_embd, s.positions); }
  void predict(int layer, const float* x, int n, int dim, const int32_t* pos) {
    if (dim != sur_->input_dim)
      throw Error(fmt::format("{}: surrogate input_dim {} does not fit the model's n_embd {}", path_, sur_->input_dim,
                              dim));
    if (layer >= sur_->n_layer || n <= 0) return;
    const int H = sur_->output_dim;
    if (scores_.size() != static_cast<size_t>(sur_->n_layer)) scores_.assign(sur_->n_layer, std::vector<std::map<int32_t, float>>(H));
    std::vector<float> out(static_cast<size_t>(n) * H);
    sur_->predict(layer, x, n, out.data());
    for (int t = 0; t < n; ++t)
      for (int h = 0; h < H; ++h) scores_[layer][h][pos[t]] = out[static_cast<size_t>(t) * H + h];
    scored_ += static_cast<size_t>(n) * H;
  }

  std::shared_ptr<const KVzapSurrogate> sur_;
  std::string path_, default_policy_;
  double tau_;
  int window_;
  bool decoding_;
  const Model* checked_ = nullptr;
  std::vector<std::vector<std::map<int32_t, float>>> scores_;  // [layer][kv head]: position -> score
  size_t scored_ = 0;
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "kvzap";
  i.kvpress = {"KVzapPress"};
  i.summary = "surrogate-predicted KVzip+ scores at entry creation; default policy threshold (evict below tau once "
              "outside a sliding window, in prefill and decode)";
  i.source = "Jegou et al. 2026, KVzap: Fast, Adaptive, and Faithful KV Cache Pruning, arXiv 2601.07891";
  // kvpress runs KVzap under DMSPress, whose names the window and decoding take.
  i.params = {{"surrogate", "", {}, {.type = ParamType::Str, .help = "the surrogate file (`kvslim kvzap-train`)"}},
              {"threshold", "-4", {}, {.type = ParamType::Float, .help = "entries scoring below it leave"}},
              {"window", "128", "sliding_window_size", {.help = "the newest entries, never evicted"}},
              {"decoding", "1", {}, {.type = ParamType::Bool, .help = "evict during decode too"}}};
  i.make = [](const PressParams& p) -> std::unique_ptr<PressImpl> {
    std::string path = param_file(p, "kvzap", "surrogate");
    double tau = param_double(p, "kvzap", "threshold");
    int window = param_int(p, "kvzap", "window"), dec = param_int(p, "kvzap", "decoding");
    if (window < 0) throw Error(fmt::format("press kvzap: window={} must be >= 0", window));
    if (dec != 0 && dec != 1) throw Error(fmt::format("press kvzap: decoding={} must be 0 or 1", dec));
    if (path.empty()) throw Error("press kvzap: give surrogate=FILE (train one with `kvslim kvzap-train`)");
    auto s = std::make_shared<const KVzapSurrogate>(KVzapSurrogate::load(path));
    return std::make_unique<KVzapPress>(s, path, tau, window, dec == 1);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
