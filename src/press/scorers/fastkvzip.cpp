// Fast KVzip (arXiv 2601.17668): the gates (forward pass, GGUF file) and the press. Reference:
// kvpress kvpress/presses/fastkvzip_press.py. The press scores every context entry with its layer's
// gate when the forward pass creates it (from the token's attention input), marks the first n_sink
// entries and the last int(n_context * window_ratio) (window_size from 32,000 tokens on) as chosen
// first (kvpress sets their score to 1.0, above every gate score), and evicts
// floor(entries x ratio) with one bottom-k over all layers and KV heads (layerwise=1: over the KV
// heads of each layer, floor(n_head_kv x n x ratio) per layer). Training: train/fastkvzip_train.h.
//
// Chunked prefill (--chunk-size, and `serve`, which always prefills in chunks): kvpress has none
// (one forward over the context, one compression); the authors' repository prefills in chunks
// (prefill/model/wrapper.py `prefill`, prefill/attention/kvcache.py `prune_chunk`) and, after each
// chunk, prunes only the entries scored since the previous chunk, except the trailing local
// window, which waits for the next chunk; earlier decisions are final. kvslim follows that by
// default: entries older than the previous step's window rank above every undecided entry (never
// evicted again), and each step evicts what brings the total to floor(entries seen x ratio), so
// one chunk is exactly kvpress's rule. `revisit=1`: every step re-ranks all present entries
// (kvslim's generic chunked rule).
#include "press/scorers/fastkvzip.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include <fmt/format.h>

#include "kvslim/gguf.h"
#include "press/authoring.h"
#include "press/param_file.h"
#include "press/budget_util.h"

namespace kvslim {

FastKVzipGates FastKVzipGates::shaped(int n_layer, int input_dim, int n_head_kv, int n_group, int dim, int n_sink) {
  if (n_layer < 1 || input_dim < 1 || n_head_kv < 1 || n_group < 1 || dim < 1 || n_sink < 0)
    throw Error(fmt::format("fastkvzip gates: bad shape (n_layer {}, input_dim {}, n_head_kv {}, n_group {}, dim {}, "
                            "n_sink {})",
                            n_layer, input_dim, n_head_kv, n_group, dim, n_sink));
  FastKVzipGates g;
  g.n_layer = n_layer;
  g.input_dim = input_dim;
  g.n_head_kv = n_head_kv;
  g.n_group = n_group;
  g.dim = dim;
  g.n_sink = n_sink;
  const size_t q = static_cast<size_t>(n_head_kv) * n_group * dim, k = static_cast<size_t>(n_head_kv) * dim;
  Layer L;
  L.wq.assign(q * input_dim, 0.0f);
  L.bq.assign(q, 0.0f);
  L.wk.assign(k * input_dim, 0.0f);
  L.q_norm.assign(dim, 1.0f);
  L.k_norm.assign(dim, 1.0f);
  L.k_base.assign(static_cast<size_t>(n_head_kv) * n_sink * dim, 0.0f);
  L.b.assign(static_cast<size_t>(n_head_kv) * n_group, 0.0f);
  g.layers.assign(n_layer, L);
  return g;
}

void FastKVzipGates::predict(int layer, const float* x, int n, float* out) const {
  if (layer < 0 || layer >= n_layer) throw Error(fmt::format("fastkvzip gates: layer {} of {}", layer, n_layer));
  const Layer& L = layers[layer];
  const int D = dim, G = n_group, S = n_sink;
  const double sd = std::sqrt(static_cast<double>(D));
  std::vector<double> k(D), q(static_cast<size_t>(G) * D), raw(D), s(S);
  auto norm = [&](const double* u, const float* w, double* dst) {
    double ms = 0;
    for (int e = 0; e < D; ++e) ms += u[e] * u[e];
    const double r = 1.0 / std::sqrt(ms / D + eps);
    for (int e = 0; e < D; ++e) dst[e] = w[e] * (u[e] * r);
  };
  for (int t = 0; t < n; ++t) {
    const float* xt = x + static_cast<size_t>(t) * input_dim;
    for (int h = 0; h < n_head_kv; ++h) {
      for (int e = 0; e < D; ++e) {
        const float* w = L.wk.data() + (static_cast<size_t>(h) * D + e) * input_dim;
        double a = 0;
        for (int i = 0; i < input_dim; ++i) a += static_cast<double>(w[i]) * xt[i];
        raw[e] = a;
      }
      norm(raw.data(), L.k_norm.data(), k.data());
      double sum = 0;
      for (int g = 0; g < G; ++g) {
        const size_t row0 = (static_cast<size_t>(h) * G + g) * D;
        for (int e = 0; e < D; ++e) {
          const float* w = L.wq.data() + (row0 + e) * input_dim;
          double a = L.bq[row0 + e];
          for (int i = 0; i < input_dim; ++i) a += static_cast<double>(w[i]) * xt[i];
          raw[e] = a;
        }
        double* qg = q.data() + static_cast<size_t>(g) * D;
        norm(raw.data(), L.q_norm.data(), qg);
        double l = 0;
        for (int e = 0; e < D; ++e) l += k[e] * qg[e];
        l = l / sd + L.b[static_cast<size_t>(h) * G + g];
        sum += fastkvzip_gate_probability(L, h, S, D, qg, sd, l, s.data());
      }
      out[static_cast<size_t>(t) * n_head_kv + h] = static_cast<float>(sum / G);
    }
  }
}

void FastKVzipGates::save(const std::string& path, const std::string& model_desc) const {
  GGUFWriter w;
  w.set("general.architecture", GGUFValue::str("fastkvzip"));
  w.set("fastkvzip.base_model", GGUFValue::str(model_desc));
  w.set("fastkvzip.n_layer", GGUFValue::u32(n_layer));
  w.set("fastkvzip.input_dim", GGUFValue::u32(input_dim));
  w.set("fastkvzip.n_head_kv", GGUFValue::u32(n_head_kv));
  w.set("fastkvzip.n_group", GGUFValue::u32(n_group));
  w.set("fastkvzip.dim", GGUFValue::u32(dim));
  w.set("fastkvzip.n_sink", GGUFValue::u32(n_sink));
  w.set("fastkvzip.eps", GGUFValue::f32(eps));
  const int64_t q = int64_t(n_head_kv) * n_group * dim, k = int64_t(n_head_kv) * dim;
  for (int l = 0; l < n_layer; ++l) {
    const Layer& L = layers[l];
    w.add_tensor_f32(fmt::format("fastkvzip.{}.wq", l), GGMLType::F32, {input_dim, q}, L.wq);
    w.add_tensor_f32(fmt::format("fastkvzip.{}.bq", l), GGMLType::F32, {q}, L.bq);
    w.add_tensor_f32(fmt::format("fastkvzip.{}.wk", l), GGMLType::F32, {input_dim, k}, L.wk);
    w.add_tensor_f32(fmt::format("fastkvzip.{}.q_norm", l), GGMLType::F32, {dim}, L.q_norm);
    w.add_tensor_f32(fmt::format("fastkvzip.{}.k_norm", l), GGMLType::F32, {dim}, L.k_norm);
    if (n_sink > 0)
      w.add_tensor_f32(fmt::format("fastkvzip.{}.k_base", l), GGMLType::F32, {dim, n_sink, n_head_kv}, L.k_base);
    w.add_tensor_f32(fmt::format("fastkvzip.{}.b", l), GGMLType::F32, {n_group, n_head_kv}, L.b);
  }
  w.write(path);
}

FastKVzipGates FastKVzipGates::load(const std::string& path) {
  auto f = GGUFFile::open(path);
  std::string arch;
  try {
    arch = f->get_string("general.architecture");
  } catch (const Error&) {
  }
  if (arch != "fastkvzip")
    throw Error(fmt::format("{}: not a fastkvzip gates file (general.architecture is not 'fastkvzip'; make one with "
                            "`kvslim fastkvzip-train`)",
                            path));
  auto get_i = [&](const char* key) { return static_cast<int>(f->get_int(key)); };
  FastKVzipGates g = shaped(get_i("fastkvzip.n_layer"), get_i("fastkvzip.input_dim"), get_i("fastkvzip.n_head_kv"),
                            get_i("fastkvzip.n_group"), get_i("fastkvzip.dim"), get_i("fastkvzip.n_sink"));
  g.eps = static_cast<float>(f->get_float("fastkvzip.eps", 1e-6));
  auto get = [&](const std::string& name, size_t count) {
    const TensorInfo& t = f->tensor(name);
    if (t.nelements() != static_cast<int64_t>(count))
      throw Error(fmt::format("{}: tensor {} has {} values, expected {}", path, name, t.nelements(), count));
    return f->tensor_f32(t);
  };
  for (int l = 0; l < g.n_layer; ++l) {
    Layer& L = g.layers[l];
    L.wq = get(fmt::format("fastkvzip.{}.wq", l), L.wq.size());
    L.bq = get(fmt::format("fastkvzip.{}.bq", l), L.bq.size());
    L.wk = get(fmt::format("fastkvzip.{}.wk", l), L.wk.size());
    L.q_norm = get(fmt::format("fastkvzip.{}.q_norm", l), L.q_norm.size());
    L.k_norm = get(fmt::format("fastkvzip.{}.k_norm", l), L.k_norm.size());
    if (g.n_sink > 0) L.k_base = get(fmt::format("fastkvzip.{}.k_base", l), L.k_base.size());
    L.b = get(fmt::format("fastkvzip.{}.b", l), L.b.size());
  }
  return g;
}

void FastKVzipGates::check(const HParams& hp, const std::string& what) const {
  if (n_layer != hp.n_layer || input_dim != hp.n_embd || n_head_kv != hp.n_head_kv)
    throw Error(fmt::format("{}: gates for {} layers, n_embd {}, {} KV heads do not fit the model ({} layers, n_embd "
                            "{}, {} KV heads)",
                            what, n_layer, input_dim, n_head_kv, hp.n_layer, hp.n_embd, hp.n_head_kv));
}

double fastkvzip_gate_probability(const FastKVzipGates::Layer& L, int h, int n_sink, int dim, const double* q,
                                  double sd, double l, double* sink_probs) {
  if (n_sink == 0) return 1.0 / (1.0 + std::exp(-l));
  // exp(l) / (exp(l) + sum_j exp(s_j)), computed from the maximum m of l and the s_j.
  double m = l;
  for (int j = 0; j < n_sink; ++j) {
    const float* kb = L.k_base.data() + (static_cast<size_t>(h) * n_sink + j) * dim;
    double a = 0;
    for (int e = 0; e < dim; ++e) a += kb[e] * q[e];
    sink_probs[j] = a / sd;
    m = std::max(m, sink_probs[j]);
  }
  double den = std::exp(l - m);
  const double num = den;
  for (int j = 0; j < n_sink; ++j) {
    sink_probs[j] = std::exp(sink_probs[j] - m);
    den += sink_probs[j];
  }
  for (int j = 0; j < n_sink; ++j) sink_probs[j] /= den;
  return num / den;
}

namespace {

/// kvpress's FastKVzip budget: floor(entries x ratio) evicted with one bottom-k over every (layer,
/// KV head) (layerwise: over the KV heads of each layer, floor(n_head_kv x n x ratio) per layer);
/// entries = n_context per segment (its own count inside a composition). kvslim keeps at least
/// one entry per segment (kvpress could empty a head; with its sinks chosen first it does not).
class FastKVzipBudget : public BudgetPolicy {
 public:
  explicit FastKVzipBudget(bool layerwise) : layerwise_(layerwise) {}
  std::string describe() const override { return layerwise_ ? "fastkvzip_layerwise" : "fastkvzip_global"; }
  KeepCounts keep_counts(const BudgetInput& in) const override {
    const KVCache& cache = in.cache;
    KeepCounts keep(cache.n_layer(), std::vector<int>(cache.n_head_kv()));
    auto place = [&](const std::vector<std::pair<int, int>>& segs) {
      int64_t numel = 0, present = 0;
      for (auto [l, h] : segs) {
        numel += static_cast<int64_t>(in.target.n_for(cache.seg(l, h)));
        present += static_cast<int64_t>(cache.seg(l, h).size());
      }
      const int64_t pruned = static_cast<int64_t>(static_cast<double>(numel) * in.target.ratio);
      const int64_t total = std::min(present, numel - pruned);
      auto x = budget::shared_top(in.scores, segs, budget::floor_counts(in.scores, segs), total);
      for (size_t i = 0; i < segs.size(); ++i) keep[segs[i].first][segs[i].second] = static_cast<int>(x[i]);
    };
    if (layerwise_)
      for (int l = 0; l < cache.n_layer(); ++l) place(budget::layer_segments(cache, l));
    else
      place(budget::all_segments(cache));
    return keep;
  }

 private:
  bool layerwise_;
};

class FastKVzipPress : public ScorerPress, private LayerHook {
 public:
  FastKVzipPress(double ratio, std::shared_ptr<const FastKVzipGates> g, std::string path, bool layerwise, int n_sink,
                 int window_size, double window_ratio, bool protect, bool revisit)
      : ScorerPress(ratio, std::make_unique<FastKVzipBudget>(layerwise)),
        gates_(std::move(g)),
        path_(std::move(path)),
        default_policy_(policy().describe()),
        layerwise_(layerwise),
        n_sink_(n_sink),
        window_size_(window_size),
        window_ratio_(window_ratio),
        protect_(protect),
        revisit_(revisit) {}

  std::string describe_scorer() const override { return params(); }
  // The budget policy is Fast KVzip's own: the spec stays "fastkvzip:..." so that it parses back.
  std::string describe() const override {
    return policy().describe() != default_policy_ ? ScorerPress::describe() : describe_with_budget();
  }
  ObservationNeeds scorer_needs() const override {
    ObservationNeeds r;
    r.hooks.push_back(const_cast<FastKVzipPress*>(this));  // scores every entry from its attention input
    return r;
  }
  void reset() override {
    ScorerPress::reset();
    scores_.clear();
    decided_ = 0;
  }
  void apply(KVCache& cache, const Model& model, const Observation& obs, const Target& target) override {
    if (checked_ != &model) {
      gates_->check(model.hparams(), path_);
      checked_ = &model;
    }
    const int64_t next = cache_next_position(cache);
    ScorerPress::apply(cache, model, obs, target);
    // Entries before this step's window are decided; the window waits for the next chunk.
    decided_ = std::max<int64_t>(decided_, next - window_of(target.n_context));
  }
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override {
    const int l = view.layer();
    const size_t n = view.target().n_context;
    // kvpress: int(ctx_len * window_ratio) below 32,000 tokens, window_size from there on. A
    // window of 0 keeps no window (kvpress's slice [-0:] would mark the whole context instead).
    const int64_t window = window_of(n);
    const int32_t next = cache_next_position(view.cache());
    const float first = keep_first_score(protect_);
    for (int h = 0; h < view.hp().n_head_kv; ++h) {
      const Segment& s = view.seg(h);
      out[h].resize(s.size());
      for (size_t i = 0; i < s.size(); ++i) {
        const int32_t p = s.positions()[i];
        // Kept by an earlier chunk's decision (authors' chunked prefill): never revisited.
        if (!revisit_ && p >= 0 && p < decided_) {
          out[h][i] = kProtected;
          continue;
        }
        if (static_cast<int64_t>(i) < n_sink_ || (window > 0 && p >= next - window)) {
          out[h][i] = first;
          continue;
        }
        // Entries created without the gates watching (e.g. a question) are never evicted.
        float v = kProtected;
        if (l < static_cast<int>(scores_.size()) && p >= 0 && static_cast<size_t>(p) < scores_[l][h].size() &&
            !std::isnan(scores_[l][h][p]))
          v = scores_[l][h][p];
        out[h][i] = v;
      }
    }
  }

 private:
  std::string params() const {
    return fmt::format(
        "fastkvzip:ratio={},gates={},layerwise={},n_sink={},window_size={},window_ratio={},protect={},revisit={}", ratio_,
        path_, layerwise_ ? 1 : 0, n_sink_, window_size_, window_ratio_, protect_ ? 1 : 0, revisit_ ? 1 : 0);
  }
  /// kvpress: int(ctx_len x window_ratio) below 32,000 tokens, window_size from there on.
  int64_t window_of(size_t n) const {
    return n < 32000 ? static_cast<int64_t>(static_cast<double>(n) * window_ratio_) : window_size_;
  }
  void after_qkv(const LayerStep& s) override {
    if (s.hp->n_embd != gates_->input_dim)
      throw Error(fmt::format("{}: gates input_dim {} does not fit the model's n_embd {}", path_, gates_->input_dim,
                              s.hp->n_embd));
    if (s.layer >= gates_->n_layer || s.n <= 0) return;
    const int H = gates_->n_head_kv;
    if (scores_.size() != static_cast<size_t>(gates_->n_layer))
      scores_.assign(gates_->n_layer, std::vector<std::vector<float>>(H));
    std::vector<float> o(static_cast<size_t>(s.n) * H);
    gates_->predict(s.layer, s.attn_input, s.n, o.data());
    for (int t = 0; t < s.n; ++t) {
      const int32_t p = s.positions[t];
      if (p < 0) continue;
      for (int h = 0; h < H; ++h) {
        auto& v = scores_[s.layer][h];
        if (v.size() <= static_cast<size_t>(p)) v.resize(static_cast<size_t>(p) + 1, NAN);
        v[p] = o[static_cast<size_t>(t) * H + h];
      }
    }
  }

  std::shared_ptr<const FastKVzipGates> gates_;
  std::string path_, default_policy_;
  bool layerwise_;
  int n_sink_, window_size_;
  double window_ratio_;
  bool protect_, revisit_;
  int64_t decided_ = 0;  // positions below it were decided by an earlier chunk (kept ones stay)
  const Model* checked_ = nullptr;
  std::vector<std::vector<std::vector<float>>> scores_;  // [layer][kv head][position]: gate score (NaN: none)
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "fastkvzip";
  i.kvpress = {"FastKVzipPress"};
  i.summary = "gate-predicted KVzip scores from each token's attention input (gates from `kvslim fastkvzip-train`); "
              "sinks and the last window_ratio of the context chosen first; one bottom-k over all layers and heads; "
              "with chunked prefill each chunk's entries are decided once, as the authors' chunked prefill "
              "(revisit=1: re-rank all each chunk)";
  i.source = "Kim, Han, Yun 2026, Fast KVzip, arXiv 2601.17668; kvpress fastkvzip_press.py, "
             "github.com/Janghyun1230/FastKVzip";
  i.params = {{"ratio", "0"},
              {"layerwise", "0", {},
               {.type = ParamType::Bool, .help = "one bottom-k per layer instead of one over all layers"}},
              {"n_sink", "4", {}, {.help = "the first entries, chosen first"}},
              {"window_size", "4096", {}, {.help = "the last entries chosen first, from 32,000 context tokens on"}},
              {"window_ratio", "0.02", {},
               {.help = "the fraction of the context at its end chosen first, below 32,000 tokens"}},
              {"gates", "", {}, {.type = ParamType::Str, .help = "the gates file (`kvslim fastkvzip-train`)"}},
              {"protect", "0", {}, kKvslimOnly},
              {"revisit", "0", {}, kKvslimOnly}};
  i.python.base_press = true;  // kvpress's FastKVzipPress is no ScorerPress
  i.make = [](const PressParams& p) -> std::unique_ptr<PressImpl> {
    const std::string path = param_file(p, "fastkvzip", "gates");
    if (path.empty()) throw Error("press fastkvzip: give gates=FILE (train them with `kvslim fastkvzip-train`)");
    const int n_sink = param_int(p, "fastkvzip", "n_sink"), window = param_int(p, "fastkvzip", "window_size");
    const double wr = param_double(p, "fastkvzip", "window_ratio");
    if (n_sink < 0 || window < 0) throw Error("press fastkvzip: n_sink and window_size must be >= 0");
    if (!(wr >= 0 && wr <= 1)) throw Error(fmt::format("press fastkvzip: window_ratio={} must be in [0, 1]", wr));
    auto g = std::make_shared<const FastKVzipGates>(FastKVzipGates::load(path));
    return std::make_unique<FastKVzipPress>(param_double(p, "fastkvzip", "ratio"), g, path,
                                            param_bool(p, "fastkvzip", "layerwise"), n_sink, window, wr,
                                            param_bool(p, "fastkvzip", "protect"),
                                            param_bool(p, "fastkvzip", "revisit"));
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
