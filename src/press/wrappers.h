#pragma once
// Wrapper presses built by the spec parser (internal to src/press).
#include <memory>
#include <vector>

#include "press/authoring.h"

namespace kvslim {

/// "a+b+...": see composed.cpp.
class ComposedPress : public PressImpl {
 public:
  explicit ComposedPress(std::vector<std::unique_ptr<PressImpl>> presses);
  std::string describe() const override;
  /// The stages' reports that are not empty, joined by "; ".
  std::string report() const override;
  ObservationNeeds needs() const override;
  ObservationNeeds decode_needs() const override;
  void observe(const KVCache& cache, const Model& model, const Observation& obs) override;
  void apply(KVCache& cache, const Model& model, const Observation& obs, const Target& target) override;
  void after_decode(KVCache& cache, const Model& model, const Observation& obs) override;
  void reset() override;
  double ratio() const override;
  /// The first stage's that prunes key channels: a later stage finds the keys pruned already
  /// (latent) and leaves them.
  double key_channel_ratio() const override;
  /// Sets the ratio of the first stage that has one (the others keep theirs); kvslim::Error when
  /// no stage has a ratio.
  void set_ratio(double r) override;
  size_t kept_after(const Target& t) const override;
  bool evicts_in_decode() const override;
  bool selects_in_decode() const override;
  void remap_positions(int l, int h, const std::vector<int32_t>& o, const std::vector<int32_t>& n) override;
  /// The first stage's (nested compositions searched in spec order), or nullptr.
  KnobControl* knobs() override;

 private:
  std::vector<std::unique_ptr<PressImpl>> p_;
};

}  // namespace kvslim
