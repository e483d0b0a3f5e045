#pragma once
// Scoring part of a cache (internal to src/press): ChunkPress and BlockPress hand their inner
// scorer a subset of each segment's entries, as kvpress calls press.score() on a slice of the keys.
#include <memory>
#include <vector>

#include "press/authoring.h"

namespace kvslim {

/// Entry indices per segment: [layer][kv head] -> increasing indices into that segment.
using SegmentIndices = std::vector<std::vector<std::vector<int32_t>>>;

/// A float32 cache holding, in every segment, the entries idx[l][h] of `cache` (decoded keys and
/// values, positions kept), in order.
KVCache sub_cache(const KVCache& cache, const SegmentIndices& idx);

/// Base of a wrapper that scores with an inner scorer press (uniform policy) on parts of the cache:
/// forwards the observation request, per-request state and the ratio to it.
class SubsetScoringPress : public PressImpl {
 public:
  explicit SubsetScoringPress(std::unique_ptr<ScorerPress> inner) : inner_(std::move(inner)) {}
  ObservationNeeds needs() const override { return inner_->needs(); }
  void observe(const KVCache& c, const Model& m, const Observation& o) override { inner_->observe(c, m, o); }
  void reset() override { inner_->reset(); }
  double ratio() const override { return inner_->ratio(); }
  double key_channel_ratio() const override { return inner_->key_channel_ratio(); }
  void set_ratio(double r) override { inner_->set_ratio(r); }
  void remap_positions(int l, int h, const std::vector<int32_t>& o, const std::vector<int32_t>& n) override {
    inner_->remap_positions(l, h, o, n);
  }

 protected:
  std::unique_ptr<ScorerPress> inner_;
};

/// Checks that `inner` can be scored on parts of the cache (a scorer press under the uniform
/// policy that keeps no per-entry state) and returns it as a ScorerPress; kvslim::Error naming
/// `wrapper` otherwise.
std::unique_ptr<ScorerPress> subset_scorer(const std::string& wrapper, std::unique_ptr<PressImpl> inner);

}  // namespace kvslim
