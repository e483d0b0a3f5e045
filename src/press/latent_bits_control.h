#pragma once
// The code bits of a press's latent stage, chosen per request: the second axis of the
// auto-budget (run/auto_budget.cpp) next to the compression ratio. The spec lists the candidates
// (`latent:...,k_bits=8/4,v_bits=8/4/2`); the auto-budget finds this internal interface through
// Press::latent_bits() and tries them, so that Press (include/kvslim/press.h) keeps only set_ratio.
#include <vector>

#include "kvslim/press.h"

namespace kvslim {

/// Implemented by the `latent` press (press/latent.cpp).
class LatentBitsControl {
 public:
  virtual ~LatentBitsControl() = default;
  /// The key / value code bits the spec lists (k_bits, v_bits: one value, or candidates separated
  /// by '/'), each 0 (f16), 2, 4, 8 or 32 (f32). One value each: nothing to choose.
  virtual const std::vector<int>& key_bit_choices() const = 0;
  virtual const std::vector<int>& value_bit_choices() const = 0;
  /// Every segment's keys / values get these bits from the next compression on (with a
  /// calibration file, instead of the file's). Throws kvslim::Error naming k_bits / v_bits for a
  /// value the spec does not list. Kept until clear_latent_bits() or reset().
  virtual void set_latent_bits(int key_bits, int value_bits) = 0;
  /// The per-request bases' ranks the spec lists (k_rank, v_rank: one value, or candidates
  /// separated by '/', which only the per-layer search chooses; until then the largest is used).
  virtual const std::vector<int>& key_rank_choices() const = 0;
  virtual const std::vector<int>& value_rank_choices() const = 0;
  /// Bits and ranks per layer from the next compression on: layer l's segments (every KV head)
  /// get key_bits[l] / value_bits[l] and, when given (else the largest listed rank),
  /// key_rank[l] / value_rank[l]: one value per layer of the cache compressed, else compressing
  /// throws kvslim::Error. Each value must be listed (kvslim::Error naming the parameter).
  /// Replaces set_latent_bits' choice; kept until clear_latent_bits() or reset().
  struct Layers {
    std::vector<int> key_bits, value_bits, key_rank, value_rank;
  };
  virtual void set_latent_layers(const Layers& layers) = 0;
  /// True when the spec asks for bits (and ranks) chosen per layer (`per_layer=1`): the
  /// auto-budget then, after choosing one pair for every layer, lowers single layers' bits or
  /// ranks while the target holds.
  virtual bool per_layer_bits() const = 0;
  /// Back to the spec's bits (with several candidates, compressing then is an error: the
  /// auto-budget must choose).
  virtual void clear_latent_bits() = 0;
};

}  // namespace kvslim
