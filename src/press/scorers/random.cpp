// Random: a baseline that evicts entries at random. Each entry's score is a hash of (seed, layer,
// KV head, position) mapped to [0, 1): deterministic, the same for a given entry in every
// compression step (so chunked prefill does not reshuffle), and independent of thread count.
// kvpress's RandomPress draws torch.rand with the seed instead.
#include <cstdint>

#include <fmt/format.h>

#include "press/authoring.h"

namespace kvslim {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

class RandomPress : public ScorerPress {
 public:
  RandomPress(double ratio, uint64_t seed) : ScorerPress(ratio), seed_(seed) {}
  std::string describe_scorer() const override { return fmt::format("random:ratio={},seed={}", ratio_, seed_); }
  void score(const LayerView& view, std::vector<std::vector<float>>& out) const override {
    for (int h = 0; h < view.hp().n_head_kv; ++h) {
      const auto& pos = view.seg(h).positions();
      out[h].resize(pos.size());
      const uint64_t base = splitmix64(splitmix64(seed_) ^ (uint64_t(view.layer()) << 32 | uint32_t(h)));
      for (size_t i = 0; i < pos.size(); ++i)
        out[h][i] = static_cast<float>((splitmix64(base ^ uint32_t(pos[i])) >> 40) * 0x1.0p-24);
    }
  }

 private:
  uint64_t seed_;
};

PressRegistrar reg({"random", "random scores (baseline); deterministic for a seed",
                    "kvpress RandomPress (baseline)",
                    {{"ratio", "0"},
                     {"seed", "42", {},
                      {.help = "the random generator's seed; None: kvslim's fixed default (kvslim is deterministic)",
                       .default_value = "None"}}},
                    [](const PressParams& p) -> std::unique_ptr<PressImpl> {
                      int seed = param_int(p, "random", "seed");
                      return std::make_unique<RandomPress>(param_double(p, "random", "ratio"),
                                                           static_cast<uint64_t>(seed));
                    }}, {"RandomPress"});

}  // namespace
}  // namespace kvslim
