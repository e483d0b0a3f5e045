#pragma once
// The observation window of decode-time presses (decoding, cam): the newest queries of the decode
// steps, seeded with the prefill's last window; and the base class those wrappers share. Internal
// to src/press.
#include <memory>

#include "press/authoring.h"

namespace kvslim {

/// Appends the decode step's recorded window queries (`step`) to `buf`, keeping the newest
/// `window` rows per layer and query head (buf.queries [layer][n_head][rows][head_dim] and
/// buf.window_positions). Nothing happens when window <= 0 or the step recorded no queries.
void append_decode_window(Observation& buf, const Observation& step, const Model& model, int window);

/// What every decode-time wrapper over an `Inner` press (a Press or a ScorerPress) shares: prefill
/// evicts nothing and only seeds the decode-time window with the prefill's last window; each decode
/// step the inner press observes it and the window moves on (observe_step()); the inner press's
/// needs, ratio and per-entry state (remap_positions) are the wrapper's; the wrapper evicts during
/// decode. A subclass writes describe() and after_decode() (and extends reset() / decode_needs() /
/// remap_positions() with its own state).
template <typename Inner>
class DecodeTimeWrapper : public PressImpl {
 public:
  explicit DecodeTimeWrapper(std::unique_ptr<Inner> inner) : inner_(std::move(inner)) {}
  ObservationNeeds needs() const override { return inner_->needs(); }
  ObservationNeeds decode_needs() const override { return merge_needs(inner_->needs(), inner_->decode_needs()); }
  void observe(const KVCache& c, const Model& m, const Observation& o) override { inner_->observe(c, m, o); }
  void apply(KVCache&, const Model&, const Observation& obs, const Target&) override {
    // Prefill: nothing is evicted; the window seeds the decode-time observation.
    window_.queries = obs.queries;
    window_.window_positions = obs.window_positions;
  }
  void reset() override {
    inner_->reset();
    window_.clear();
  }
  double ratio() const override { return inner_->ratio(); }
  double key_channel_ratio() const override { return inner_->key_channel_ratio(); }
  void set_ratio(double r) override { inner_->set_ratio(r); }
  size_t kept_after(const Target& t) const override { return t.n_context; }
  bool evicts_in_decode() const override { return true; }
  void remap_positions(int l, int h, const std::vector<int32_t>& o, const std::vector<int32_t>& n) override {
    inner_->remap_positions(l, h, o, n);
  }

 protected:
  /// The inner press observes the decode step `step` and the window takes its queries.
  void observe_step(const KVCache& cache, const Model& model, const Observation& step) {
    inner_->observe(cache, model, step);
    append_decode_window(window_, step, model, inner_->needs().window);
  }

  std::unique_ptr<Inner> inner_;
  Observation window_;  ///< the decode-time observation window (queries and their positions)
};

}  // namespace kvslim
