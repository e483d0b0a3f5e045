#include "run/auto_budget.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include <fmt/format.h>

#include "kvslim/error.h"
#include "kvslim/sampling.h"
#include "press/knobs.h"
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

std::vector<float> prefill_auto_budget(Session& session, PressImpl& press, const std::vector<Token>& context,
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

  // The press's knobs (press/knobs.h: the latent stage's code bits and ranks), when its spec lists
  // candidates: every combination of the grid knobs' candidates, the other knobs at their widest,
  // is a setting with its own ratio. An empty setting is the press as specified.
  KnobControl* kc = press.knobs();
  const std::vector<Knob> knobs = kc ? kc->knob_list() : std::vector<Knob>{};
  auto widest = [&](size_t k) {
    const Knob& kn = knobs[k];
    return kn.choices[std::max_element(kn.widths.begin(), kn.widths.end()) - kn.widths.begin()];
  };
  std::string listed;
  for (const Knob& k : knobs)
    if (k.choices.size() > 1) listed += (listed.empty() ? "" : ", ") + k.name;
  std::vector<std::vector<int>> settings;
  if (!listed.empty()) {
    if (!fidelity)
      throw Error(fmt::format("auto-budget: the press lists several candidates for {} (values separated by '/'): "
                              "choosing among them needs a fidelity target (target_kl > 0)",
                              listed));
    std::vector<int> base(knobs.size());
    for (size_t k = 0; k < knobs.size(); ++k) base[k] = widest(k);
    settings.push_back(base);
    for (size_t k = 0; k < knobs.size(); ++k) {
      if (!knobs[k].in_grid) continue;
      std::vector<std::vector<int>> next;
      for (const auto& st : settings)
        for (int c : knobs[k].choices) {
          next.push_back(st);
          next.back()[k] = c;
        }
      settings.swap(next);
    }
  } else {
    settings.emplace_back();
  }
  // Fails before any work when the press has no ratio to set, unless there are bits or ranks to
  // choose (a latent press alone: only those are chosen, at ratio 0).
  bool has_ratio = true;
  try {
    press.set_ratio(0.0);
  } catch (const Error&) {
    if (settings.size() == 1 && !(kc && kc->knobs_per_layer())) throw;
    has_ratio = false;
  }

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
  // Per-layer knob values [knob][layer] of the trial run next (set by the per-layer search below;
  // empty: one setting for every layer).
  std::vector<std::vector<int>> layers;
  // Compresses the observed cache with setting s (or `layers` when set) at ratio r and measures it;
  // restores the full cache unless `keep`.
  auto run_trial = [&](const std::vector<int>& s, double r, bool keep) {
    press.reset();
    if (!layers.empty())
      kc->set_knobs_per_layer(layers);
    else if (!s.empty())
      kc->set_knobs(s);
    if (has_ratio) press.set_ratio(r);
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
  std::map<std::pair<std::vector<int>, double>, Trial> seen;
  auto measure = [&](const std::vector<int>& s, double r) {
    const auto key = std::make_pair(s, r);
    auto it = seen.find(key);
    if (it == seen.end()) it = seen.emplace(key, run_trial(s, r, false)).first;
    return it->second;
  };

  struct Choice {
    double ratio = 0;
    bool budget_met = true, target_met = true;
  };
  // The ratio for one setting.
  auto choose_ratio = [&](const std::vector<int>& s) {
    Choice c;
    if (!has_ratio) {  // bits only: the cache at ratio 0
      const Trial t = measure(s, 0.0);
      c.budget_met = !budget || t.bytes <= opt.kv_budget_bytes;
      c.target_met = t.kl <= opt.target_kl;
      return c;
    }
    // Budget: the smallest ratio whose cache fits (bytes fall as the ratio grows).
    double lo_ratio = 0.0;
    if (budget) {
      const Trial at0 = measure(s, 0.0);
      if (at0.bytes > opt.kv_budget_bytes) {
        if (measure(s, opt.max_ratio).bytes > opt.kv_budget_bytes) {
          c.budget_met = false;
          lo_ratio = opt.max_ratio;
        } else {
          double bad = 0.0, good = opt.max_ratio;
          while (good - bad > opt.tolerance) {
            const double mid = 0.5 * (bad + good);
            (measure(s, mid).bytes <= opt.kv_budget_bytes ? good : bad) = mid;
          }
          lo_ratio = good;
        }
      }
    }
    // Fidelity: the largest ratio at or above that whose probe KL stays within the target.
    c.ratio = lo_ratio;
    if (fidelity && c.budget_met) {
      if (measure(s, lo_ratio).kl > opt.target_kl) {
        c.target_met = false;
      } else if (measure(s, opt.max_ratio).kl <= opt.target_kl) {
        c.ratio = opt.max_ratio;
      } else {
        double good = lo_ratio, bad = opt.max_ratio;
        while (bad - good > opt.tolerance) {
          const double mid = 0.5 * (good + bad);
          (measure(s, mid).kl <= opt.target_kl ? good : bad) = mid;
        }
        c.ratio = good;
      }
    }
    return c;
  };

  // Of the settings, the one whose chosen cache has the fewest bytes while meeting the budget and
  // the target (ties: the lower KL); when none meets both, one that meets the budget, lowest KL.
  std::vector<int> best_s = settings[0];
  Choice best_c;
  Trial best_t;
  for (size_t i = 0; i < settings.size(); ++i) {
    const Choice c = choose_ratio(settings[i]);
    const Trial t = measure(settings[i], c.ratio);
    const bool ok = c.budget_met && c.target_met, best_ok = best_c.budget_met && best_c.target_met;
    bool better = i == 0;
    if (!better && ok != best_ok) better = ok;
    else if (!better && ok) better = t.bytes < best_t.bytes || (t.bytes == best_t.bytes && t.kl < best_t.kl);
    else if (!better) better = c.budget_met != best_c.budget_met ? c.budget_met : t.kl < best_t.kl;
    if (better) {
      best_s = settings[i];
      best_c = c;
      best_t = t;
    }
  }

  // Knobs per layer (the spec's per_layer=1): from the chosen setting, at the chosen ratio, lower
  // one layer's knob one step at a time (to the candidate of the next smaller width): of the steps
  // whose probe KL stays within the target, the one with the least KL increase per byte saved,
  // until none is left. A step that exceeds the target is not tried again (lowering others only
  // adds error), so this costs at most knobs x layers trials per step taken, plus knobs x layers.
  if (kc && kc->knobs_per_layer() && fidelity && best_c.budget_met && best_c.target_met && !best_s.empty()) {
    // The candidate of knob k next below value v in width, or -1 when v is its narrowest.
    auto narrower = [&](size_t k, int v) {
      const Knob& kn = knobs[k];
      const int w = kn.widths[std::find(kn.choices.begin(), kn.choices.end(), v) - kn.choices.begin()];
      int best = -1, best_w = 0;
      for (size_t i = 0; i < kn.choices.size(); ++i)
        if (kn.widths[i] < w && (best < 0 || kn.widths[i] > best_w)) {
          best = kn.choices[i];
          best_w = kn.widths[i];
        }
      return best;
    };
    const int L = session.cache().n_layer();
    std::vector<std::vector<int>> cur(knobs.size());
    for (size_t k = 0; k < knobs.size(); ++k) cur[k].assign(L, best_s[k]);
    // A step: (layer, knob); applies it to `s` and returns false when that knob has no narrower
    // candidate there.
    auto step = [&](std::vector<std::vector<int>>& s, int l, int k) {
      const int n = narrower(static_cast<size_t>(k), s[k][l]);
      if (n < 0) return false;
      s[k][l] = n;
      return true;
    };
    Trial now = best_t;
    std::vector<std::pair<int, int>> live;  // (layer, knob) still worth a try
    for (int l = 0; l < L; ++l)
      for (int k = 0; k < static_cast<int>(knobs.size()); ++k) {
        std::vector<std::vector<int>> probe_s = cur;
        if (step(probe_s, l, k)) live.emplace_back(l, k);
      }
    while (!live.empty()) {
      std::vector<std::pair<int, int>> next;
      int pick = -1;
      double pick_score = 0;
      Trial pick_t;
      for (const auto& [l, k] : live) {
        layers = cur;
        step(layers, l, k);
        const Trial t = run_trial(best_s, best_c.ratio, false);
        if (t.kl > opt.target_kl) continue;
        next.emplace_back(l, k);
        const double saved = static_cast<double>(now.bytes) - static_cast<double>(t.bytes);
        const double score = (t.kl - now.kl) / std::max(saved, 1.0);
        if (pick < 0 || score < pick_score) {
          pick = static_cast<int>(next.size()) - 1;
          pick_score = score;
          pick_t = t;
        }
      }
      if (pick < 0) break;
      const auto [l, k] = next[pick];
      step(cur, l, k);
      now = pick_t;
      std::vector<std::vector<int>> further = cur;
      if (!step(further, l, k)) next.erase(next.begin() + pick);
      live = std::move(next);
    }
    layers = cur;
  }

  const Trial final_trial = run_trial(best_s, best_c.ratio, true);
  report.ratio = best_c.ratio;
  report.probe_kl = final_trial.kl;
  report.budget_met = best_c.budget_met;
  report.target_met = best_c.target_met;
  if (budget) report.budget_met = final_trial.bytes <= opt.kv_budget_bytes;
  if (fidelity) report.target_met = final_trial.kl <= opt.target_kl;
  return held_out ? last_row : logits;
}

}  // namespace kvslim::run
