// Composed press ("a+b+..."): each press compresses what the previous ones left, sized from the
// entries actually present in each segment (a press that protects its window, or leaves segments
// uneven, hands on what it really kept), so the kept fractions multiply: the requested ratio is
// 1 - prod(1 - r_i) and the measured one follows it up to rounding and protected entries
// (kvpress's ComposedPress). All presses observe a step before any of them evicts, so presses
// with per-entry state (H2O) see the step's attention aligned with the cache.
#include <fmt/format.h>

#include "kvslim/error.h"
#include "press/wrappers.h"

namespace kvslim {

ComposedPress::ComposedPress(std::vector<std::unique_ptr<PressImpl>> presses) : p_(std::move(presses)) {}

KnobControl* ComposedPress::knobs() {
  for (auto& p : p_)
    if (KnobControl* c = p->knobs()) return c;
  return nullptr;
}

std::string ComposedPress::describe() const {
  std::string s;
  for (const auto& p : p_) s += (s.empty() ? "" : "+") + p->describe();
  return s;
}

std::string ComposedPress::report() const {
  std::string s;
  for (const auto& p : p_) {
    const std::string r = p->report();
    if (!r.empty()) s += (s.empty() ? "" : "; ") + r;
  }
  return s;
}

ObservationNeeds ComposedPress::needs() const {
  ObservationNeeds r;
  for (const auto& p : p_) r = merge_needs(r, p->needs());
  return r;
}

ObservationNeeds ComposedPress::decode_needs() const {
  ObservationNeeds r;
  for (const auto& p : p_) r = merge_needs(r, p->decode_needs());
  return r;
}

void ComposedPress::observe(const KVCache& cache, const Model& model, const Observation& obs) {
  for (auto& p : p_) p->observe(cache, model, obs);
}

void ComposedPress::apply(KVCache& cache, const Model& model, const Observation& obs, const Target& target) {
  // Presses that only select at decode time (ClusterKV) record the cache as the evicting presses
  // leave it, whatever their place in the spec: their index must point at entries that exist.
  bool first = true;
  for (int selectors = 0; selectors < 2; ++selectors)
    for (auto& p : p_) {
      if (p->selects_in_decode() != (selectors == 1)) continue;
      Target t{p->ratio(), target.n_context};
      if (!first) {
        // Sized from what the previous stages actually left, segment by segment.
        t.per_segment = true;
        const size_t segs = static_cast<size_t>(cache.n_layer()) * cache.n_head_kv();
        t.n_context = segs ? cache.entries() / segs : 0;
      }
      p->apply(cache, model, obs, t);
      first = false;
    }
}

void ComposedPress::after_decode(KVCache& cache, const Model& model, const Observation& obs) {
  for (auto& p : p_) p->after_decode(cache, model, obs);
}

void ComposedPress::reset() {
  for (auto& p : p_) p->reset();
}

double ComposedPress::ratio() const {
  double kept = 1.0;
  for (const auto& p : p_) kept *= 1.0 - p->ratio();
  return 1.0 - kept;
}

double ComposedPress::key_channel_ratio() const {
  for (const auto& p : p_)
    if (p->key_channel_ratio() > 0) return p->key_channel_ratio();
  return 0.0;
}

void ComposedPress::set_ratio(double r) {
  check_ratio(r, describe());
  for (auto& p : p_) {
    try {
      p->set_ratio(r);
      return;
    } catch (const Error&) {  // this stage has no ratio (latent, threshold): try the next
    }
  }
  throw Error(fmt::format("press {} has no stage with a compression ratio to set", describe()));
}

size_t ComposedPress::kept_after(const Target& t) const {
  size_t n = t.n_context;
  for (const auto& p : p_) n = p->kept_after(Target{p->ratio(), n});
  return n;
}

bool ComposedPress::selects_in_decode() const {
  for (const auto& p : p_)
    if (p->selects_in_decode()) return true;
  return false;
}

bool ComposedPress::evicts_in_decode() const {
  for (const auto& p : p_)
    if (p->evicts_in_decode()) return true;
  return false;
}

void ComposedPress::remap_positions(int l, int h, const std::vector<int32_t>& o, const std::vector<int32_t>& n) {
  for (auto& p : p_) p->remap_positions(l, h, o, n);
}

}  // namespace kvslim
