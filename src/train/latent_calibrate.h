#pragma once
// Calibration of latent bases (press/latent.h): PCA of every segment's keys and values over
// calibration text, the ranks and code bits chosen by a memory target or by measured KL.
#include <string>
#include <vector>

#include "kv/latent.h"
#include "kvslim/model.h"
#include "press/scorers/latent.h"

namespace kvslim {

/// How kvslim latent-calibrate chooses ranks.
struct LatentCalibration {
  int k_rank = 0, v_rank = 0;  ///< fixed ranks for every segment (0 = chosen below)
  double energy = 0.99;        ///< without fixed ranks or a memory ratio: keep this fraction of variance
  /// > 0: ranks chosen so that the cache's bytes per entry (codes, per-entry code scales and the
  /// position; bases excluded) are at most this fraction of the f16 entry (2 * 2 * head_dim + 4
  /// bytes), spending dimensions where they keep the largest share of a segment's variance.
  double memory_ratio = 0.0;
  int k_bits = 0, v_bits = 0;  ///< code bits (0 = f16, 2, 4, 8, 32 = f32)
  /// With memory_ratio: choose each segment side's bits among 2, 4, 8 together with its rank
  /// (k_bits / v_bits ignored), minimizing the predicted relative error (variance beyond the
  /// rank + Max's Gaussian quantization error of the kept variance at those bits) summed over
  /// segments under the byte budget, by a Lagrange multiplier bisected to the budget.
  bool auto_bits = false;
  /// >= 0: adjacent layers (same KV head and side) share one basis when the pooled basis keeps,
  /// for every member, at least its own kept fraction - share of its variance (latent_share.h);
  /// < 0: no sharing. share_max > 0 caps the layers per group.
  double share = -1.0;
  int share_max = 0;
};

/// Relative mean squared error of a unit Gaussian quantized uniformly with 2^bits levels at the
/// MSE-optimal step (Max 1960, table II: 0.1188 for 4 levels, 0.01154 for 16; 256 levels: step^2 / 12
/// with step 0.0308); 0 for f16 / f32 codes (bits 0, 32).
double latent_quant_error(int bits);

/// Bytes of one entry's codes of `rank` coordinates at `bits` (LatentCodes::row_bytes; the
/// latent press scales quantized codes per channel by default).
size_t latent_row_bytes(int rank, int bits, LatentScales scales = LatentScales::Channel);

/// Runs the model over `docs` (each from position 0, f32 cache), gathers every segment's keys
/// (after RoPE) and values, and fits one basis per (layer, KV head) and side by PCA with the
/// ranks `opt` asks for. `report` (optional) receives one line per segment (ranks, variance kept)
/// and a summary with the predicted memory ratio. Throws kvslim::Error for no tokens, bad bits, or
/// a memory ratio too small for rank 1 everywhere.
LatentBases calibrate_latent(const Model& model, const std::vector<std::vector<Token>>& docs,
                             const LatentCalibration& opt, std::vector<std::string>* report = nullptr);

/// One candidate of choose_latent_bits_by_kl: the same bits for every segment's keys (k_bits)
/// and values (v_bits).
struct LatentBitsTrial {
  int k_bits = 0, v_bits = 0;
  double bytes_per_entry = 0;  ///< codes with their per-entry scale and the 4-byte position, summed over segments
  double kl = 0;               ///< mean KL(full cache || latent cache) over the held-out tokens, nats
};

/// What choose_latent_bits_by_kl measured and chose.
struct LatentBitsChoice {
  std::vector<LatentBitsTrial> trials;  ///< in the order run: bytes per entry ascending
  int chosen = -1;                      ///< index into trials
  bool target_met = false;
  /// With per_segment: the segment sides lowered one step each after the uniform choice, in
  /// order, and the bytes per entry and KL after all of them (else 0 steps, the chosen trial's).
  int steps = 0;
  double bytes_per_entry = 0, kl = 0;
};

/// Chooses the code bits of `bases` (the same for every segment: keys and values apart, each in
/// {2, 4, 8, 0 = f16}) by **measured** fidelity instead of a variance proxy: for every document
/// of `probe_docs`, the first tokens (all but the last max(1, holdout x size)) are prefilled into
/// an f16 cache, which is then converted to codes in `bases` at the candidate bits with `scales`
/// (as the latent press does), and the last tokens are teacher-forced; the trial's KL is the mean
/// of KL(full-cache logits || latent-cache logits) over every teacher-forced token of every
/// document. Candidates are tried from the fewest bytes per entry up (ties: fewer key bits
/// last, so keys keep precision first) and the first with KL <= target_kl is chosen; when none
/// is, the one with the least KL. Writes the chosen bits to bases.key_bits / value_bits.
/// per_segment (when the uniform choice met the target): then, greedily, one segment side at a
/// time is lowered one step (f16 -> 8 -> 4 -> 2 bits): of every side whose lowering keeps the
/// measured KL within the target, the one with the least KL increase per byte saved, until none
/// can be lowered; so the bytes never exceed the uniform choice's.
/// Throws kvslim::Error for target_kl < 0, holdout outside (0, 1) or no document of >= 2 tokens.
LatentBitsChoice choose_latent_bits_by_kl(const Model& model, LatentBases& bases,
                                          const std::vector<std::vector<Token>>& probe_docs, double target_kl,
                                          LatentScales scales = LatentScales::Channel, double holdout = 0.25,
                                          bool per_segment = false);

}  // namespace kvslim
