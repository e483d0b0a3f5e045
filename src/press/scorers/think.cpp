// ThinK: query-driven pruning of key channels. Xu et al., "ThinK: Thinner Key Cache by
// Query-Driven Pruning", arXiv 2407.21018; scoring as kvpress's ThinKPress: per KV head, channel
// d scores mean_window,group(q_d^2) * mean_entries(k_d^2) and the floor(head_dim * key_ratio)
// lowest-scoring channels are pruned.
// kvpress zeroes the pruned channels (no memory saved); here the segment stores only the kept
// channels (a selection basis, kv/latent.h), so the bytes really go down, and entries appended
// later (question, decode) are stored with the same channels. Values keep their precision.
#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "kernels/threads.h"
#include "press/authoring.h"

namespace kvslim {
namespace {

// Bits of latent codes that keep a side as precise as the cache's codec.
int bits_like(KVCodec c, const KVQuantOptions& q) {
  if (q.kivi_bits) return q.kivi_bits;
  switch (c) {
    case KVCodec::F32: return 32;
    case KVCodec::Q8_0: return 8;
    case KVCodec::Q4_0: return 4;
    case KVCodec::Q2_1: return 2;
    default: return 0;  // f16 (bf16 is stored as f16 codes)
  }
}

class ThinKPress : public PressImpl {
 public:
  ThinKPress(double key_ratio, int window) : key_ratio_(key_ratio), window_(window) {}
  std::string describe() const override { return fmt::format("think:key_ratio={},window={}", key_ratio_, window_); }
  ObservationNeeds needs() const override {
    ObservationNeeds r;
    r.window = window_;
    return r;
  }
  // Channels, not entries: the entry count is unchanged, the key channels go.
  double ratio() const override { return 0.0; }
  // What apply() prunes: floor(head_dim * key_ratio) channels, at least one kept.
  double key_channel_ratio() const override { return key_ratio_; }
  size_t kept_after(const Target& t) const override { return t.n_context; }

  void apply(KVCache& cache, const Model& model, const Observation& obs, const Target&) override {
    if (key_ratio_ <= 0.0) return;
    const HParams& hp = model.hparams();
    const int L = cache.n_layer(), H = cache.n_head_kv(), hd = cache.head_dim(), G = hp.n_group();
    const int nw = obs.n_window();
    if (nw == 0) throw Error("press think: no observation-window queries were recorded");
    const int keep = std::max(1, hd - static_cast<int>(std::floor(hd * key_ratio_ + 1e-9)));
    auto values = identity_basis(hd);  // one basis for every segment, counted once
    parallel_for(static_cast<int64_t>(L) * H, [&](int64_t b, int64_t e) {
      std::vector<double> qn(hd), kn(hd);
      std::vector<float> k(hd);
      for (int64_t u = b; u < e; ++u) {
        const int l = static_cast<int>(u / H), h = static_cast<int>(u % H);
        Segment& seg = cache.seg(l, h);
        // With chunked prefill the first chunk chooses the channels; later entries follow them.
        if (seg.size() == 0 || seg.latent()) continue;
        std::fill(qn.begin(), qn.end(), 0.0);
        std::fill(kn.begin(), kn.end(), 0.0);
        const float* Q = obs.queries[l].data();
        for (int g = 0; g < G; ++g)
          for (int i = 0; i < nw; ++i) {
            const float* q = Q + (static_cast<size_t>(h * G + g) * nw + i) * hd;
            for (int d = 0; d < hd; ++d) qn[d] += static_cast<double>(q[d]) * q[d];
          }
        for (size_t j = 0; j < seg.size(); ++j) {
          seg.key(j, k.data());
          for (int d = 0; d < hd; ++d) kn[d] += static_cast<double>(k[d]) * k[d];
        }
        // Means only rescale every channel alike; the product of sums ranks the same.
        std::vector<int32_t> ch(hd);
        std::iota(ch.begin(), ch.end(), 0);
        std::stable_sort(ch.begin(), ch.end(), [&](int32_t a, int32_t c) { return qn[a] * kn[a] > qn[c] * kn[c]; });
        ch.resize(keep);
        std::sort(ch.begin(), ch.end());
        auto kb = std::make_shared<LatentBasis>();
        kb->head_dim = hd;
        kb->channels = std::move(ch);
        seg.to_latent(std::move(kb), bits_like(seg.key_codec(), seg.quant()), values,
                      bits_like(seg.value_codec(), seg.quant()));
      }
    });
  }

 private:
  double key_ratio_;
  int window_;
};

PressRegistrar reg([] {
  PressInfo i;
  i.name = "think";
  i.kvpress = {"ThinKPress"};
  i.summary = "prunes the key channels with the lowest query-weighted magnitude (per KV head); entries stay, "
              "the pruned channels' bytes are freed";
  i.source = "Xu et al. 2024, ThinK: Thinner Key Cache by Query-Driven Pruning, arXiv 2407.21018";
  i.params = {{"key_ratio", "0.5", "key_channel_compression_ratio",
               {.help = "the fraction of key channels pruned", .default_value = "0.0"}},
              {"window", "32", "window_size",
               {.help = "the last context queries whose magnitudes score the channels"}}};
  i.make = [](const PressParams& p) -> std::unique_ptr<PressImpl> {
    const double r = param_double(p, "think", "key_ratio");
    if (!(r >= 0.0 && r < 1.0)) throw Error(fmt::format("press think: key_ratio={} must be in [0, 1)", r));
    const int w = param_int(p, "think", "window");
    if (w < 1) throw Error(fmt::format("press think: window={} must be >= 1", w));
    return std::make_unique<ThinKPress>(r, w);
  };
  return i;
}());

}  // namespace
}  // namespace kvslim
