#pragma once
// Latent bases of a whole model: one key and one value basis per (layer, KV head), from
// calibration activations, saved to and loaded from GGUF (kvslim latent-calibrate writes them,
// train/latent_calibrate.h fits them, the `latent` press loads them).
#include <memory>
#include <string>
#include <vector>

#include "kv/latent.h"
#include "kvslim/model.h"

namespace kvslim {

/// Bases and code bits per (layer, KV head); layer-major vectors of n_layer * n_head_kv.
/// Segments whose bases are the same object share them (cross-layer sharing counts them once).
struct LatentBases {
  int n_layer = 0, n_head_kv = 0, head_dim = 0;
  std::vector<std::shared_ptr<const LatentBasis>> key, value;
  std::vector<int> key_bits, value_bits;

  /// GGUF layout: general.architecture "kvslim-latent", latent.{n_layer,n_head_kv,head_dim},
  /// latent.key_bits / latent.value_bits (i32 arrays), latent.key_source / latent.value_source
  /// (i32 arrays: the index of the (layer, head) whose basis a segment reuses, its own index when
  /// it has its own), and for every own basis tensors latent.{l}.{h}.{k|v}.{proj,mean,scale}
  /// (proj: [head_dim, rank] in ggml order). `model_desc` is recorded as latent.base_model.
  void save(const std::string& path, const std::string& model_desc) const;
  /// Throws kvslim::Error naming the file and the field for a missing or malformed entry.
  /// Every basis loaded is marked LatentBasis::shared.
  static LatentBases load(const std::string& path);
  /// load() once per process and file (path, size and modification time): every press that names
  /// the same file uses the same bases, which caches count as shared memory. Thread-safe.
  static std::shared_ptr<const LatentBases> load_shared(const std::string& path);
  /// Throws kvslim::Error when the shape differs from the model's, naming `what`.
  void check(const HParams& hp, const std::string& what) const;
};

}  // namespace kvslim
