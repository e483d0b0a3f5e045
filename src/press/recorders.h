#pragma once
// Recorders: the small LayerHook classes that record what presses read (observation-window
// queries, attention mass, hidden states, the step's tokens) into an Observation, and the one
// helper every job uses to run a step with a press's needs. Internal to the library.
#include <cstdint>
#include <memory>
#include <vector>

#include "model/layer_hook.h"
#include "press/authoring.h"

namespace kvslim {

/// Queries (RoPE applied) of the newest `window` tokens at positions >= `from`, per layer:
/// Observation::queries [layer][n_head][n_window][head_dim] and window_positions.
class WindowQueryRecorder : public LayerHook {
 public:
  WindowQueryRecorder(int window, int32_t from) : window_(window), from_(from) {}
  bool before_attention(const LayerStep& step, std::vector<std::vector<int32_t>>&) override;
  /// Moves what was recorded into `obs`.
  void finish(Observation& obs);

 private:
  int window_;
  int32_t from_;
  int n_head_ = 0, head_dim_ = 0;
  std::vector<std::vector<float>> rows_;  // [layer] -> [row][n_head][head_dim], newest `window` rows
  std::vector<int32_t> positions_;
};

/// Attention mass every entry receives from the step's tokens, accumulated over the step's
/// batches: Observation::attention_mass [layer][kv head][entry].
class AttentionMassRecorder : public LayerHook {
 public:
  bool wants_attention_mass() const override { return true; }
  void after_attention(const LayerStep& step, const std::vector<std::vector<float>>* mass) override;
  void finish(Observation& obs) { obs.attention_mass = std::move(mass_); }

 private:
  std::vector<std::vector<std::vector<float>>> mass_;
};

/// Layer-input hidden states of the step's tokens: Observation::hidden, hidden_positions.
class HiddenStateRecorder : public LayerHook {
 public:
  void after_qkv(const LayerStep& step) override;
  void finish(Observation& obs);

 private:
  std::vector<std::vector<float>> hidden_;
  std::vector<int32_t> positions_;
};

/// Every token of the step and its position (what KVzip replays): Observation::tokens.
class TokenRecorder : public LayerHook {
 public:
  void begin(const Token* tokens, int n, int32_t first) override;
  void finish(Observation& obs);

 private:
  std::vector<Token> tokens_;
  std::vector<int32_t> positions_;
};

/// The recorders `needs` asks for plus the needs' own hooks, as one hook; observation() collects
/// what was recorded.
class Observer : public LayerHook {
 public:
  /// Window queries are recorded for positions >= window_from (the last tokens of the step).
  Observer(const ObservationNeeds& needs, int32_t window_from);
  void begin(const Token* tokens, int n, int32_t first) override { hooks_.begin(tokens, n, first); }
  void after_qkv(const LayerStep& s) override { hooks_.after_qkv(s); }
  bool before_attention(const LayerStep& s, std::vector<std::vector<int32_t>>& subset) override {
    return hooks_.before_attention(s, subset);
  }
  bool wants_attention_mass() const override { return hooks_.wants_attention_mass(); }
  void after_attention(const LayerStep& s, const std::vector<std::vector<float>>* mass) override {
    hooks_.after_attention(s, mass);
  }
  /// What the recorders saw (call once, after the step).
  Observation observation();

 private:
  std::unique_ptr<WindowQueryRecorder> window_;
  std::unique_ptr<AttentionMassRecorder> mass_;
  std::unique_ptr<HiddenStateRecorder> hidden_;
  std::unique_ptr<TokenRecorder> tokens_;
  HookList hooks_;
};

/// Runs `tokens` on `runner` with what `needs` asks for recorded into `obs` (window queries of
/// the step's last needs.window tokens; everything else over the whole step) and its hooks
/// called; obs.runner is set to `runner`. Returns the last token's logits. With nothing needed the
/// step runs without a hook.
std::vector<float> run_observed(ModelRunner& runner, const std::vector<Token>& tokens, const ObservationNeeds& needs,
                                Observation& obs);

}  // namespace kvslim
