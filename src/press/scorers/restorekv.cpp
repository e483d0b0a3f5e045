// RestoreKV (arXiv 2608.01247), as kvpress's RestoreKVPress (kvpress/presses/restorekv_press.py)
// runs it on top of KVzipPress:
//  1. KVzip scores the context (n tokens) by its replay (press/kvzip.cpp);
//  2. the restore pass: R learned input embeddings run once at positions n .. n + R - 1 over the
//     whole, still uncompressed cache, with the file's LoRA adapter on for this pass only (no
//     scoring hook sees it); their entries are appended to every segment;
//  3. KVzip evicts with the ratio raised to min(1, ratio + R / n) over the context entries only:
//     floor(L x H x n x that) context entries leave in one bottom-k over all layers and KV heads
//     (kvpress's KVzipPress.compress_post). The restore entries are outside KVzip's score range,
//     so they always stay: the budget is matched (they fill R of every segment's slots).
// The question and the decoded tokens then continue at position n + R (kvpress's pipeline reads
// the cache length).
// kvslim's rules on top (as for `kvzip`): the first n_sink entries of a segment are never
// evicted (kvpress scores them 1.0, the largest attention probability, so they go last) and no
// segment is emptied. At ratio 0 nothing runs (kvpress skips scoring and the restore pass).
// The restore pass runs once over the whole context: a context prefilled in several steps
// (RequestOptions::chunk_size, the server) is refused with an error, as kvpress has no chunked
// prefill to follow.
#include "press/scorers/restorekv.h"

#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "model/input_override.h"
#include "press/budget_util.h"
#include "press/scorers/kvzip.h"
#include "press/param_file.h"

namespace kvslim {
namespace {

/// kvpress's KVzip budget with the restore entries added: keeps min(present, context - pruned +
/// restore) entries over all segments, context entries ranked by one top-k (the restore entries
/// and sinks are kProtected). The press sets the counts before each apply().
class RestoreKVBudget : public BudgetPolicy {
 public:
  std::string describe() const override { return "restorekv_global"; }
  void set(int64_t context_entries, int64_t pruned, int64_t restore_entries) {
    context_ = context_entries;
    pruned_ = pruned;
    restore_ = restore_entries;
  }
  KeepCounts keep_counts(const BudgetInput& in) const override {
    const KVCache& cache = in.cache;
    auto segs = budget::all_segments(cache);
    int64_t present = 0;
    for (auto [l, h] : segs) present += static_cast<int64_t>(cache.seg(l, h).size());
    const int64_t total = std::min(present, context_ - pruned_ + restore_);
    auto x = budget::shared_top(in.scores, segs, budget::floor_counts(in.scores, segs), total);
    KeepCounts keep(cache.n_layer(), std::vector<int>(cache.n_head_kv()));
    for (size_t i = 0; i < segs.size(); ++i) keep[segs[i].first][segs[i].second] = static_cast<int>(x[i]);
    return keep;
  }

 private:
  int64_t context_ = 0, pruned_ = 0, restore_ = 0;
};

class RestoreKVPress : public KVzipPress {
 public:
  RestoreKVPress(double ratio, KVzipOptions opt, std::shared_ptr<const RestoreKVWeights> w, std::string path)
      : KVzipPress(ratio, opt, std::make_unique<RestoreKVBudget>()), w_(std::move(w)), path_(std::move(path)) {
    budget_ = static_cast<RestoreKVBudget*>(policy_.get());
  }
  std::string describe_scorer() const override {
    return fmt::format("restorekv:ratio={},file={},chunk={},n_sink={},plus={}", ratio_, path_, options().chunk,
                       options().n_sink, options().plus ? 1 : 0);
  }
  // The budget policy is RestoreKV's own: the spec stays "restorekv:..." so that it parses back.
  std::string describe() const override { return describe_with_budget(); }
  void reset() override {
    KVzipPress::reset();
    restored_ = false;
  }
  void observe(const KVCache& cache, const Model& model, const Observation& obs) override {
    if ((ratio_ > 0.0 || policy().budget() > 0) && restored_ && !obs.tokens.empty())
      throw Error(fmt::format("press restorekv: the context came in more than one prefill step (chunked prefill: "
                              "RequestOptions::chunk_size, or the server's chunks); the restore pass runs once over "
                              "the whole context, as kvpress's RestoreKVPress does: prefill the context in one step"));
    KVzipPress::observe(cache, model, obs);
  }
  void apply(KVCache& cache, const Model& model, const Observation& obs, const Target& target) override {
    // kvpress: no replay and no restore pass at ratio 0 (and here without a budget).
    if ((ratio_ <= 0.0 && policy().budget() == 0) || target.n_context == 0) return;
    if (checked_ != &model) {
      w_->check(model.hparams(), path_);
      checked_ = &model;
    }
    if (!obs.runner || &obs.runner->cache() != &cache)
      throw Error("press restorekv: needs the request runner that owns the cache (it runs the restore pass)");
    const int R = w_->n_tokens;
    restore_pass(*obs.runner);
    restored_ = true;
    // Context entries: n per segment (inside a composition, what each segment holds besides the
    // restore entries), R / n with n the context length as kvpress (the mean in a composition).
    const int L = cache.n_layer(), H = cache.n_head_kv();
    int64_t context = 0;
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h)
        context += target.per_segment ? static_cast<int64_t>(cache.seg(l, h).size()) - R
                                      : static_cast<int64_t>(target.n_context);
    const double ratio = std::min(1.0, target.ratio + static_cast<double>(R) / static_cast<double>(target.n_context));
    budget_->set(context, static_cast<int64_t>(static_cast<double>(context) * ratio), static_cast<int64_t>(L) * H * R);
    Target t = target;
    t.ratio = ratio;
    KVzipPress::apply(cache, model, obs, t);
  }

 private:
  /// The R restore embeddings at runner.next_position() .. + R - 1 over the whole cache, the
  /// adapter on for this call only; their entries are appended by the forward pass.
  void restore_pass(ModelRunner& runner) const {
    const int R = w_->n_tokens;
    const int32_t p = runner.next_position();
    if (static_cast<int64_t>(p) + R > runner.n_ctx())
      throw Error(fmt::format("press restorekv: the {} restore entries need positions {}..{}, beyond the context size "
                              "n_ctx {}; raise n_ctx",
                              R, p, p + R - 1, runner.n_ctx()));
    InputOverride over(w_->embeddings.data(), R, w_->n_embd, w_->lora.rank > 0 ? &w_->lora : nullptr);
    runner.run_inputs(over, nullptr);
  }

  std::shared_ptr<const RestoreKVWeights> w_;
  std::string path_;
  RestoreKVBudget* budget_ = nullptr;  // owned by ScorerPress::policy_
  const Model* checked_ = nullptr;
  bool restored_ = false;
};

}  // namespace

std::unique_ptr<PressImpl> make_restorekv_press(double ratio, std::shared_ptr<const RestoreKVWeights> w,
                                            const std::string& name) {
  check_ratio(ratio, "restorekv");
  KVzipOptions o;
  o.plus = false;  // the registry's default (KVzipOptions defaults to KVzip+)
  return std::make_unique<RestoreKVPress>(ratio, o, std::move(w), name);
}

namespace {

PressRegistrar reg([] {
  PressInfo i;
  i.name = "restorekv";
  i.kvpress = {"RestoreKVPress"};
  i.summary = "KVzip plus R learned restore tokens (file=: embeddings and a LoRA adapter) run once over the full "
              "cache before eviction; their entries always stay and count in the budget (KVzip evicts at ratio + "
              "R / n of the context); the context must be prefilled in one step";
  i.source = "RestoreKV, arXiv 2608.01247; reference: kvpress/presses/restorekv_press.py (RestoreKVPress, a "
             "subclass of KVzipPress)";
  i.params = {{"ratio", "0"},
              {"n_sink", "4", {}, {.help = "the first entries of every segment, never evicted"}},
              {"plus", "0", "kvzip_plus_normalization", {.type = ParamType::Bool, .help = "KVzip+'s normalisation"}},
              {"file", "", {},
               {.type = ParamType::Str, .help = "the restore embeddings and LoRA adapter for this model (GGUF)"}},
              {"chunk", "2048", {}, kKvslimOnly}};
  i.python.base_press = true;  // kvpress's RestoreKVPress is a KVzipPress
  i.make = [](const PressParams& p) -> std::unique_ptr<PressImpl> {
    const std::string path = param_file(p, "restorekv", "file");
    if (path.empty())
      throw Error("press restorekv: give file=FILE.gguf (the restore embeddings and LoRA adapter for this model)");
    KVzipOptions o;
    o.chunk = param_int(p, "restorekv", "chunk");
    o.n_sink = param_int(p, "restorekv", "n_sink");
    o.plus = param_bool(p, "restorekv", "plus");
    if (o.chunk < 16) throw Error(fmt::format("press restorekv: chunk={} must be >= 16", o.chunk));
    if (o.n_sink < 0) throw Error(fmt::format("press restorekv: n_sink={} must be >= 0", o.n_sink));
    auto w = std::make_shared<const RestoreKVWeights>(RestoreKVWeights::load(path));
    return std::make_unique<RestoreKVPress>(param_double(p, "restorekv", "ratio"), o, std::move(w), path);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
