#include "kvslim/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "kvslim/error.h"

namespace kvslim {

namespace {

double log_sum_exp(const float* x, size_t n) {
  double m = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < n; ++i) m = std::max(m, double(x[i]));
  if (!std::isfinite(m)) return m;
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += std::exp(double(x[i]) - m);
  return m + std::log(s);
}

}  // namespace

double kl_divergence_logits(const float* p, const float* q, size_t n) {
  const double lp = log_sum_exp(p, n), lq = log_sum_exp(q, n);
  double kl = 0;
  for (size_t i = 0; i < n; ++i) {
    const double logp = double(p[i]) - lp;
    const double pi = std::exp(logp);
    if (pi == 0.0) continue;
    kl += pi * (logp - (double(q[i]) - lq));
  }
  // Rounding can leave a tiny negative sum for identical distributions.
  return std::max(kl, 0.0);
}

double nll_logits(const float* logits, size_t n, int target) {
  if (target < 0 || static_cast<size_t>(target) >= n)
    throw Error(fmt::format("target token {} is outside the vocabulary of {} tokens", target, n));
  return log_sum_exp(logits, n) - double(logits[target]);
}


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
