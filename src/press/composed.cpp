// Composed press ("a+b+..."): each press compresses what the previous ones left, so the kept
// fractions multiply and the reported ratio is 1 - prod(1 - r_i) (kvpress's ComposedPress). All
// presses observe a step before any of them evicts, so presses with per-entry state (H2O) see the
// step's attention aligned with the cache. With chunked prefill, press i's ratio applies to what
// presses 0..i-1 would leave of the context seen so far.
#include <fmt/format.h>

#include "press/wrappers.h"

namespace kvslim {

ComposedPress::ComposedPress(std::vector<std::unique_ptr<Press>> presses) : p_(std::move(presses)) {}

std::string ComposedPress::describe() const {
  std::string s;
  for (const auto& p : p_) s += (s.empty() ? "" : "+") + p->describe();
  return s;
}

ObservationRequest ComposedPress::request() const {
  ObservationRequest r;
  for (const auto& p : p_) r = merge_requests(r, p->request());
  return r;
}

ObservationRequest ComposedPress::decode_request() const {
  ObservationRequest r;
  for (const auto& p : p_) r = merge_requests(r, p->decode_request());
  return r;
}

void ComposedPress::observe(const KVCache& cache, const Model& model, const Observation& obs) {
  for (auto& p : p_) p->observe(cache, model, obs);
}

void ComposedPress::apply(KVCache& cache, const Model& model, const Observation& obs, const Target& target) {
  size_t n = target.n_context;
  for (auto& p : p_) {
    Target t{p->ratio(), n};
    p->apply(cache, model, obs, t);
    n = p->kept_after(t);
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

size_t ComposedPress::kept_after(const Target& t) const {
  size_t n = t.n_context;
  for (const auto& p : p_) n = p->kept_after(Target{p->ratio(), n});
  return n;
}

void ComposedPress::remap_positions(int l, int h, const std::vector<int32_t>& o, const std::vector<int32_t>& n) {
  for (auto& p : p_) p->remap_positions(l, h, o, n);
}

}  // namespace kvslim
