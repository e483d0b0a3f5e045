#include "kvslim/eval_metrics.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include <fmt/format.h>

#include "kvslim/error.h"
#include "kvslim/sampling.h"

namespace kvslim {

namespace {

std::string lower(const std::string& s) {
  std::string r = s;
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

}  // namespace

void FidelityAccumulator::add(const float* full, const float* comp, size_t n, int target) {
  // A NaN would otherwise print as a KL of -nan and a top-1 agreement of 1 (argmax of NaNs).
  for (const float* l : {full, comp})
    for (size_t i = 0; i < n; ++i)
      if (!std::isfinite(l[i]))
        throw Error(fmt::format("fidelity: the {} model's logit for token {} is {} at continuation token {}",
                                l == full ? "full-cache" : "compressed-cache", i, l[i], n_));
  const double kl = kl_divergence_logits(full, comp, n);
  kl_sum_ += kl;
  kl_max_ = std::max(kl_max_, kl);
  agree_ += argmax(full, n) == argmax(comp, n);
  nll_full_ += nll_logits(full, n, target);
  nll_comp_ += nll_logits(comp, n, target);
  ++n_;
}

void FidelityAccumulator::merge(const FidelityAccumulator& o) {
  n_ += o.n_;
  agree_ += o.agree_;
  kl_sum_ += o.kl_sum_;
  kl_max_ = std::max(kl_max_, o.kl_max_);
  nll_full_ += o.nll_full_;
  nll_comp_ += o.nll_comp_;
}

FidelityAccumulator FidelityAccumulator::from_sums(size_t tokens, size_t top1_agreements, double kl_sum,
                                                  double kl_max, double nll_full_sum, double nll_compressed_sum) {
  FidelityAccumulator a;
  a.n_ = tokens;
  a.agree_ = top1_agreements;
  a.kl_sum_ = kl_sum;
  a.kl_max_ = kl_max;
  a.nll_full_ = nll_full_sum;
  a.nll_comp_ = nll_compressed_sum;
  return a;
}

double FidelityAccumulator::perplexity_full() const { return n_ ? std::exp(nll_full_ / n_) : 0.0; }
double FidelityAccumulator::perplexity_compressed() const { return n_ ? std::exp(nll_comp_ / n_) : 0.0; }

double string_match_all(const std::string& prediction, const std::vector<std::string>& refs) {
  if (refs.empty()) return 0.0;
  const std::string p = lower(prediction);
  size_t hit = 0;
  for (const auto& r : refs) hit += p.find(lower(r)) != std::string::npos;
  return double(hit) / refs.size();
}

double string_match_part(const std::string& prediction, const std::vector<std::string>& refs) {
  const std::string p = lower(prediction);
  for (const auto& r : refs)
    if (p.find(lower(r)) != std::string::npos) return 1.0;
  return 0.0;
}

}  // namespace kvslim
