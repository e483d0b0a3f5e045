#pragma once
// Learned input embeddings, optionally with a LoRA adapter, run instead of token ids (RestoreKV's
// restore pass, arXiv 2608.01247: R learned rows at positions n .. n + R - 1 over the whole cache,
// the adapter on for that pass only). Internal.
//
// A caller hands an InputOverride to ModelRunner::run_inputs (Session::forward_inputs): row i is
// the input of the i-th new position instead of a token's embedding row, and the adapter's low-rank
// update is added to the seven projections of every layer for those rows. The positions, the cache
// append and the position counter are the normal forward pass's.

#include "model/lora.h"

namespace kvslim {

class InputOverride {
 public:
  /// embeddings: [n][n_embd] input rows (held by pointer: they must outlive the call);
  /// lora: the adapter for these rows, or nullptr.
  InputOverride(const float* embeddings, int n, int n_embd, const LoraAdapter* lora)
      : emb_(embeddings), n_(n), n_embd_(n_embd), lora_(lora) {}
  int n() const { return n_; }
  int n_embd() const { return n_embd_; }
  /// Input row i [n_embd], 0 <= i < n().
  const float* row(int i) const { return emb_ + static_cast<size_t>(i) * n_embd_; }
  const LoraAdapter* lora() const { return lora_; }

 private:
  const float* emb_;
  int n_, n_embd_;
  const LoraAdapter* lora_;
};

}  // namespace kvslim
