#pragma once
// Presses: methods that decide which KV cache entries to keep (kvpress's term). A score-based
// press = a scorer (one score per entry; higher is kept) + a budget policy (how many entries each
// (layer, KV head) keeps) + selection; the cache then retains exactly the chosen entries.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvslim/kv_cache.h"
#include "kvslim/model.h"
#include "kvslim/session.h"

namespace kvslim {

/// Score of entries that must never be evicted (sinks, observation window, sliding window).
constexpr float kProtected = 3.0e38f;

/// scores[layer][kv head][entry], aligned with the cache segments.
using Scores = std::vector<std::vector<std::vector<float>>>;
/// keep[layer][kv head]: how many entries each segment keeps.
using KeepCounts = std::vector<std::vector<int>>;

/// What a press sees of one layer when it compresses.
class LayerView {
 public:
  LayerView(const Model& model, const KVCache& cache, const Observation& obs, int layer);
  int layer() const { return layer_; }
  const HParams& hp() const { return model_.hparams(); }
  const Model& model() const { return model_; }
  const Segment& seg(int kv_head) const { return cache_.seg(layer_, kv_head); }
  const Observation& obs() const { return obs_; }
  /// Observation-window queries of query head qh: [n_window][head_dim], RoPE applied.
  const float* window_queries(int qh) const;
  int n_window() const { return obs_.n_window(); }
  /// Softmax attention of the observation-window queries of every query head of KV head h's
  /// GQA group over the segment's entries (causal: a query sees entries at positions <= its own):
  /// [group][n_window][n_entries]. Computed once per (layer, KV head) and shared.
  const std::vector<float>& window_attention(int kv_head) const;

 private:
  const Model& model_;
  const KVCache& cache_;
  const Observation& obs_;
  int layer_;
  mutable std::map<int, std::vector<float>> attn_;
};

/// Base of all presses.
class Press {
 public:
  virtual ~Press() = default;
  /// Registry name with parameters, e.g. "snapkv:window=64,kernel=5,ratio=0.5".
  virtual std::string describe() const = 0;
  /// What the forward pass must record for compress().
  virtual ObservationRequest request() const { return {}; }
  /// Compresses `cache` after a prefill step (the whole context, or one chunk of it when
  /// prefill is chunked). `obs` holds what request() asked for.
  virtual void compress(KVCache& cache, const Model& model, const Observation& obs) = 0;
  /// Called after each decode step; decoding presses evict here. Default: nothing.
  virtual void after_decode(KVCache& cache, const Model& model, const Observation& obs) {}
  /// Forgets per-request state (a press object may serve several requests).
  virtual void reset() {}
  /// The compression ratio asked for (fraction of context entries to remove).
  virtual double ratio() const { return 0.0; }
};

/// Turns scores into keep-counts per (layer, KV head).
class BudgetPolicy {
 public:
  virtual ~BudgetPolicy() = default;
  virtual std::string describe() const = 0;
  /// keep[l][h] for removing `ratio` of the entries. Implementations call clamp_keep().
  virtual KeepCounts keep_counts(const Scores& scores, const KVCache& cache, double ratio) const = 0;
};

/// floor(n * (1 - ratio)), at least 1 (when n > 0) and at most n.
int uniform_keep(size_t n, double ratio);

/// Uniform policy: every segment keeps uniform_keep(n, ratio).
class UniformBudget : public BudgetPolicy {
 public:
  std::string describe() const override { return "uniform"; }
  KeepCounts keep_counts(const Scores& scores, const KVCache& cache, double ratio) const override;
};

/// Keeps, in segment (l, h), the keep[l][h] highest-scoring entries plus every entry scored
/// kProtected; ties go to the later entry. Returns the increasing indices kept.
std::vector<int32_t> select_top(const std::vector<float>& scores, int keep);

/// A press defined by a per-layer scorer and a budget policy.
class ScorerPress : public Press {
 public:
  explicit ScorerPress(double ratio, std::unique_ptr<BudgetPolicy> policy = nullptr);
  void compress(KVCache& cache, const Model& model, const Observation& obs) override;
  double ratio() const override { return ratio_; }
  /// Scores of layer `view.layer()`: out[kv head][entry]. Protected entries get kProtected.
  virtual void score(const LayerView& view, std::vector<std::vector<float>>& out) const = 0;
  const BudgetPolicy& policy() const { return *policy_; }
  void set_policy(std::unique_ptr<BudgetPolicy> p) { policy_ = std::move(p); }

 protected:
  double ratio_;
  std::unique_ptr<BudgetPolicy> policy_;
};

/// Parameters of a press as given on the command line: name -> value text.
using PressParams = std::map<std::string, std::string>;

/// A registered press: its parameters with defaults, its source, and a factory.
struct PressInfo {
  std::string name;
  std::string summary;
  std::string source;  ///< paper and arXiv id
  std::vector<std::pair<std::string, std::string>> params;  ///< name, default value
  std::function<std::unique_ptr<Press>(const PressParams&)> make;
};

/// All presses, by name.
class PressRegistry {
 public:
  static PressRegistry& instance();
  void add(PressInfo info);
  const PressInfo* find(const std::string& name) const;
  std::vector<const PressInfo*> all() const;

 private:
  std::map<std::string, PressInfo> presses_;
};

/// Registers a press at static-initialization time: `static PressRegistrar r({...});`.
struct PressRegistrar {
  explicit PressRegistrar(PressInfo info) { PressRegistry::instance().add(std::move(info)); }
};

/// Builds a press from a spec "name[:key=value,...]". `ratio` (the --compression-ratio value)
/// fills the `ratio` parameter unless the spec sets it. Throws kvslim::Error for an unknown press
/// or parameter, or a value out of range, naming it.
std::unique_ptr<Press> make_press(const std::string& spec, double ratio);

/// Typed parameter readers for factories; errors name the press, the key and the value.
double param_double(const PressParams& p, const std::string& press, const std::string& key);
int param_int(const PressParams& p, const std::string& press, const std::string& key);
std::string param_str(const PressParams& p, const std::string& press, const std::string& key);
/// Checks 0 <= ratio < 1, else kvslim::Error.
void check_ratio(double ratio, const std::string& press);

}  // namespace kvslim
