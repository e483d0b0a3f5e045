// Q-Filters press: score = <k, u_{l,h}>, the key's projection on its (layer, KV head)'s query
// direction from `kvslim qfilter-calibrate` (see qfilter.h); the largest projections stay. No
// protected entries, as kvpress's QFilterPress (which scores -<k, filter> with the hub's filters).
// Godey et al., "Q-Filters: Leveraging QK Geometry for Efficient KV Cache Compression", arXiv
// 2503.02812; reference: kvpress/presses/qfilter_press.py (QFilterPress).
#include <memory>

#include <fmt/format.h>

#include "press/authoring.h"
#include "press/param_file.h"
#include "press/qfilter.h"

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
                    {{"ratio", "0"}, {"filters", ""}},
                    [](const PressParams& p) -> std::unique_ptr<Press> {
                      const std::string path = param_file(p, "qfilter", "filters");
                      if (path.empty())
                        throw Error("press qfilter needs filters=FILE.gguf (compute them on your model with `kvslim "
                                    "qfilter-calibrate`)");
                      return std::make_unique<QFilterPress>(param_double(p, "qfilter", "ratio"), path);
                    }});

}  // namespace
}  // namespace kvslim
