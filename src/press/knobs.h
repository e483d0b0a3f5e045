#pragma once
// Settings a press lets the auto-budget (run/auto_budget.cpp) choose per request beside the
// compression ratio: each knob is a spec parameter that lists candidate values ("k_bits=8/4").
// The auto-budget finds a press's knobs through PressImpl::knobs() and knows nothing of what they mean,
// only which candidate keeps more (its width) and whether the press takes them per layer.
#include <string>
#include <vector>

#include "kvslim/press.h"

namespace kvslim {

/// One setting with its candidates.
struct Knob {
  std::string name;          ///< the spec parameter, for messages ("k_bits")
  std::vector<int> choices;  ///< the candidates in the spec's order
  /// How much of the cache each candidate keeps (aligned with choices; larger keeps more): the
  /// per-layer search steps from a value to the candidate of the next smaller width.
  std::vector<int> widths;
  /// Tried in every combination with the other such knobs when one setting is chosen for all
  /// layers; false: held at its widest candidate there and lowered only per layer.
  bool in_grid = true;
};

/// Implemented by a press that has knobs (the `latent` press: code bits and ranks).
class KnobControl {
 public:
  virtual ~KnobControl() = default;
  /// The press's knobs, in a fixed order: the index of a knob is its place in every setting.
  virtual std::vector<Knob> knob_list() const = 0;
  /// Whether the spec asks for the knobs chosen per layer (after one setting for all layers).
  virtual bool knobs_per_layer() const = 0;
  /// From the next compression on, knob k takes values[k] in every layer. Throws kvslim::Error
  /// naming the parameter for a value the spec does not list. Kept until clear_knobs() or reset().
  virtual void set_knobs(const std::vector<int>& values) = 0;
  /// From the next compression on, knob k takes values[k][l] in layer l: one value per layer of
  /// the cache compressed, else compressing throws kvslim::Error. Replaces set_knobs' choice.
  virtual void set_knobs_per_layer(const std::vector<std::vector<int>>& values) = 0;
  /// Back to the spec's values (with several candidates, compressing then is an error: the
  /// auto-budget must choose).
  virtual void clear_knobs() = 0;
};

}  // namespace kvslim
