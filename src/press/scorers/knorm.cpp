// KNorm: keys with a small L2 norm draw more attention, so the largest-norm keys are evicted.
// Devoto et al., "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression",
// arXiv 2406.11430.
#include <cmath>

#include <fmt/format.h>

#include "press/authoring.h"

namespace kvslim {
namespace {

class KNormPress : public ScorerPress {
 public:
  using ScorerPress::ScorerPress;
  std::string describe_scorer() const override { return fmt::format("knorm:ratio={}", ratio_); }
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override {
    const int hd = view.hp().head_dim;
    std::vector<float> k(hd);
    for (int h = 0; h < view.hp().n_head_kv; ++h) {
      const Segment& s = view.seg(h);
      out[h].resize(s.size());
      for (size_t i = 0; i < s.size(); ++i) {
        s.key(i, k.data());
        double ss = 0;
        for (float x : k) ss += double(x) * x;
        out[h][i] = -static_cast<float>(std::sqrt(ss));
      }
    }
  }
};

PressRegistrar reg({"knorm", "evicts the keys with the largest L2 norm",
                    "Devoto et al. 2024, A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression, "
                    "arXiv 2406.11430",
                    {{"ratio", "0"}}, [](const PressParams& p) -> std::unique_ptr<PressImpl> {
                      return std::make_unique<KNormPress>(param_double(p, "knorm", "ratio"));
                    }}, {"KnormPress"});

}  // namespace
}  // namespace kvslim
