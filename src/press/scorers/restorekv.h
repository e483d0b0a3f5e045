#pragma once
// RestoreKV (arXiv 2608.01247; reference: kvpress kvpress/presses/restorekv_press.py,
// RestoreKVPress, a subclass of KVzipPress): after KVzip has scored the context (n tokens), R
// learned input embeddings run once at positions n .. n + R - 1 over the whole cache with a LoRA
// adapter switched on for that pass only; their entries are appended and always kept, and KVzip
// then evicts at ratio min(1, ratio + R / n) of the context, so the restore entries fill part of
// the same budget. The press is in restorekv.cpp; this header holds its file of embeddings and
// adapter. Internal.
#include <memory>
#include <string>
#include <vector>

#include "kvslim/model.h"
#include "kvslim/press.h"
#include "model/lora.h"

namespace kvslim {

/// What `restorekv:file=X.gguf` loads: the restore embeddings and the adapter of the restore pass.
///
/// File layout (GGUF, general.architecture = "restorekv"):
///   restorekv.base_model (string, informative), restorekv.n_embd, restorekv.n_layer,
///   restorekv.n_tokens (R), restorekv.lora_rank (0: no adapter), restorekv.lora_alpha (f32)
///   tensor restorekv.embeddings          f32, ne [n_embd, R]     (row t = restore token t's input)
///   tensor restorekv.<layer>.<proj>.lora_a f32, ne [in, rank]     (A: rank rows of `in` values)
///   tensor restorekv.<layer>.<proj>.lora_b f32, ne [rank, out]    (B: `out` rows of rank values)
/// for every layer and each projection <proj> in q k v o gate up down that the adapter changes
/// (all seven in kvpress's test adapter: rank 8, alpha 16); a projection without tensors is
/// left unchanged. in / out as lora_target_shape().
struct RestoreKVWeights {
  int n_embd = 0;
  int n_layer = 0;
  int n_tokens = 0;              ///< R
  std::vector<float> embeddings; ///< [R][n_embd]
  LoraAdapter lora;              ///< rank 0: none

  /// Throws kvslim::Error naming `what` (the file) when the weights do not fit the model: n_embd,
  /// layer count, or a LoRA factor's shape.
  void check(const HParams& hp, const std::string& what) const;
  /// Writes the file. `base_model` is recorded for information.
  void save(const std::string& path, const std::string& base_model) const;
  /// Reads a file written by save(). Throws kvslim::Error naming the file and the key or tensor
  /// that is missing or has the wrong size (e.g. "r.gguf: tensor 'restorekv.embeddings' has 500
  /// values, expected R 8 x n_embd 64 = 512").
  static RestoreKVWeights load(const std::string& path);
};

/// The `restorekv` press over weights already in memory (the trainer's student; `name` stands
/// for the file in describe()). n_sink 4, chunk 2048, plain KVzip, as the registry's defaults.
std::unique_ptr<PressImpl> make_restorekv_press(double ratio, std::shared_ptr<const RestoreKVWeights> w,
                                            const std::string& name);

}  // namespace kvslim
