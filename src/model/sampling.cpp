#include "kvslim/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "kvslim/error.h"

namespace kvslim {

Sampler::Sampler(SamplingParams p) : p_(p), rng_(p.seed) {
  if (!std::isfinite(p.temp)) throw Error(fmt::format("sampling: temperature {} is not a finite number", p.temp));
  if (!std::isfinite(p.top_p)) throw Error(fmt::format("sampling: top_p {} is not a finite number", p.top_p));
}

Token argmax(const float* logits, size_t n) {
  size_t best = 0;
  for (size_t i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<Token>(best);
}

Token Sampler::sample(const std::vector<float>& logits) {
  if (p_.temp <= 0.0f) return argmax(logits.data(), logits.size());
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] != logits[b] ? logits[a] > logits[b] : a < b; };
  size_t k = p_.top_k > 0 ? std::min<size_t>(p_.top_k, idx.size()) : idx.size();
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by_logit);
  idx.resize(k);
  // Nucleus on the untempered distribution, as llama.cpp applies top-p before temperature.
  std::vector<double> pr(k);
  double mx = logits[idx[0]], sum = 0;
  for (size_t i = 0; i < k; ++i) sum += pr[i] = std::exp(double(logits[idx[i]]) - mx);
  if (p_.top_p < 1.0f) {
    double acc = 0;
    size_t keep = k;
    for (size_t i = 0; i < k; ++i) {
      acc += pr[i] / sum;
      if (acc >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    idx.resize(keep);
  }
  std::vector<double> w(idx.size());
  for (size_t i = 0; i < idx.size(); ++i) w[i] = std::exp((double(logits[idx[i]]) - mx) / p_.temp);
  std::discrete_distribution<size_t> dist(w.begin(), w.end());
  return idx[dist(rng_)];
}

}  // namespace kvslim
