#pragma once
// Metrics of the evaluation harness: fidelity of next-token distributions (KL, top-1 agreement,
// perplexity; the per-distribution KL and NLL are in sampling.h, beside the distributions they
// compare) and RULER's string-match scores.
#include <cstddef>
#include <string>
#include <vector>

#include "kvslim/sampling.h"  // kl_divergence_logits, nll_logits

namespace kvslim {

/// Accumulates teacher-forced fidelity of a compressed cache against the full cache, one
/// predicted token at a time (architecture section 6).
class FidelityAccumulator {
 public:
  /// `full` and `comp` are the n-vocabulary logits predicting `target`. Top-1 agreement compares
  /// the arg max of both (lowest index on ties, as greedy decoding does).
  void add(const float* full, const float* comp, size_t n, int target);
  /// Merges another accumulator (token-weighted).
  void merge(const FidelityAccumulator& o);

  size_t tokens() const { return n_; }
  /// Mean KL(full || compressed) per token, nats.
  double mean_kl() const { return n_ ? kl_sum_ / n_ : 0.0; }
  /// Largest per-token KL seen, nats.
  double max_kl() const { return kl_max_; }
  /// Fraction of tokens where both caches predict the same arg max.
  double top1_agreement() const { return n_ ? double(agree_) / n_ : 0.0; }
  /// exp(mean NLL of the targets) under the full and the compressed cache.
  double perplexity_full() const;
  double perplexity_compressed() const;
  double nll_full_sum() const { return nll_full_; }
  double nll_compressed_sum() const { return nll_comp_; }
  size_t top1_agreements() const { return agree_; }
  double kl_sum() const { return kl_sum_; }
  /// Rebuilds an accumulator from its sums (as written to samples.jsonl), so results read back
  /// from shards summarize bit-identically to the run that produced them.
  static FidelityAccumulator from_sums(size_t tokens, size_t top1_agreements, double kl_sum, double kl_max,
                                       double nll_full_sum, double nll_compressed_sum);

 private:
  size_t n_ = 0, agree_ = 0;
  double kl_sum_ = 0, kl_max_ = 0, nll_full_ = 0, nll_comp_ = 0;
};

/// RULER's string_match_all: the fraction of `refs` found (case-insensitively) as substrings of
/// `prediction`. Hsieh et al., "RULER: What's the Real Context Size of Your Long-Context Language
/// Models?", arXiv 2404.06654. Empty `refs` -> 0.
double string_match_all(const std::string& prediction, const std::vector<std::string>& refs);

/// RULER's string_match_part: 1 when any of `refs` is found (case-insensitively) in `prediction`.
double string_match_part(const std::string& prediction, const std::vector<std::string>& refs);

}  // namespace kvslim
