#pragma once
// A press that compresses nothing and keeps what the forward pass recorded during prefill: how
// analyses (attention statistics, layer budgets, calibration) run a prompt through the request
// runner and read the observation-window queries afterwards.
#include <string>

#include "press/authoring.h"

namespace kvslim {

class RecordingPress : public PressImpl {
 public:
  /// Records what `needs` asks (e.g. the queries of the last `window` tokens).
  explicit RecordingPress(ObservationNeeds needs) : needs_(std::move(needs)) {}
  std::string describe() const override { return "none"; }
  ObservationNeeds needs() const override { return needs_; }
  /// Keeps the observation of the last prefill chunk.
  void observe(const KVCache&, const Model&, const Observation& obs) override { obs_ = obs; }
  void apply(KVCache&, const Model&, const Observation&, const Target&) override {}
  void reset() override { obs_.clear(); }
  /// What the last prefill chunk recorded.
  const Observation& observation() const { return obs_; }

 private:
  ObservationNeeds needs_;
  Observation obs_;
};

}  // namespace kvslim
