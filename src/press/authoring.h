#pragma once
// Writing a press (internal to the library): what the forward pass records for a press
// (ObservationNeeds, Observation), what a press sees of one layer (LayerView), the step's target,
// score conventions (kProtected, kPreferred), budget policies, the scorer-press base, parameter
// readers for factories and registration, and PressImpl, the interface every press implements.
// kvslim/press.h holds the public part (Press, the registry, make_press).
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kv/cache.h"
#include "kvslim/model.h"
#include "kvslim/press.h"
#include "model/session.h"
#include "model/layer_hook.h"

namespace kvslim {

class ScorerPress;
class KnobControl;  // press/knobs.h

/// What a press needs from the forward pass while a step runs. The plain needs are recorded by the
/// hooks of src/press/recorders.h into an Observation; `hooks` are the press's own (Expected
/// Attention's query statistics, KVzap's surrogate, ClusterKV's selection), called at every layer
/// of every batch of the step.
struct ObservationNeeds {
  int window = 0;                  ///< queries (RoPE applied) of the last `window` tokens of the step
  bool hidden_states = false;      ///< each layer's input hidden state for every token of the step
  bool attention_mass = false;     ///< per entry, the attention it receives from the step's tokens
  bool tokens = false;             ///< every token of the step with its position (KVzip's replay)
  std::vector<LayerHook*> hooks;   ///< the press's own hooks, in order
  /// Whether anything must be recorded or called (otherwise a step may run in a batched pass).
  bool any() const { return window > 0 || hidden_states || attention_mass || tokens || !hooks.empty(); }
};

/// Union of two needs: largest window, any flag set in either, the hooks of both (a before b).
ObservationNeeds merge_needs(const ObservationNeeds& a, const ObservationNeeds& b);

/// What the recorders saw during one step (a prefill chunk or a decode step), for presses.
struct Observation {
  /// [layer] -> [n_head][n_window][head_dim] query vectors (RoPE applied) of the observation window.
  std::vector<std::vector<float>> queries;
  std::vector<int32_t> window_positions;  ///< positions of the observation-window queries
  /// [layer] -> [n_tokens][n_embd] layer-input hidden states of the step's tokens.
  std::vector<std::vector<float>> hidden;
  std::vector<int32_t> hidden_positions;
  /// [layer][kv head] -> per entry of the segment, the sum over the step's queries and over the
  /// GQA group of the softmax probability the entry received (H2O's accumulated attention). Kept
  /// aligned with the segment by the press that uses it.
  std::vector<std::vector<std::vector<float>>> attention_mass;
  /// Every token of the step and its position.
  std::vector<Token> tokens;
  std::vector<int32_t> token_positions;
  /// The request runner's session, for a press that runs the model again on the same cache
  /// (KVzip's replay); nullptr when the press is used outside a runner.
  ModelRunner* runner = nullptr;
  /// During a prefill: the position after the context's last token, known before its first chunk
  /// runs, so that a press that needs positions after the context (KVzip's replay) can refuse a
  /// context that leaves too few at the first chunk instead of the last; -1 when unknown.
  int32_t context_end = -1;
  int n_window() const { return static_cast<int>(window_positions.size()); }
  void clear() { *this = Observation{}; }
};

/// Score of entries that must never be evicted (sinks, observation window, sliding window).
constexpr float kProtected = 3.0e38f;
/// Score that ranks an entry above every unprotected score without protecting it (CriticalKV's
/// first-stage selection): it still counts against the budget.
constexpr float kPreferred = 1.0e30f;
/// Score of an entry a press keeps first (observation window, sinks, recent window): kPreferred by
/// default, as kvpress pads those entries with the largest score + 1 so they are chosen first but
/// count against the budget (the requested ratio is honoured even when the budget is smaller than
/// the window); kProtected with kvslim's `protect=1` option (never evicted, even past the budget).
inline float keep_first_score(bool protect) { return protect ? kProtected : kPreferred; }

/// scores[layer][kv head][entry], aligned with the cache segments.
using Scores = std::vector<std::vector<std::vector<float>>>;
/// keep[layer][kv head]: how many entries each segment keeps.
using KeepCounts = std::vector<std::vector<int>>;

/// What one compression step aims at: remove `ratio` of `n_context` entries per segment.
/// n_context is the number of context tokens seen so far (with chunked prefill, every chunk so
/// far). Inside a composition, every stage after the first is sized from the entries the previous
/// stages actually left (`per_segment`): each segment's own count, and n_context their mean.
///
/// Under a per-head entry budget (`budget` > 0, the policy's budget=N) the target is a count, not a
/// share: a segment sized from n entries keeps min(n, budget) whatever the ratio, so with chunked
/// prefill every chunk ends with at most N context entries per KV head (an adaptive policy moves
/// them between heads: N x heads per layer) and the cache stops growing with the context.
struct Target {
  double ratio = 0.0;
  size_t n_context = 0;
  bool per_segment = false;
  size_t budget = 0;  ///< entries per KV head; 0 = keep by ratio
  /// Entries segment `s` is sized from: its present count when per_segment, else n_context.
  size_t n_for(const Segment& s) const { return per_segment ? s.size() : n_context; }
  /// Entries a segment sized from n keeps: min(n, budget) under a budget, else uniform_keep(n, ratio).
  int keep(size_t n) const;
};

/// The interface the request runner drives: every press derives from it (a scorer press through
/// ScorerPress). A press serves one request at a time; reset() (called before the first chunk of a
/// request) forgets everything about the previous one.
class PressImpl : public Press {
 public:
  /// What the forward pass must record (or call) during prefill.
  virtual ObservationNeeds needs() const;
  /// What the forward pass must record (or call) at each decode step (for after_decode).
  virtual ObservationNeeds decode_needs() const;
  /// Compresses `cache` after a prefill step (the whole context, or one chunk of it when prefill
  /// is chunked): observe(), then apply() toward {ratio(), tokens seen so far}. `obs` holds what
  /// needs() asked for, recorded over this step's tokens.
  void compress(KVCache& cache, const Model& model, const Observation& obs);
  /// Updates per-request state from a forward step (e.g. H2O's accumulated attention). Called
  /// before any entry of the step is evicted.
  virtual void observe(const KVCache& cache, const Model& model, const Observation& obs) {}
  /// Evicts toward `target`.
  virtual void apply(KVCache& cache, const Model& model, const Observation& obs, const Target& target) = 0;
  /// Called after each decode step (the new token's entries are in the cache); decoding presses
  /// evict here. `obs` holds what decode_needs() asked for. Default: nothing.
  virtual void after_decode(KVCache& cache, const Model& model, const Observation& obs) {}
  /// Forgets per-request state.
  virtual void reset() {}
  /// Sets the ratio (wrappers and `outer(...):ratio=` use it). Default: kvslim::Error.
  virtual void set_ratio(double r);
  /// Entries per segment apply() leaves from `n` when nothing is protected: what the next press
  /// of a composition compresses.
  virtual size_t kept_after(const Target& t) const;
  /// Press: kept_after({ratio(), n}).
  size_t kept_of(size_t n) const override;
  /// Entries of segment (layer, kv_head) moved from positions old_pos to new_pos (key
  /// re-rotation); presses that keep per-entry state keyed by position follow them.
  virtual void remap_positions(int layer, int kv_head, const std::vector<int32_t>& old_pos,
                               const std::vector<int32_t>& new_pos) {}
  /// Default: a press that evicts or selects entries during decode, or observes decode steps, is
  /// refused (see Press).
  std::string storage_refusal() const override;
  /// This press as a scorer (entries kept by score under a budget policy), or nullptr: budget
  /// policies and wrappers reach their inner press's scores and policy through it.
  virtual ScorerPress* scorer() { return nullptr; }
  /// The settings besides the ratio this press lets a caller choose per request (the
  /// auto-budget's other axes, press/knobs.h: the `latent` press's code bits and ranks), or
  /// nullptr; a composition gives its first stage's that has them.
  virtual KnobControl* knobs() { return nullptr; }
};

/// What a press sees of one layer when it compresses.
class LayerView {
 public:
  LayerView(const Model& model, const KVCache& cache, const Observation& obs, int layer, Target target = {});
  int layer() const { return layer_; }
  const HParams& hp() const { return model_.hparams(); }
  const Model& model() const { return model_; }
  const KVCache& cache() const { return cache_; }
  const Segment& seg(int kv_head) const { return cache_.seg(layer_, kv_head); }
  const Observation& obs() const { return obs_; }
  /// The step's target (ratio and the context length it applies to).
  const Target& target() const { return target_; }
  /// Observation-window queries of query head qh: [n_window][head_dim], RoPE applied; nullptr
  /// when none were recorded.
  const float* window_queries(int qh) const;
  int n_window() const { return obs_.n_window(); }
  /// Softmax attention of the observation-window queries of every query head of KV head h's
  /// GQA group over the segment's entries (causal: a query sees entries at positions <= its own):
  /// [group][n_window][n_entries]. Computed once per (layer, KV head) and shared.
  const std::vector<float>& window_attention(int kv_head) const;
  /// The same attention summed over the last `rows` window queries (clamped to n_window()):
  /// [group][n_entries]. Cheaper than window_attention (no [n_window][n_entries] matrix); cached.
  const std::vector<float>& window_mass(int kv_head, int rows) const;

 private:
  /// Keys of segment h decoded and transposed in blocks of 16 entries, [block][head_dim][16]
  /// (zero-padded); cached.
  const std::vector<float>& keys_t(int kv_head) const;
  /// Probabilities of window queries [i0, i1) of group head g over segment h: out[i1 - i0][n].
  void attention_rows(int kv_head, int g, int i0, int i1, float* out) const;
  const Model& model_;
  const KVCache& cache_;
  const Observation& obs_;
  int layer_;
  Target target_;
  mutable std::map<int, std::vector<float>> attn_, kt_;
  mutable std::map<std::pair<int, int>, std::vector<float>> mass_;
};

/// floor(n * (1 - ratio)), at least 1 (when n > 0) and at most n.
int uniform_keep(size_t n, double ratio);

/// Largest position stored + 1 over the cache (0 when empty), read from each segment's last
/// entry: right after a forward call, the number of tokens the session has seen.
int32_t cache_next_position(const KVCache& cache);

/// Inputs of a budget policy.
struct BudgetInput {
  const Scores& scores;           ///< after BudgetPolicy::prepare
  const KVCache& cache;
  Target target;
  std::vector<double> layer_stat;  ///< BudgetPolicy::inspect() of every layer (when it wants one)
};

/// Turns scores into keep-counts per (layer, KV head). Every policy keeps, in every segment, at
/// least its kProtected entries and at most its size. A ratio-driven policy keeps in all exactly
/// as many entries as the uniform policy at the same target (only their distribution differs),
/// unless protected entries force more.
class BudgetPolicy {
 public:
  virtual ~BudgetPolicy() = default;
  /// e.g. "adakv:alpha=0.2" ("uniform" for the default).
  virtual std::string describe() const = 0;
  /// Observation the policy needs beyond the scorer's (ZigZagKV: a window).
  virtual ObservationNeeds needs() const { return {}; }
  /// False when the keep-counts do not depend on the ratio (threshold, per-layer ratios): then
  /// ratio 0 does not skip the press.
  virtual bool uses_ratio() const { return true; }
  /// The ratio the press reports under this policy (per_layer: the mean of its ratios).
  virtual double reported_ratio(double scorer_ratio) const { return scorer_ratio; }
  /// Decode steps between evictions during decode (0 = the policy does not act in decode).
  virtual int decode_interval() const { return 0; }
  /// Whether inspect() must run for every layer while it is scored.
  virtual bool wants_inspect() const { return false; }
  /// One number per layer computed from the layer view while it is scored (ZigZagKV: LMBA).
  virtual double inspect(const LayerView& view) const { return 0.0; }
  /// May mark more entries kProtected before counting (threshold: the sliding window).
  virtual void prepare(Scores& scores, const KVCache& cache, const Target& target) const {}
  virtual KeepCounts keep_counts(const BudgetInput& in) const = 0;
  /// Told what the scorer it is set on records (ScorerPress::set_policy): PyramidKV sizes its
  /// layer budgets with the scorer's observation window, as kvpress's PyramidKVPress.
  virtual void set_scorer_needs(const ObservationNeeds& scorer) {}
  /// The per-head entry budget (`budget=N`, declared here once for every scorer press and policy;
  /// 0 = off): a ratio-driven policy keeps toward Target::keep (N entries per KV head, or N x
  /// heads per layer for an adaptive one) instead of a share; a policy that keeps by its own
  /// parameters (threshold, per_layer) keeps at most N per head.
  size_t budget() const { return budget_; }
  void set_budget(size_t n) { budget_ = n; }

 private:
  size_t budget_ = 0;
};

/// Uniform policy: every segment keeps min(size, uniform_keep(target.n_for(segment), ratio)).
class UniformBudget : public BudgetPolicy {
 public:
  std::string describe() const override { return "uniform"; }
  KeepCounts keep_counts(const BudgetInput& in) const override;
};

/// Number of kProtected scores.
int count_protected(const std::vector<float>& scores);

/// Keeps, in one segment, the `keep` highest-scoring entries plus every entry scored kProtected;
/// ties go to the later entry; NaN ranks lowest. Returns the increasing indices kept.
std::vector<int32_t> select_top(const std::vector<float>& scores, int keep);

/// A press defined by a per-layer scorer and a budget policy.
class ScorerPress : public PressImpl {
 public:
  explicit ScorerPress(double ratio, std::unique_ptr<BudgetPolicy> policy = nullptr);
  ScorerPress* scorer() override { return this; }
  /// "<scorer>" under the uniform policy, "<policy>(<scorer>)" otherwise (policy parameters after
  /// the parentheses).
  std::string describe() const override;
  /// The scorer's spec alone, e.g. "snapkv:ratio=0.5,window=64,kernel=5,pooling=avg".
  virtual std::string describe_scorer() const = 0;
  /// The scorer's needs merged with the policy's.
  ObservationNeeds needs() const override;
  virtual ObservationNeeds scorer_needs() const { return {}; }
  ObservationNeeds decode_needs() const override;
  /// Scores every layer (in parallel), runs the policy and retains the selection. Ratio 0 under a
  /// ratio-driven policy returns at once (bit-identical to no press).
  void apply(KVCache& cache, const Model& model, const Observation& obs, const Target& target) override;
  /// With a policy that acts in decode (threshold:decode=1): observe and apply every interval.
  void after_decode(KVCache& cache, const Model& model, const Observation& obs) override;
  bool evicts_in_decode() const override { return policy_->decode_interval() > 0; }
  double ratio() const override { return policy_->reported_ratio(ratio_); }
  void set_ratio(double r) override;
  size_t kept_after(const Target& t) const override;
  /// Subclasses with per-request state override and call this.
  void reset() override { decode_steps_ = 0; }
  /// Scores of layer `view.layer()`: out[kv head][entry] (out has n_head_kv empty vectors on
  /// entry). Protected entries get kProtected. Must be thread-safe (layers run in parallel).
  virtual void score(const LayerView& view, std::vector<std::vector<float>>& out) const = 0;
  /// Scores of every layer, as apply() computes them (also used by tests and analysis).
  Scores score_all(const KVCache& cache, const Model& model, const Observation& obs, const Target& target,
                   std::vector<double>* layer_stat = nullptr) const;
  const BudgetPolicy& policy() const { return *policy_; }
  /// Replaces the policy; the per-head budget of the one it replaces carries over.
  void set_policy(std::unique_ptr<BudgetPolicy> p);
  /// The policy's per-head entry budget (BudgetPolicy::set_budget).
  void set_budget(size_t n) { policy_->set_budget(n); }

 protected:
  /// `t` with the policy's per-head budget (the target apply() and kept_after() work toward); under
  /// a budget its ratio is the share that leaves N of n_context.
  Target budgeted(Target t) const;
  /// describe() of a press whose default policy is its own (KVzip's global, Fast KVzip's,
  /// RestoreKV's): the scorer's spec plus the per-head budget, when there is one.
  std::string describe_with_budget() const;
  double ratio_;
  std::unique_ptr<BudgetPolicy> policy_;
  int decode_steps_ = 0;
};

/// make_press() for the library's own code and tests: the press as the runner drives it. Throws
/// kvslim::Error as make_press.
std::unique_ptr<PressImpl> make_press_impl(const std::string& spec, double ratio);
std::unique_ptr<PressImpl> make_press_impl(const std::string& spec, double ratio, bool& ratio_used);

/// Registers a press at static-initialization time: `static PressRegistrar r({...});`.
struct PressRegistrar {
  explicit PressRegistrar(PressInfo info) { PressRegistry::instance().add(std::move(info)); }
  /// With kvpress's class names for the press (PressInfo::kvpress).
  PressRegistrar(PressInfo info, std::vector<std::string> kvpress) {
    info.kvpress = std::move(kvpress);
    PressRegistry::instance().add(std::move(info));
  }
  /// With kvpress's class names and how the Python classes differ from the defaults
  /// (PressInfo::python), e.g. `{.name = "H2OPress"}` for a press kvpress does not have.
  PressRegistrar(PressInfo info, std::vector<std::string> kvpress, PythonClass python) {
    info.kvpress = std::move(kvpress);
    info.python = std::move(python);
    PressRegistry::instance().add(std::move(info));
  }
};

/// Typed parameter readers for factories; errors name the press, the key and the value.
double param_double(const PressParams& p, const std::string& press, const std::string& key);
int param_int(const PressParams& p, const std::string& press, const std::string& key);
std::string param_str(const PressParams& p, const std::string& press, const std::string& key);
/// A 0/1 flag; any other value is an error naming the press and the key.
bool param_bool(const PressParams& p, const std::string& press, const std::string& key);
/// "0.2/0.5/0.7" -> {0.2, 0.5, 0.7}.
std::vector<double> param_double_list(const PressParams& p, const std::string& press, const std::string& key);
}  // namespace kvslim
