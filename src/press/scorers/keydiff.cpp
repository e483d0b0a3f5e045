// KeyDiff: keys that differ most from the segment's average key direction are kept. The anchor is
// the mean of the L2-normalized keys of the segment; score = -cos(key, anchor). Park et al.,
// "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference in
// Resource-Constrained Environments", arXiv 2504.15364; as kvpress's KeyDiffPress (one-shot: the
// paper's block-wise iteration is what chunked prefill does here).
#include <cmath>

#include <fmt/format.h>

#include "press/authoring.h"

namespace kvslim {
namespace {

class KeyDiffPress : public ScorerPress {
 public:
  using ScorerPress::ScorerPress;
  std::string describe_scorer() const override { return fmt::format("keydiff:ratio={}", ratio_); }
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override {
    const int hd = view.hp().head_dim;
    for (int h = 0; h < view.hp().n_head_kv; ++h) {
      const Segment& s = view.seg(h);
      const size_t n = s.size();
      out[h].assign(n, 0.0f);
      if (n == 0) continue;
      std::vector<float> k(n * hd);
      s.keys(0, n, k.data());
      std::vector<double> norm(n), anchor(hd, 0.0);
      for (size_t i = 0; i < n; ++i) {
        double ss = 0;
        for (int d = 0; d < hd; ++d) ss += double(k[i * hd + d]) * k[i * hd + d];
        norm[i] = std::sqrt(ss);
        // torch's F.normalize divides by max(norm, 1e-12)
        double inv = 1.0 / std::max(norm[i], 1e-12);
        for (int d = 0; d < hd; ++d) anchor[d] += k[i * hd + d] * inv;
      }
      double an = 0;
      for (double& a : anchor) {
        a /= static_cast<double>(n);
        an += a * a;
      }
      an = std::sqrt(an);
      for (size_t i = 0; i < n; ++i) {
        double dot = 0;
        for (int d = 0; d < hd; ++d) dot += k[i * hd + d] * anchor[d];
        // torch's cosine_similarity: x.y / max(|x| |y|, eps), eps = 1e-8
        out[h][i] = static_cast<float>(-dot / std::max(norm[i] * an, 1e-8));
      }
    }
  }
};

PressRegistrar reg({"keydiff", "evicts keys most similar to the segment's mean key direction",
                    "Park et al. 2025, KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM "
                    "Inference in Resource-Constrained Environments, arXiv 2504.15364",
                    {{"ratio", "0"}}, [](const PressParams& p) -> std::unique_ptr<PressImpl> {
                      return std::make_unique<KeyDiffPress>(param_double(p, "keydiff", "ratio"));
                    }}, {"KeyDiffPress"});

}  // namespace
}  // namespace kvslim
