#pragma once
// Next-token distributions: sampling (greedy, or top-k -> top-p -> temperature -> draw, llama.cpp's
// order) and how far two logit vectors' distributions are apart (KL, NLL).
#include <cstdint>
#include <random>
#include <vector>

#include "kvslim/tokenizer.h"

namespace kvslim {

struct SamplingParams {
  float temp = 0.8f;    ///< <= 0: greedy (arg max)
  int top_k = 40;       ///< <= 0: all tokens
  float top_p = 0.95f;  ///< >= 1: no nucleus cut
  uint64_t seed = 0;
};

/// Draws tokens from logits; deterministic for a seed.
class Sampler {
 public:
  /// A non-finite temperature or top_p -> kvslim::Error.
  explicit Sampler(SamplingParams p);
  /// logits has n_vocab values. Ties in greedy mode go to the lowest id.
  Token sample(const std::vector<float>& logits);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

/// Index of the largest value (lowest index on ties).
Token argmax(const float* logits, size_t n);

/// KL(P || Q) in nats between the softmax distributions of two logit vectors of length n,
/// computed in float64 with log-sum-exp (no overflow for large logits). Entries where P is 0
/// contribute 0; a finite P entry where Q is 0 makes the result +inf.
double kl_divergence_logits(const float* p_logits, const float* q_logits, size_t n);

/// -log softmax(logits)[target] in nats (float64). Throws kvslim::Error when target is outside [0, n).
double nll_logits(const float* logits, size_t n, int target);

}  // namespace kvslim
