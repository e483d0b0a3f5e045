#pragma once
// A press that compresses nothing and keeps what the forward pass recorded during prefill: how
// analyses (attention statistics, layer budgets, calibration) run a prompt through the request
// runner and read the observation-window queries afterwards.
#include <string>

#include "kvslim/press.h"

namespace kvslim {

class ObservationRecorder : public Press {
 public:
  /// Records what `req` asks (e.g. the queries of the last `window` tokens).
  explicit ObservationRecorder(ObservationRequest req) : req_(std::move(req)) {}
  std::string describe() const override { return "none"; }
  ObservationRequest request() const override { return req_; }
  /// Keeps the observation of the last prefill chunk.
  void observe(const KVCache&, const Model&, const Observation& obs) override { obs_ = obs; }
  void apply(KVCache&, const Model&, const Observation&, const Target&) override {}
  void reset() override { obs_.clear(); }
  /// What the last prefill chunk recorded.
  const Observation& observation() const { return obs_; }

 private:
  ObservationRequest req_;
  Observation obs_;
};

}  // namespace kvslim
