#include "run/auto_budget.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "kvslim/error.h"
#include "kvslim/sampling.h"
#include "press/latent_bits_control.h"
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

  // The latent stage's code bits, when its spec lists candidates (k_bits=8/4, ...): each
  // (key, value) pair is a setting with its own ratio; (-1, -1) is the press as specified.
  LatentBitsControl* bits = press.latent_bits();
  std::vector<std::pair<int, int>> settings;
  if (bits && (bits->key_bit_choices().size() > 1 || bits->value_bit_choices().size() > 1 ||
               bits->key_rank_choices().size() > 1 || bits->value_rank_choices().size() > 1)) {
    if (!fidelity)
      throw Error("auto-budget: the press's latent stage lists several code bits or ranks (k_bits / v_bits / k_rank / "
                  "v_rank with '/'): choosing among them needs a fidelity target (target_kl > 0)");
    for (int kb : bits->key_bit_choices())
      for (int vb : bits->value_bit_choices()) settings.emplace_back(kb, vb);
  } else {
    settings.emplace_back(-1, -1);
  }
  // Fails before any work when the press has no ratio to set, unless there are bits or ranks to
  // choose (a latent press alone: only those are chosen, at ratio 0).
  bool has_ratio = true;
  try {
    press.set_ratio(0.0);
  } catch (const Error&) {
    if (settings.size() == 1 && !(bits && bits->per_layer_bits())) throw;
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
  // Per-layer bits (and ranks) of the trial run next (set by the per-layer search below; empty:
  // one pair).
  LatentBitsControl::Layers layers;
  // Compresses the observed cache with setting s (or layer_k / layer_v when set) at ratio r and
  // measures it; restores the full cache unless `keep`.
  auto run_trial = [&](std::pair<int, int> s, double r, bool keep) {
    press.reset();
    if (!layers.key_bits.empty())
      bits->set_latent_layers(layers);
    else if (s.first >= 0)
      bits->set_latent_bits(s.first, s.second);
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
  std::map<std::tuple<int, int, double>, Trial> seen;
  auto measure = [&](std::pair<int, int> s, double r) {
    const auto key = std::make_tuple(s.first, s.second, r);
    auto it = seen.find(key);
    if (it == seen.end()) it = seen.emplace(key, run_trial(s, r, false)).first;
    return it->second;
  };

  struct Choice {
    double ratio = 0;
    bool budget_met = true, target_met = true;
  };
  // The ratio for one setting.
  auto choose_ratio = [&](std::pair<int, int> s) {
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
  std::pair<int, int> best_s = settings[0];
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

  // Bits and ranks per layer (the spec's per_layer=1): from the chosen pair (and the largest
  // listed ranks), at the chosen ratio, lower one layer's key or value bits or rank one step at a
  // time (to the next narrower candidate): of the steps whose probe KL stays within the target, the
  // one with the least KL increase per byte saved, until none is left. A step that exceeds the
  // target is not tried again (lowering others only adds error), so this costs at most 4 x layers
  // trials per step taken, plus 4 x layers.
  if (bits && bits->per_layer_bits() && fidelity && best_c.budget_met && best_c.target_met && best_s.first >= 0) {
    // Narrower = fewer bits per code (f16 codes count as 16), or a smaller rank.
    auto width = [](int b) { return b == 0 ? 16 : b; };
    auto narrower_bits = [&](const std::vector<int>& choices, int b) {
      int best = -1;
      for (int c : choices)
        if (width(c) < width(b) && (best < 0 || width(c) > width(best))) best = c;
      return best;
    };
    auto narrower_rank = [](const std::vector<int>& choices, int r) {
      int best = -1;
      for (int c : choices)
        if (c < r && c > best) best = c;
      return best;
    };
    const bool ranks = bits->key_rank_choices().size() > 1 || bits->value_rank_choices().size() > 1;
    const int L = session.cache().n_layer();
    LatentBitsControl::Layers cur;
    cur.key_bits.assign(L, best_s.first);
    cur.value_bits.assign(L, best_s.second);
    if (ranks) {
      cur.key_rank.assign(L, *std::max_element(bits->key_rank_choices().begin(), bits->key_rank_choices().end()));
      cur.value_rank.assign(L,
                            *std::max_element(bits->value_rank_choices().begin(), bits->value_rank_choices().end()));
    }
    // A step: (layer, axis) with axis 0 / 1 = key / value bits, 2 / 3 = key / value rank; applies
    // it to `s` and returns false when that axis has no narrower candidate.
    auto step = [&](LatentBitsControl::Layers& s, int l, int axis) {
      int& v = axis == 0 ? s.key_bits[l] : axis == 1 ? s.value_bits[l] : axis == 2 ? s.key_rank[l] : s.value_rank[l];
      const int n = axis < 2 ? narrower_bits(axis ? bits->value_bit_choices() : bits->key_bit_choices(), v)
                             : narrower_rank(axis == 3 ? bits->value_rank_choices() : bits->key_rank_choices(), v);
      if (n < 0) return false;
      v = n;
      return true;
    };
    Trial now = best_t;
    std::vector<std::pair<int, int>> live;  // (layer, axis) still worth a try
    for (int l = 0; l < L; ++l)
      for (int axis = 0; axis < (ranks ? 4 : 2); ++axis) {
        LatentBitsControl::Layers probe_s = cur;
        if (step(probe_s, l, axis)) live.emplace_back(l, axis);
      }
    while (!live.empty()) {
      std::vector<std::pair<int, int>> next;
      int pick = -1;
      double pick_score = 0;
      Trial pick_t;
      for (const auto& [l, axis] : live) {
        layers = cur;
        step(layers, l, axis);
        const Trial t = run_trial(best_s, best_c.ratio, false);
        if (t.kl > opt.target_kl) continue;
        next.emplace_back(l, axis);
        const double saved = static_cast<double>(now.bytes) - static_cast<double>(t.bytes);
        const double score = (t.kl - now.kl) / std::max(saved, 1.0);
        if (pick < 0 || score < pick_score) {
          pick = static_cast<int>(next.size()) - 1;
          pick_score = score;
          pick_t = t;
        }
      }
      if (pick < 0) break;
      const auto [l, axis] = next[pick];
      step(cur, l, axis);
      now = pick_t;
      LatentBitsControl::Layers further = cur;
      if (!step(further, l, axis)) next.erase(next.begin() + pick);
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
