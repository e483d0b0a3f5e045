#pragma once
// Running learned input embeddings, optionally with a LoRA adapter, instead of token ids
// (RestoreKV's restore pass, arXiv 2608.01247: R learned rows at positions n .. n + R - 1 over the
// whole cache, the adapter on for that pass only). Internal.
//
// A caller passes an InputOverride as the hook of ModelRunner::run (Session::forward) together
// with R placeholder token ids: Session::forward_batch recognises the hook (dynamic_cast, once per
// batch), takes row p - first_position of `embeddings` as the input of the token at position p
// instead of the token's embedding row, and adds the adapter's low-rank update to the seven
// projections of every layer. The positions, the cache append and the position counter are the
// normal forward pass's. Without such a hook the forward pass is unchanged (bit for bit).
// The override must be the hook itself, not an entry of a HookList.
#include <cstdint>

#include <fmt/format.h>

#include "kvslim/error.h"
#include "model/layer_hook.h"
#include "model/lora.h"

namespace kvslim {

class InputOverride : public LayerHook {
 public:
  /// embeddings: [n][n_embd] input rows of the call (copied by pointer: they must outlive it);
  /// lora: the adapter for this call, or nullptr.
  InputOverride(const float* embeddings, int n, int n_embd, const LoraAdapter* lora)
      : emb_(embeddings), n_(n), n_embd_(n_embd), lora_(lora) {}
  /// Checks that the call runs exactly n rows and remembers its first position.
  void begin(const Token* tokens, int n, int32_t first_position) override {
    if (n != n_)
      throw Error(fmt::format("input override: the call runs {} tokens but {} input rows were given", n, n_));
    first_ = first_position;
  }
  /// Input row [n_embd] of the token at sequence position `position`. Throws kvslim::Error when
  /// the width differs from the model's or the position is not one of the call's.
  const float* row(int32_t position, int n_embd) const {
    if (n_embd != n_embd_)
      throw Error(fmt::format("input override: rows of {} values, the model's n_embd is {}", n_embd_, n_embd));
    const int64_t i = static_cast<int64_t>(position) - first_;
    if (i < 0 || i >= n_) throw Error(fmt::format("input override: position {} is not in the call", position));
    return emb_ + i * n_embd_;
  }
  const LoraAdapter* lora() const { return lora_; }

 private:
  const float* emb_;
  int n_, n_embd_;
  const LoraAdapter* lora_;
  int32_t first_ = 0;
};

}  // namespace kvslim
