// Q-Filters press: score = <k, u_{l,h}>, the key's projection on its (layer, KV head)'s query
// direction from `kvslim qfilter-calibrate` (see qfilter.h); the largest projections stay. No
// protected entries, as kvpress's QFilterPress (which scores -<k, filter> with the hub's filters).
// Godey et al., "Q-Filters: Leveraging QK Geometry for Efficient KV Cache Compression", arXiv
// 2503.02812; reference: kvpress/presses/qfilter_press.py (QFilterPress).
#include <cmath>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "kvslim/gguf.h"
#include "press/authoring.h"
#include "press/param_file.h"
#include "press/scorers/qfilter.h"

namespace kvslim {
namespace {

class QFilterPress : public ScorerPress {
 public:
  QFilterPress(double ratio, std::string path)
      : ScorerPress(ratio), path_(std::move(path)), f_(std::make_shared<QFilters>(QFilters::load(path_))) {}
  std::string describe_scorer() const override { return fmt::format("qfilter:ratio={},filters={}", ratio_, path_); }
  // The file is checked against the model here, on the calling thread, before the layers are
  // scored in parallel (and even at ratio 0, so a wrong file never goes unnoticed).
  void apply(KVCache& cache, const Model& model, const Observation& obs, const Target& target) override {
    f_->check(model.hparams(), "press qfilter (" + path_ + ")");
    ScorerPress::apply(cache, model, obs, target);
  }
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override {
    f_->check(view.hp(), "press qfilter (" + path_ + ")");
    const int hd = view.hp().head_dim;
    for (int h = 0; h < view.hp().n_head_kv; ++h) {
      const Segment& s = view.seg(h);
      const size_t n = s.size();
      std::vector<float> k(n * hd);
      if (n) s.keys(0, n, k.data());
      const float* u = f_->at(view.layer(), h);
      out[h].resize(n);
      for (size_t i = 0; i < n; ++i) {
        double d = 0;
        for (int c = 0; c < hd; ++c) d += double(k[i * hd + c]) * u[c];
        out[h][i] = static_cast<float>(d);
      }
    }
  }

 private:
  std::string path_;
  std::shared_ptr<const QFilters> f_;
};

PressRegistrar reg({"qfilter", "keeps the keys that project most on the queries' principal direction (Q-Filters)",
                    "Godey et al. 2025, Q-Filters: Leveraging QK Geometry for Efficient KV Cache Compression, arXiv "
                    "2503.02812; reference: kvpress/presses/qfilter_press.py (QFilterPress); filters from kvslim "
                    "qfilter-calibrate",
                    {{"ratio", "0"},
                     {"filters", "", {},
                      {.type = ParamType::Str, .help = "the filters file (`kvslim qfilter-calibrate`)"}}},
                    [](const PressParams& p) -> std::unique_ptr<PressImpl> {
                      const std::string path = param_file(p, "qfilter", "filters");
                      if (path.empty())
                        throw Error("press qfilter needs filters=FILE.gguf (compute them on your model with `kvslim "
                                    "qfilter-calibrate`)");
                      return std::make_unique<QFilterPress>(param_double(p, "qfilter", "ratio"), path);
                    }}, {"QFilterPress"});

}  // namespace
// The filters' GGUF file.

void QFilters::save(const std::string& path) const {
  GGUFWriter w;
  w.set("general.architecture", GGUFValue::str("qfilter"));
  w.set("qfilter.base_model", GGUFValue::str(base_model));
  w.set("qfilter.n_layer", GGUFValue::u32(n_layer));
  w.set("qfilter.n_head_kv", GGUFValue::u32(n_head_kv));
  w.set("qfilter.head_dim", GGUFValue::u32(head_dim));
  w.add_tensor_f32("qfilter.dir", GGMLType::F32, {head_dim, n_head_kv, n_layer}, dir);
  w.add_tensor_f32("qfilter.explained", GGMLType::F32, {n_head_kv, n_layer}, explained);
  w.write(path);
}

QFilters QFilters::load(const std::string& path) {
  auto f = GGUFFile::open(path);
  QFilters q;
  if (f->get_string("general.architecture") != "qfilter")
    throw Error(fmt::format("{}: not a Q-filters file (general.architecture is '{}'; write one with kvslim "
                            "qfilter-calibrate)",
                            path, f->get_string("general.architecture")));
  q.n_layer = static_cast<int>(f->get_int("qfilter.n_layer"));
  q.n_head_kv = static_cast<int>(f->get_int("qfilter.n_head_kv"));
  q.head_dim = static_cast<int>(f->get_int("qfilter.head_dim"));
  q.base_model = f->get_string("qfilter.base_model");
  if (q.n_layer < 1 || q.n_head_kv < 1 || q.head_dim < 1)
    throw Error(fmt::format("{}: bad Q-filters shape ({} layers, {} KV heads, head_dim {})", path, q.n_layer,
                            q.n_head_kv, q.head_dim));
  const TensorInfo& t = f->tensor("qfilter.dir");
  const int64_t want = int64_t(q.n_layer) * q.n_head_kv * q.head_dim;
  if (t.nelements() != want)
    throw Error(fmt::format("{}: tensor qfilter.dir has {} values, expected {}", path, t.nelements(), want));
  q.dir = f->tensor_f32(t);
  const TensorInfo& e = f->tensor("qfilter.explained");
  if (e.nelements() != int64_t(q.n_layer) * q.n_head_kv)
    throw Error(fmt::format("{}: tensor qfilter.explained has {} values, expected {}", path, e.nelements(),
                            int64_t(q.n_layer) * q.n_head_kv));
  q.explained = f->tensor_f32(e);
  return q;
}

void QFilters::check(const HParams& hp, const std::string& what) const {
  if (n_layer != hp.n_layer || n_head_kv != hp.n_head_kv || head_dim != hp.head_dim)
    throw Error(fmt::format("{}: Q-filters for {} layers x {} KV heads x head_dim {} do not fit the model ({} x {} x "
                            "{})",
                            what, n_layer, n_head_kv, head_dim, hp.n_layer, hp.n_head_kv, hp.head_dim));
}

}  // namespace kvslim
