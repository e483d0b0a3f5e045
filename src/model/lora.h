#pragma once
// LoRA adapters on the seven projections of a llama layer (Hu et al., "LoRA: Low-Rank Adaptation of
// Large Language Models", arXiv 2106.09685), as PEFT applies them: a projection y = W x (+ b)
// becomes y = W x (+ b) + (alpha / rank) B (A x), with A [rank][in] and B [out][rank]. Used by the
// forward pass only when a caller switches an adapter on for one call (RestoreKV's restore pass,
// arXiv 2608.01247, through model/input_override.h); the normal forward pass never reads one.
// Internal.
#include <array>
#include <string>
#include <vector>

#include "kvslim/model.h"

namespace kvslim {

/// The projections an adapter may change, in PEFT's target-module order.
enum class LoraTarget : int { Q = 0, K, V, O, Gate, Up, Down };
constexpr int kLoraTargets = 7;

/// "q", "k", "v", "o", "gate", "up", "down" (names in files and messages).
const char* lora_target_name(LoraTarget t);

/// Input and output widths of projection `t` in a model with hyper-parameters `hp`: q [n_embd ->
/// n_head x head_dim], k and v [n_embd -> n_head_kv x head_dim], o [n_head x head_dim -> n_embd],
/// gate and up [n_embd -> n_ff], down [n_ff -> n_embd].
void lora_target_shape(const HParams& hp, LoraTarget t, int& in, int& out);

/// Low-rank updates of every layer's projections.
struct LoraAdapter {
  /// One projection's factors; both empty when the adapter leaves it unchanged.
  struct Factors {
    std::vector<float> a;  ///< [rank][in]
    std::vector<float> b;  ///< [out][rank]
    bool active() const { return !a.empty(); }
  };
  int rank = 0;
  float alpha = 0.0f;
  std::vector<std::array<Factors, kLoraTargets>> layers;  ///< [n_layer]

  /// The PEFT scaling alpha / rank (0 when rank is 0).
  float scale() const { return rank > 0 ? alpha / static_cast<float>(rank) : 0.0f; }
  /// An adapter of `rank` on every listed projection of every layer of `hp`, A and B zero
  /// (a no-op until filled). Throws kvslim::Error for rank < 1.
  static LoraAdapter zeros(const HParams& hp, int rank, float alpha, const std::vector<LoraTarget>& targets);
  /// Throws kvslim::Error naming `what` (a file) when the layer count or a factor's size does not
  /// fit the model, e.g. "r.gguf: LoRA factor 'down' of layer 2 has 1376 values in A, expected 8 x 172".
  void check(const HParams& hp, const std::string& what) const;
  /// y[t] += scale() * B (A x[t]) for the n rows x [n][in] -> y [n][out] of projection `t` of
  /// `layer` (nothing when that projection has no factors). A x is accumulated in double.
  void add(int layer, LoraTarget t, const float* x, int n, float* y) const;
};

}  // namespace kvslim
