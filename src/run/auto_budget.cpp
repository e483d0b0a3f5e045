#include "run/auto_budget.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "kvslim/error.h"
#include "kvslim/eval_metrics.h"
#include "press/recorders.h"
#include "util/clock.h"

namespace kvslim::run {

namespace {

void check_options(const AutoBudget& o) {
  if (!std::isfinite(o.target_kl) || o.target_kl < 0)
    throw Error(fmt::format("auto-budget: target KL {} must be a finite number >= 0 (nats)", o.target_kl));
  if (!(o.max_ratio > 0 && o.max_ratio < 1))
    throw Error(fmt::format("auto-budget: largest ratio {} must be in (0, 1)", o.max_ratio));
  if (!(o.tolerance > 0 && o.tolerance < 1))
    throw Error(fmt::format("auto-budget: tolerance {} must be in (0, 1)", o.tolerance));
  if (o.probe_tokens < 1) throw Error(fmt::format("auto-budget: probe length {} must be >= 1 token", o.probe_tokens));
}

struct Trial {
  size_t bytes = 0;
  double kl = 0;
};

}  // namespace

std::vector<float> prefill_auto_budget(Session& session, Press& press, const std::vector<Token>& context,
                                       const std::vector<Token>& question, const AutoBudget& opt,
                                       AutoBudgetReport& report, size_t* peak_bytes, double* press_seconds) {
  check_options(opt);
  report = AutoBudgetReport{};
  report.used = true;
  const bool fidelity = opt.target_kl > 0;
  const bool budget = opt.kv_budget_bytes > 0;

  // The probe: the question when there is one (it follows the context anyway), else the context's
  // tail, held out so that what is measured is the compressed cache's effect on text it did not see.
  std::vector<Token> prefix = context, probe;
  bool held_out = false;
  if (fidelity) {
    if (!question.empty()) {
      probe = question;
      report.probe_is_question = true;
    } else {
      const size_t p = std::min<size_t>(static_cast<size_t>(opt.probe_tokens), context.size() / 2);
      if (p < 1)
        throw Error(fmt::format("auto-budget: a context of {} token(s) is too short to hold out a probe for the "
                                "fidelity target; give a question or a longer context",
                                context.size()));
      probe.assign(context.end() - static_cast<std::ptrdiff_t>(p), context.end());
      prefix.resize(context.size() - p);
      held_out = true;
    }
    report.probe_tokens = static_cast<int>(probe.size());
  }

  press.set_ratio(0.0);  // fails before any work when the press has no ratio to set

  Observation obs;
  std::vector<float> logits = run_observed(session, prefix, press.needs(), obs);
  if (peak_bytes) *peak_bytes = std::max(*peak_bytes, session.cache().bytes());
  const int32_t base = session.next_position();
  const size_t n_vocab = logits.size();
  std::vector<float> reference;
  if (fidelity) {
    reference = session.forward(probe, true);
    if (held_out && peak_bytes) *peak_bytes = std::max(*peak_bytes, session.cache().bytes());
    session.rewind(base);
  }
  const KVCache full = session.cache();

  std::vector<float> last_row;  // the last probe logits of the final trial (held-out probe)
  // Compresses the observed cache at ratio r and measures it; restores the full cache unless `keep`.
  auto run_trial = [&](double r, bool keep) {
    press.reset();
    press.set_ratio(r);
    const double t0 = steady_seconds();
    press.compress(session.cache(), session.model(), obs);
    if (press_seconds) *press_seconds += steady_seconds() - t0;
    Trial t;
    t.bytes = session.cache().bytes();
    if (fidelity) {
      const std::vector<float> q = session.forward(probe, true);
      if (held_out) t.bytes = session.cache().bytes();  // the held-out tokens stay in the cache
      double sum = 0;
      for (size_t i = 0; i < probe.size(); ++i)
        sum += kl_divergence_logits(reference.data() + i * n_vocab, q.data() + i * n_vocab, n_vocab);
      t.kl = sum / static_cast<double>(probe.size());
      if (keep && held_out)
        last_row.assign(q.end() - static_cast<std::ptrdiff_t>(n_vocab), q.end());
      else
        session.rewind(base);
    }
    if (!keep) {
      session.cache() = full;
      ++report.trials;
    }
    return t;
  };
  std::map<double, Trial> seen;
  auto measure = [&](double r) {
    auto it = seen.find(r);
    if (it == seen.end()) it = seen.emplace(r, run_trial(r, false)).first;
    return it->second;
  };

  // Budget: the smallest ratio whose cache fits (bytes fall as the ratio grows).
  double lo_ratio = 0.0;
  if (budget) {
    const Trial at0 = measure(0.0);
    if (at0.bytes > opt.kv_budget_bytes) {
      if (measure(opt.max_ratio).bytes > opt.kv_budget_bytes) {
        report.budget_met = false;
        lo_ratio = opt.max_ratio;
      } else {
        double bad = 0.0, good = opt.max_ratio;
        while (good - bad > opt.tolerance) {
          const double mid = 0.5 * (bad + good);
          (measure(mid).bytes <= opt.kv_budget_bytes ? good : bad) = mid;
        }
        lo_ratio = good;
      }
    }
  }
  // Fidelity: the largest ratio at or above that whose probe KL stays within the target.
  double chosen = lo_ratio;
  if (fidelity && report.budget_met) {
    if (measure(lo_ratio).kl > opt.target_kl) {
      report.target_met = false;
    } else if (measure(opt.max_ratio).kl <= opt.target_kl) {
      chosen = opt.max_ratio;
    } else {
      double good = lo_ratio, bad = opt.max_ratio;
      while (bad - good > opt.tolerance) {
        const double mid = 0.5 * (good + bad);
        (measure(mid).kl <= opt.target_kl ? good : bad) = mid;
      }
      chosen = good;
    }
  }

  const Trial final_trial = run_trial(chosen, true);
  report.ratio = chosen;
  report.probe_kl = final_trial.kl;
  if (budget) report.budget_met = final_trial.bytes <= opt.kv_budget_bytes;
  if (fidelity) report.target_met = final_trial.kl <= opt.target_kl;
  return held_out ? last_row : logits;
}

}  // namespace kvslim::run
